// The gateway's own routes (local_routes.h). Moved out of gateway_server.cc (issue #19).
#include "gateway/local_routes.h"

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

namespace flotilla::gateway {

// The name under which `auth.open_routes` lists a local route.
std::string_view open_route_name(RouteKind kind) {
  switch (kind) {
    case RouteKind::kHealth:
    case RouteKind::kServerMetadata:
      return "health";
    case RouteKind::kMetrics:
      return "metrics";
    case RouteKind::kStats:
      return "stats";
    case RouteKind::kListModels:
    case RouteKind::kModel:
      return "models";
    default:
      return "";
  }
}

namespace {

// An OpenAI model object for a generative endpoint, as vLLM writes it (max_model_len added).
nlohmann::json model_object(const std::string& name, const EndpointView& view) {
  return {{"id", name},
          {"object", "model"},
          {"created", 0},
          {"owned_by", "flotilla"},
          {"max_model_len",
           view.max_model_len > 0 ? nlohmann::json(view.max_model_len) : nlohmann::json(nullptr)}};
}

}  // namespace

http::Response answer_local(const Route& route, const http::Request& request,
                            const Snapshot& snapshot, ErrorShape shape,
                            const std::vector<std::string>& scope, bool draining,
                            MetricsRegistry& registry) {
  http::Response response;
  const std::string_view authorization = http::find_header(request.headers, "authorization");
  // Whether the request's token may see endpoint `name` (a model listing shows only those).
  const auto may_see = [&](const std::string& name) {
    return !snapshot.auth_enabled || snapshot.is_open("models") ||
           snapshot.auth->check(authorization, name) == auth::AuthResult::kAllowed;
  };
  switch (route.kind) {
    case RouteKind::kHealth: {
      const bool ready = !draining;
      const bool live_route = request.target.starts_with("/v2/health/live");
      response.status = live_route || ready ? 200 : 503;
      response.body =
          live_route ? R"({"live":true})" : (ready ? R"({"ready":true})" : R"({"ready":false})");
      break;
    }
    case RouteKind::kServerMetadata:
      // OIP server metadata: the replicas answer the same for their own /v2.
      response.body = std::string(R"({"name":"flotilla","version":")") + FLOTILLA_VERSION +
                      R"(","extensions":[]})";
      break;
    case RouteKind::kMetrics:
      response.content_type = "text/plain; version=0.0.4; charset=utf-8";
      response.body = auth::scope_metrics(registry.render(), scope);
      break;
    case RouteKind::kListModels: {
      nlohmann::json data = nlohmann::json::array();
      for (const std::string& name : snapshot.names) {
        const EndpointView& view = *snapshot.find(name);
        if (view.generative && may_see(name)) {
          data.push_back(model_object(name, view));
        }
      }
      response.body = nlohmann::json{{"object", "list"}, {"data", data}}.dump();
      break;
    }
    case RouteKind::kModel: {
      const EndpointView* view = snapshot.find(route.endpoint);
      if (view == nullptr || !view->generative || !may_see(route.endpoint)) {
        response = error_response(shape, 404, "the model '" + route.endpoint + "' does not exist",
                                  "model");
        break;
      }
      response.body = model_object(route.endpoint, *view).dump();
      break;
    }
    case RouteKind::kStats: {
      nlohmann::json endpoints = nlohmann::json::array();
      for (const std::string& name : snapshot.names) {
        if (!scope.empty() && std::find(scope.begin(), scope.end(), name) == scope.end()) {
          continue;
        }
        const EndpointView& view = *snapshot.find(name);
        nlohmann::json replicas = nlohmann::json::array();
        for (const auto& version : view.versions) {
          for (const auto& replica : version.replicas) {
            replicas.push_back({{"id", replica->id},
                                {"version", replica->version},
                                {"address", replica->address},
                                {"in_flight", replica->in_flight.load()},
                                {"cap", replica->cap.load()},
                                {"eligible", replica->eligible()},
                                {"ejected", replica->outlier.ejected()}});
          }
        }
        nlohmann::json samples = nlohmann::json::array();
        for (const LoadSample& sample : view.runtime->sampler.latest(60)) {
          samples.push_back({{"unix_ms", sample.unix_ms},
                             {"concurrency", sample.concurrency},
                             {"queued", sample.queued},
                             {"arrivals", sample.arrivals},
                             {"completions", sample.completions},
                             {"latency_ms", sample.latency_ms},
                             {"rejected", sample.rejected}});
        }
        endpoints.push_back({{"name", name},
                             {"in_flight", view.runtime->in_flight.load()},
                             {"queued", view.runtime->queued.load()},
                             {"replicas", replicas},
                             {"samples", samples}});
      }
      response.body = nlohmann::json{{"endpoints", endpoints}}.dump();
      break;
    }
    default:
      response = error_response(shape, 404, "no route");
  }
  return response;
}

}  // namespace flotilla::gateway

// Request routing: which endpoint a request is for and which path it takes on the replica.
#include <simdjson.h>

#include "gateway/gateway.h"

namespace flotilla::gateway {
namespace {

constexpr std::string_view kInvocationsPrefix = "/serving-endpoints/";
constexpr std::string_view kOipPrefix = "/v2/models/";

std::string_view path_of(std::string_view target) {
  const size_t query = target.find('?');
  return query == std::string_view::npos ? target : target.substr(0, query);
}

// The top-level "model" string of an OpenAI body. simdjson's on-demand API walks the top-level
// keys and skips every other value without building a DOM.
Result<std::string> find_model(std::string_view body) {
  thread_local simdjson::ondemand::parser parser;
  simdjson::padded_string padded(body);
  simdjson::ondemand::document document;
  if (auto error = parser.iterate(padded).get(document); error) {
    return invalid_argument(std::string("malformed JSON: ") + simdjson::error_message(error));
  }
  simdjson::ondemand::object object;
  if (document.get_object().get(object) != simdjson::SUCCESS) {
    return invalid_argument("the request body must be a JSON object");
  }
  for (auto field : object) {
    std::string_view key;
    if (field.unescaped_key().get(key) != simdjson::SUCCESS) {
      return invalid_argument("malformed JSON in the request body");
    }
    if (key == "model") {
      std::string_view model;
      if (field.value().get_string().get(model) != simdjson::SUCCESS) {
        return invalid_argument("'model' must be a string naming the endpoint");
      }
      return std::string(model);
    }
  }
  return invalid_argument("the request has no 'model' field naming the endpoint");
}

}  // namespace

Route route_request(http::Method method, std::string_view target, std::string_view body,
                    std::string_view default_endpoint) {
  Route route;
  const std::string_view path = path_of(target);
  if (path == "/v2/health/live" || path == "/v2/health/ready") {
    route.kind = RouteKind::kHealth;
    return route;
  }
  if (path == "/metrics") {
    route.kind = RouteKind::kMetrics;
    return route;
  }
  if (path == "/gateway/stats") {
    route.kind = RouteKind::kStats;
    return route;
  }
  if (path == "/v1/models" && method == http::Method::kGet) {
    route.kind = RouteKind::kListModels;
    return route;
  }
  if (path.starts_with(kInvocationsPrefix)) {
    const std::string_view rest = path.substr(kInvocationsPrefix.size());
    const size_t slash = rest.find('/');
    if (slash != std::string_view::npos && slash > 0 && rest.substr(slash) == "/invocations") {
      route.kind = RouteKind::kInvocations;
      route.endpoint = std::string(rest.substr(0, slash));
      route.upstream_target = "/invocations";
      route.upstream_target.append(target.substr(path.size()));  // the query, if any
    }
    return route;  // kNotFound for other shapes
  }
  if (path.starts_with(kOipPrefix)) {
    const std::string_view rest = path.substr(kOipPrefix.size());
    const std::string_view name = rest.substr(0, rest.find('/'));
    if (!name.empty()) {
      route.kind = RouteKind::kOip;
      route.endpoint = std::string(name);
      route.upstream_target = std::string(target);
    }
    return route;
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (method != http::Method::kPost) {
      return route;
    }
    auto model = find_model(body);
    if (!model.is_ok()) {
      route.kind = RouteKind::kBadRequest;
      route.error = model.status().message();
      return route;
    }
    route.kind = RouteKind::kOpenAi;
    route.endpoint = std::move(model).value();
    route.upstream_target = std::string(target);
    return route;
  }
  if (!default_endpoint.empty()) {
    route.kind = RouteKind::kCatchAll;
    route.endpoint = std::string(default_endpoint);
    route.upstream_target = std::string(target);
  }
  return route;
}

}  // namespace flotilla::gateway

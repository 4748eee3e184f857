// Request routing: which endpoint a request is for and which path it takes on the replica.
#include <simdjson.h>

#include "gateway/gateway.h"
#include "protocol/protocol.h"

namespace flotilla::gateway {
namespace {

constexpr std::string_view kOipPrefix = "/v2/models/";

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
  // The grammar is protocol's (shared with the replica); which paths and methods the gateway
  // proxies is decided here.
  const protocol::ParsedPath parsed = protocol::parse_path(target);
  const std::string_view path = parsed.path;
  const auto not_allowed = [&route](std::string_view allow) {
    route.kind = RouteKind::kMethodNotAllowed;
    route.allow = allow;
    return route;
  };
  const bool get = method == http::Method::kGet || method == http::Method::kHead;
  switch (parsed.kind) {
    case protocol::PathKind::kOther:
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
      if (path == "/v2" || path == "/v2/") {
        if (!get) {
          return not_allowed("GET, HEAD");
        }
        route.kind = RouteKind::kServerMetadata;
        return route;
      }
      break;
    case protocol::PathKind::kOpenAi:
      if (parsed.malformed) {
        return route;  // kNotFound: /v1/models/
      }
      if (parsed.rest == "/models") {
        if (!get) {
          return not_allowed("GET, HEAD");
        }
        route.kind = RouteKind::kListModels;
        return route;
      }
      if (!parsed.name.empty()) {  // /v1/models/{name}: endpoint names hold no '/'
        if (parsed.name.find('/') != std::string_view::npos) {
          return route;  // kNotFound
        }
        if (!get) {
          return not_allowed("GET, HEAD");
        }
        route.kind = RouteKind::kModel;
        route.endpoint = std::string(parsed.name);
        return route;
      }
      if (parsed.rest == "/completions" || parsed.rest == "/chat/completions") {
        if (method != http::Method::kPost) {
          return not_allowed("POST");
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
      break;  // other /v1 paths: the catch-all's
    case protocol::PathKind::kServingEndpoint:
      if (!parsed.malformed && parsed.rest == "/invocations") {
        if (method != http::Method::kPost) {
          return not_allowed("POST");
        }
        route.kind = RouteKind::kInvocations;
        route.endpoint = std::string(parsed.name);
        route.upstream_target = "/invocations";
        route.upstream_target.append(parsed.query);
      }
      return route;  // kNotFound for other shapes
    case protocol::PathKind::kOipModel:
      if (parsed.malformed) {
        return route;
      }
      if (parsed.rest == "/infer" && method != http::Method::kPost) {
        return not_allowed("POST");
      }
      route.kind = RouteKind::kOip;
      route.endpoint = std::string(parsed.name);
      if (parsed.version.empty()) {
        route.upstream_target = std::string(target);
      } else {
        route.version = std::string(parsed.version);
        route.upstream_target.reserve(target.size());
        route.upstream_target.append(kOipPrefix);
        route.upstream_target.append(parsed.name);
        route.upstream_target.append(parsed.rest);
        route.upstream_target.append(parsed.query);
      }
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

// Request routing: which endpoint a request is for and which path it takes on the replica.
#include <simdjson.h>

#include "gateway/gateway.h"

namespace flotilla::gateway {
namespace {

constexpr std::string_view kInvocationsPrefix = "/serving-endpoints/";
constexpr std::string_view kOipPrefix = "/v2/models/";
constexpr std::string_view kVersionsInfix = "/versions/";
constexpr std::string_view kModelsPrefix = "/v1/models/";

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
  const auto not_allowed = [&route](std::string_view allow) {
    route.kind = RouteKind::kMethodNotAllowed;
    route.allow = allow;
    return route;
  };
  const bool get = method == http::Method::kGet || method == http::Method::kHead;
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
  if (path == "/v1/models") {
    if (!get) {
      return not_allowed("GET, HEAD");
    }
    route.kind = RouteKind::kListModels;
    return route;
  }
  if (path.starts_with(kModelsPrefix)) {
    const std::string_view name = path.substr(kModelsPrefix.size());
    if (name.empty() || name.find('/') != std::string_view::npos) {
      return route;  // kNotFound
    }
    if (!get) {
      return not_allowed("GET, HEAD");
    }
    route.kind = RouteKind::kModel;
    route.endpoint = std::string(name);
    return route;
  }
  if (path.starts_with(kInvocationsPrefix)) {
    const std::string_view rest = path.substr(kInvocationsPrefix.size());
    const size_t slash = rest.find('/');
    if (slash != std::string_view::npos && slash > 0 && rest.substr(slash) == "/invocations") {
      if (method != http::Method::kPost) {
        return not_allowed("POST");
      }
      route.kind = RouteKind::kInvocations;
      route.endpoint = std::string(rest.substr(0, slash));
      route.upstream_target = "/invocations";
      route.upstream_target.append(target.substr(path.size()));  // the query, if any
    }
    return route;  // kNotFound for other shapes
  }
  if (path.starts_with(kOipPrefix)) {
    const std::string_view rest = path.substr(kOipPrefix.size());
    const size_t name_end = rest.find('/');
    const std::string_view name = rest.substr(0, name_end);
    if (name.empty()) {
      return route;
    }
    std::string_view tail = name_end == std::string_view::npos ? "" : rest.substr(name_end);
    std::string_view version;
    if (tail.starts_with(kVersionsInfix)) {
      version = tail.substr(kVersionsInfix.size());
      const size_t version_end = version.find('/');
      tail = version_end == std::string_view::npos ? "" : version.substr(version_end);
      version = version.substr(0, version_end);
      if (version.empty()) {
        return route;
      }
    }
    if (tail == "/infer" && method != http::Method::kPost) {
      return not_allowed("POST");
    }
    route.kind = RouteKind::kOip;
    route.endpoint = std::string(name);
    if (version.empty()) {
      route.upstream_target = std::string(target);
    } else {
      route.version = std::string(version);
      route.upstream_target.reserve(target.size());
      route.upstream_target.append(kOipPrefix);
      route.upstream_target.append(name);
      route.upstream_target.append(tail);
      route.upstream_target.append(target.substr(path.size()));  // the query, if any
    }
    return route;
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
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
  if (!default_endpoint.empty()) {
    route.kind = RouteKind::kCatchAll;
    route.endpoint = std::string(default_endpoint);
    route.upstream_target = std::string(target);
  }
  return route;
}

}  // namespace flotilla::gateway

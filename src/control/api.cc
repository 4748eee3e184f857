// The control plane's REST API (docs/control-plane.md), shaped after the managed-serving API
// users already script against: /api/2.0/serving-endpoints and /api/2.0/tokens. Errors are
// {"error_code": "...", "message": "..."} with the matching HTTP status.
#include <algorithm>
#include <charconv>

#include "control/control_api.h"
#include "control/control_metrics.h"
#include "control/dashboard.h"
#include "protocol/protocol.h"

namespace flotilla::control {
namespace {

constexpr std::string_view kEndpointsPrefix = "/api/2.0/serving-endpoints";
constexpr std::string_view kTokensPrefix = "/api/2.0/tokens";

http::Response json_response(int status, const nlohmann::json& body) {
  http::Response response;
  response.status = status;
  response.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return response;
}

// MLflow's error shape, written by protocol; the API's answers carry U+FFFD itself for
// invalid bytes in a message, as they always have.
http::Response error_response(int status, std::string_view code, const std::string& message) {
  http::Response response;
  response.status = status;
  response.body = protocol::encode_mlflow_error(code, protocol::valid_utf8(message));
  return response;
}

std::string_view code_for_status(int status) {
  switch (status) {
    case 413:
      return "REQUEST_TOO_LARGE";
    case 431:
      return "HEADERS_TOO_LARGE";
    case 503:
      return "TEMPORARILY_UNAVAILABLE";
    default:
      return status >= 500 ? "INTERNAL_ERROR" : "BAD_REQUEST";
  }
}

// The HTTP status is common's http_status_for (the one Status -> HTTP table); only the MLflow
// error_code name is the API's own.
http::Response error_response(const Status& status) {
  const int http_status = http_status_for(status.code());
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      return error_response(http_status, "INVALID_PARAMETER_VALUE", status.message());
    case StatusCode::kNotFound:
      return error_response(http_status, "RESOURCE_DOES_NOT_EXIST", status.message());
    case StatusCode::kFailedPrecondition:
      return error_response(http_status, "RESOURCE_ALREADY_EXISTS", status.message());
    default:
      return error_response(http_status, code_for_status(http_status), status.message());
  }
}

http::Response method_not_allowed(std::string_view allowed) {
  http::Response response =
      error_response(405, "METHOD_NOT_ALLOWED", "this route accepts " + std::string(allowed));
  response.headers.emplace_back("Allow", std::string(allowed));
  return response;
}

// The value of `name` in a query string, "" when absent.
std::string query_value(std::string_view query, std::string_view name) {
  while (!query.empty()) {
    const size_t end = query.find('&');
    const std::string_view pair = query.substr(0, end);
    if (pair.starts_with(name) && pair.size() > name.size() && pair[name.size()] == '=') {
      return std::string(pair.substr(name.size() + 1));
    }
    query = end == std::string_view::npos ? std::string_view() : query.substr(end + 1);
  }
  return "";
}

std::string_view content_type_of(std::string_view name) {
  if (name.ends_with(".html")) {
    return "text/html; charset=utf-8";
  }
  if (name.ends_with(".js")) {
    return "text/javascript; charset=utf-8";
  }
  return name.ends_with(".css") ? "text/css; charset=utf-8" : "application/octet-stream";
}

// GET /dashboard/...: the embedded files, to anyone (they hold no data; the page asks the API
// with the user's token). The page may talk only to this server.
http::Response dashboard_response(std::string_view path) {
  if (path == "/dashboard") {
    http::Response response;
    response.status = 308;
    response.headers.emplace_back("Location", "/dashboard/");
    return response;
  }
  std::string_view name = path.substr(std::string_view("/dashboard/").size());
  if (name.empty()) {
    name = "index.html";
  }
  for (const DashboardAsset& asset : dashboard_assets()) {
    if (asset.name == name) {
      http::Response response;
      response.content_type = std::string(content_type_of(name));
      response.body = std::string(asset.body);
      response.headers.emplace_back("Cache-Control", "no-cache");
      response.headers.emplace_back("X-Content-Type-Options", "nosniff");
      response.headers.emplace_back("Referrer-Policy", "no-referrer");
      response.headers.emplace_back(
          "Content-Security-Policy",
          "default-src 'self'; img-src 'self' data:; object-src 'none'; frame-ancestors 'none'");
      return response;
    }
  }
  return error_response(404, "ENDPOINT_NOT_FOUND",
                        "no dashboard file " + std::string(path) + " (see /dashboard/)");
}

}  // namespace

bool is_dashboard_path(std::string_view path) {
  return path == "/dashboard" || path.starts_with("/dashboard/");
}

std::string api_error_body(int status, std::string_view message) {
  return protocol::encode_mlflow_error(code_for_status(status), protocol::valid_utf8(message));
}

void ApiRoutes::configure_server(http::ServerOptions& options) {
  options.workers = 1;
  options.capture_headers = true;
  options.max_body_bytes = std::min<size_t>(options.max_body_bytes, 1024 * 1024);
  options.error_body = [](int status, std::string_view message) {
    return api_error_body(status, message);
  };
}

Result<std::unique_ptr<ApiServer>> ApiServer::create(http::ServerOptions options,
                                                     ApiService& service, bool metrics_open) {
  auto api = std::unique_ptr<ApiServer>(new ApiServer(service, metrics_open));
  ApiRoutes::configure_server(options);
  FLOTILLA_ASSIGN_OR_RETURN(
      api->server_,
      http::Server::create(
          options, [server = api.get()](http::Request&& request, http::Responder&& responder) {
            responder.send(server->handle(request));
          }));
  return api;
}

http::Response ApiRoutes::handle(const http::Request& request) const {
  std::string_view target = request.target;
  const size_t question = target.find('?');
  const std::string_view path = target.substr(0, question);

  if (path == "/health") {
    return json_response(200, {{"status", "ok"}});
  }
  if (is_dashboard_path(path)) {
    return request.method == http::Method::kGet ? dashboard_response(path)
                                                : method_not_allowed("GET");
  }
  if (path == "/metrics" && request.method == http::Method::kGet) {
    // The same series as the gateway's /metrics, under the same rule: any valid token (none with
    // `--open-routes metrics`), one scoped to endpoints seeing only theirs.
    std::vector<std::string> scope;
    if (!metrics_open_) {
      Result<auth::AuthResult> checked =
          service_.check_token(http::find_header(request.headers, "authorization"), &scope);
      if (!checked.is_ok()) {
        return error_response(checked.status());
      }
      const auth::AuthResult result = *checked;
      if (result == auth::AuthResult::kMissing) {
        return error_response(401, "UNAUTHENTICATED",
                              "missing Authorization: Bearer <token> (any token; one scoped to "
                              "endpoints sees only their series)");
      }
      if (result != auth::AuthResult::kAllowed) {
        return error_response(401, "UNAUTHENTICATED", "invalid token");
      }
    }
    http::Response response;
    response.content_type = "text/plain; version=0.0.4";
    response.body = auth::scope_metrics(service_.render_metrics(), scope);
    return response;
  }
  std::string actor;
  Result<auth::AuthResult> admin =
      service_.check_admin(http::find_header(request.headers, "authorization"), &actor);
  if (!admin.is_ok()) {
    return error_response(admin.status());
  }
  switch (*admin) {
    case auth::AuthResult::kAllowed:
      break;
    case auth::AuthResult::kMissing:
      return error_response(
          401, "UNAUTHENTICATED",
          "missing Authorization: Bearer <token> (an admin token; " + admin_token_hint_ + ")");
    case auth::AuthResult::kInvalid:
      return error_response(401, "UNAUTHENTICATED", "invalid token");
    case auth::AuthResult::kForbidden:
      return error_response(403, "PERMISSION_DENIED",
                            "this token may call endpoints but not the control plane API");
  }
  if (path == "/api/2.0/info") {
    return json_response(200, service_.info());
  }
  if (path.starts_with(kEndpointsPrefix)) {
    return handle_endpoints(
        request, std::string_view(request.target).substr(kEndpointsPrefix.size()), actor);
  }
  if (path.starts_with(kTokensPrefix)) {
    return handle_tokens(request, path.substr(kTokensPrefix.size()), actor);
  }
  return error_response(
      404, "ENDPOINT_NOT_FOUND",
      "no API route " + std::string(path) + " (see /api/2.0/serving-endpoints, /api/2.0/tokens)");
}

http::Response ApiRoutes::handle_endpoints(const http::Request& request, std::string_view rest,
                                           const std::string& actor) const {
  const size_t question = rest.find('?');
  const std::string_view query =
      question == std::string_view::npos ? std::string_view() : rest.substr(question + 1);
  rest = rest.substr(0, question);
  if (rest.empty() || rest == "/") {
    if (request.method == http::Method::kGet) {
      Result<std::vector<nlohmann::json>> views = service_.endpoint_views();
      if (!views.is_ok()) {
        return error_response(views.status());
      }
      return json_response(200, {{"endpoints", std::move(views).value()}});
    }
    if (request.method == http::Method::kPost) {
      Result<nlohmann::json> view = service_.create_endpoint(request.body, actor);
      return view.is_ok() ? json_response(200, *view) : error_response(view.status());
    }
    return method_not_allowed("GET, POST");
  }
  if (rest.front() != '/') {
    return error_response(404, "ENDPOINT_NOT_FOUND", "no API route " + request.target);
  }
  rest.remove_prefix(1);
  const size_t slash = rest.find('/');
  const std::string name(rest.substr(0, slash));
  const std::string_view action =
      slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);

  if (action.empty()) {
    if (request.method == http::Method::kGet) {
      Result<nlohmann::json> view = service_.endpoint_view(name);
      if (!view.is_ok()) {
        return error_response(view.status());
      }
      Result<std::vector<EventRow>> events = service_.list_events(name, 20);
      nlohmann::json list = nlohmann::json::array();
      for (const EventRow& event : events.is_ok() ? *events : std::vector<EventRow>{}) {
        list.push_back({{"timestamp", event.unix_ms},
                        {"kind", event.kind},
                        {"actor", event.actor},
                        {"message", event.message}});
      }
      (*view)["events"] = std::move(list);
      return json_response(200, *view);
    }
    if (request.method == http::Method::kDelete) {
      Status status = service_.delete_endpoint(name, actor);
      return status.is_ok() ? json_response(200, nlohmann::json::object()) : error_response(status);
    }
    return method_not_allowed("GET, DELETE");
  }
  if (action == "config") {
    if (request.method != http::Method::kPut) {
      return method_not_allowed("PUT");
    }
    Result<nlohmann::json> view = service_.update_endpoint(name, request.body, actor);
    return view.is_ok() ? json_response(200, *view) : error_response(view.status());
  }
  if (action == "events") {
    if (request.method != http::Method::kGet) {
      return method_not_allowed("GET");
    }
    if (Result<nlohmann::json> view = service_.endpoint_view(name); !view.is_ok()) {
      // Events of a deleted endpoint stay readable; only names never seen are unknown.
      Result<std::vector<EventRow>> any = service_.list_events(name, 1);
      if (!any.is_ok() || any->empty()) {
        return error_response(view.status());
      }
    }
    size_t limit = 100;
    const std::string limit_text = query_value(query, "limit");
    if (!limit_text.empty()) {
      const auto [end, error] =
          std::from_chars(limit_text.data(), limit_text.data() + limit_text.size(), limit);
      if (error != std::errc() || end != limit_text.data() + limit_text.size() || limit == 0 ||
          limit > 10'000) {
        return error_response(400, "INVALID_PARAMETER_VALUE",
                              "limit: must be an integer from 1 to 10000");
      }
    }
    Result<std::vector<EventRow>> events = service_.list_events(name, limit);
    if (!events.is_ok()) {
      return error_response(events.status());
    }
    nlohmann::json list = nlohmann::json::array();
    for (const EventRow& event : *events) {
      list.push_back({{"id", event.id},
                      {"timestamp", event.unix_ms},
                      {"kind", event.kind},
                      {"actor", event.actor},
                      {"message", event.message}});
    }
    return json_response(200, {{"events", std::move(list)}});
  }
  if (action == "metrics") {
    if (request.method != http::Method::kGet) {
      return method_not_allowed("GET");
    }
    int64_t seconds = kMetricsWindowDefaultSeconds;
    if (const std::string window = query_value(query, "window"); !window.empty()) {
      Result<int64_t> parsed = parse_metrics_window(window);
      if (!parsed.is_ok()) {
        return error_response(parsed.status());
      }
      seconds = *parsed;
    }
    Result<nlohmann::json> metrics = service_.endpoint_metrics(name, seconds);
    return metrics.is_ok() ? json_response(200, *metrics) : error_response(metrics.status());
  }
  return error_response(404, "ENDPOINT_NOT_FOUND", "no API route " + request.target);
}

http::Response ApiRoutes::handle_tokens(const http::Request& request, std::string_view rest,
                                        const std::string& actor) const {
  if (rest.empty() || rest == "/") {
    if (request.method == http::Method::kGet) {
      Result<nlohmann::json> tokens = service_.list_tokens();
      return tokens.is_ok() ? json_response(200, {{"tokens", *tokens}})
                            : error_response(tokens.status());
    }
    if (request.method != http::Method::kPost) {
      return method_not_allowed("GET, POST");
    }
    const nlohmann::json body = nlohmann::json::parse(request.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      return error_response(400, "INVALID_PARAMETER_VALUE", "body: must be a JSON object");
    }
    for (const auto& [key, value] : body.items()) {
      if (key != "id" && key != "endpoints" && key != "admin" && key != "comment") {
        return error_response(400, "INVALID_PARAMETER_VALUE", "unknown field '" + key + "'");
      }
    }
    if (!body.contains("id") || !body["id"].is_string()) {
      return error_response(400, "INVALID_PARAMETER_VALUE", "id: required, a string");
    }
    std::vector<std::string> endpoints;
    if (body.contains("endpoints")) {
      if (!body["endpoints"].is_array()) {
        return error_response(400, "INVALID_PARAMETER_VALUE", "endpoints: must be a list");
      }
      for (const auto& endpoint : body["endpoints"]) {
        if (!endpoint.is_string()) {
          return error_response(400, "INVALID_PARAMETER_VALUE",
                                "endpoints: must be a list of names");
        }
        endpoints.push_back(endpoint.get<std::string>());
      }
    }
    if (body.contains("admin") && !body["admin"].is_boolean()) {
      return error_response(400, "INVALID_PARAMETER_VALUE", "admin: must be true or false");
    }
    if (body.contains("comment") && !body["comment"].is_string()) {
      return error_response(400, "INVALID_PARAMETER_VALUE", "comment: must be a string");
    }
    const bool admin = body.value("admin", false);
    if (admin && !endpoints.empty()) {
      return error_response(400, "INVALID_PARAMETER_VALUE",
                            "endpoints: an admin token may call every endpoint; leave it out");
    }
    Result<nlohmann::json> created =
        service_.create_token(body["id"].get<std::string>(), std::move(endpoints), admin,
                              body.value("comment", std::string()), actor);
    return created.is_ok() ? json_response(200, *created) : error_response(created.status());
  }
  if (rest.front() == '/' && rest.find('/', 1) == std::string_view::npos) {
    if (request.method != http::Method::kDelete) {
      return method_not_allowed("DELETE");
    }
    const std::string id(rest.substr(1));
    if (id == actor) {
      return error_response(400, "INVALID_PARAMETER_VALUE",
                            "token '" + id +
                                "' is the one making this call; revoke it with "
                                "another admin token");
    }
    Status status = service_.revoke_token(id, actor);
    return status.is_ok() ? json_response(200, nlohmann::json::object()) : error_response(status);
  }
  return error_response(404, "ENDPOINT_NOT_FOUND", "no API route " + request.target);
}

}  // namespace flotilla::control

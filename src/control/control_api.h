// The control plane's REST API (docs/control-plane.md): routes that parse requests, check tokens
// and shape answers, over ApiService, the operations they need. The routes know nothing of where
// endpoints live: `flotilla up`'s ControlPlaneImpl implements the service over its SQLite store,
// Kubernetes mode's cluster::ClusterApi over ServingEndpoint objects and Secrets. A public part
// of the control module, with no store or orchestrator in it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "auth/auth.h"
#include "common/common.h"
#include "http/http.h"

namespace flotilla::control {

// One entry of an endpoint's event log, newest last in the store.
struct EventRow {
  int64_t id = 0;  // assigned by the store, increasing
  int64_t unix_ms = 0;
  std::string endpoint;  // "" for platform-wide events
  std::string kind;      // "created", "updated", "deleted", "replica_started", ...
  std::string actor;     // a token id, "orchestrator", "reconciler"
  std::string message;
  bool operator==(const EventRow&) const = default;
};

// What the API's routes need of the control plane. Every method may be called from the API
// server's worker thread while the control plane runs; each blocks only as its comment says.
class ApiService {
 public:
  virtual ~ApiService() = default;

  // kAllowed for an admin token (its id in *token_id), kForbidden for a valid non-admin one,
  // kMissing or kInvalid as auth::Authenticator says. An error (kUnavailable: where the tokens
  // are kept cannot be read now) is the API's 503, not a verdict on the token.
  virtual Result<auth::AuthResult> check_admin(std::string_view authorization,
                                               std::string* token_id) = 0;
  // Any valid token; on kAllowed, *scope is the endpoints it may see (empty: all).
  virtual Result<auth::AuthResult> check_token(std::string_view authorization,
                                               std::vector<std::string>* scope) = 0;
  // The control plane's metrics in the Prometheus text format, every series.
  virtual std::string render_metrics() = 0;
  // GET /api/2.0/info: where the gateway and the API listen, the data directory, the version.
  virtual nlohmann::json info() = 0;

  // Endpoint operations, as JSON views (docs/control-plane.md). create, update and delete
  // return once the gateway's table shows the change (up to a few seconds). Errors:
  // kInvalidArgument (a bad spec), kNotFound, kFailedPrecondition (already exists),
  // kUnavailable (the store).
  virtual Result<nlohmann::json> create_endpoint(std::string_view body,
                                                 const std::string& actor) = 0;
  virtual Result<nlohmann::json> update_endpoint(const std::string& name, std::string_view body,
                                                 const std::string& actor) = 0;
  virtual Status delete_endpoint(const std::string& name, const std::string& actor) = 0;
  virtual Result<nlohmann::json> endpoint_view(const std::string& name) = 0;
  // Every endpoint's view, by name (GET /api/2.0/serving-endpoints): one read of what it needs,
  // not one per endpoint.
  virtual Result<std::vector<nlohmann::json>> endpoint_views() = 0;
  // The newest `limit` events of `endpoint`, newest first; those of a deleted endpoint too.
  virtual Result<std::vector<EventRow>> list_events(const std::string& endpoint, size_t limit) = 0;
  // GET .../{name}/metrics: the endpoint's 1 s history over the last `seconds`, as
  // metrics_window_to_json (control_metrics.h) shapes it. Errors: kNotFound; kUnavailable where
  // this process keeps none (a controller that does not lead).
  virtual Result<nlohmann::json> endpoint_metrics(const std::string& name, int64_t seconds) = 0;

  // Tokens: {"token": "<shown once>", "token_info": {...}} from create_token.
  virtual Result<nlohmann::json> create_token(const std::string& id,
                                              std::vector<std::string> endpoints, bool admin,
                                              const std::string& comment,
                                              const std::string& actor) = 0;
  virtual Status revoke_token(const std::string& id, const std::string& actor) = 0;
  virtual Result<nlohmann::json> list_tokens() = 0;
};

// /dashboard and what is under it: the dashboard's files, which ApiRoutes serves without a
// token (docs/dashboard.md).
bool is_dashboard_path(std::string_view path);

// The API's error body for errors the HTTP server answers itself (413, 431, ...), in the
// API's shape: {"error_code": "...", "message": "..."}.
std::string api_error_body(int status, std::string_view message);

// The API's routes: one request in, its answer out. Thread-safety: handle() may be called from
// any thread. The server that carries them must capture headers (Authorization);
// configure_server() sets that and the API's limits and error body.
class ApiRoutes {
 public:
  // `metrics_open`: GET /metrics needs no token (--open-routes metrics). `admin_token_hint`:
  // where an admin token is found, said to a caller who sent none. `service` must outlive this.
  ApiRoutes(ApiService& service, bool metrics_open, std::string admin_token_hint)
      : service_(service),
        metrics_open_(metrics_open),
        admin_token_hint_(std::move(admin_token_hint)) {}

  // One worker, headers captured, bodies up to 1 MiB, errors in the API's shape.
  static void configure_server(http::ServerOptions& options);

  http::Response handle(const http::Request& request) const;

 private:
  http::Response handle_endpoints(const http::Request& request, std::string_view rest,
                                  const std::string& actor) const;
  http::Response handle_tokens(const http::Request& request, std::string_view rest,
                               const std::string& actor) const;

  ApiService& service_;
  const bool metrics_open_;
  const std::string admin_token_hint_;
};

// The API's routes on an http::Server of their own. Thread-safety: handle() may be called from
// any thread; run() and drain() from the owner's.
class ApiServer {
 public:
  // Binds `options`' address (ApiRoutes::configure_server's settings). Errors: kUnavailable
  // when the address cannot be bound.
  static Result<std::unique_ptr<ApiServer>> create(http::ServerOptions options, ApiService& service,
                                                   bool metrics_open);

  uint16_t port() const { return server_->port(); }
  // Serves until drain(); blocks.
  void run() { server_->run(); }
  // Stops accepting; in-flight calls finish within `timeout`.
  void drain(std::chrono::milliseconds timeout) { server_->drain(timeout); }

  // One request's answer, as the server sends it.
  http::Response handle(const http::Request& request) const { return routes_.handle(request); }

 private:
  ApiServer(ApiService& service, bool metrics_open)
      : routes_(service, metrics_open, "see <data-dir>/admin.token") {}

  ApiRoutes routes_;
  std::unique_ptr<http::Server> server_;
};

}  // namespace flotilla::control

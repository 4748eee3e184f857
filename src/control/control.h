// The control module's contract (DESIGN.md §2, §7; docs/control-plane.md): endpoint specs and
// their versions, persisted in SQLite; the autoscaler's live loop; the reconciler that turns
// them into replicas (through an orchestrator) and into the gateway's endpoint table;
// zero-downtime rollouts; API tokens; the event log; and the REST API under /api/2.0 that the
// CLI speaks.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/common.h"
#include "control/control_scaling.h"
#include "gateway/gateway.h"
#include "http/http.h"
#include "orchestrator/orchestrator.h"

namespace flotilla::control {

struct ControlOptions {
  std::string data_dir;     // holds state.db and admin.token; created if missing
  http::ServerOptions api;  // where the REST API listens
  std::string gateway_url;  // the gateway's address, reported to clients (GET /api/2.0/info)
  // Gateway routes served without a token (auth.h kOpenRoutes names).
  std::vector<std::string> open_routes = {"health"};
  std::chrono::milliseconds reconcile_interval{200};
  AutoscalingOptions autoscaling;
  // The host-wide cap on replica processes (the orchestrator's): a spec whose least replica
  // count exceeds it is refused (400). 0: no cap.
  int64_t max_replicas = 0;
};

// The default host-wide cap on replica processes: min(32 x cores, memory / 256 MiB), at least
// 4 (docs/control-plane.md). `cores` and `memory_bytes` 0: this machine's.
int64_t default_max_replicas(int64_t cores = 0, int64_t memory_bytes = 0);

// Creates a data directory (and its parents) with mode 0700 for the directory itself. An
// existing one is kept as it is; a warning is logged when others may read it.
Status make_data_dir(const std::string& path);

// `flotilla tokens reset-admin`: with local access to `data_dir` (and no `flotilla up` using
// it: its lock is taken), writes a new admin token to <data_dir>/admin.token (mode 0600) and
// replaces the token 'admin' in the state database (created if it was revoked) — the way back
// in when the admin token file is lost. Returns the new token. Errors: kUnavailable when the
// data directory is in use or cannot be written; nothing changes then.
Result<std::string> reset_admin_token(const std::string& data_dir);

// Owns the state store, the reconciler thread and the API server. Thread-safety: create(),
// run() and shutdown() from the owning thread; everything else is internal.
class ControlPlane {
 public:
  // Opens (or creates) the state in options.data_dir, re-adopts the replicas a previous run
  // left, pushes the endpoint table and the tokens to `gateway`, subscribes to its capacity
  // requests (scale from zero; until shutdown()), starts the reconciler and binds the API. On
  // the first start, mints an admin token, writes it to <data_dir>/admin.token (mode 0600) and
  // returns it from new_admin_token(). `orchestrator`, `gateway`, `registry` and `clock` must
  // outlive the control plane. `clock` times the autoscaler's periods and stamps records; its
  // wall clock must be the one the gateway's samples are stamped with. Errors: kUnavailable
  // when the data directory, the database or the API address cannot be used.
  static Result<std::unique_ptr<ControlPlane>> create(const ControlOptions& options,
                                                      orchestrator::Orchestrator& orchestrator,
                                                      gateway::GatewaySink& gateway,
                                                      MetricsRegistry& registry,
                                                      const Clock& clock = real_clock());
  virtual ~ControlPlane() = default;

  virtual uint16_t api_port() const = 0;
  // The admin token minted by this start (only on the first start of a data directory), or "".
  virtual const std::string& new_admin_token() const = 0;
  // Serves the API until shutdown(); blocks.
  virtual void run() = 0;
  // Stops the reconciler, then the API server (in-flight API calls finish within `timeout`).
  // Replicas are left to the orchestrator's own shutdown. Thread-safe; idempotent.
  virtual void shutdown(std::chrono::milliseconds timeout) = 0;
};

}  // namespace flotilla::control

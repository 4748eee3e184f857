// The control plane's implementation class (control_plane.cc): operations, tokens and events
// over the store, the reconciler, and the service behind the REST API (control_api.h). Private to
// the control module.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "control/control.h"
#include "control/control_api.h"
#include "control/control_metrics.h"
#include "control/control_scaling.h"
#include "control/control_spec.h"
#include "control/reconciler.h"
#include "control/store.h"

namespace flotilla::control {

// The runtime a served model's replicas run: "auto" resolved from the artifact where it can be.
std::string resolve_runtime(const ServedModelSpec& served);

// The admin token's file in the data directory.
inline constexpr std::string_view kAdminTokenFile = "admin.token";

// Writes `text` to a new file `path`, mode 0600 from its creation (O_CREAT | O_EXCL, never
// through a symlink), synced. With `replace`, a file (not a directory) already there is removed
// first. On failure nothing is left at `path`.
Status write_secret_file(const std::string& path, const std::string& text, bool replace);

class ControlPlaneImpl final : public ControlPlane,
                               public gateway::CapacityRequester,
                               public ApiService {
 public:
  ControlPlaneImpl(const ControlOptions& options, std::unique_ptr<Store> store,
                   orchestrator::Orchestrator& orchestrator, gateway::GatewaySink& gateway,
                   MetricsRegistry& registry, const Clock& clock);
  ~ControlPlaneImpl() override;

  // Loads the stored state, adopts leftover replicas, binds the API, starts the reconciler.
  Status start();

  uint16_t api_port() const override;
  // Scale from zero: the gateway calls it (once subscribed by start()) for an endpoint whose
  // requests wait for a first ready replica. Thread-safe, never blocks.
  void request_capacity(const std::string& endpoint) override;
  const std::string& new_admin_token() const override { return new_admin_token_; }
  void run() override;
  void shutdown(std::chrono::milliseconds timeout) override;

 private:
  struct Stored {
    EndpointState state;
    EndpointRecord record;
  };

  // ApiService: what the REST API's routes call (control_api.h), on the API server's worker.
  Result<auth::AuthResult> check_admin(std::string_view authorization,
                                       std::string* token_id) override;
  Result<auth::AuthResult> check_token(std::string_view authorization,
                                       std::vector<std::string>* scope) override;
  std::string render_metrics() override { return registry_.render(); }
  nlohmann::json info() override;
  Result<nlohmann::json> create_endpoint(std::string_view body, const std::string& actor) override;
  Result<nlohmann::json> update_endpoint(const std::string& name, std::string_view body,
                                         const std::string& actor) override;
  Status delete_endpoint(const std::string& name, const std::string& actor) override;
  Result<nlohmann::json> endpoint_view(const std::string& name) override;
  Result<std::vector<nlohmann::json>> endpoint_views() override;
  std::vector<std::string> endpoint_names() FLOTILLA_EXCLUDES(mu_);
  Result<std::vector<EventRow>> list_events(const std::string& endpoint, size_t limit) override {
    return store_->list_events(endpoint, limit);
  }
  Result<nlohmann::json> endpoint_metrics(const std::string& name, int64_t seconds) override;
  Result<nlohmann::json> create_token(const std::string& id, std::vector<std::string> endpoints,
                                      bool admin, const std::string& comment,
                                      const std::string& actor) override;
  Status revoke_token(const std::string& id, const std::string& actor) override;
  Result<nlohmann::json> list_tokens() override;
  static nlohmann::json token_view(const TokenRow& row);

  // Before any other thread exists (from start()), so without mu_.
  Status mint_first_admin_token() FLOTILLA_NO_THREAD_SAFETY_ANALYSIS;
  void publish_auth() FLOTILLA_REQUIRES(mu_);
  void record_event(const std::string& endpoint, const std::string& kind, const std::string& actor,
                    const std::string& message);
  void on_replica(const orchestrator::ReplicaEvent& event);
  // After a change of endpoints_: wakes the reconciler and waits until a pass that saw the
  // change has published the gateway table, so an API call's effect is visible in the gateway
  // when the call returns (a new endpoint is known, a deleted one is 404).
  void wait_until_applied();
  void reconcile_loop();
  void reconcile_once();
  // The autoscaler's pass (reconciler thread): the gateway's samples in, decisions out into
  // endpoints_.
  void autoscale(const std::vector<orchestrator::Replica>& replicas,
                 const std::map<std::string, std::vector<LoadSample>>& samples);
  // Adds each endpoint's new gateway samples to metrics_history_, with its replicas and scale.
  void record_metrics(const std::vector<orchestrator::Replica>& replicas,
                      const std::map<std::string, std::vector<LoadSample>>& samples);
  // Stores what an endpoint's autoscaler learned when it changed since the last save.
  void save_learned(const std::string& endpoint, const LearnedTarget& learned);
  // The forecast's demand history: read from the store when an endpoint's scaler starts, and
  // each bucket stored once it closed (pruned past what the forecast reads).
  void restore_demand(const std::string& endpoint, EndpointScaler& scaler);
  void save_demand(const std::string& endpoint, EndpointScaler& scaler, autoscaler::Millis now);
  // What `replicas` did since their previous reading: mean CPU use and mean requests queued
  // inside them, from the orchestrator's usage query.
  ReplicaUsage replica_usage(const std::vector<orchestrator::Replica>& replicas);

  const ControlOptions options_;
  const Clock& clock_;
  std::unique_ptr<Store> store_;
  orchestrator::Orchestrator& orchestrator_;
  gateway::GatewaySink& gateway_;
  MetricsRegistry& registry_;
  Counter& rollouts_;
  Histogram& cold_start_warm_;
  Histogram& cold_start_fresh_;
  Counter& replica_failures_;
  Counter& replicas_capped_;
  std::vector<std::pair<orchestrator::ReplicaState, Gauge*>> replicas_by_state_;

  Mutex mu_;
  CondVar wake_;  // the reconciler waits on it between passes
  std::map<std::string, Stored> endpoints_ FLOTILLA_GUARDED_BY(mu_);
  std::vector<TokenRow> tokens_ FLOTILLA_GUARDED_BY(mu_);
  std::shared_ptr<const auth::Authenticator> admin_auth_ FLOTILLA_GUARDED_BY(mu_);
  bool stopping_ = false;
  // Bumped by every endpoint change.
  uint64_t change_generation_ FLOTILLA_GUARDED_BY(mu_) = 0;
  // The newest change a pass published.
  uint64_t applied_generation_ FLOTILLA_GUARDED_BY(mu_) = 0;
  CondVar applied_;                         // notified after every reconciler pass
  gateway::EndpointTable published_table_;  // reconciler thread only
  std::set<std::string> capacity_requests_ FLOTILLA_GUARDED_BY(mu_);
  std::map<std::string, int64_t> replica_failures_by_endpoint_ FLOTILLA_GUARDED_BY(mu_);
  // How long each endpoint's newest replica took from its start to ready, ms (APA's spare).
  std::map<std::string, int64_t> replica_start_ms_by_endpoint_ FLOTILLA_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<EndpointScaler>> scalers_;  // reconciler thread only
  // What each endpoint's autoscaler learned, as last saved to the store (loaded at start);
  // reconciler thread only after start().
  std::map<std::string, LearnedTarget> learned_;
  // Each replica's previous usage reading, by replica id; reconciler thread only.
  std::map<std::string, UsageCounters> usage_readings_;
  // Every deployment ensured with replicas, by key (reconciler thread only).
  std::map<std::string, orchestrator::Deployment> ensured_;
  MetricsHistory metrics_history_;
  std::string new_admin_token_;
  std::unique_ptr<ApiServer> api_;
  std::thread reconciler_;
};

}  // namespace flotilla::control

// Flotilla's Kubernetes mode (issue #20, DESIGN.md §8), over the kube client: the names and
// labels the controller and the gateway agree on, and the gateway's discovery, which turns
// ServingEndpoints, the EndpointSlices of their versions' Services and the token Secrets into
// the gateway's endpoint table and tokens (`flotilla gateway --kubernetes`), and the
// controller's level-triggered plan: from a ServingEndpoint and the Deployments it owns, the
// Deployments and Services to keep, the old ones to scale to zero and delete, and its status.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "auth/auth.h"
#include "common/common.h"
#include "control/control_api.h"
#include "control/control_metrics.h"
#include "control/control_scaling.h"
#include "control/control_spec.h"
#include "gateway/gateway.h"
#include "kube/kube.h"

namespace flotilla::cluster {

// Labels on every object the controller makes for a served model version (Deployment, its
// pods, Service; EndpointSlices inherit the Service's labels).
inline constexpr std::string_view kEndpointLabel = "flotilla.dev/endpoint";
inline constexpr std::string_view kVersionLabel = "flotilla.dev/version";
// Set to "true" on a ConfigMap that holds one API token's salted hash: data keys id, salt,
// sha256 (as auth::TokenRecord), optionally endpoints (comma-separated; absent: all) and admin
// ("true": it may call the control plane's API too). See TokenObject. ConfigMaps, not Secrets:
// a Role cannot narrow list + watch to labelled Secrets, so a gateway that read token Secrets
// could read every Secret of the namespace, the admin token's plaintext included; a salted
// hash of a random token is no secret.
inline constexpr std::string_view kTokenLabel = "flotilla.dev/token";
// On a version's Deployment: what its pods run (control::deployment_key), and a digest of the
// pod template the controller wrote (the API server adds defaults to the stored one).
inline constexpr std::string_view kKeyAnnotation = "flotilla.dev/deployment-key";
inline constexpr std::string_view kTemplateAnnotation = "flotilla.dev/template-digest";
// The label Kubernetes puts on each EndpointSlice: the Service it belongs to.
inline constexpr std::string_view kServiceNameLabel = "kubernetes.io/service-name";

// "{endpoint}-{version}": the Deployment and the Service of one served model version.
std::string version_object_name(std::string_view endpoint, std::string_view version);

// The gateway's table from the mirrors (by name) of ServingEndpoints and EndpointSlices.
// Versions and their weights are the controller's serving state (status.versions: name,
// traffic, targetConcurrencyPerReplica) once it has written one, else the spec's served models.
// A version's replicas are the endpoints of the slices of its Service: ready and not
// terminating → ready; terminating → draining (in-flight requests finish, no new ones); not
// ready → starting. An endpoint whose objects do not make a valid table entry is left out and
// named in `problems` (the others are served).
gateway::EndpointTable table_from_objects(const kube::Reflector::Objects& serving_endpoints,
                                          const kube::Reflector::Objects& endpoint_slices,
                                          std::vector<std::string>* problems);

// The gateway's tokens from the mirror of token ConfigMaps (kTokenLabel). Auth is enabled
// (closed: no token, no request through). A ConfigMap that does not hold a valid token is left
// out and named in `problems`.
gateway::AuthConfig auth_from_config_maps(const kube::Reflector::Objects& config_maps,
                                          std::vector<std::string> open_routes,
                                          std::vector<std::string>* problems);

// ---- Tokens as ConfigMaps ---------------------------------------------------------------------

// One token ConfigMap (kTokenLabel) as the API shows it. Data: id, salt, sha256, endpoints,
// admin; annotations kCommentAnnotation and kCreatedAnnotation (unix ms).
struct TokenObject {
  std::string name;  // the ConfigMap's
  auth::TokenRecord record;
  bool admin = false;
  std::string comment;
  int64_t created_unix_ms = 0;
};
inline constexpr std::string_view kCommentAnnotation = "flotilla.dev/comment";
inline constexpr std::string_view kCreatedAnnotation = "flotilla.dev/created-unix-ms";
// The admin token the first controller to start mints: its token ConfigMap, and a Secret of the
// same name whose data.token holds the token itself, for the operator to read with kubectl
// (the gateways cannot read Secrets).
inline constexpr std::string_view kAdminTokenSecret = "flotilla-admin-token";

// Errors: kInvalidArgument naming the ConfigMap and the data key.
Result<TokenObject> token_from_config_map(const std::string& name,
                                          const nlohmann::json& config_map);
// The ConfigMap (in the client's namespace) that holds `token`'s hash.
nlohmann::json token_config_map_object(const TokenObject& token);
// The Secret kAdminTokenSecret holding the admin token `plaintext` under data.token.
nlohmann::json admin_token_secret_object(const std::string& plaintext);

// Keeps a gateway's table and tokens in step with the API server: one Reflector each for
// ServingEndpoints, EndpointSlices (those labelled kEndpointLabel) and token ConfigMaps, on threads
// of their own; after each change, the table (once both of its mirrors have listed) and the
// tokens are pushed to `gateway`. A broken watch keeps the last table: the gateway serves on
// while the reflectors reconnect.
class GatewayDiscovery {
 public:
  struct Options {
    std::vector<std::string> open_routes = {"health"};
    kube::Reflector::Options watch;  // label_selector is set per reflector
  };

  // `client` and `gateway` must outlive it. Starts the threads.
  GatewayDiscovery(kube::Client& client, gateway::GatewaySink& gateway, Options options);
  ~GatewayDiscovery();  // stops and joins
  GatewayDiscovery(const GatewayDiscovery&) = delete;
  GatewayDiscovery& operator=(const GatewayDiscovery&) = delete;

  void stop();

  // The ServingEndpoints mirrored now, by name (the gateway reports their samples).
  std::vector<std::string> endpoint_names() FLOTILLA_EXCLUDES(mu_);

 private:
  void publish_table() FLOTILLA_EXCLUDES(mu_);
  void publish_auth();

  gateway::GatewaySink& gateway_;
  const Options options_;
  std::vector<std::unique_ptr<Random>> randoms_;
  Mutex mu_;
  kube::Reflector::Objects serving_endpoints_ FLOTILLA_GUARDED_BY(mu_);
  kube::Reflector::Objects endpoint_slices_ FLOTILLA_GUARDED_BY(mu_);
  bool endpoints_listed_ FLOTILLA_GUARDED_BY(mu_) = false;
  bool slices_listed_ FLOTILLA_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<kube::Reflector>> reflectors_;
  std::vector<std::thread> threads_;
};

// ---- Load samples, from a fleet of gateways to the controller --------------------------------

// The Lease the controllers elect their leader on, and its annotation where the leader says
// where its API listens ("host:port"): the gateways send their samples there.
inline constexpr std::string_view kControllerLease = "flotilla-controller";
inline constexpr std::string_view kControllerAddressAnnotation = "flotilla.dev/controller-address";

// One gateway's report (POST /v1/samples on the controller): its last seconds of samples per
// endpoint, and the endpoints where a request waits with no replica (scale from zero).
struct SampleReport {
  std::string gateway;  // the reporting gateway's name, unique in the fleet
  std::map<std::string, std::vector<LoadSample>> endpoints;
  std::vector<std::string> capacity;
};
std::string sample_report_to_json(const SampleReport& report);
// Errors: kInvalidArgument naming what is wrong (not JSON, a missing or mistyped field).
Result<SampleReport> parse_sample_report(std::string_view body);

// Every gateway's samples, summed per second per endpoint, for the controller's autoscaler: a
// second of the fleet is what all its gateways measured in it. A gateway sends its last few
// seconds again with every report, so a lost report costs nothing: a second of one gateway
// counts once, as its latest copy says. Gateways' seconds end at different moments; each is
// counted in the wall-clock second nearest its end (two of one gateway's samples that land in
// one second both count: counts summed, gauges averaged). A second is taken once it ended
// `settle` ago (every gateway has reported it by then); copies that come later are dropped, and
// so are seconds more than a minute ahead of the controller's clock. Not thread-safe.
class FleetSamples {
 public:
  explicit FleetSamples(std::chrono::milliseconds settle = std::chrono::milliseconds(2'500))
      : settle_(settle) {}

  void add(const std::string& gateway, const std::string& endpoint,
           const std::vector<LoadSample>& samples);
  // The settled seconds of `endpoint` not taken before, oldest first: concurrency, queued,
  // arrivals, completions, rejections and responses summed over the gateways; latency the mean over
  // their completions.
  std::vector<LoadSample> take(const std::string& endpoint, int64_t now_unix_ms);
  // Forgets the endpoints not named.
  void retain(const std::vector<std::string>& endpoints);

 private:
  struct Seconds {
    int64_t taken_until = 0;  // seconds up to here were taken
    // second → gateway → the sample's own end → sample
    std::map<int64_t, std::map<std::string, std::map<int64_t, LoadSample>>> by_second;
  };
  const std::chrono::milliseconds settle_;
  std::map<std::string, Seconds> endpoints_;
};

// A gateway's half (`flotilla gateway --kubernetes`): every period, reads the leading
// controller's address from its Lease and posts the last seconds of each endpoint's samples
// there; a capacity request (an endpoint with no replica has a request waiting) goes out at
// once. A controller that cannot be reached costs the samples of that report only: the next
// one carries them again. Runs on a thread of its own.
// The Secret holding the key a gateway sends with its reports to the leading controller
// (`Authorization: Bearer KEY` on POST /v1/samples): the first controller to need it mints it.
// A gateway's Role may get this Secret and no other. Deleting it rotates the key: a controller
// mints a new one when a report does not match, and the gateways read it again on a 401.
inline constexpr std::string_view kReportKeySecret = "flotilla-report-key";

// The report key from its Secret; with `mint`, made first when the Secret is missing (a
// controller losing the race to another reads the winner's). Errors: kNotFound (no Secret and
// not `mint`), kInvalidArgument (no data.key), kUnavailable (the API server).
Result<std::string> read_report_key(kube::Client& client, bool mint);

// The controller's check of a report's Authorization header against the report key. Thread-safe.
class ReportKeyCheck {
 public:
  explicit ReportKeyCheck(kube::Client& client);  // `client` must outlive it
  // True for "Bearer KEY" with the key (compared in constant time). A header that does not
  // match reads the Secret again (minting it when missing), at most once a second.
  bool allows(std::string_view authorization) FLOTILLA_EXCLUDES(mu_);

 private:
  bool matches(std::string_view presented) const FLOTILLA_REQUIRES(mu_);

  kube::Client& client_;
  Mutex mu_;
  std::string key_ FLOTILLA_GUARDED_BY(mu_);
  bool read_once_ FLOTILLA_GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point last_read_ FLOTILLA_GUARDED_BY(mu_);
};

class SampleReporter : public gateway::CapacityRequester {
 public:
  struct Options {
    std::string gateway;  // this gateway's name in the fleet (its pod name)
    std::chrono::milliseconds period{1'000};
    size_t seconds = 5;  // seconds of samples in each report
    std::chrono::milliseconds timeout{2'000};
  };

  // `client`, `gateway` and `discovery` must outlive it. Starts the thread.
  SampleReporter(kube::Client& client, const gateway::GatewaySink& gateway,
                 GatewayDiscovery& discovery, Options options);
  ~SampleReporter() override;  // stops and joins
  SampleReporter(const SampleReporter&) = delete;
  SampleReporter& operator=(const SampleReporter&) = delete;

  void request_capacity(const std::string& endpoint) override FLOTILLA_EXCLUDES(mu_);
  void stop() FLOTILLA_EXCLUDES(mu_);

 private:
  void run() FLOTILLA_EXCLUDES(mu_);
  // One report to the leader; false when it did not get there.
  bool report(const std::vector<std::string>& capacity);

  kube::Client& client_;
  const gateway::GatewaySink& gateway_;
  GatewayDiscovery& discovery_;
  const Options options_;
  // The reporter thread's own: the leader's "host:port" as last read (empty: read the Lease),
  // the report key (empty: read its Secret), and capacity requests not yet delivered (sent
  // again with the next report).
  std::string controller_;
  std::string key_;
  std::vector<std::string> unsent_capacity_;
  Mutex mu_;
  CondVar wake_;
  bool stopping_ FLOTILLA_GUARDED_BY(mu_) = false;
  std::vector<std::string> capacity_ FLOTILLA_GUARDED_BY(mu_);
  std::thread thread_;
};

// ---- The REST API over the API server ----------------------------------------------------------

// The control plane's REST API in Kubernetes mode (control::ApiService, served by `flotilla
// controller` on the routes `flotilla up` serves): an endpoint is its ServingEndpoint, so
// `flotilla deploy`, the API and `kubectl apply` change the same object; a token is a token
// Secret (salted hashes only), which the gateways watch; an endpoint's events are its status
// conditions' transitions. Every call reads or writes the API server, nothing is kept here, so
// every controller replica serves it, leading or not. Thread-safe.
class ClusterApi : public control::ApiService {
 public:
  struct Options {
    std::string api_url;            // where this API is served (/api/2.0/info)
    std::string gateway_url;        // where clients reach the gateways (/api/2.0/info)
    std::function<bool()> leading;  // for /metrics; may be empty
    // An endpoint's 1 s history (ApiService::endpoint_metrics) once it is known to exist: the
    // leading controller's. Empty: none kept here.
    std::function<Result<nlohmann::json>(const std::string& name, int64_t seconds)> metrics;
  };

  // `client` must outlive it.
  ClusterApi(kube::Client& client, Options options);

  // When no token ConfigMap is an admin one, mints the admin token: its ConfigMap, then its
  // plaintext into the Secret kAdminTokenSecret. A controller that loses the race to create the
  // ConfigMap finds it made and writes no Secret. Called at start and by every admin check, so
  // an admin token exists again soon after the last one is revoked or the API server was away
  // at start. Errors: kUnavailable (the API server), or the token's.
  Status ensure_admin_token();
  // Moves tokens kept as Secrets (kTokenLabel, base64 data: before tokens were ConfigMaps) into
  // token ConfigMaps, deletes those Secrets, and keeps kAdminTokenSecret's plaintext in a Secret
  // without the label. Called at start, before ensure_admin_token. A Secret that holds no valid
  // token is left as it is, logged. Errors: kUnavailable (the API server).
  Status move_token_secrets();

  Result<auth::AuthResult> check_admin(std::string_view authorization,
                                       std::string* token_id) override;
  Result<auth::AuthResult> check_token(std::string_view authorization,
                                       std::vector<std::string>* scope) override;
  std::string render_metrics() override;
  nlohmann::json info() override;
  // create and update return once the API server holds the object; `flotilla deploy` then
  // waits until its status says it serves.
  Result<nlohmann::json> create_endpoint(std::string_view body, const std::string& actor) override;
  Result<nlohmann::json> update_endpoint(const std::string& name, std::string_view body,
                                         const std::string& actor) override;
  Status delete_endpoint(const std::string& name, const std::string& actor) override;
  Result<nlohmann::json> endpoint_view(const std::string& name) override;
  // Two API calls: the ServingEndpoints, and the pods of every endpoint.
  Result<std::vector<nlohmann::json>> endpoint_views() override;
  Result<std::vector<control::EventRow>> list_events(const std::string& endpoint,
                                                     size_t limit) override;
  Result<nlohmann::json> endpoint_metrics(const std::string& name, int64_t seconds) override;
  Result<nlohmann::json> create_token(const std::string& id, std::vector<std::string> endpoints,
                                      bool admin, const std::string& comment,
                                      const std::string& actor) override;
  Status revoke_token(const std::string& id, const std::string& actor) override;
  Result<nlohmann::json> list_tokens() override;

 private:
  // The token ConfigMaps that hold valid tokens (the others are skipped, as the gateways skip
  // them); with `first_of_each_id`, only the one of each id the gateways use (by name).
  Result<std::vector<TokenObject>> token_objects(bool first_of_each_id = true);
  Status ensure_admin_token(const std::vector<TokenObject>& tokens);
  Result<nlohmann::json> get_endpoint(const std::string& name);
  // The replica pods `label_selector` picks, by name; none when they cannot be listed.
  kube::Reflector::Objects replica_pods(const std::string& label_selector);

  kube::Client& client_;
  const Options options_;
};

// The view of one ServingEndpoint and its pods in the API's shape (docs/control-plane.md).
nlohmann::json endpoint_view_of(const nlohmann::json& serving_endpoint,
                                const kube::Reflector::Objects& pods);

// ---- The controller's plan ------------------------------------------------------------------

// How the controller builds a served model version's Deployment.
struct ReplicaTemplate {
  std::string image = "flotilla:latest";
  std::string binary = "/usr/local/bin/flotilla";  // inside the image
  uint16_t port = 8000;
  // The pod's preStop wait, so that every gateway sees its endpoint terminating (and stops
  // sending it requests) before the replica gets SIGTERM and drains what it holds.
  int64_t drain_seconds = 5;
  // From SIGTERM to SIGKILL: the drain, plus the longest request a replica should finish.
  int64_t termination_grace_seconds = 65;
  // Set in every replica container: the controller's own tracing settings, so that replica pods
  // export spans where the controller was told to (docs/tracing.md). Changing them rolls the pods.
  std::vector<std::pair<std::string, std::string>> env;
};

// The spec of a ServingEndpoint (the §7 endpoint spec under `spec`, its name from metadata),
// checked as `flotilla deploy` checks it, and each version's Deployment and Service name checked
// against Kubernetes' name rule (DNS-1035: lower case letters, digits and '-', starting with a
// letter, at most 63). Errors: kInvalidArgument naming the field.
Result<control::EndpointSpec> spec_of(const nlohmann::json& serving_endpoint);

// The Deployment and the Service of one served model version, owned by `serving_endpoint` (its
// uid), labelled kEndpointLabel and kVersionLabel; the Deployment's annotation
// flotilla.dev/deployment-key says what its pods run (control::deployment_key), so a changed
// model or runtime rolls its pods.
nlohmann::json version_deployment(const nlohmann::json& serving_endpoint,
                                  const control::ServedModelSpec& served, int64_t replicas,
                                  const ReplicaTemplate& replica);
nlohmann::json version_service(const nlohmann::json& serving_endpoint,
                               const control::ServedModelSpec& served,
                               const ReplicaTemplate& replica);

// What the controller does for one ServingEndpoint, from what it owns now. A rollout is level
// triggered: the spec's versions get their Deployments at once; the versions serving before
// (status.versions) keep their traffic and their Deployments until every new one is ready
// (its Deployment observed, updated and ready at its replica count); then the traffic moves to
// the spec's weights, and old Deployments are scaled to zero, then deleted with their Services.
// A rollback is the same with the old spec.
struct EndpointPlan {
  std::vector<nlohmann::json> deployments;  // to create, or update when they differ
  std::vector<nlohmann::json> services;     // to create when missing
  std::vector<std::string> scale_to_zero;   // Deployment names
  std::vector<std::string> remove;          // Deployment (and Service) names
  nlohmann::json status;                    // the ServingEndpoint's status subresource
};
// `deployments`: the Deployments labelled with this endpoint, by name. `scale`: the
// autoscaler's decision (each version gets its share, control::version_replicas, and the
// gateways its per-replica cap); nullopt: each version's provisioned count.
EndpointPlan plan_endpoint(const nlohmann::json& serving_endpoint,
                           const kube::Reflector::Objects& deployments,
                           const std::optional<control::Scale>& scale,
                           const ReplicaTemplate& replica, const Clock& clock);

// ---- Replica usage, for the vertical autoscaler -------------------------------------------------

// A ready replica pod to read: its name, version label and where its replica listens.
struct PodTarget {
  std::string name;
  std::string version;
  std::string host;
  uint16_t port = 0;
};
// A pod that is not terminating and whose Ready condition is true.
bool pod_ready(const nlohmann::json& pod);
// The ready (and not terminating) pods of a pod list, with an IP and a container port.
std::vector<PodTarget> ready_pod_targets(const nlohmann::json& pod_list);
// The container restarts of a pod, summed over its containers (0 when its status has none).
int64_t pod_restarts(const nlohmann::json& pod);
// How long the newest ready replica pod of `endpoint` took from its creation to Ready, ms (the
// API server's timestamps: whole seconds): the start time the autoscaler sizes its spare and
// hedged starts by (autoscaler::Fleet::start_ms). Pods whose containers restarted are left out
// (ready again long after their creation); nullopt when no pod is left.
std::optional<int64_t> newest_pod_start_ms(const kube::Reflector::Objects& pods,
                                           std::string_view endpoint);
// Replica failures of one endpoint as a running count (autoscaler::Fleet::failures): the
// container restarts its pods gained since the first update (a new leader's baseline; a pod
// first seen later counts all of its own), pod by pod, so a pod deleted takes nothing back.
class PodRestarts {
 public:
  // `pods`: the replica pods now (those of other endpoints are skipped). Returns the count.
  int64_t update(const kube::Reflector::Objects& pods, std::string_view endpoint);

 private:
  std::map<std::string, int64_t> last_;  // restarts per pod at the last update
  bool baseline_taken_ = false;
  int64_t total_ = 0;
};

// The vertical autoscaler's readings in Kubernetes mode: the controller reads each ready pod's
// own /metrics (process_cpu_seconds_total, flotilla_replica_queue_wait_seconds_total), as
// `flotilla up`'s orchestrator reads its replica processes, and keeps each pod's last reading
// for the rates. The NetworkPolicy lets the controller reach replica pods. Not thread-safe: the
// leader's thread owns it.
class PodUsage {
 public:
  struct Reading {
    control::ReplicaUsage usage;
    int64_t replicas_read = 0;  // pods whose /metrics answered in time
  };

  // `client` must outlive it. `deadline`: how long one read() may block, whatever the pods.
  PodUsage(kube::Client& client, std::chrono::milliseconds deadline);

  // `endpoint`'s ready pods' usage since each one's previous reading. `cores_of_version`: the
  // cores a version's pods may use (its resources.cpus; a version without is counted as one
  // core, since the node's size is not known here).
  Reading read(const std::string& endpoint, const std::map<std::string, double>& cores_of_version);
  // Forgets the endpoints not named.
  void retain(const std::vector<std::string>& endpoints);

 private:
  kube::Client& client_;
  const std::chrono::milliseconds deadline_;
  std::map<std::string, std::map<std::string, control::UsageCounters>> previous_;  // endpoint, pod
};

// ---- The controller ---------------------------------------------------------------------------

// `flotilla controller`: while it holds the Lease (one leader among its replicas), mirrors the
// ServingEndpoints of its namespace and the Deployments and Services labelled kEndpointLabel,
// and after every change (and every resync period) applies each endpoint's plan: creates or
// updates Deployments, writes replica counts through the scale subresource, scales old
// versions to zero and deletes them, and writes the status subresource. Level triggered and
// restart-safe: everything it knows it reads from the API server again.
//
// Its autoscaler is `flotilla up`'s (control::EndpointScaler) on the gateways' samples summed
// over the fleet (add_report): each endpoint's replica count and per-replica target, split
// across its versions. A new leader starts each endpoint at the replicas its Deployments ask
// for and at the target the status recorded (status.autoscaler), so a takeover scales nothing
// down. The vertical policy reads the replicas' CPU and engine queue from the pods themselves
// (PodUsage), and what it read last goes into status.usage.
class Controller {
 public:
  struct Options {
    ReplicaTemplate replica;
    kube::LeaderElector::Options election;  // lease_name and identity required
    std::chrono::milliseconds resync{30'000};
    kube::Reflector::Options watch;
    control::AutoscalingOptions autoscaling;
    std::chrono::milliseconds sample_settle{2'500};  // FleetSamples' settle
  };

  // `client` must outlive it.
  Controller(kube::Client& client, Options options);
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // Elects and, while leading, reconciles until stop(); blocks.
  void run();
  void stop();  // from any thread
  bool leading() const { return elector_.leading(); }

  // One gateway's samples and capacity requests (POST /v1/samples); from any thread. Ignored
  // while not leading.
  void add_report(const SampleReport& report) FLOTILLA_EXCLUDES(mu_);
  // Each endpoint's last hour at 1 s, kept while leading (with the autoscaler on: the seconds
  // it takes from the gateways' reports). Any thread.
  const control::MetricsHistory& metrics_history() const { return metrics_history_; }

 private:
  void lead();  // from leading to losing the Lease
  // Ticks each endpoint's scaler; true when a scale changed.
  bool autoscale(const kube::Reflector::Objects& endpoints,
                 const kube::Reflector::Objects& deployments, const kube::Reflector::Objects& pods)
      FLOTILLA_EXCLUDES(mu_);
  void reconcile_all() FLOTILLA_EXCLUDES(mu_);
  void apply(const nlohmann::json& serving_endpoint, const EndpointPlan& plan,
             const kube::Reflector::Objects& deployments, const kube::Reflector::Objects& services);

  kube::Client& client_;
  const Options options_;
  kube::LeaderElector elector_;
  Mutex mu_;
  CondVar wake_;
  bool stopping_ FLOTILLA_GUARDED_BY(mu_) = false;
  bool leading_ FLOTILLA_GUARDED_BY(mu_) = false;
  bool dirty_ FLOTILLA_GUARDED_BY(mu_) = false;
  kube::Reflector::Objects serving_endpoints_ FLOTILLA_GUARDED_BY(mu_);
  kube::Reflector::Objects deployments_ FLOTILLA_GUARDED_BY(mu_);
  kube::Reflector::Objects services_ FLOTILLA_GUARDED_BY(mu_);
  kube::Reflector::Objects pods_ FLOTILLA_GUARDED_BY(mu_);  // the replicas': start times
  int synced_ FLOTILLA_GUARDED_BY(mu_) = 0;  // mirrors that have listed, of those lead() starts
  FleetSamples samples_ FLOTILLA_GUARDED_BY(mu_);
  std::set<std::string> capacity_ FLOTILLA_GUARDED_BY(mu_);  // endpoints a request waits for
  // The leader thread's own, made anew at each term: each endpoint's scaler and decision.
  std::map<std::string, std::unique_ptr<control::EndpointScaler>> scalers_;
  std::map<std::string, control::Scale> scales_;
  std::map<std::string, PodUsage::Reading> usage_read_;  // the last reading of each endpoint
  std::map<std::string, PodRestarts> restarts_;          // each endpoint's replica failures
  PodUsage pod_usage_;
  control::MetricsHistory metrics_history_;
};

}  // namespace flotilla::cluster

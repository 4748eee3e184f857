// Flotilla's Kubernetes mode (issue #20, DESIGN.md §8), over the kube client: the names and
// labels the controller and the gateway agree on, and the gateway's discovery, which turns
// ServingEndpoints, the EndpointSlices of their versions' Services and the token Secrets into
// the gateway's endpoint table and tokens (`flotilla gateway --kubernetes`), and the
// controller's level-triggered plan: from a ServingEndpoint and the Deployments it owns, the
// Deployments and Services to keep, the old ones to scale to zero and delete, and its status.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/common.h"
#include "control/control_spec.h"
#include "gateway/gateway.h"
#include "kube/kube.h"

namespace flotilla::cluster {

// Labels on every object the controller makes for a served model version (Deployment, its
// pods, Service; EndpointSlices inherit the Service's labels).
inline constexpr std::string_view kEndpointLabel = "flotilla.dev/endpoint";
inline constexpr std::string_view kVersionLabel = "flotilla.dev/version";
// Set to "true" on a Secret that holds one API token: data keys id, salt, sha256 (as
// auth::TokenRecord) and optionally endpoints (comma-separated; absent: all).
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

// The gateway's tokens from the mirror of token Secrets (kTokenLabel). Auth is enabled (closed:
// no Secret, no request through). A Secret that does not hold a valid token is left out and
// named in `problems`.
gateway::AuthConfig auth_from_secrets(const kube::Reflector::Objects& secrets,
                                      std::vector<std::string> open_routes,
                                      std::vector<std::string>* problems);

// Keeps a gateway's table and tokens in step with the API server: one Reflector each for
// ServingEndpoints, EndpointSlices (those labelled kEndpointLabel) and token Secrets, on threads
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
// `deployments`: the Deployments labelled with this endpoint, by name. `replicas`: the
// autoscaler's count per version; a version it does not name gets the spec's provisioned count.
EndpointPlan plan_endpoint(const nlohmann::json& serving_endpoint,
                           const kube::Reflector::Objects& deployments,
                           const std::map<std::string, int64_t>& replicas,
                           const ReplicaTemplate& replica, const Clock& clock);

// ---- The controller ---------------------------------------------------------------------------

// `flotilla controller`: while it holds the Lease (one leader among its replicas), mirrors the
// ServingEndpoints of its namespace and the Deployments and Services labelled kEndpointLabel,
// and after every change (and every resync period) applies each endpoint's plan: creates or
// updates Deployments, writes replica counts through the scale subresource, scales old
// versions to zero and deletes them, and writes the status subresource. Level triggered and
// restart-safe: everything it knows it reads from the API server again.
class Controller {
 public:
  struct Options {
    ReplicaTemplate replica;
    kube::LeaderElector::Options election;  // lease_name and identity required
    std::chrono::milliseconds resync{30'000};
    kube::Reflector::Options watch;
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

 private:
  void lead();  // from leading to losing the Lease
  void reconcile_all();
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
  int synced_ FLOTILLA_GUARDED_BY(mu_) = 0;  // mirrors that have listed, of three
};

}  // namespace flotilla::cluster

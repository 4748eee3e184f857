// The controller's plan for one ServingEndpoint: its versions' Deployments and Services, the
// rollout's step, and the status that says where it stands. Pure: objects in, objects out.
#include <algorithm>
#include <ctime>
#include <set>

#include "cluster/cluster.h"
#include "common/common_sha256.h"

namespace flotilla::cluster {
namespace {

using kube::field;
using nlohmann::json;

bool dns_label(std::string_view name) {
  if (name.empty() || name.size() > 63 || name.front() < 'a' || name.front() > 'z' ||
      name.back() == '-') {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

std::string rfc3339(std::chrono::system_clock::time_point at) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(at);
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  char out[32];
  return std::string(out, std::strftime(out, sizeof(out), "%Y-%m-%dT%H:%M:%SZ", &utc));
}

json labels_of(std::string_view endpoint, std::string_view version) {
  return {{std::string(kEndpointLabel), endpoint},
          {std::string(kVersionLabel), version},
          {"app.kubernetes.io/name", "flotilla"},
          {"app.kubernetes.io/component", "replica"}};
}

json owner_of(const json& serving_endpoint) {
  return json::array({{{"apiVersion", "flotilla.dev/v1"},
                       {"kind", "ServingEndpoint"},
                       {"name", kube::string_field(field(serving_endpoint, "metadata"), "name")},
                       {"uid", kube::string_field(field(serving_endpoint, "metadata"), "uid")},
                       {"controller", true},
                       {"blockOwnerDeletion", true}}});
}

// Every pod of the Deployment runs what it asks for, and as many as it asks for are ready.
bool deployment_ready(const json& deployment, const std::string& key) {
  const json& metadata = field(deployment, "metadata");
  const json& status = field(deployment, "status");
  const int64_t wanted = kube::integer_field(field(deployment, "spec"), "replicas", 1);
  return kube::string_field(field(metadata, "annotations"), kKeyAnnotation) == key &&
         kube::integer_field(status, "observedGeneration", 0) >=
             kube::integer_field(metadata, "generation", 1) &&
         kube::integer_field(status, "updatedReplicas", 0) >= wanted &&
         kube::integer_field(status, "readyReplicas", 0) >= wanted &&
         kube::integer_field(status, "replicas", 0) == wanted;
}

// A condition, keeping its lastTransitionTime while its status stays the same.
json condition(const json& previous_status, const std::string& type, bool value,
               const std::string& reason, const std::string& message, int64_t generation,
               const Clock& clock) {
  std::string since = rfc3339(clock.system_now());
  const json& previous = field(previous_status, "conditions");
  if (previous.is_array()) {
    for (const json& entry : previous) {
      if (kube::string_field(entry, "type") == type &&
          kube::string_field(entry, "status") == (value ? "True" : "False")) {
        since = kube::string_field(entry, "lastTransitionTime").empty()
                    ? since
                    : kube::string_field(entry, "lastTransitionTime");
      }
    }
  }
  return {{"type", type},
          {"status", value ? "True" : "False"},
          {"reason", reason},
          {"message", message},
          {"lastTransitionTime", since},
          {"observedGeneration", generation}};
}

}  // namespace

Result<control::EndpointSpec> spec_of(const json& serving_endpoint) {
  const std::string name = kube::string_field(field(serving_endpoint, "metadata"), "name");
  const json& spec = field(serving_endpoint, "spec");
  if (name.empty() || !spec.is_object()) {
    return invalid_argument("a ServingEndpoint needs metadata.name and a spec");
  }
  FLOTILLA_ASSIGN_OR_RETURN(control::EndpointSpec parsed,
                            control::parse_endpoint_spec(spec.dump(), name));
  for (size_t i = 0; i < parsed.served_models.size(); ++i) {
    if (parsed.served_models[i].external) {
      // A pod runs `flotilla replica` from the controller's image; a user's server needs its
      // own image, which the spec has no field for yet.
      return invalid_argument("served_models[" + std::to_string(i) +
                              "].runtime: external runs only under `flotilla up` for now; in "
                              "Kubernetes mode run your server as a Deployment of its own");
    }
    const std::string object = version_object_name(name, parsed.served_models[i].name);
    if (!dns_label(object)) {
      return invalid_argument("served_models[" + std::to_string(i) + "].name: '" +
                              parsed.served_models[i].name + "' makes the Service name '" + object +
                              "', not a Kubernetes name (lower case letters, digits and '-', "
                              "starting with a letter, at most 63)");
    }
  }
  return parsed;
}

json version_deployment(const json& serving_endpoint, const control::ServedModelSpec& served,
                        int64_t replicas, const ReplicaTemplate& replica) {
  const std::string endpoint = kube::string_field(field(serving_endpoint, "metadata"), "name");
  const std::string name = version_object_name(endpoint, served.name);
  const std::string port = std::to_string(replica.port);
  json container = {
      {"name", "replica"},
      {"image", replica.image},
      {"command", {replica.binary}},
      {"args",
       {"replica", "--model", served.model, "--runtime", served.runtime, "--name", endpoint,
        "--model-version", served.name, "--host", "0.0.0.0", "--port", port, "--cache-dir",
        "/cache"}},
      {"ports", {{{"name", "http"}, {"containerPort", replica.port}, {"protocol", "TCP"}}}},
      // Every second (the API's least period): a pod is routed up to a period after it is
      // ready, which is most of what a scale-up waits for (bench/RESULTS.md, issue #20).
      // Two failures in a row take it out, as one in two seconds did.
      {"readinessProbe",
       {{"httpGet", {{"path", "/v2/health/ready"}, {"port", "http"}}},
        {"periodSeconds", 1},
        {"failureThreshold", 2}}},
      {"livenessProbe",
       {{"httpGet", {{"path", "/v2/health/live"}, {"port", "http"}}},
        {"periodSeconds", 10},
        {"failureThreshold", 3}}},
      {"lifecycle",
       {{"preStop",
         {{"exec", {{"command", {"/bin/sleep", std::to_string(replica.drain_seconds)}}}}}}}},
      {"volumeMounts", {{{"name", "cache"}, {"mountPath", "/cache"}}}},
      {"securityContext",
       {{"allowPrivilegeEscalation", false},
        {"readOnlyRootFilesystem", true},
        {"capabilities", {{"drop", {"ALL"}}}}}}};
  json resources = json::object();
  if (served.resources.cpus > 0) {
    resources["requests"]["cpu"] = std::to_string(served.resources.cpus);
    resources["limits"]["cpu"] = std::to_string(served.resources.cpus);
  }
  if (served.resources.memory_mb > 0) {
    const std::string memory = std::to_string(served.resources.memory_mb) + "Mi";
    resources["requests"]["memory"] = memory;
    resources["limits"]["memory"] = memory;
  }
  if (!resources.empty()) {
    container["resources"] = resources;
  }
  for (const auto& [variable, value] : replica.env) {
    container["env"].push_back({{"name", variable}, {"value", value}});
  }
  const json labels = labels_of(endpoint, served.name);
  json deployment = {
      {"apiVersion", "apps/v1"},
      {"kind", "Deployment"},
      {"metadata",
       {{"name", name},
        {"labels", labels},
        {"annotations", {{std::string(kKeyAnnotation), control::deployment_key(endpoint, served)}}},
        {"ownerReferences", owner_of(serving_endpoint)}}},
      {"spec",
       {{"replicas", replicas},
        {"selector",
         {{"matchLabels",
           {{std::string(kEndpointLabel), endpoint}, {std::string(kVersionLabel), served.name}}}}},
        {"strategy",
         {{"type", "RollingUpdate"}, {"rollingUpdate", {{"maxSurge", 1}, {"maxUnavailable", 0}}}}},
        {"template",
         {{"metadata", {{"labels", labels}}},
          {"spec",
           {{"automountServiceAccountToken", false},
            {"terminationGracePeriodSeconds", replica.termination_grace_seconds},
            {"securityContext", {{"runAsNonRoot", true}}},
            {"containers", {container}},
            {"volumes", {{{"name", "cache"}, {"emptyDir", json::object()}}}}}}}}}}};
  // The API server fills in defaults inside the template, so the controller compares what it
  // asked for by this digest, not the stored template with its own.
  deployment["metadata"]["annotations"][std::string(kTemplateAnnotation)] =
      sha256_hex(deployment["spec"]["template"].dump()).substr(0, 16);
  return deployment;
}

json version_service(const json& serving_endpoint, const control::ServedModelSpec& served,
                     const ReplicaTemplate& replica) {
  const std::string endpoint = kube::string_field(field(serving_endpoint, "metadata"), "name");
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata",
           {{"name", version_object_name(endpoint, served.name)},
            {"labels", labels_of(endpoint, served.name)},
            {"ownerReferences", owner_of(serving_endpoint)}}},
          {"spec",
           {{"selector",
             {{std::string(kEndpointLabel), endpoint}, {std::string(kVersionLabel), served.name}}},
            {"ports",
             {{{"name", "http"},
               {"port", replica.port},
               {"targetPort", "http"},
               {"protocol", "TCP"}}}}}}};
}

EndpointPlan plan_endpoint(const json& serving_endpoint,
                           const kube::Reflector::Objects& deployments,
                           const std::optional<control::Scale>& scale,
                           const ReplicaTemplate& replica, const Clock& clock) {
  EndpointPlan plan;
  const json& previous = field(serving_endpoint, "status");
  const int64_t generation =
      kube::integer_field(field(serving_endpoint, "metadata"), "generation", 1);
  const std::string endpoint = kube::string_field(field(serving_endpoint, "metadata"), "name");
  plan.status = {{"observedGeneration", generation}};

  Result<control::EndpointSpec> spec = spec_of(serving_endpoint);
  if (!spec.is_ok()) {
    // Nothing changes until the spec is fixed: what serves keeps serving.
    plan.status = previous.is_object() ? previous : json::object();
    plan.status["observedGeneration"] = generation;
    plan.status["conditions"] = {condition(previous, "Ready", false, "InvalidSpec",
                                           spec.status().message(), generation, clock),
                                 condition(previous, "Degraded", true, "InvalidSpec",
                                           spec.status().message(), generation, clock)};
    return plan;
  }

  std::set<std::string> target;
  bool all_ready = true;
  json versions = json::array();
  int64_t desired_total = 0;
  int64_t ready_total = 0;
  for (size_t i = 0; i < spec->served_models.size(); ++i) {
    const control::ServedModelSpec& served = spec->served_models[i];
    const std::string name = version_object_name(endpoint, served.name);
    target.insert(name);
    const int64_t count = control::version_replicas(served, scale);
    plan.deployments.push_back(version_deployment(serving_endpoint, served, count, replica));
    plan.services.push_back(version_service(serving_endpoint, served, replica));
    const auto observed = deployments.find(name);
    const json& status = observed != deployments.end() ? field(observed->second, "status") : json();
    const bool ready =
        observed != deployments.end() &&
        kube::integer_field(field(observed->second, "spec"), "replicas", -1) == count &&
        deployment_ready(observed->second, control::deployment_key(endpoint, served));
    all_ready = all_ready && ready;
    desired_total += count;
    ready_total += kube::integer_field(status, "readyReplicas", 0);
    versions.push_back({{"name", served.name},
                        {"deployment", name},
                        {"traffic", served.traffic},
                        {"desiredReplicas", count},
                        {"readyReplicas", kube::integer_field(status, "readyReplicas", 0)},
                        {"updatedReplicas", kube::integer_field(status, "updatedReplicas", 0)},
                        {"targetConcurrencyPerReplica", control::replica_cap(served, scale)}});
  }

  // What served before and is not in the spec: kept, with its traffic, until the spec's
  // versions are all ready.
  json serving_before = json::array();
  const json& before = field(previous, "versions");
  if (before.is_array()) {
    for (const json& version : before) {
      if (!target.contains(version_object_name(endpoint, kube::string_field(version, "name")))) {
        serving_before.push_back(version);
      }
    }
  }
  const bool rolling = !all_ready && !serving_before.empty();
  if (rolling) {
    // Traffic stays where it was: the old versions keep theirs, a new version gets its old
    // share (0 when it did not serve).
    std::map<std::string, int64_t> old_traffic;
    for (const json& version : before) {
      old_traffic[kube::string_field(version, "name")] = kube::integer_field(version, "traffic", 0);
    }
    for (json& version : versions) {
      const auto it = old_traffic.find(version["name"].get<std::string>());
      version["traffic"] = it != old_traffic.end() ? it->second : 0;
    }
    for (const json& version : serving_before) {
      versions.push_back(version);
    }
  }
  // Old Deployments: scaled to zero once nothing is routed to them, then deleted.
  for (const auto& [name, deployment] : deployments) {
    if (target.contains(name) || rolling) {
      continue;
    }
    if (kube::integer_field(field(deployment, "spec"), "replicas", 1) > 0) {
      plan.scale_to_zero.push_back(name);
    } else if (kube::integer_field(field(deployment, "status"), "replicas", 0) == 0) {
      plan.remove.push_back(name);
    }
  }

  plan.status["versions"] = versions;
  plan.status["desiredReplicas"] = desired_total;
  plan.status["readyReplicas"] = ready_total;
  const std::string message = all_ready
                                  ? "every version is ready at its replica count"
                                  : std::to_string(ready_total) + " of " +
                                        std::to_string(desired_total) + " replicas ready" +
                                        (rolling ? "; the previous versions serve meanwhile" : "");
  plan.status["conditions"] = {
      condition(previous, "Ready", all_ready, all_ready ? "AllReplicasReady" : "ReplicasNotReady",
                message, generation, clock),
      condition(previous, "Progressing", !all_ready || !plan.scale_to_zero.empty(),
                rolling ? "RollingOut" : (all_ready ? "Stable" : "ScalingUp"), message, generation,
                clock),
      condition(previous, "Degraded", false, "AsExpected", "", generation, clock)};
  return plan;
}

}  // namespace flotilla::cluster

#include "control/reconciler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace flotilla::control {
namespace {

using orchestrator::Replica;
using orchestrator::ReplicaState;

int ready_count(const std::vector<Replica>& replicas, const std::string& key) {
  int ready = 0;
  for (const Replica& replica : replicas) {
    ready += replica.deployment.key == key && replica.state == ReplicaState::kReady;
  }
  return ready;
}

bool all_ready(const std::string& endpoint, const EndpointSpec& spec,
               const std::optional<Scale>& scale, const std::vector<Replica>& replicas) {
  for (const ServedModelSpec& served : spec.served_models) {
    if (ready_count(replicas, deployment_key(endpoint, served)) < version_replicas(served, scale)) {
      return false;
    }
  }
  return true;
}

gateway::EndpointEntry table_entry(const EndpointSpec& spec, const std::optional<Scale>& scale,
                                   const std::vector<Replica>& replicas,
                                   const RuntimeResolver& resolve_runtime,
                                   const ContextLengthResolver& context_length) {
  gateway::EndpointEntry entry;
  entry.name = spec.name;
  entry.inference_table = spec.inference_table;
  for (const ServedModelSpec& served : spec.served_models) {
    gateway::VersionEntry version;
    version.name = served.name;
    version.traffic = served.traffic;
    version.runtime = resolve_runtime(served);
    if (version.runtime == "llm" && context_length) {
      version.max_model_len = context_length(served);
    }
    const std::string key = deployment_key(spec.name, served);
    for (const Replica& replica : replicas) {
      if (replica.deployment.key == key && replica.state == ReplicaState::kReady) {
        version.replicas.push_back(gateway::ReplicaEntry{replica.id, replica.host, replica.port,
                                                         replica_cap(served, scale),
                                                         gateway::ReplicaState::kReady});
      }
    }
    entry.versions.push_back(std::move(version));
  }
  return entry;
}

}  // namespace

orchestrator::Deployment make_deployment(const std::string& endpoint, const ServedModelSpec& served,
                                         const RuntimeResolver& resolve_runtime) {
  orchestrator::Deployment deployment;
  deployment.key = deployment_key(endpoint, served);
  deployment.endpoint = endpoint;
  deployment.version = served.name;
  deployment.model = served.model;
  deployment.runtime = resolve_runtime(served);
  deployment.external = served.external;
  deployment.cpus = served.resources.cpus;
  deployment.memory_bytes = served.resources.memory_mb * 1024 * 1024;
  return deployment;
}

ReconcilePlan reconcile(const std::vector<EndpointState>& endpoints,
                        const std::vector<Replica>& replicas,
                        const RuntimeResolver& resolve_runtime,
                        const ContextLengthResolver& context_length) {
  ReconcilePlan plan;
  std::set<std::string> wanted_keys;
  // A key in both the target and the serving spec (a traffic change in flight) keeps the larger
  // of its two counts until the promotion: the table still routes by the serving weights.
  auto want = [&](const std::string& endpoint, const ServedModelSpec& served,
                  const std::optional<Scale>& scale) {
    orchestrator::Deployment deployment = make_deployment(endpoint, served, resolve_runtime);
    const int count = static_cast<int>(version_replicas(served, scale));
    if (wanted_keys.insert(deployment.key).second) {
      plan.ensure.emplace_back(std::move(deployment), count);
      return;
    }
    for (auto& [known, known_count] : plan.ensure) {
      if (known.key == deployment.key) {
        known_count = std::max(known_count, count);
      }
    }
  };

  for (const EndpointState& state : endpoints) {
    const std::string& name = state.target.name;
    std::optional<EndpointSpec> serving = state.serving;
    if (serving != state.target && all_ready(name, state.target, state.scale, replicas)) {
      serving = state.target;
      plan.promoted.push_back(name);
    }
    for (const ServedModelSpec& served : state.target.served_models) {
      want(name, served, state.scale);
    }
    if (serving) {
      for (const ServedModelSpec& served : serving->served_models) {
        want(name, served, state.scale);
      }
    }
    // Before the first promotion the endpoint is listed with the target's versions and no
    // ready replica: the gateway holds its requests until one is ready (cold start).
    plan.table.endpoints.push_back(table_entry(serving ? *serving : state.target, state.scale,
                                               replicas, resolve_runtime, context_length));
  }

  // Retire whatever runs and is no longer wanted: old versions, deleted endpoints.
  std::set<std::string> retired;
  for (const Replica& replica : replicas) {
    const std::string& key = replica.deployment.key;
    const bool live = replica.state != ReplicaState::kStopped &&
                      replica.state != ReplicaState::kFailed &&
                      replica.state != ReplicaState::kDraining;
    if (live && !wanted_keys.contains(key) && retired.insert(key).second) {
      plan.ensure.emplace_back(replica.deployment, 0);
    }
  }
  return plan;
}

}  // namespace flotilla::control

// The gateway's discovery in Kubernetes mode: objects in, the endpoint table and tokens out.
#include <map>

#include <spdlog/spdlog.h>

#include "auth/auth.h"
#include "cluster/cluster.h"

namespace flotilla::cluster {
namespace {

using Objects = kube::Reflector::Objects;
using kube::field;
using nlohmann::json;

// A condition of an EndpointSlice endpoint: absent means `otherwise` (the API: ready unset is
// ready, terminating unset is not).
bool condition(const json& endpoint, const char* key, bool otherwise) {
  const json& value = field(field(endpoint, "conditions"), key);
  return value.is_boolean() ? value.get<bool>() : otherwise;
}

// The versions of one ServingEndpoint: the controller's serving state when it wrote one.
std::vector<gateway::VersionEntry> versions_of(const json& object) {
  std::map<std::string, std::string> runtimes;
  const json& served = field(field(object, "spec"), "served_models");
  if (served.is_array()) {
    for (const json& model : served) {
      if (model.is_object()) {
        runtimes[kube::string_field(model, "name")] = kube::string_field(model, "runtime");
      }
    }
  }
  std::vector<gateway::VersionEntry> versions;
  const json& status = field(field(object, "status"), "versions");
  if (status.is_array() && !status.empty()) {
    for (const json& version : status) {
      if (!version.is_object()) {
        continue;
      }
      gateway::VersionEntry& entry = versions.emplace_back();
      entry.name = kube::string_field(version, "name");
      entry.traffic = kube::integer_field(version, "traffic", 0);
      entry.runtime = runtimes[entry.name];
    }
    return versions;
  }
  if (served.is_array()) {
    for (const json& model : served) {
      if (!model.is_object()) {
        continue;
      }
      gateway::VersionEntry& entry = versions.emplace_back();
      entry.name = kube::string_field(model, "name");
      // A single served model may leave its traffic out (all of it), as in the spec.
      entry.traffic = kube::integer_field(model, "traffic", served.size() == 1 ? 100 : 0);
      entry.runtime = kube::string_field(model, "runtime");
    }
  }
  return versions;
}

// The per-replica cap the controller learned for a version; 0 (none) until it has.
int64_t target_of(const json& object, const std::string& version) {
  const json& status = field(field(object, "status"), "versions");
  if (status.is_array()) {
    for (const json& entry : status) {
      if (entry.is_object() && kube::string_field(entry, "name") == version) {
        return std::max<int64_t>(0, kube::integer_field(entry, "targetConcurrencyPerReplica", 0));
      }
    }
  }
  return 0;
}

// The replicas of one EndpointSlice.
void add_replicas(const json& slice, int64_t cap, std::vector<gateway::ReplicaEntry>& replicas) {
  const json& ports = field(slice, "ports");
  int64_t port = 0;
  if (ports.is_array()) {
    for (const json& entry : ports) {
      if (entry.is_object() && (port == 0 || kube::string_field(entry, "name") == "http")) {
        port = kube::integer_field(entry, "port", 0);
      }
    }
  }
  const json& endpoints = field(slice, "endpoints");
  if (port <= 0 || port > 65535 || !endpoints.is_array()) {
    return;
  }
  for (const json& endpoint : endpoints) {
    const json& addresses = field(endpoint, "addresses");
    if (!addresses.is_array() || addresses.empty() || !addresses[0].is_string()) {
      continue;
    }
    gateway::ReplicaEntry& replica = replicas.emplace_back();
    replica.host = addresses[0].get<std::string>();
    replica.port = static_cast<uint16_t>(port);
    // The pod's name when the slice names it: the id logs and stats show.
    const json& target = field(endpoint, "targetRef");
    replica.id = !kube::string_field(target, "name").empty()
                     ? kube::string_field(target, "name")
                     : replica.host + ":" + std::to_string(port);
    replica.max_in_flight = cap;
    if (condition(endpoint, "terminating", false)) {
      replica.state = gateway::ReplicaState::kDraining;
    } else if (condition(endpoint, "ready", true)) {
      replica.state = gateway::ReplicaState::kReady;
    } else {
      replica.state = gateway::ReplicaState::kStarting;
    }
  }
}

}  // namespace

std::string version_object_name(std::string_view endpoint, std::string_view version) {
  std::string name(endpoint);
  name += '-';
  name += version;
  return name;
}

gateway::EndpointTable table_from_objects(const Objects& serving_endpoints,
                                          const Objects& endpoint_slices,
                                          std::vector<std::string>* problems) {
  std::map<std::string, std::vector<const json*>> slices_by_service;
  for (const auto& [name, slice] : endpoint_slices) {
    slices_by_service[kube::label(slice, kServiceNameLabel)].push_back(&slice);
  }
  gateway::EndpointTable table;
  for (const auto& [name, object] : serving_endpoints) {
    gateway::EndpointEntry entry;
    entry.name = name;
    entry.versions = versions_of(object);
    // The spec's inference table applies at once, whatever version serves; a spec that does not
    // parse (the controller marks it degraded) records nothing.
    if (Result<control::EndpointSpec> spec = spec_of(object);
        spec.is_ok() && spec->inference_table.enabled) {
      entry.inference_table = spec->inference_table;
    }
    for (gateway::VersionEntry& version : entry.versions) {
      const int64_t cap = target_of(object, version.name);
      for (const json* slice : slices_by_service[version_object_name(name, version.name)]) {
        add_replicas(*slice, cap, version.replicas);
      }
      // Two slices may list one pod while it moves between them: keep it once.
      std::sort(version.replicas.begin(), version.replicas.end(),
                [](const auto& a, const auto& b) { return a.id < b.id; });
      version.replicas.erase(std::unique(version.replicas.begin(), version.replicas.end(),
                                         [](const auto& a, const auto& b) { return a.id == b.id; }),
                             version.replicas.end());
    }
    gateway::EndpointTable alone;
    alone.endpoints.push_back(entry);
    if (Status valid = gateway::validate_endpoint_table(alone); !valid.is_ok()) {
      if (problems != nullptr) {
        problems->push_back("ServingEndpoint '" + name + "': " + valid.message());
      }
      continue;
    }
    table.endpoints.push_back(std::move(entry));
  }
  return table;
}

gateway::AuthConfig auth_from_config_maps(const Objects& config_maps,
                                          std::vector<std::string> open_routes,
                                          std::vector<std::string>* problems) {
  gateway::AuthConfig auth;
  auth.enabled = true;
  auth.open_routes = std::move(open_routes);
  for (const auto& [name, config_map] : config_maps) {
    Result<TokenObject> record = token_from_config_map(name, config_map);
    if (!record.is_ok()) {
      if (problems != nullptr) {
        problems->push_back(record.status().message());
      }
      continue;
    }
    const std::string& id = record->record.id;
    const bool duplicate =
        std::any_of(auth.tokens.begin(), auth.tokens.end(),
                    [&id](const auth::TokenRecord& token) { return token.id == id; });
    if (duplicate) {
      if (problems != nullptr) {
        problems->push_back("ConfigMap '" + name + "': token id '" + id + "' is already used");
      }
      continue;
    }
    auth.tokens.push_back(std::move(record->record));
  }
  return auth;
}

GatewayDiscovery::GatewayDiscovery(kube::Client& client, gateway::GatewaySink& gateway,
                                   Options options)
    : gateway_(gateway), options_(std::move(options)) {
  const std::string& ns = client.config().namespace_name;
  const auto seed = static_cast<uint64_t>(real_clock().now().time_since_epoch().count());
  auto make = [&](const kube::Resource& resource, std::string selector,
                  kube::Reflector::OnChange on_change) {
    kube::Reflector::Options watch = options_.watch;
    watch.label_selector = std::move(selector);
    // One generator per reflector: each draws its jitter on its own thread.
    randoms_.push_back(std::make_unique<SeededRandom>(seed + randoms_.size()));
    reflectors_.push_back(std::make_unique<kube::Reflector>(
        client, resource, ns, watch, std::move(on_change), *randoms_.back()));
  };
  make(kube::kServingEndpoints, "", [this](const Objects& objects) {
    {
      MutexLock lock(mu_);
      serving_endpoints_ = objects;
      endpoints_listed_ = true;
    }
    publish_table();
  });
  make(kube::kEndpointSlices, std::string(kEndpointLabel), [this](const Objects& objects) {
    {
      MutexLock lock(mu_);
      endpoint_slices_ = objects;
      slices_listed_ = true;
    }
    publish_table();
  });
  make(kube::kConfigMaps, std::string(kTokenLabel) + "=true", [this](const Objects& objects) {
    std::vector<std::string> problems;
    gateway_.update_auth(auth_from_config_maps(objects, options_.open_routes, &problems));
    for (const std::string& problem : problems) {
      spdlog::warn("token ignored: {}", problem);
    }
  });
  for (auto& reflector : reflectors_) {
    threads_.emplace_back([&reflector] { reflector->run(); });
  }
}

GatewayDiscovery::~GatewayDiscovery() {
  stop();
}

void GatewayDiscovery::stop() {
  for (auto& reflector : reflectors_) {
    reflector->stop();
  }
  for (std::thread& thread : threads_) {
    if (thread.joinable()) {
      thread.join();
    }
  }
}

std::vector<std::string> GatewayDiscovery::endpoint_names() {
  MutexLock lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, serving_endpoint] : serving_endpoints_) {
    names.push_back(name);
  }
  return names;
}

void GatewayDiscovery::publish_table() {
  // Under the lock to the end: two reflectors' updates reach the gateway in the order of the
  // mirrors they were built from, never an older table after a newer one.
  MutexLock lock(mu_);
  if (!endpoints_listed_ || !slices_listed_) {
    return;  // half a picture would drop every replica of the endpoints it knows
  }
  std::vector<std::string> problems;
  gateway::EndpointTable table =
      table_from_objects(serving_endpoints_, endpoint_slices_, &problems);
  for (const std::string& problem : problems) {
    spdlog::warn("endpoint left out of the table: {}", problem);
  }
  if (Status updated = gateway_.update_table(std::move(table)); !updated.is_ok()) {
    spdlog::error("endpoint table refused: {}", updated.message());
  }
}

}  // namespace flotilla::cluster

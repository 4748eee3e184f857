// The endpoint table's YAML form and validation.
#include <fstream>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "gateway/config_util.h"
#include "gateway/gateway.h"

namespace flotilla::gateway {
namespace {

using detail::check_keys;

Result<ReplicaState> parse_state(const std::string& state, const std::string& where) {
  if (state == "ready")
    return ReplicaState::kReady;
  if (state == "starting")
    return ReplicaState::kStarting;
  if (state == "draining")
    return ReplicaState::kDraining;
  return invalid_argument(where + ": unknown state '" + state +
                          "' (use ready, starting or draining)");
}

// "host:port" → host and port.
Status parse_address(const std::string& address, const std::string& where, ReplicaEntry& replica) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return invalid_argument(where + ": '" + address + "' is not host:port");
  }
  replica.host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 ||
      std::stoi(port) > 65535) {
    return invalid_argument(where + ": port in '" + address + "' must be 1 to 65535");
  }
  replica.port = static_cast<uint16_t>(std::stoi(port));
  return Status::ok();
}

Result<EndpointTable> read_table(const YAML::Node& root) {
  EndpointTable table;
  FLOTILLA_RETURN_IF_ERROR(check_keys(root, {"endpoints", "auth"}, "config"));
  const YAML::Node endpoints = root["endpoints"];
  if (!endpoints || !endpoints.IsSequence()) {
    return invalid_argument("endpoints: must be a list");
  }
  for (size_t e = 0; e < endpoints.size(); ++e) {
    const std::string where = "endpoints[" + std::to_string(e) + "]";
    const YAML::Node endpoint = endpoints[e];
    FLOTILLA_RETURN_IF_ERROR(check_keys(endpoint, {"name", "versions", "inference_table"}, where));
    EndpointEntry entry;
    entry.name = endpoint["name"] ? endpoint["name"].as<std::string>() : "";
    if (const YAML::Node table = endpoint["inference_table"]) {
      FLOTILLA_RETURN_IF_ERROR(
          check_keys(table, {"enabled", "sample_rate", "max_body_bytes", "retention_s"},
                     where + ".inference_table"));
      InferenceTableConfig& config = entry.inference_table;
      config.enabled = table["enabled"] ? table["enabled"].as<bool>() : false;
      config.sample_rate = table["sample_rate"] ? table["sample_rate"].as<double>() : 1;
      config.max_body_bytes =
          table["max_body_bytes"] ? table["max_body_bytes"].as<int64_t>() : config.max_body_bytes;
      config.retention_s =
          table["retention_s"] ? table["retention_s"].as<int64_t>() : config.retention_s;
    }
    const YAML::Node versions = endpoint["versions"];
    if (!versions || !versions.IsSequence()) {
      return invalid_argument(where + ".versions: must be a list");
    }
    for (size_t v = 0; v < versions.size(); ++v) {
      const std::string vwhere = where + ".versions[" + std::to_string(v) + "]";
      const YAML::Node version = versions[v];
      FLOTILLA_RETURN_IF_ERROR(
          check_keys(version, {"name", "traffic", "replicas", "runtime", "max_model_len"}, vwhere));
      VersionEntry ventry;
      ventry.name = version["name"] ? version["name"].as<std::string>() : "";
      ventry.traffic = version["traffic"] ? version["traffic"].as<int64_t>() : 100;
      ventry.runtime = version["runtime"] ? version["runtime"].as<std::string>() : "";
      ventry.max_model_len = version["max_model_len"] ? version["max_model_len"].as<int64_t>() : 0;
      const YAML::Node replicas = version["replicas"];
      if (replicas && !replicas.IsSequence()) {
        return invalid_argument(vwhere + ".replicas: must be a list");
      }
      for (size_t r = 0; replicas && r < replicas.size(); ++r) {
        const std::string rwhere = vwhere + ".replicas[" + std::to_string(r) + "]";
        const YAML::Node replica = replicas[r];
        FLOTILLA_RETURN_IF_ERROR(
            check_keys(replica, {"id", "address", "max_in_flight", "state"}, rwhere));
        ReplicaEntry rentry;
        rentry.id = replica["id"] ? replica["id"].as<std::string>() : "";
        if (!replica["address"]) {
          return invalid_argument(rwhere + ".address: is required");
        }
        FLOTILLA_RETURN_IF_ERROR(
            parse_address(replica["address"].as<std::string>(), rwhere + ".address", rentry));
        rentry.max_in_flight =
            replica["max_in_flight"] ? replica["max_in_flight"].as<int64_t>() : 0;
        if (replica["state"]) {
          FLOTILLA_ASSIGN_OR_RETURN(
              rentry.state, parse_state(replica["state"].as<std::string>(), rwhere + ".state"));
        }
        ventry.replicas.push_back(std::move(rentry));
      }
      entry.versions.push_back(std::move(ventry));
    }
    table.endpoints.push_back(std::move(entry));
  }
  return table;
}

}  // namespace

const EndpointEntry* EndpointTable::find(std::string_view name) const {
  for (const EndpointEntry& endpoint : endpoints) {
    if (endpoint.name == name) {
      return &endpoint;
    }
  }
  return nullptr;
}

Status validate_endpoint_table(const EndpointTable& table) {
  std::set<std::string> endpoint_names;
  for (size_t e = 0; e < table.endpoints.size(); ++e) {
    const EndpointEntry& endpoint = table.endpoints[e];
    const std::string where = "endpoints[" + std::to_string(e) + "]";
    FLOTILLA_RETURN_IF_ERROR(check_name(endpoint.name, where + ".name"));
    if (!endpoint_names.insert(endpoint.name).second) {
      return invalid_argument(where + ".name: endpoint '" + endpoint.name + "' appears twice");
    }
    if (endpoint.versions.empty()) {
      return invalid_argument(where + ".versions: needs at least one version");
    }
    const InferenceTableConfig& table = endpoint.inference_table;
    if (!(table.sample_rate > 0 && table.sample_rate <= 1) || table.max_body_bytes < 0 ||
        table.retention_s <= 0) {
      return invalid_argument(where +
                              ".inference_table: sample_rate in (0, 1], max_body_bytes >= 0 and "
                              "retention_s > 0 are required");
    }
    int64_t traffic = 0;
    std::set<std::string> version_names;
    std::set<std::string> replica_ids;
    for (size_t v = 0; v < endpoint.versions.size(); ++v) {
      const VersionEntry& version = endpoint.versions[v];
      const std::string vwhere = where + ".versions[" + std::to_string(v) + "]";
      FLOTILLA_RETURN_IF_ERROR(check_name(version.name, vwhere + ".name"));
      if (!version_names.insert(version.name).second) {
        return invalid_argument(vwhere + ".name: version '" + version.name + "' appears twice");
      }
      if (version.traffic < 0 || version.traffic > 100) {
        return invalid_argument(vwhere + ".traffic: must be a percentage in [0, 100]");
      }
      traffic += version.traffic;
      if (version.max_model_len < 0) {
        return invalid_argument(vwhere + ".max_model_len: must be >= 0 (0: unknown)");
      }
      for (size_t r = 0; r < version.replicas.size(); ++r) {
        const ReplicaEntry& replica = version.replicas[r];
        const std::string rwhere = vwhere + ".replicas[" + std::to_string(r) + "]";
        FLOTILLA_RETURN_IF_ERROR(check_name(replica.id, rwhere + ".id"));
        if (!replica_ids.insert(replica.id).second) {
          return invalid_argument(rwhere + ".id: replica '" + replica.id +
                                  "' appears twice in endpoint '" + endpoint.name + "'");
        }
        if (replica.host.empty() || replica.port == 0) {
          return invalid_argument(rwhere + ".address: needs a host and a port");
        }
        if (replica.max_in_flight < 0) {
          return invalid_argument(rwhere + ".max_in_flight: must be >= 0 (0: no cap)");
        }
      }
    }
    if (traffic != 100) {
      return invalid_argument(where + ": traffic of the versions sums to " +
                              std::to_string(traffic) + ", not 100");
    }
  }
  return Status::ok();
}

Result<EndpointTable> parse_endpoint_table_yaml(std::string_view text) {
  EndpointTable table;
  try {
    FLOTILLA_ASSIGN_OR_RETURN(table, read_table(YAML::Load(std::string(text))));
  } catch (const std::exception& e) {
    // yaml-cpp throws on syntax errors and on scalars of the wrong type.
    return invalid_argument(std::string("invalid endpoint config: ") + e.what());
  }
  FLOTILLA_RETURN_IF_ERROR(validate_endpoint_table(table));
  return table;
}

Result<GatewayConfig> load_gateway_config(const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    return invalid_argument("cannot read '" + path + "'");
  }
  std::stringstream text;
  text << file.rdbuf();
  GatewayConfig config;
  auto table = parse_endpoint_table_yaml(text.str());
  if (!table.is_ok()) {
    return table.status().with_context(path);
  }
  auto auth = parse_auth_config_yaml(text.str());
  if (!auth.is_ok()) {
    return auth.status().with_context(path);
  }
  return GatewayConfig{std::move(table).value(), std::move(auth).value()};
}

}  // namespace flotilla::gateway

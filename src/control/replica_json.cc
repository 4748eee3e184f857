#include "control/replica_json.h"

namespace flotilla::control {

nlohmann::json to_json(const orchestrator::Replica& replica) {
  const orchestrator::Deployment& deployment = replica.deployment;
  nlohmann::json json = {
      {"id", replica.id},
      {"version", deployment.version},
      {"address", replica.host + ":" + std::to_string(replica.port)},
      {"state", orchestrator::state_name(replica.state)},
      {"pid", replica.pid},
      {"reason", replica.reason},
      {"started_unix_ms", replica.started_unix_ms},
      {"ready_unix_ms", replica.ready_unix_ms},
      {"from_warm_pool", replica.from_warm_pool},
      {"limits", replica.limits},
      {"host", replica.host},
      {"port", replica.port},
      {"process_start_ticks", replica.process_start_ticks},
      {"deployment",
       {{"key", deployment.key},
        {"endpoint", deployment.endpoint},
        {"version", deployment.version},
        {"model", deployment.model},
        {"runtime", deployment.runtime},
        {"cpus", deployment.cpus},
        {"memory_bytes", deployment.memory_bytes}}},
  };
  if (deployment.external) {
    const ExternalCommand& external = *deployment.external;
    json["deployment"]["external"] = {{"command", external.command},
                                      {"env", external.env},
                                      {"workdir", external.workdir},
                                      {"ready_path", external.ready_path}};
  }
  return json;
}

Result<orchestrator::Replica> replica_from_json(const nlohmann::json& json) {
  orchestrator::Replica replica;
  try {
    replica.id = json.at("id").get<std::string>();
    replica.host = json.at("host").get<std::string>();
    replica.port = json.at("port").get<uint16_t>();
    replica.pid = json.at("pid").get<int64_t>();
    replica.process_start_ticks = json.at("process_start_ticks").get<uint64_t>();
    replica.reason = json.at("reason").get<std::string>();
    replica.started_unix_ms = json.at("started_unix_ms").get<int64_t>();
    replica.ready_unix_ms = json.at("ready_unix_ms").get<int64_t>();
    replica.from_warm_pool = json.at("from_warm_pool").get<bool>();
    replica.limits = json.at("limits").get<std::string>();
    const nlohmann::json& deployment = json.at("deployment");
    replica.deployment.key = deployment.at("key").get<std::string>();
    replica.deployment.endpoint = deployment.at("endpoint").get<std::string>();
    replica.deployment.version = deployment.at("version").get<std::string>();
    replica.deployment.model = deployment.at("model").get<std::string>();
    replica.deployment.runtime = deployment.at("runtime").get<std::string>();
    replica.deployment.cpus = deployment.at("cpus").get<double>();
    replica.deployment.memory_bytes = deployment.at("memory_bytes").get<int64_t>();
    if (const auto external = deployment.find("external"); external != deployment.end()) {
      ExternalCommand& command = replica.deployment.external.emplace();
      command.command = external->at("command").get<std::vector<std::string>>();
      command.env = external->at("env").get<std::map<std::string, std::string>>();
      command.workdir = external->at("workdir").get<std::string>();
      command.ready_path = external->at("ready_path").get<std::string>();
    }
    FLOTILLA_ASSIGN_OR_RETURN(replica.state,
                              orchestrator::parse_state(json.at("state").get<std::string>()));
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(std::string("replica record: ") + e.what());
  }
  return replica;
}

}  // namespace flotilla::control

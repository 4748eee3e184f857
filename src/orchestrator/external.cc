// The external runtime's process set-up: placeholders and extra ports.
#include "orchestrator/external.h"

#include <algorithm>

#include "orchestrator/process_util.h"

namespace flotilla::orchestrator {
namespace {

constexpr std::string_view kPortPrefix = "{port:";

}  // namespace

std::string expand_placeholders(const std::string& text,
                                const std::map<std::string, std::string>& values) {
  std::string out;
  out.reserve(text.size());
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find('{', at);
    if (open == std::string::npos) {
      break;
    }
    const size_t close = text.find('}', open + 1);
    if (close == std::string::npos) {
      break;
    }
    out.append(text, at, open - at);
    const auto value = values.find(text.substr(open + 1, close - open - 1));
    if (value != values.end()) {
      out += value->second;
      at = close + 1;
    } else {
      out += '{';  // not ours: kept, and the search goes on after this brace
      at = open + 1;
    }
  }
  out.append(text, at, std::string::npos);
  return out;
}

std::vector<std::string> extra_port_names(const ExternalCommand& external) {
  std::vector<std::string> names;
  auto scan = [&](const std::string& text) {
    for (size_t at = text.find(kPortPrefix); at != std::string::npos;
         at = text.find(kPortPrefix, at + 1)) {
      const size_t close = text.find('}', at);
      if (close == std::string::npos) {
        return;
      }
      std::string name = text.substr(at + kPortPrefix.size(), close - at - kPortPrefix.size());
      if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end()) {
        names.push_back(std::move(name));
      }
    }
  };
  for (const std::string& arg : external.command) {
    scan(arg);
  }
  for (const auto& [name, value] : external.env) {
    scan(value);
  }
  return names;
}

Result<ExternalLaunch> external_launch(const Deployment& deployment, const std::string& replica_id,
                                       const std::string& host, uint16_t port) {
  const ExternalCommand& external = *deployment.external;
  ExternalLaunch launch;
  launch.workdir = external_workdir(external, deployment.model);
  FLOTILLA_ASSIGN_OR_RETURN(const std::string program, find_program(external, launch.workdir));
  std::map<std::string, std::string> values = {{"port", std::to_string(port)},
                                               {"model", deployment.model},
                                               {"endpoint", deployment.endpoint},
                                               {"version", deployment.version},
                                               {"replica", replica_id}};
  std::vector<uint16_t> taken = {port};
  for (const std::string& name : extra_port_names(external)) {
    uint16_t extra = port;
    // The kernel hands out ephemeral ports in turn, so a repeat is rare; a few tries rule it out.
    for (int attempt = 0;
         attempt < 8 && std::find(taken.begin(), taken.end(), extra) != taken.end(); ++attempt) {
      FLOTILLA_ASSIGN_OR_RETURN(extra, pick_free_port(host));
    }
    if (std::find(taken.begin(), taken.end(), extra) != taken.end()) {
      return unavailable("no distinct free port for {port:" + name + "}");
    }
    taken.push_back(extra);
    values["port:" + name] = std::to_string(extra);
  }
  launch.argv.push_back(program);
  for (size_t i = 1; i < external.command.size(); ++i) {
    launch.argv.push_back(expand_placeholders(external.command[i], values));
  }
  for (const auto& [name, value] : external.env) {
    launch.env.push_back(name + "=" + expand_placeholders(value, values));
  }
  launch.env.push_back("PORT=" + std::to_string(port));
  return launch;
}

}  // namespace flotilla::orchestrator

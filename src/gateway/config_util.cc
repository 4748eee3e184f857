#include "gateway/config_util.h"

namespace flotilla::gateway::detail {

Status check_keys(const YAML::Node& node, std::initializer_list<const char*> known,
                  const std::string& where) {
  if (!node.IsMap()) {
    return invalid_argument(where + ": must be a mapping");
  }
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>();
    bool found = false;
    for (const char* name : known) {
      found = found || key == name;
    }
    if (!found) {
      return invalid_argument(where + ": unknown field '" + key + "'");
    }
  }
  return Status::ok();
}

}  // namespace flotilla::gateway::detail

#include "gateway/config_util.h"

namespace flotilla::gateway::detail {

Status check_name(const std::string& name, const std::string& where) {
  constexpr size_t kMaxNameLength = 128;
  if (name.empty() || name.size() > kMaxNameLength) {
    return invalid_argument(where + ": must be 1 to 128 characters");
  }
  for (char c : name) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                         (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!allowed) {
      return invalid_argument(where + ": '" + name +
                              "' may hold only letters, digits, '-', '_' and '.'");
    }
  }
  return Status::ok();
}

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

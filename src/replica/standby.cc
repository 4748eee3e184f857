#include <nlohmann/json.hpp>

#include "replica/replica_standby.h"

namespace flotilla::replica {

using Json = nlohmann::json;

std::string encode_standby_command(const std::vector<std::string>& args) {
  return Json{{"args", args}}.dump() + "\n";
}

Result<std::vector<std::string>> parse_standby_command(std::string_view line) {
  if (line.ends_with('\n')) {
    line.remove_suffix(1);
  }
  const Json command = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (command.is_discarded()) {
    return invalid_argument("the command is not JSON");
  }
  if (!command.is_object()) {
    return invalid_argument("the command is not a JSON object");
  }
  const auto found = command.find("args");
  if (found == command.end()) {
    return invalid_argument("the command has no 'args'");
  }
  if (!found->is_array()) {
    return invalid_argument("'args' is not a list");
  }
  std::vector<std::string> args;
  args.reserve(found->size());
  for (const Json& arg : *found) {
    if (!arg.is_string()) {
      return invalid_argument("'args' must be a list of strings, not of " +
                              std::string(arg.type_name()) + "s");
    }
    args.push_back(arg.get<std::string>());
  }
  return args;
}

}  // namespace flotilla::replica

// Checks shared by the gateway config's sections (endpoint table, auth): YAML keys. Names
// follow common's check_name.
// Private to the gateway module.
#pragma once

#include <initializer_list>
#include <string>

#include <yaml-cpp/yaml.h>

#include "common/common.h"

namespace flotilla::gateway::detail {

// `node` is a mapping whose keys are all in `known`; errors name `where` and the key.
Status check_keys(const YAML::Node& node, std::initializer_list<const char*> known,
                  const std::string& where);

}  // namespace flotilla::gateway::detail

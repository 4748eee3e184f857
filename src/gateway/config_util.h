// Checks shared by the gateway config's sections (endpoint table, auth): names and YAML keys.
// Private to the gateway module.
#pragma once

#include <initializer_list>
#include <string>

#include <yaml-cpp/yaml.h>

#include "common/common.h"

namespace flotilla::gateway::detail {

// An endpoint, version or replica name: 1 to 128 of [A-Za-z0-9-_.]. Errors name `where`.
Status check_name(const std::string& name, const std::string& where);

// `node` is a mapping whose keys are all in `known`; errors name `where` and the key.
Status check_keys(const YAML::Node& node, std::initializer_list<const char*> known,
                  const std::string& where);

}  // namespace flotilla::gateway::detail

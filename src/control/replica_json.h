// The JSON form of orchestrator replicas: stored in SQLite for re-adoption after a restart, and
// shown by the API. Private to the control module.
#pragma once

#include <nlohmann/json.hpp>

#include "common/common.h"
#include "orchestrator/orchestrator.h"

namespace flotilla::control {

nlohmann::json to_json(const orchestrator::Replica& replica);

// Reads what to_json wrote; kInvalidArgument when a field is missing or has the wrong type.
Result<orchestrator::Replica> replica_from_json(const nlohmann::json& json);

}  // namespace flotilla::control

// The warm-pool protocol between an orchestrator and a `flotilla replica --standby` process,
// defined once for both sides: the orchestrator writes one line on the standby's stdin with the
// command-line flags of the replica it is to become, and the standby parses it. The line is a
// JSON object, {"args": ["--model", "m.json", ...]}, ended by "\n"; end of input instead of a
// line means "exit" (the pool is closed). Pure functions, safe on any thread; this part of the
// replica module links nothing but common, so the orchestrator can use it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/common.h"

namespace flotilla::replica {

// The line that hands `args` (replica flags, without the program and subcommand names) to a
// standby, "\n" included.
std::string encode_standby_command(const std::vector<std::string>& args);

// The flags of one line read from stdin (with or without its "\n"). kInvalidArgument saying
// what is wrong for anything else: not JSON, not an object, no "args", "args" not a list of
// strings.
Result<std::vector<std::string>> parse_standby_command(std::string_view line);

}  // namespace flotilla::replica

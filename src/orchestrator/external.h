// The `external` runtime's side of the local orchestrator (issue 24; docs/external-runtime.md):
// from a deployment's ExternalCommand (common.h) to the argv, environment and working directory
// of one replica's process. Private to the module; pure but for the file system lookups and
// the free ports it picks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/common.h"
#include "orchestrator/orchestrator.h"

namespace flotilla::orchestrator {

// What one external replica is started with.
struct ExternalLaunch {
  std::vector<std::string> argv;  // argv[0] the program's path, as find_program() found it
  std::vector<std::string> env;   // "NAME=value": the spec's env, then PORT
  std::string workdir;
};

// Replaces each placeholder `{name}` in `text` whose name `values` holds by its value; any other
// text, other braces included, stays as it is.
std::string expand_placeholders(const std::string& text,
                                const std::map<std::string, std::string>& values);

// The distinct NAMEs of the {port:NAME} placeholders in `external`'s command and env values, in
// order of first appearance.
std::vector<std::string> extra_port_names(const ExternalCommand& external);

// The argv, environment and working directory of replica `replica_id` of `deployment` (which
// has `external`), serving HTTP on `port` of `host`. Picks one more free port on `host` per
// {port:NAME}. Errors: kNotFound when the program cannot be found (find_program), kUnavailable
// when no free port can be had.
Result<ExternalLaunch> external_launch(const Deployment& deployment, const std::string& replica_id,
                                       const std::string& host, uint16_t port);

}  // namespace flotilla::orchestrator

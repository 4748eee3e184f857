// Every process's log lines: one a line on stderr, JSON by default (time, level, component,
// endpoint, replica, request id, message) so that a collector reads them without a grammar,
// or text for a person at a terminal. stdout stays for machine-readable lines (the replica's
// listen line). The gateway's access log is its own file (gateway/access_log.h).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <spdlog/formatter.h>

#include "common/common.h"

namespace flotilla {

// Who writes the lines: `component` is the process's part ("gateway", "controller", "replica",
// "up", "pull"); `endpoint` and `replica` are set by a process that serves one (a replica).
// An empty field is left out of a line.
struct LogFields {
  // `{}`: designated initializers may leave any out without a warning.
  std::string component{};
  std::string endpoint{};
  std::string replica{};
  std::string request_id{};
};

// Sends spdlog's default logger to stderr at `level` ("trace" .. "off") in `format` ("json":
// each line carrying `process`'s fields; "text": time, level, message). Returns an error for
// an unknown level or format.
Status init_logging(std::string_view level, std::string_view format = "text",
                    LogFields process = {});

// While alive, the lines this thread logs carry `fields`' non-empty ones in place of the
// process's: a request's id, the endpoint and replica it went to. Scopes nest.
class LogScope {
 public:
  explicit LogScope(LogFields fields);
  ~LogScope();
  LogScope(const LogScope&) = delete;
  LogScope& operator=(const LogScope&) = delete;

 private:
  LogFields previous_;
};

// The JSON line formatter init_logging installs (for tests: any spdlog sink takes it). Each
// line is one JSON object: "time" (UTC, RFC 3339 with milliseconds), "level", the non-empty
// fields of `process` and of the thread's LogScope, "message"; invalid UTF-8 in a message
// becomes U+FFFD.
std::unique_ptr<spdlog::formatter> make_json_log_formatter(LogFields process);

}  // namespace flotilla

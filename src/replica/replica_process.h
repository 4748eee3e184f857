// The replica process's composition, for `flotilla replica`: listen, fetch the model (a URL is
// pulled into the artifact cache, lazily unless told otherwise, with its download progress in
// /metrics), load its runtime, serve until drained; and the warm-pool standby mode that does all
// that once an orchestrator hands it its flags (replica/replica_standby.h). The command line
// itself is the caller's (cli/main.cc): this part takes parsed flags.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/common.h"
#include "runtime/runtime.h"

namespace flotilla::replica {

// Exit codes of the process, as cli's: 0 clean, 1 drain timed out, 2 bad arguments or input,
// 3 cannot listen.
constexpr int kExitDrainTimeout = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitCannotListen = 3;

// What the flags of `flotilla replica` say (its --help has each one's meaning).
struct ProcessFlags {
  std::string model;
  std::string name;
  std::string model_version = "1";
  std::string runtime = "auto";
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  // The OIP gRPC service's port on `host` (0 picks one); unset: no gRPC.
  std::optional<uint16_t> grpc_port;
  int workers = 0;
  int64_t max_batch_size = 64;
  int64_t max_queue_delay_us = 0;
  bool no_batching = false;
  size_t max_body_bytes = 8 * 1024 * 1024;
  int64_t header_timeout_ms = 10'000;
  std::string otlp_endpoint;       // "": from the environment (docs/tracing.md)
  double trace_sample_ratio = -1;  // below 0: from the environment
  int64_t body_timeout_ms = 30'000;
  int64_t idle_timeout_ms = 60'000;
  int64_t drain_timeout_ms = 30'000;
  int predict_threads = 1;
  std::string log_level = "info";
  std::string log_format = "json";
  std::string replica_id;  // for the log lines; empty: $POD_NAME, else none
  std::string cache_dir = ".flotilla/cache";
  bool no_lazy_load = false;
  bool standby = false;
  runtime::LlmRuntimeOptions llm;
};

// Runs a replica until it has drained (SIGTERM, SIGINT); returns the exit code. Its first
// stdout line, once the model serves, is {"event":"listening","host":..,"port":..,"model":..}
// for orchestrators. Blocks the calling thread (the main one) for the process's life.
int run_replica_process(const ProcessFlags& flags);

// What a standby needs from the process that wires it (cli): the orchestrator's parent-death
// arming (orchestrator::exit_with_parent, disarm_parent_death), kept out of this module so
// that the orchestrator, which speaks replica_standby.h, is not also its dependency; and the
// command-line parser that turns the flags of the stdin line into ProcessFlags (an error's
// message is printed, and the process exits with kExitBadInput).
struct StandbyHooks {
  std::function<bool()> exit_with_parent;
  std::function<void()> disarm_parent_death;
  std::function<Result<ProcessFlags>(std::vector<std::string> args)> parse_flags;
};

// A warm-pool process: pays the runtime's start-up costs, then reads one standby command from
// stdin and runs as run_replica_process() with its flags; exits 0 on end of input.
int run_standby_process(const ProcessFlags& standby_flags, const StandbyHooks& hooks);

}  // namespace flotilla::replica

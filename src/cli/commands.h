// The subcommands of `flotilla`, one file each; main.cc wires them into CLI11.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>
#include <signal.h>

#include "common/common.h"
#include "common/common_logging.h"
#include "control/control_scaling.h"

namespace flotilla::cli {

// Exit codes shared by the commands: 0 clean, 1 drain timed out, 2 bad arguments or input,
// 3 cannot listen.
constexpr int kExitDrainTimeout = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitCannotListen = 3;

// Adds `flotilla gateway` (and `flotilla gateway mint-token`) to `app`; the returned callable
// runs whichever was parsed.
std::function<int()> add_gateway_command(CLI::App& app);

// Adds `flotilla controller` (Kubernetes mode); the returned callable runs it.
std::function<int()> add_controller_command(CLI::App& app);

// Adds `flotilla sim`; the returned callable runs it.
std::function<int()> add_sim_command(CLI::App& app);

// Adds `flotilla up`; the returned callable runs it.
std::function<int()> add_up_command(CLI::App& app);

// Adds the control-plane client commands (deploy, ls, get, predict, rm, tokens, events); the
// returned callable runs whichever was parsed, or returns -1 when none was.
std::function<int()> add_client_commands(CLI::App& app);

// Adds `flotilla top`, a live terminal view of the endpoints; the returned callable runs it when
// it was parsed, or returns -1.
std::function<int()> add_top_command(CLI::App& app);
// Adds `flotilla logs`, which reads an endpoint's inference table from the data directory;
// the returned callable runs it when it was parsed, or returns -1.
std::function<int()> add_logs_command(CLI::App& app);
// Adds `flotilla pull` and `flotilla artifact pack`; the returned callable runs whichever was
// parsed, or returns -1 when none was.
std::function<int()> add_artifact_commands(CLI::App& app);

// "host:port" → host and port; kInvalidArgument naming the text otherwise.
Result<std::pair<std::string, uint16_t>> split_address(const std::string& address);

// The autoscaler's flags (--no-autoscale, --autoscale-period-ms, --scale-up-window-ms,
// --scale-down-window-ms, --vertical-period-ms), DESIGN.md §4's defaults.
struct AutoscalingFlags {
  bool no_autoscale = false;
  int64_t period_ms = 5'000;
  int64_t fast_period_ms = 1'000;
  int64_t up_window_ms = 20'000;
  int64_t down_window_ms = 300'000;
  int64_t vertical_period_ms = 30'000;
  int64_t forecast_day_ms = 86'400'000;
  control::AutoscalingOptions options() const;
};
void add_autoscaling_flags(CLI::App& cmd, AutoscalingFlags& flags);

// --balancer: the gateway's choice of replica (`flotilla gateway`, `flotilla up`); its value
// goes through gateway::parse_balancer_kind.
void add_balancer_flag(CLI::App& cmd, std::string& balancer);

// --otlp-endpoint and --trace-sample-ratio (docs/tracing.md): they win over OpenTelemetry's
// variables (trace::tracer_options_from_env). `sample_ratio` stays below 0 when the flag is not
// given.
void add_tracing_flags(CLI::App& cmd, std::string& endpoint, double& sample_ratio);

// --log-format: json (the default) or text (common/common_logging.h).
void add_log_format_flag(CLI::App& cmd, std::string& format);

// This process's name among its peers (a controller on the Lease, a gateway in the fleet's
// samples): `flag` when given, else $POD_NAME, else the host name and pid.
std::string instance_name(const std::string& flag);

// SIGTERM and SIGINT, taken synchronously: made on the main thread before any other starts
// (every thread started later inherits the mask; replicas get a clean one at spawn). SIGPIPE
// is ignored.
class StopSignals {
 public:
  StopSignals();
  int wait();  // blocks until one arrives; returns it

 private:
  sigset_t signals_;
};

}  // namespace flotilla::cli

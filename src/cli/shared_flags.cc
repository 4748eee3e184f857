// What several commands share: the autoscaler's flags (`flotilla up`, `flotilla controller`), a
// process's name among its peers, and the stop signals of a long-running command.
#include <cstdlib>

#include <signal.h>
#include <unistd.h>

#include "cli/commands.h"

namespace flotilla::cli {

control::AutoscalingOptions AutoscalingFlags::options() const {
  control::AutoscalingOptions options;
  options.enabled = !no_autoscale;
  options.horizontal_period = std::chrono::milliseconds(period_ms);
  options.fast_period = std::chrono::milliseconds(fast_period_ms);
  options.up_window = std::chrono::milliseconds(up_window_ms);
  options.down_window = std::chrono::milliseconds(down_window_ms);
  options.vertical_period = std::chrono::milliseconds(vertical_period_ms);
  options.forecast_day = std::chrono::milliseconds(forecast_day_ms);
  return options;
}

void add_autoscaling_flags(CLI::App& cmd, AutoscalingFlags& flags) {
  cmd.add_flag("--no-autoscale", flags.no_autoscale,
               "Keep every version at its provisioned minimum (no autoscaler)");
  cmd.add_option("--autoscale-period-ms", flags.period_ms, "Horizontal autoscaler decision period")
      ->check(CLI::Range(int64_t{100}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd.add_option("--scale-up-fast-period-ms", flags.fast_period_ms,
                 "Between decisions, scale up at this cadence when the load outgrows the ready "
                 "replicas (0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd.add_option("--scale-up-window-ms", flags.up_window_ms,
                 "Window whose busiest second drives scale-up")
      ->check(CLI::Range(int64_t{1'000}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd.add_option("--scale-down-window-ms", flags.down_window_ms,
                 "Window that must all ask for fewer replicas before a scale-down")
      ->check(CLI::Range(int64_t{1'000}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd.add_option("--vertical-period-ms", flags.vertical_period_ms,
                 "Period of the per-replica target concurrency (vertical) decisions")
      ->check(CLI::Range(int64_t{100}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd.add_option("--forecast-day-ms", flags.forecast_day_ms,
                 "The day the forecast learns its pattern over (its history kept a minute in "
                 "1,440 of it); shorter only for experiments")
      ->check(CLI::Range(int64_t{14'400}, int64_t{86'400'000}))
      ->capture_default_str();
}

void add_balancer_flag(CLI::App& cmd, std::string& balancer) {
  cmd.add_option("--balancer", balancer,
                 "p2c (power of two choices weighed by response time); p2c_in_flight, "
                 "round_robin and least_request for comparisons")
      ->check(CLI::IsMember({"p2c", "p2c_in_flight", "round_robin", "least_request"}))
      ->capture_default_str();
}

void add_tracing_flags(CLI::App& cmd, std::string& endpoint, double& sample_ratio) {
  cmd.add_option(
      "--otlp-endpoint", endpoint,
      "Export spans as OTLP/HTTP JSON to this URL (the collector's full traces path, "
      "e.g. http://127.0.0.1:4318/v1/traces; default: "
      "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else $OTEL_EXPORTER_OTLP_ENDPOINT/v1/traces, "
      "else no spans)");
  cmd.add_option("--trace-sample-ratio", sample_ratio,
                 "Share of the traces this process starts that are recorded; a request's "
                 "traceparent decides for it (default: $OTEL_TRACES_SAMPLER_ARG, else 1)")
      ->check(CLI::Range(0.0, 1.0));
}

void add_log_format_flag(CLI::App& cmd, std::string& format) {
  cmd.add_option("--log-format", format,
                 "Log lines on stderr: json (an object a line: time, level, component, endpoint, "
                 "replica, request_id, message) or text")
      ->check(CLI::IsMember({"json", "text"}))
      ->capture_default_str();
}

std::string instance_name(const std::string& flag) {
  if (!flag.empty()) {
    return flag;
  }
  if (const char* pod = std::getenv("POD_NAME"); pod != nullptr && *pod != '\0') {
    return pod;
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return std::string(host) + "-" + std::to_string(::getpid());
}

StopSignals::StopSignals() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGTERM);
  sigaddset(&signals_, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

int StopSignals::wait() {
  int received = 0;
  sigwait(&signals_, &received);
  return received;
}

}  // namespace flotilla::cli

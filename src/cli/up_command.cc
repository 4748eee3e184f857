// `flotilla up`: embedded mode (DESIGN.md §2). The control plane, the gateway and the local
// orchestrator in one process; replicas are child processes. State lives in --data-dir.
//
// Shutdown order on SIGTERM or SIGINT: the control plane stops (no new decisions), the gateway
// drains (in-flight requests finish on their replicas), then the replicas drain and stop.
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include "cli/commands.h"
#include "control/control.h"
#include "gateway/gateway.h"
#include "orchestrator/orchestrator.h"
#include "trace/trace.h"

namespace flotilla::cli {
namespace {

struct UpFlags {
  std::string data_dir = ".flotilla";
  std::string gateway_addr = "127.0.0.1:8080";
  std::string api_addr = "127.0.0.1:8081";
  std::string grpc_addr = "127.0.0.1:8082";  // "off": no gRPC
  int gateway_workers = 0;
  std::string balancer = "p2c";
  int warm_pool = 1;
  std::vector<std::string> open_routes = {"health"};
  int64_t drain_timeout_ms = 30'000;
  std::string log_level = "info";
  std::string log_format = "json";
  std::string replica_log_level = "warn";
  AutoscalingFlags autoscaling;
  int64_t cold_start_timeout_ms = 60'000;
  int64_t max_replicas = 0;  // 0: control::default_max_replicas()
  int64_t liveness_timeout_ms = 5'000;
  int64_t inference_period_s = 3'600;
  std::string otlp_endpoint;
  double trace_sample_ratio = -1;
};

int fail(const std::string& message, int code = kExitBadInput) {
  std::cerr << "flotilla up: " << message << "\n";
  return code;
}

// Holds an exclusive lock on <data_dir>/lock for the life of the process (released by the
// kernel even on kill -9), so two `flotilla up` never share a data directory.
Result<int> lock_data_dir(const std::string& data_dir) {
  const std::string path = data_dir + "/lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return unavailable("cannot open '" + path + "': " + std::strerror(errno));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return unavailable("data directory '" + data_dir + "' is in use by another flotilla up (lock " +
                       path + ")");
  }
  return fd;
}

int run_up(const UpFlags& flags) {
  if (Status status = init_logging(flags.log_level, flags.log_format, {.component = "up"});
      !status.is_ok()) {
    return fail(status.message());
  }
  auto tracing = trace::tracer_options_from_env("flotilla-gateway", flags.otlp_endpoint,
                                                flags.trace_sample_ratio);
  if (!tracing.is_ok()) {
    return fail(tracing.status().message());
  }
  auto gateway_address = split_address(flags.gateway_addr);
  auto api_address = split_address(flags.api_addr);
  if (!gateway_address.is_ok() || !api_address.is_ok()) {
    return fail(
        "--gateway-addr / --api-addr: " +
        (gateway_address.is_ok() ? api_address.status() : gateway_address.status()).message());
  }
  const bool grpc_on = flags.grpc_addr != "off";
  std::string grpc_host;
  if (grpc_on) {
    auto grpc_address = split_address(flags.grpc_addr);
    if (!grpc_address.is_ok()) {
      return fail("--grpc-addr: " + grpc_address.status().message());
    }
    grpc_host = grpc_address->first;
  }
  std::error_code error;
  const std::string data_dir = std::filesystem::absolute(flags.data_dir, error).lexically_normal();
  if (Status made = control::make_data_dir(data_dir); !made.is_ok()) {
    return fail(made.message());
  }
  Result<int> lock = lock_data_dir(data_dir);
  if (!lock.is_ok()) {
    return fail(lock.status().message());
  }

  StopSignals signals;

  MetricsRegistry& registry = default_registry();
  register_process_metrics(registry);

  orchestrator::LocalOptions local;
  local.binary = std::filesystem::read_symlink("/proc/self/exe", error).string();
  local.log_dir = data_dir + "/logs";
  local.warm_pool_size = flags.warm_pool;
  // Replicas pull URL models into the data directory's shared cache (docs/store.md).
  local.replica_args = {"--log-level",    flags.replica_log_level, "--log-format",
                        flags.log_format, "--cache-dir",           data_dir + "/cache"};
  // The replicas trace as the gateway does: the flags given here, else the same variables
  // (they inherit the environment).
  if (!flags.otlp_endpoint.empty()) {
    local.replica_args.insert(local.replica_args.end(), {"--otlp-endpoint", flags.otlp_endpoint});
  }
  if (flags.trace_sample_ratio >= 0) {
    local.replica_args.insert(local.replica_args.end(),
                              {"--trace-sample-ratio", std::to_string(flags.trace_sample_ratio)});
  }
  local.stop_timeout = std::chrono::milliseconds(flags.drain_timeout_ms);
  // Replicas carry the data directory as their marker: a restart finds those no row describes.
  local.instance = data_dir;
  const int64_t max_replicas =
      flags.max_replicas > 0 ? flags.max_replicas : control::default_max_replicas();
  local.max_replicas = static_cast<int>(max_replicas);
  local.liveness_timeout = std::chrono::milliseconds(flags.liveness_timeout_ms);
  auto orchestrator = orchestrator::create_local_orchestrator(local);
  if (!orchestrator.is_ok()) {
    return fail(orchestrator.status().message());
  }
  if (std::string reason = orchestrator::cgroup_unavailable_reason(local.cgroup_root);
      !reason.empty()) {
    spdlog::warn("per-replica CPU and memory limits are off: {}", reason);
  }

  gateway::GatewayOptions gateway_options;
  gateway_options.server.host = gateway_address->first;
  gateway_options.server.port = gateway_address->second;
  gateway_options.server.workers = flags.gateway_workers;
  gateway_options.balancer = gateway::parse_balancer_kind(flags.balancer).value();  // CLI checked
  // One descriptor budget for the whole process (docs/gateway.md, "File descriptors"): the
  // gateway's client connections take 7/16 of it and their upstream connections as much, the
  // control API 1/16; the reserve covers the API's loops, the orchestrator (spawns, probes,
  // replica logs), SQLite and the logs.
  gateway_options.server.fd_reserve = 128;
  gateway_options.server.fd_share = 7.0 / 16;
  gateway_options.cold_start_timeout = std::chrono::milliseconds(flags.cold_start_timeout_ms);
  gateway_options.inference_dir = data_dir + "/inference";
  gateway_options.inference_period = std::chrono::seconds(flags.inference_period_s);
  gateway_options.tracing = std::move(tracing).value();
  if (grpc_on) {
    gateway_options.grpc_listen = flags.grpc_addr;
  }
  gateway::AuthConfig closed;
  closed.enabled = true;  // no request passes before the control plane publishes the tokens
  auto gateway =
      gateway::Gateway::create(gateway_options, gateway::EndpointTable{}, closed, registry);
  if (!gateway.is_ok()) {
    return fail(gateway.status().message(), kExitCannotListen);
  }

  control::ControlOptions control_options;
  control_options.data_dir = data_dir;
  control_options.api.host = api_address->first;
  control_options.api.port = api_address->second;
  control_options.api.fd_reserve = 128;
  control_options.api.fd_share = 1.0 / 16;
  control_options.gateway_url =
      "http://" + gateway_address->first + ":" + std::to_string((*gateway)->port());
  control_options.open_routes = flags.open_routes;
  control_options.max_replicas = max_replicas;
  control_options.autoscaling = flags.autoscaling.options();
  auto control =
      control::ControlPlane::create(control_options, **orchestrator, **gateway, registry);
  if (!control.is_ok()) {
    (*orchestrator)->shutdown(std::chrono::milliseconds(flags.drain_timeout_ms));
    return fail(control.status().message(), control.status().code() == StatusCode::kUnavailable
                                                ? kExitCannotListen
                                                : kExitBadInput);
  }

  std::thread gateway_thread([&] { (*gateway)->run(); });
  std::thread api_thread([&] { (*control)->run(); });
  std::cout << "flotilla up: gateway " << control_options.gateway_url;
  if (grpc_on) {
    std::cout << ", grpc " << grpc_host << ":" << (*gateway)->grpc_port();
  }
  std::cout << ", api http://" << api_address->first << ":" << (*control)->api_port()
            << ", data dir " << data_dir << std::endl;
  if (!(*control)->new_admin_token().empty()) {
    std::cout << "admin token (shown once; also in " << data_dir
              << "/admin.token): " << (*control)->new_admin_token() << std::endl;
  }

  const int received = signals.wait();
  spdlog::info("{}: shutting down", strsignal(received));
  const auto timeout = std::chrono::milliseconds(flags.drain_timeout_ms);
  (*control)->shutdown(timeout);
  (*gateway)->drain(timeout);
  gateway_thread.join();
  api_thread.join();
  (*orchestrator)->shutdown(timeout);
  orchestrator->reset();  // its thread ends before the control plane it reports to
  spdlog::info("stopped");
  return 0;
}

}  // namespace

std::function<int()> add_up_command(CLI::App& app) {
  auto flags = std::make_shared<UpFlags>();
  CLI::App* cmd = app.add_subcommand(
      "up",
      "Run the platform on this machine: control plane API, gateway and replicas (embedded "
      "mode). Prints both addresses when ready; SIGTERM or Ctrl-C drains and stops everything.");
  cmd->add_option("--data-dir", flags->data_dir,
                  "State directory: SQLite database, admin token, replica logs")
      ->capture_default_str();
  cmd->add_option("--gateway-addr", flags->gateway_addr,
                  "Where clients send requests (port 0: any free port)")
      ->capture_default_str();
  cmd->add_option("--api-addr", flags->api_addr, "Where the control plane API listens")
      ->capture_default_str();
  cmd->add_option("--grpc-addr", flags->grpc_addr,
                  "Where clients call the Open Inference Protocol over gRPC (port 0: any free "
                  "port; off: no gRPC)")
      ->capture_default_str();
  cmd->add_option("--gateway-workers", flags->gateway_workers,
                  "Gateway event loops (0: one per core)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  add_balancer_flag(*cmd, flags->balancer);
  cmd->add_option("--warm-pool", flags->warm_pool,
                  "Idle replica processes kept ready per runtime (0: none)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_option("--open-routes", flags->open_routes,
                  "Routes served without a token: health, metrics (/metrics on both ports, "
                  "for a local Prometheus), stats, models")
      ->check(CLI::IsMember({"health", "metrics", "stats", "models"}))
      ->capture_default_str();
  cmd->add_option("--drain-timeout-ms", flags->drain_timeout_ms,
                  "How long in-flight requests may take at shutdown and when a replica stops")
      ->check(CLI::Range(int64_t{0}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--log-level", flags->log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  add_log_format_flag(*cmd, flags->log_format);
  cmd->add_option("--replica-log-level", flags->replica_log_level,
                  "Log level of the replicas (their logs: <data-dir>/logs)")
      ->capture_default_str();
  add_autoscaling_flags(*cmd, flags->autoscaling);
  add_tracing_flags(*cmd, flags->otlp_endpoint, flags->trace_sample_ratio);
  cmd->add_option("--cold-start-timeout-ms", flags->cold_start_timeout_ms,
                  "How long the gateway holds requests for an endpoint with no ready replica "
                  "(then 503)")
      ->check(CLI::Range(int64_t{100}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--max-replicas", flags->max_replicas,
                  "Host-wide cap on replica processes (0: min(32 x cores, memory / 256 MiB), at "
                  "least 4); specs needing more are refused, the autoscaler is held below it")
      ->check(CLI::Range(int64_t{0}, int64_t{100'000}))
      ->capture_default_str();
  cmd->add_option("--liveness-timeout-ms", flags->liveness_timeout_ms,
                  "A ready replica answering no liveness probe this long is killed and replaced "
                  "(0: no liveness probes)")
      ->check(CLI::Range(int64_t{0}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--inference-period-s", flags->inference_period_s,
                  "How long each inference table file (DATA_DIR/inference/ENDPOINT/) is written "
                  "before it is closed and the next begun")
      ->check(CLI::Range(int64_t{1}, int64_t{86'400}))
      ->capture_default_str();
  return [flags] {
    return run_up(*flags);
  };
}

}  // namespace flotilla::cli

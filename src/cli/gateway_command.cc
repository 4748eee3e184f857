// `flotilla gateway`: the gateway as its own process, fronting the replicas of a YAML endpoint
// table (--config, reloaded when it changes), a plain list of upstreams (--upstreams), or what a
// Kubernetes API server says (--kubernetes: ServingEndpoints, EndpointSlices, token ConfigMaps).
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "auth/auth.h"
#include "cli/commands.h"
#include "cluster/cluster.h"
#include "common/common.h"
#include "gateway/gateway.h"
#include "trace/trace.h"

namespace flotilla::cli {
namespace {

struct GatewayFlags {
  std::string listen = "127.0.0.1:8080";
  std::string grpc_listen;
  std::string config;
  std::string upstreams;
  bool kubernetes = false;
  std::string kubeconfig;
  std::string namespace_name;
  std::string name;
  std::string default_endpoint;
  int64_t max_in_flight = 0;
  int workers = 0;
  std::string balancer = "p2c";
  size_t queue_size = 1024;
  int64_t queue_timeout_ms = 5'000;
  int64_t cold_start_timeout_ms = 60'000;
  int64_t upstream_timeout_ms = 60'000;
  int eject_after = 3;
  size_t max_body_bytes = 8 * 1024 * 1024;
  size_t max_header_bytes = 16 * 1024;
  size_t max_connections = 10'000;
  int64_t header_timeout_ms = 10'000;
  int64_t body_timeout_ms = 30'000;
  int64_t idle_timeout_ms = 60'000;
  int64_t drain_timeout_ms = 30'000;
  int64_t config_poll_ms = 1'000;
  std::string access_log;
  std::string inference_dir;
  std::string otlp_endpoint;
  double trace_sample_ratio = -1;
  int64_t inference_period_s = 3'600;
  std::string log_level = "info";
  std::string log_format = "json";
};

struct MintFlags {
  std::string id;
  std::vector<std::string> endpoints;
};

// --upstreams a:1,b:2 → one endpoint "default" with one version whose replicas are those.
Result<gateway::EndpointTable> table_from_upstreams(const std::string& list, int64_t cap) {
  gateway::EndpointEntry endpoint;
  endpoint.name = "default";
  gateway::VersionEntry& version = endpoint.versions.emplace_back();
  version.name = "v1";
  version.traffic = 100;
  std::stringstream stream(list);
  std::string item;
  while (std::getline(stream, item, ',')) {
    FLOTILLA_ASSIGN_OR_RETURN(auto address, split_address(item));
    gateway::ReplicaEntry& replica = version.replicas.emplace_back();
    replica.id = "r" + std::to_string(version.replicas.size());
    replica.host = address.first;
    replica.port = address.second;
    replica.max_in_flight = cap;
  }
  gateway::EndpointTable table;
  table.endpoints.push_back(std::move(endpoint));
  FLOTILLA_RETURN_IF_ERROR(gateway::validate_endpoint_table(table));
  return table;
}

int fail(const std::string& message) {
  std::cerr << "flotilla gateway: " << message << "\n";
  return kExitBadInput;
}

int run_gateway(const GatewayFlags& flags) {
  if (Status status = init_logging(flags.log_level, flags.log_format, {.component = "gateway"});
      !status.is_ok()) {
    return fail(status.message());
  }
  if (int sources = !flags.config.empty() + !flags.upstreams.empty() + flags.kubernetes;
      sources != 1) {
    return fail("give exactly one of --config FILE, --upstreams HOST:PORT,... or --kubernetes");
  }
  if (!flags.kubernetes &&
      (!flags.kubeconfig.empty() || !flags.namespace_name.empty() || !flags.name.empty())) {
    return fail("--kubeconfig, --namespace and --name go with --kubernetes");
  }
  std::optional<kube::Client> kubernetes;
  if (flags.kubernetes) {
    auto config = kube::resolve_config(flags.kubeconfig, flags.namespace_name);
    if (!config.is_ok()) {
      return fail("--kubernetes: " + config.status().message());
    }
    kubernetes.emplace(std::move(config).value());
  }
  auto listen = split_address(flags.listen);
  if (!listen.is_ok()) {
    return fail("--listen: " + listen.status().message());
  }
  auto balancer = gateway::parse_balancer_kind(flags.balancer);
  if (!balancer.is_ok()) {
    return fail("--balancer: " + balancer.status().message());
  }
  gateway::EndpointTable table;
  gateway::AuthConfig auth;
  std::string default_endpoint = flags.default_endpoint;
  if (!flags.config.empty()) {
    auto config = gateway::load_gateway_config(flags.config);
    if (!config.is_ok()) {
      return fail(config.status().message());
    }
    table = std::move(config->table);
    auth = std::move(config->auth);
  } else if (flags.kubernetes) {
    auth.enabled = true;  // closed until the token ConfigMaps are read
  } else {
    auto parsed = table_from_upstreams(flags.upstreams, flags.max_in_flight);
    if (!parsed.is_ok()) {
      return fail("--upstreams: " + parsed.status().message());
    }
    table = std::move(parsed).value();
    if (default_endpoint.empty()) {
      default_endpoint = "default";
    }
  }

  gateway::GatewayOptions options;
  options.server.host = listen->first;
  options.server.port = listen->second;
  options.server.workers = flags.workers;
  options.server.max_body_bytes = flags.max_body_bytes;
  options.server.max_header_bytes = flags.max_header_bytes;
  options.server.max_connections = flags.max_connections;
  // Each client connection may hold an upstream one while its request is in flight.
  options.server.fd_share = 0.5;
  options.server.header_timeout = std::chrono::milliseconds(flags.header_timeout_ms);
  options.server.body_timeout = std::chrono::milliseconds(flags.body_timeout_ms);
  options.server.idle_timeout = std::chrono::milliseconds(flags.idle_timeout_ms);
  options.balancer = *balancer;
  options.queue_capacity = flags.queue_size;
  options.queue_timeout = std::chrono::milliseconds(flags.queue_timeout_ms);
  options.cold_start_timeout = std::chrono::milliseconds(flags.cold_start_timeout_ms);
  options.upstream_timeout = std::chrono::milliseconds(flags.upstream_timeout_ms);
  options.eject_after_failures = flags.eject_after;
  options.default_endpoint = default_endpoint;
  if (!flags.grpc_listen.empty()) {
    if (auto grpc_address = split_address(flags.grpc_listen); !grpc_address.is_ok()) {
      return fail("--grpc-listen: " + grpc_address.status().message());
    }
    options.grpc_listen = flags.grpc_listen;
  }
  options.access_log = flags.access_log;
  options.inference_dir = flags.inference_dir;
  options.inference_period = std::chrono::seconds(flags.inference_period_s);
  auto tracing = trace::tracer_options_from_env("flotilla-gateway", flags.otlp_endpoint,
                                                flags.trace_sample_ratio);
  if (!tracing.is_ok()) {
    std::cerr << "flotilla gateway: " << tracing.status().message() << "\n";
    return kExitBadInput;
  }
  options.tracing = std::move(tracing).value();

  MetricsRegistry& registry = default_registry();
  register_process_metrics(registry);
  auto created = gateway::Gateway::create(options, std::move(table), std::move(auth), registry);
  if (!created.is_ok()) {
    std::cerr << "flotilla gateway: " << created.status().message() << "\n";
    return created.status().code() == StatusCode::kInvalidArgument ? kExitBadInput
                                                                   : kExitCannotListen;
  }
  gateway::Gateway& gw = **created;
  if (!flags.config.empty()) {
    gw.watch_config(flags.config, std::chrono::milliseconds(flags.config_poll_ms));
  }
  // Kept up to date from the API server until the gateway has drained; the table it last saw
  // stays while a watch reconnects.
  std::optional<cluster::GatewayDiscovery> discovery;
  // Its 1 s samples and scale-from-zero requests go to the leading controller.
  std::optional<cluster::SampleReporter> reporter;
  if (kubernetes) {
    discovery.emplace(*kubernetes, gw, cluster::GatewayDiscovery::Options{});
    cluster::SampleReporter::Options reporting;
    reporting.gateway = instance_name(flags.name);
    reporter.emplace(*kubernetes, gw, *discovery, reporting);
    gw.set_capacity_requester(&*reporter);
    spdlog::info("discovering endpoints from {} in namespace {}",
                 kubernetes->config().server.text(), kubernetes->config().namespace_name);
  }
  gw.drain_on_signals(std::chrono::milliseconds(flags.drain_timeout_ms));
  // The first stdout line is for scripts and orchestrators: where to reach the gateway.
  nlohmann::json listening = {{"event", "listening"}, {"host", listen->first}, {"port", gw.port()}};
  if (gw.grpc_port() != 0) {
    listening["grpc_port"] = gw.grpc_port();
  }
  std::cout << listening.dump() << std::endl;
  spdlog::info("gateway listening on {}:{}", listen->first, gw.port());
  const bool clean = gw.run();
  gw.set_capacity_requester(nullptr);
  reporter.reset();
  discovery.reset();
  spdlog::info(clean ? "drained, exiting" : "drain timed out, exiting");
  return clean ? 0 : kExitDrainTimeout;
}

int run_mint_token(const MintFlags& flags) {
  auto minted = auth::generate_token(flags.id, flags.endpoints);
  if (!minted.is_ok()) {
    return fail(minted.status().message());
  }
  // The token goes to stdout once; only the record (a salted hash) belongs in the config.
  std::cout << "token: " << minted->token << "\n"
            << "config (under auth.tokens):\n  - " << gateway::token_record_yaml(minted->record)
            << "\n";
  return 0;
}

}  // namespace

Result<std::pair<std::string, uint16_t>> split_address(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return invalid_argument("'" + address + "' is not host:port");
  }
  try {
    const int port = std::stoi(address.substr(colon + 1));
    if (port < 0 || port > 65535) {
      return invalid_argument("port in '" + address + "' must be 0 to 65535");
    }
    return std::make_pair(address.substr(0, colon), static_cast<uint16_t>(port));
  } catch (const std::exception&) {
    return invalid_argument("port in '" + address + "' is not a number");
  }
}

std::function<int()> add_gateway_command(CLI::App& app) {
  auto flags = std::make_shared<GatewayFlags>();
  auto mint = std::make_shared<MintFlags>();
  CLI::App* cmd = app.add_subcommand(
      "gateway",
      "Serve the gateway: auth, routing, power-of-two-choices balancing, admission queue, "
      "retries, in front of the replicas of an endpoint table.");
  cmd->add_option("--listen", flags->listen, "Address to listen on; port 0 picks a free one")
      ->capture_default_str();
  cmd->add_option("--grpc-listen", flags->grpc_listen,
                  "Also serve the Open Inference Protocol over gRPC here (host:port; port 0 "
                  "picks a free one; default: no gRPC)");
  cmd->add_option("--config", flags->config,
                  "YAML endpoint table (and auth); reloaded when the file changes");
  cmd->add_option("--upstreams", flags->upstreams,
                  "Comma-separated host:port list served as endpoint 'default' on every path");
  cmd->add_flag("--kubernetes", flags->kubernetes,
                "Serve the ServingEndpoints of a Kubernetes namespace: their replicas from the "
                "EndpointSlices of their versions' Services, tokens from ConfigMaps labelled "
                "flotilla.dev/token=true (docs/kubernetes.md)");
  cmd->add_option("--kubeconfig", flags->kubeconfig,
                  "With --kubernetes: the kubeconfig to use (default: in-cluster when in a pod, "
                  "else $KUBECONFIG, else ~/.kube/config)");
  cmd->add_option("--name", flags->name,
                  "With --kubernetes: this gateway's name in the fleet's samples to the "
                  "controller (default: $POD_NAME, else host-pid)");
  cmd->add_option("--namespace", flags->namespace_name,
                  "With --kubernetes: the namespace (default: the kubeconfig context's, or the "
                  "pod's)");
  cmd->add_option("--default-endpoint", flags->default_endpoint,
                  "Endpoint that receives paths no route claims (default: none, 404)");
  cmd->add_option("--max-in-flight", flags->max_in_flight,
                  "With --upstreams: per-upstream concurrency cap (0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000}))
      ->capture_default_str();
  cmd->add_option("--workers", flags->workers, "Event-loop threads (0: one per core)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  add_balancer_flag(*cmd, flags->balancer);
  cmd->add_option("--queue-size", flags->queue_size,
                  "Requests that may wait per endpoint when every replica is at its cap")
      ->check(CLI::Range(size_t{0}, size_t{1'000'000}))
      ->capture_default_str();
  cmd->add_option("--queue-timeout-ms", flags->queue_timeout_ms,
                  "How long a request may wait for a replica before 429")
      ->check(CLI::Range(int64_t{0}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--cold-start-timeout-ms", flags->cold_start_timeout_ms,
                  "How long a request waits for an endpoint with no ready replica before 503")
      ->check(CLI::Range(int64_t{0}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--upstream-timeout-ms", flags->upstream_timeout_ms,
                  "How long a replica may take to answer before 504")
      ->check(CLI::Range(int64_t{1}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--eject-after", flags->eject_after,
                  "Consecutive failures that eject a replica until it answers a probe")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", flags->max_body_bytes, "Largest request body (413 above)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 32))
      ->capture_default_str();
  cmd->add_option("--max-header-bytes", flags->max_header_bytes,
                  "Largest request header (431 above)")
      ->check(CLI::Range(size_t{256}, size_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--max-connections", flags->max_connections,
                  "Open client connections at most (503 above); lowered to fit the open-file "
                  "limit (docs/gateway.md)")
      ->check(CLI::Range(size_t{1}, size_t{1'000'000}))
      ->capture_default_str();
  cmd->add_option("--header-timeout-ms", flags->header_timeout_ms,
                  "Time to receive a request header")
      ->check(CLI::Range(int64_t{1}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--body-timeout-ms", flags->body_timeout_ms, "Time to receive a request body")
      ->check(CLI::Range(int64_t{1}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--idle-timeout-ms", flags->idle_timeout_ms,
                  "Idle keep-alive connection lifetime")
      ->check(CLI::Range(int64_t{1}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--drain-timeout-ms", flags->drain_timeout_ms,
                  "On SIGTERM, how long in-flight requests may take before exit")
      ->check(CLI::Range(int64_t{0}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--config-poll-ms", flags->config_poll_ms, "How often --config is checked")
      ->check(CLI::Range(int64_t{10}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--access-log", flags->access_log,
                  "JSON access log: a file path, or - for stderr (default: none)");
  cmd->add_option("--inference-dir", flags->inference_dir,
                  "Where endpoints that enable an inference table have it written, one "
                  "directory each (default: none, nothing recorded)");
  cmd->add_option("--inference-period-s", flags->inference_period_s,
                  "How long each inference table file is written before the next begins")
      ->check(CLI::Range(int64_t{1}, int64_t{86'400}))
      ->capture_default_str();
  add_tracing_flags(*cmd, flags->otlp_endpoint, flags->trace_sample_ratio);
  cmd->add_option("--log-level", flags->log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  add_log_format_flag(*cmd, flags->log_format);

  CLI::App* mint_cmd = cmd->add_subcommand(
      "mint-token", "Create an API token: prints it once, with the salted hash for the config");
  mint_cmd->add_option("--id", mint->id, "Public token id ([A-Za-z0-9-], up to 64)")->required();
  mint_cmd->add_option("--endpoint", mint->endpoints,
                       "Endpoint the token may call (repeat; none: all)");

  return [mint_cmd, flags, mint]() -> int {
    if (mint_cmd->parsed()) {
      return run_mint_token(*mint);
    }
    return run_gateway(*flags);
  };
}

}  // namespace flotilla::cli

// `flotilla controller`: Kubernetes mode's control plane (docs/kubernetes.md). Elects a leader
// among its replicas on a Lease; the leader reconciles the namespace's ServingEndpoints into
// Deployments and Services and autoscales them on the gateways' samples. Serves on --api-addr
// GET /health (and whether it leads), POST /v1/samples (the gateways' reports) and the REST API
// of `flotilla up` (/api/2.0/..., /metrics) over ServingEndpoints and token Secrets.
#include <cstring>
#include <iostream>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cluster/cluster.h"
#include "common/common.h"
#include "control/control_api.h"
#include "control/control_metrics.h"
#include "http/http.h"
#include "kube/kube.h"

namespace flotilla::cli {
namespace {

struct ControllerFlags {
  std::string kubeconfig;
  std::string namespace_name;
  std::string identity;
  std::string api_addr = "127.0.0.1:8081";
  std::string advertise_address;
  std::string gateway_url = "http://flotilla-gateway:8080";
  std::string image = "flotilla:latest";
  int64_t lease_duration_ms = 15'000;
  int64_t renew_deadline_ms = 10'000;
  int64_t retry_period_ms = 2'000;
  int64_t resync_ms = 30'000;
  AutoscalingFlags autoscaling;
  std::string log_level = "info";
  std::string log_format = "json";
};

// Where gateways reach this controller: --advertise-address, else $POD_IP (or the listen host)
// with the port it listens on.
std::string advertised_address(const ControllerFlags& flags, const std::string& listen_host,
                               uint16_t port) {
  if (!flags.advertise_address.empty()) {
    return flags.advertise_address;
  }
  const char* pod_ip = std::getenv("POD_IP");
  const std::string host = pod_ip != nullptr && *pod_ip != '\0' ? pod_ip : listen_host;
  return host + ":" + std::to_string(port);
}

http::Response json_response(int status, const nlohmann::json& body) {
  return {status, "application/json", body.dump(), {}};
}

bool is_api_path(std::string_view path) {
  return path.starts_with("/api/") || path == "/metrics" || control::is_dashboard_path(path);
}

int fail(const std::string& message) {
  std::cerr << "flotilla controller: " << message << "\n";
  return kExitBadInput;
}

int run_controller(const ControllerFlags& flags) {
  if (Status status = init_logging(flags.log_level, flags.log_format, {.component = "controller"});
      !status.is_ok()) {
    return fail(status.message());
  }
  if (flags.renew_deadline_ms >= flags.lease_duration_ms ||
      flags.retry_period_ms >= flags.renew_deadline_ms) {
    return fail("need --retry-period-ms < --renew-deadline-ms < --lease-duration-ms");
  }
  auto listen = split_address(flags.api_addr);
  if (!listen.is_ok()) {
    return fail("--api-addr: " + listen.status().message());
  }
  auto config = kube::resolve_config(flags.kubeconfig, flags.namespace_name);
  if (!config.is_ok()) {
    return fail(config.status().message());
  }
  StopSignals signals;

  kube::Client client(std::move(config).value());
  // The server first: the Lease carries the port it got.
  std::unique_ptr<cluster::Controller> controller;
  std::unique_ptr<cluster::ClusterApi> api_service;
  std::unique_ptr<control::ApiRoutes> api_routes;
  http::ServerOptions server_options;
  server_options.host = listen->first;
  server_options.port = listen->second;
  control::ApiRoutes::configure_server(server_options);
  // A gateway's report carries up to five seconds of samples per endpoint.
  server_options.max_body_bytes = 4 * 1024 * 1024;
  // Each API call waits on the Kubernetes API server: more workers than `flotilla up`'s one,
  // so that a slow call does not hold up the gateways' reports and /health. ClusterApi keeps
  // no state of its own and the controller's report intake locks.
  server_options.workers = 4;
  cluster::ReportKeyCheck report_key(client);
  auto server = http::Server::create(server_options, [&](http::Request&& request,
                                                         http::Responder&& responder) {
    const std::string path = request.target.substr(0, request.target.find('?'));
    if (is_api_path(path)) {
      responder.send(api_routes->handle(request));
      return;
    }
    if (path == "/health" && request.method == http::Method::kGet) {
      responder.send(json_response(200, {{"status", "ok"}, {"leading", controller->leading()}}));
      return;
    }
    if (path == "/v1/samples" && request.method == http::Method::kPost) {
      if (!report_key.allows(http::find_header(request.headers, "authorization"))) {
        responder.send(
            json_response(401, {{"error_code", "UNAUTHENTICATED"},
                                {"message", "a report needs the key of the Secret " +
                                                std::string(cluster::kReportKeySecret)}}));
        return;
      }
      Result<cluster::SampleReport> report = cluster::parse_sample_report(request.body);
      if (!report.is_ok()) {
        responder.send(json_response(400, {{"error_code", "INVALID_PARAMETER_VALUE"},
                                           {"message", report.status().message()}}));
        return;
      }
      if (!controller->leading()) {
        // The gateway reads the Lease again and finds the leader.
        responder.send(json_response(
            503, {{"error_code", "TEMPORARILY_UNAVAILABLE"}, {"message", "not the leader"}}));
        return;
      }
      controller->add_report(*report);
      responder.send(json_response(200, nlohmann::json::object()));
      return;
    }
    responder.send(
        json_response(404, {{"error_code", "ENDPOINT_NOT_FOUND"},
                            {"message",
                             "the controller serves GET /health, POST /v1/samples, /metrics and "
                             "/api/2.0/serving-endpoints and /api/2.0/tokens"}}));
  });
  if (!server.is_ok()) {
    std::cerr << "flotilla controller: " << server.status().message() << "\n";
    return kExitCannotListen;
  }

  cluster::Controller::Options options;
  options.replica.image = flags.image;
  // Tracing settings pass to the replica pods as they do to `flotilla up`'s replicas; headers
  // stay out of pod specs (they may hold credentials).
  for (const char* variable :
       {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_TRACES_SAMPLER_ARG", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_BSP_SCHEDULE_DELAY",
        "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_BSP_EXPORT_TIMEOUT"}) {
    if (const char* value = std::getenv(variable); value != nullptr && *value != '\0') {
      options.replica.env.emplace_back(variable, value);
    }
  }
  options.election.lease_name = std::string(cluster::kControllerLease);
  options.election.identity = instance_name(flags.identity);
  options.election.lease_duration = std::chrono::milliseconds(flags.lease_duration_ms);
  options.election.renew_deadline = std::chrono::milliseconds(flags.renew_deadline_ms);
  options.election.retry_period = std::chrono::milliseconds(flags.retry_period_ms);
  options.resync = std::chrono::milliseconds(flags.resync_ms);
  options.autoscaling = flags.autoscaling.options();
  options.autoscaling.hedge_starts = true;  // pods start on many nodes
  const std::string advertised = advertised_address(flags, listen->first, (*server)->port());
  options.election.annotations[std::string(cluster::kControllerAddressAnnotation)] = advertised;
  controller = std::make_unique<cluster::Controller>(client, options);
  api_service = std::make_unique<cluster::ClusterApi>(
      client,
      cluster::ClusterApi::Options{
          "http://" + advertised, flags.gateway_url,
          [&controller] { return controller->leading(); },
          [&controller](const std::string& name, int64_t seconds) -> Result<nlohmann::json> {
            if (!controller->leading()) {
              return unavailable(
                  "this controller does not lead; the leader (its address is on the Lease " +
                  std::string(cluster::kControllerLease) + ") keeps the endpoints' metrics");
            }
            return control::metrics_window_to_json(
                name, seconds,
                controller->metrics_history().window(name, real_clock().unix_ms(), seconds));
          }});
  api_routes = std::make_unique<control::ApiRoutes>(*api_service, /*metrics_open=*/false,
                                                    "kubectl get secret " +
                                                        std::string(cluster::kAdminTokenSecret) +
                                                        " -o jsonpath='{.data.token}' | base64 -d");
  if (Status moved = api_service->move_token_secrets(); !moved.is_ok()) {
    spdlog::warn("token Secrets: {}", moved.message());
  }
  if (Status minted = api_service->ensure_admin_token(); !minted.is_ok()) {
    // The API server may not answer yet; a later start (or another replica) mints it.
    spdlog::warn("admin token: {}", minted.message());
  }
  if (Result<std::string> key = cluster::read_report_key(client, /*mint=*/true); !key.is_ok()) {
    // Minted later, when a gateway's report finds none.
    spdlog::warn("the gateways' report key: {}", key.status().message());
  }

  std::thread api([&] { (*server)->run(); });
  std::thread reconciler([&] { controller->run(); });
  const nlohmann::json listening = {
      {"event", "listening"}, {"host", listen->first}, {"port", (*server)->port()}};
  std::cout << listening.dump() << std::endl;
  spdlog::info("controller {} in namespace {} of {}", options.election.identity,
               client.config().namespace_name, client.config().server.text());

  const int received = signals.wait();
  spdlog::info("{}: shutting down", strsignal(received));
  controller->stop();  // releases the Lease: another controller takes over at once
  reconciler.join();
  (*server)->drain(std::chrono::seconds(5));
  api.join();
  return 0;
}

}  // namespace

std::function<int()> add_controller_command(CLI::App& app) {
  auto flags = std::make_shared<ControllerFlags>();
  CLI::App* cmd = app.add_subcommand(
      "controller",
      "Kubernetes mode's control plane: reconciles ServingEndpoints into Deployments and "
      "Services, leader-elected on a Lease (docs/kubernetes.md).");
  cmd->add_option("--kubeconfig", flags->kubeconfig,
                  "Kubeconfig (default: in-cluster when in a pod, else $KUBECONFIG, else "
                  "~/.kube/config)");
  cmd->add_option("--namespace", flags->namespace_name,
                  "Namespace (default: the kubeconfig context's, or the pod's)");
  cmd->add_option("--identity", flags->identity,
                  "This candidate's name on the Lease (default: $POD_NAME, else host-pid)");
  cmd->add_option("--api-addr", flags->api_addr,
                  "Where the REST API, GET /health and the gateways' POST /v1/samples are "
                  "served")
      ->capture_default_str();
  cmd->add_option("--advertise-address", flags->advertise_address,
                  "host:port where gateways reach this controller, written on the Lease while "
                  "it leads (default: $POD_IP, else the --api-addr host, with its port)");
  cmd->add_option("--gateway-url", flags->gateway_url,
                  "Where clients reach the gateways, as GET /api/2.0/info says")
      ->capture_default_str();
  cmd->add_option("--image", flags->image, "The image replica pods run")->capture_default_str();
  cmd->add_option("--lease-duration-ms", flags->lease_duration_ms,
                  "How long a silent leader's Lease stands before another takes over")
      ->check(CLI::Range(int64_t{100}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--renew-deadline-ms", flags->renew_deadline_ms,
                  "How long a leader tries to renew before it stops leading")
      ->check(CLI::Range(int64_t{50}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--retry-period-ms", flags->retry_period_ms, "How often the Lease is tried")
      ->check(CLI::Range(int64_t{10}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--resync-ms", flags->resync_ms,
                  "How often every endpoint is reconciled even without a change")
      ->check(CLI::Range(int64_t{100}, int64_t{3'600'000}))
      ->capture_default_str();
  add_autoscaling_flags(*cmd, flags->autoscaling);
  cmd->add_option("--log-level", flags->log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  add_log_format_flag(*cmd, flags->log_format);
  return [flags]() {
    return run_controller(*flags);
  };
}

}  // namespace flotilla::cli

// `flotilla controller`: Kubernetes mode's control plane (docs/kubernetes.md). Elects a leader
// among its replicas on a Lease; the leader reconciles the namespace's ServingEndpoints into
// Deployments and Services. Serves GET /health (and whether it leads) on --api-addr.
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
#include "http/http.h"
#include "kube/kube.h"

namespace flotilla::cli {
namespace {

struct ControllerFlags {
  std::string kubeconfig;
  std::string namespace_name;
  std::string identity;
  std::string api_addr = "127.0.0.1:8081";
  std::string image = "flotilla:latest";
  int64_t lease_duration_ms = 15'000;
  int64_t renew_deadline_ms = 10'000;
  int64_t retry_period_ms = 2'000;
  int64_t resync_ms = 30'000;
  std::string log_level = "info";
};

int fail(const std::string& message) {
  std::cerr << "flotilla controller: " << message << "\n";
  return kExitBadInput;
}

// This candidate's name: --identity, else the pod's name, else the host name and pid.
std::string identity_of(const ControllerFlags& flags) {
  if (!flags.identity.empty()) {
    return flags.identity;
  }
  if (const char* pod = std::getenv("POD_NAME"); pod != nullptr && *pod != '\0') {
    return pod;
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return std::string(host) + "-" + std::to_string(::getpid());
}

int run_controller(const ControllerFlags& flags) {
  if (Status status = init_logging(flags.log_level); !status.is_ok()) {
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
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  kube::Client client(std::move(config).value());
  cluster::Controller::Options options;
  options.replica.image = flags.image;
  options.election.lease_name = "flotilla-controller";
  options.election.identity = identity_of(flags);
  options.election.lease_duration = std::chrono::milliseconds(flags.lease_duration_ms);
  options.election.renew_deadline = std::chrono::milliseconds(flags.renew_deadline_ms);
  options.election.retry_period = std::chrono::milliseconds(flags.retry_period_ms);
  options.resync = std::chrono::milliseconds(flags.resync_ms);
  cluster::Controller controller(client, options);

  http::ServerOptions server_options;
  server_options.host = listen->first;
  server_options.port = listen->second;
  server_options.workers = 1;
  auto server = http::Server::create(server_options, [&controller](http::Request&& request,
                                                                   http::Responder&& responder) {
    const std::string path = request.target.substr(0, request.target.find('?'));
    if (path == "/health") {
      responder.send({200,
                      "application/json",
                      nlohmann::json{{"status", "ok"}, {"leading", controller.leading()}}.dump(),
                      {}});
      return;
    }
    const nlohmann::json error = {
        {"error_code", "ENDPOINT_NOT_FOUND"},
        {"message",
         "the controller serves only GET /health; endpoints are ServingEndpoint objects"}};
    responder.send({404, "application/json", error.dump(), {}});
  });
  if (!server.is_ok()) {
    std::cerr << "flotilla controller: " << server.status().message() << "\n";
    return kExitCannotListen;
  }
  std::thread api([&] { (*server)->run(); });
  std::thread reconciler([&] { controller.run(); });
  const nlohmann::json listening = {
      {"event", "listening"}, {"host", listen->first}, {"port", (*server)->port()}};
  std::cout << listening.dump() << std::endl;
  spdlog::info("controller {} in namespace {} of {}", options.election.identity,
               client.config().namespace_name, client.config().server.text());

  int received = 0;
  sigwait(&signals, &received);
  spdlog::info("{}: shutting down", strsignal(received));
  controller.stop();  // releases the Lease: another controller takes over at once
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
  cmd->add_option("--api-addr", flags->api_addr, "Where GET /health is served")
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
  cmd->add_option("--log-level", flags->log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  return [flags]() {
    return run_controller(*flags);
  };
}

}  // namespace flotilla::cli

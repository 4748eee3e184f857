// A gateway's load samples and capacity requests, posted to the leading controller.
#include <algorithm>
#include <charconv>

#include <spdlog/spdlog.h>

#include "cluster/cluster.h"
#include "http/http.h"

namespace flotilla::cluster {

SampleReporter::SampleReporter(kube::Client& client, const gateway::GatewaySink& gateway,
                               GatewayDiscovery& discovery, Options options)
    : client_(client),
      gateway_(gateway),
      discovery_(discovery),
      options_(std::move(options)),
      thread_([this] { run(); }) {}

SampleReporter::~SampleReporter() {
  stop();
  if (thread_.joinable()) {
    thread_.join();
  }
}

void SampleReporter::stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
}

void SampleReporter::request_capacity(const std::string& endpoint) {
  {
    MutexLock lock(mu_);
    capacity_.push_back(endpoint);
  }
  wake_.notify_all();
}

void SampleReporter::run() {
  auto next = std::chrono::steady_clock::now() + options_.period;
  while (true) {
    std::vector<std::string> capacity;
    {
      MutexLock lock(mu_);
      while (!stopping_ && capacity_.empty() && wake_.wait_until(mu_, next)) {
      }
      if (stopping_) {
        return;
      }
      capacity.swap(capacity_);
    }
    if (std::chrono::steady_clock::now() >= next) {
      next = std::chrono::steady_clock::now() + options_.period;
    }
    for (const std::string& endpoint : capacity) {
      // Once each: requests keep asking while the controller cannot be reached.
      if (std::find(unsent_capacity_.begin(), unsent_capacity_.end(), endpoint) ==
          unsent_capacity_.end()) {
        unsent_capacity_.push_back(endpoint);
      }
    }
    if (report(unsent_capacity_)) {
      unsent_capacity_.clear();
    }
  }
}

bool SampleReporter::report(const std::vector<std::string>& capacity) {
  if (controller_.empty()) {
    Result<kube::Reply> lease = client_.get(kube::object_path(
        kube::kLeases, client_.config().namespace_name, std::string(kControllerLease)));
    if (!lease.is_ok() || !lease->ok()) {
      spdlog::debug("no controller Lease to read yet");
      return false;
    }
    controller_ =
        kube::string_field(kube::field(kube::field(lease->body, "metadata"), "annotations"),
                           kControllerAddressAnnotation);
  }
  const size_t colon = controller_.rfind(':');
  uint16_t port = 0;
  if (colon == std::string::npos ||
      std::from_chars(controller_.data() + colon + 1, controller_.data() + controller_.size(), port)
              .ec != std::errc() ||
      port == 0) {
    spdlog::debug("the controller Lease names no address: '{}'", controller_);
    controller_.clear();
    return false;
  }
  if (key_.empty()) {
    Result<std::string> key = read_report_key(client_, /*mint=*/false);
    if (key.is_ok()) {
      key_ = std::move(key).value();
    } else if (key.status().code() != StatusCode::kNotFound) {
      spdlog::debug("the report key: {}", key.status().message());
      return false;
    }
    // No Secret: the report goes without a key, so that the controller, refusing it, mints one.
  }
  SampleReport report{options_.gateway, {}, capacity};
  for (const std::string& endpoint : discovery_.endpoint_names()) {
    report.endpoints[endpoint] = gateway_.samples(endpoint, options_.seconds);
  }
  http::ClientRequest request;
  request.method = http::Method::kPost;
  request.target = "/v1/samples";
  request.headers.push_back({"Content-Type", "application/json"});
  if (!key_.empty()) {
    request.headers.push_back({"Authorization", "Bearer " + key_});
  }
  request.body = sample_report_to_json(report);
  const http::ClientResponse response =
      http::fetch(controller_.substr(0, colon), port, std::move(request), options_.timeout);
  if (response.failure != http::UpstreamFailure::kNone || response.status != 200) {
    // The leader may have changed: read the Lease again for the next report.
    spdlog::debug("samples to the controller at {}: {}", controller_,
                  response.failure != http::UpstreamFailure::kNone
                      ? response.error
                      : "HTTP " + std::to_string(response.status));
    controller_.clear();
    if (response.status == 401) {
      key_.clear();  // rotated: read its Secret again
    }
    return false;
  }
  return true;
}

}  // namespace flotilla::cluster

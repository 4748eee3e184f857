// The vertical autoscaler's readings in Kubernetes mode: each ready replica pod's own /metrics,
// read by the controller (the NetworkPolicy lets it reach replica pods), as `flotilla up`'s
// orchestrator reads its replica processes.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <thread>

#include "cluster/cluster.h"
#include "http/http.h"

namespace flotilla::cluster {
namespace {

using kube::field;
using nlohmann::json;

bool pod_ready(const json& pod) {
  if (!kube::string_field(field(pod, "metadata"), "deletionTimestamp").empty()) {
    return false;
  }
  const json& conditions = field(field(pod, "status"), "conditions");
  if (conditions.is_array()) {
    for (const json& condition : conditions) {
      if (kube::string_field(condition, "type") == "Ready") {
        return kube::string_field(condition, "status") == "True";
      }
    }
  }
  return false;
}

}  // namespace

std::vector<PodTarget> ready_pod_targets(const json& pod_list) {
  std::vector<PodTarget> targets;
  const json& items = field(pod_list, "items");
  if (!items.is_array()) {
    return targets;
  }
  for (const json& pod : items) {
    const std::string host = kube::string_field(field(pod, "status"), "podIP");
    const json& containers = field(field(pod, "spec"), "containers");
    if (!pod_ready(pod) || host.empty() || !containers.is_array() || containers.empty()) {
      continue;
    }
    const json& ports = field(containers[0], "ports");
    const int64_t port =
        ports.is_array() && !ports.empty() ? kube::integer_field(ports[0], "containerPort", 0) : 0;
    if (port <= 0 || port > 65535) {
      continue;
    }
    targets.push_back({kube::string_field(field(pod, "metadata"), "name"),
                       kube::string_field(field(field(pod, "metadata"), "labels"), kVersionLabel),
                       host, static_cast<uint16_t>(port)});
  }
  return targets;
}

PodUsage::PodUsage(kube::Client& client, std::chrono::milliseconds deadline)
    : client_(client), deadline_(deadline) {}

PodUsage::Reading PodUsage::read(const std::string& endpoint,
                                 const std::map<std::string, double>& cores_of_version) {
  Reading result;
  Result<kube::Reply> reply = client_.get(
      kube::collection_path(kube::kPods, client_.config().namespace_name),
      "labelSelector=" + kube::query_escape(std::string(kEndpointLabel) + "=" + endpoint));
  if (!reply.is_ok() || !reply->ok()) {
    // Unknown, not zero: the vertical policy waits for a reading.
    result.usage.queued = std::nullopt;
    return result;
  }
  const std::vector<PodTarget> targets = ready_pod_targets(reply->body);
  // Every pod's /metrics on a thread of its own, each fetch ending by the deadline: a slow
  // pod costs the deadline once, not once per pod.
  const auto until = std::chrono::steady_clock::now() + deadline_;
  std::vector<control::UsageCounters> readings(targets.size());
  // One byte each (not vector<bool>'s bits): the readers write them concurrently.
  std::vector<char> answered(targets.size(), 0);
  constexpr size_t kParallel = 64;
  for (size_t begin = 0; begin < targets.size(); begin += kParallel) {
    std::vector<std::thread> readers;
    for (size_t i = begin; i < std::min(targets.size(), begin + kParallel); ++i) {
      readers.emplace_back([&, i] {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            until - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
          return;
        }
        http::ClientRequest request;
        request.method = http::Method::kGet;
        request.target = "/metrics";
        const http::ClientResponse response =
            http::fetch(targets[i].host, targets[i].port, std::move(request), left);
        if (response.failure != http::UpstreamFailure::kNone || response.status != 200) {
          return;
        }
        control::UsageCounters& reading = readings[i];
        // A value that is not a finite count (a replica of another make) is unknown.
        const auto finite = [](std::optional<double> value) {
          return value && std::isfinite(*value) && *value >= 0 ? value : std::nullopt;
        };
        reading.cpu_seconds =
            finite(metric_value(response.body, "process_cpu_seconds_total")).value_or(-1);
        reading.queue_wait_seconds =
            finite(metric_value(response.body, "flotilla_replica_queue_wait_seconds_total"));
        reading.at = std::chrono::steady_clock::now();
        answered[i] = 1;
      });
    }
    for (std::thread& reader : readers) {
      reader.join();
    }
  }
  std::map<std::string, control::UsageCounters>& previous = previous_[endpoint];
  std::map<std::string, control::UsageCounters> now;
  std::vector<control::UsageChange> changes;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (answered[i] == 0) {
      continue;
    }
    const auto cores = cores_of_version.find(targets[i].version);
    readings[i].cores = cores != cores_of_version.end() && cores->second > 0 ? cores->second : 1;
    control::UsageChange change;
    change.now = readings[i];
    if (const auto before = previous.find(targets[i].name); before != previous.end()) {
      change.before = before->second;
    }
    now[targets[i].name] = readings[i];
    changes.push_back(change);
  }
  previous = std::move(now);  // pods gone, or not answering, start afresh
  result.usage = control::usage_from_changes(changes);
  result.replicas_read = static_cast<int64_t>(changes.size());
  return result;
}

void PodUsage::retain(const std::vector<std::string>& endpoints) {
  std::erase_if(previous_, [&](const auto& entry) {
    return std::find(endpoints.begin(), endpoints.end(), entry.first) == endpoints.end();
  });
}

}  // namespace flotilla::cluster

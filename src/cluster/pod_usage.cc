// The vertical autoscaler's readings in Kubernetes mode: each ready replica pod's own /metrics,
// read by the controller (the NetworkPolicy lets it reach replica pods), as `flotilla up`'s
// orchestrator reads its replica processes.
#include <algorithm>
#include <cmath>

#include "cluster/cluster.h"
#include "http/http.h"

namespace flotilla::cluster {
namespace {

using kube::field;
using nlohmann::json;

}  // namespace

bool pod_ready(const json& pod) {
  return kube::string_field(field(pod, "metadata"), "deletionTimestamp").empty() &&
         kube::string_field(kube::condition(field(pod, "status"), "Ready"), "status") == "True";
}

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
                       kube::label(pod, kVersionLabel), host, static_cast<uint16_t>(port)});
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
  std::vector<std::pair<std::string, uint16_t>> origins;
  origins.reserve(targets.size());
  for (const PodTarget& target : targets) {
    origins.emplace_back(target.host, target.port);
  }
  const std::vector<http::ClientResponse> responses =
      http::fetch_each(origins, "/metrics", deadline_);
  const auto at = std::chrono::steady_clock::now();
  // A value that is not a finite count (a replica of another make) is unknown.
  const auto finite = [](std::optional<double> value) {
    return value && std::isfinite(*value) && *value >= 0 ? value : std::nullopt;
  };
  std::map<std::string, control::UsageCounters>& previous = previous_[endpoint];
  std::map<std::string, control::UsageCounters> now;
  std::vector<control::UsageChange> changes;
  for (size_t i = 0; i < targets.size(); ++i) {
    const http::ClientResponse& response = responses[i];
    if (response.failure != http::UpstreamFailure::kNone || response.status != 200) {
      continue;
    }
    const auto cores = cores_of_version.find(targets[i].version);
    control::UsageChange change;
    change.now.cpu_seconds =
        finite(metric_value(response.body, "process_cpu_seconds_total")).value_or(-1);
    change.now.queue_wait_seconds =
        finite(metric_value(response.body, "flotilla_replica_queue_wait_seconds_total"));
    change.now.cores = cores != cores_of_version.end() && cores->second > 0 ? cores->second : 1;
    change.now.at = at;
    if (const auto before = previous.find(targets[i].name); before != previous.end()) {
      change.before = before->second;
    }
    now[targets[i].name] = change.now;
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

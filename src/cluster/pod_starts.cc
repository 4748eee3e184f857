// How replica pods start and restart, for the autoscaler (its spare and hedged starts).
#include <map>

#include "cluster/cluster.h"

namespace flotilla::cluster {

using kube::field;
using nlohmann::json;

int64_t pod_restarts(const json& pod) {
  int64_t restarts = 0;
  const json& containers = field(field(pod, "status"), "containerStatuses");
  if (containers.is_array()) {
    for (const json& container : containers) {
      restarts += kube::integer_field(container, "restartCount", 0);
    }
  }
  return restarts;
}

std::optional<int64_t> newest_pod_start_ms(const kube::Reflector::Objects& pods,
                                           std::string_view endpoint) {
  std::optional<int64_t> newest_ready_ms;
  std::optional<int64_t> took_ms;
  for (const auto& [name, pod] : pods) {
    if (kube::label(pod, kEndpointLabel) != endpoint || !pod_ready(pod)) {
      continue;
    }
    // A container that restarted made its pod ready again long after the pod was created: that
    // is a restart's time, not a start's.
    if (!field(field(pod, "status"), "containerStatuses").is_array()) {
      continue;
    }
    const bool restarted = pod_restarts(pod) > 0;
    const int64_t created =
        kube::unix_ms_of(kube::string_field(field(pod, "metadata"), "creationTimestamp"));
    const int64_t ready = kube::unix_ms_of(
        kube::string_field(kube::condition(field(pod, "status"), "Ready"), "lastTransitionTime"));
    if (restarted || created <= 0 || ready < created) {
      continue;
    }
    if (!newest_ready_ms || ready > *newest_ready_ms) {
      newest_ready_ms = ready;
      took_ms = ready - created;
    }
  }
  return took_ms;
}

int64_t PodRestarts::update(const kube::Reflector::Objects& pods, std::string_view endpoint) {
  std::map<std::string, int64_t> seen;
  for (const auto& [name, pod] : pods) {
    if (kube::label(pod, kEndpointLabel) != endpoint) {
      continue;
    }
    const int64_t restarts = pod_restarts(pod);
    const auto before = last_.find(name);
    // The first update is the baseline; a pod first seen later counts all its restarts.
    const int64_t since = before != last_.end() ? before->second : (baseline_taken_ ? 0 : restarts);
    total_ += std::max<int64_t>(0, restarts - since);
    seen[name] = restarts;
  }
  last_ = std::move(seen);
  baseline_taken_ = true;
  return total_;
}

}  // namespace flotilla::cluster

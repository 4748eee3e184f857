// An endpoint's last hour at 1 s resolution, as the dashboard, `flotilla top` and
// GET /api/2.0/serving-endpoints/{name}/metrics read it: the gateway's load samples (requests by
// status code, latency quantiles, in-flight, queue) with the replicas by version and state and
// the autoscaler's decision as they were in that second. `flotilla up`'s control plane and
// Kubernetes mode's leading controller each keep one. A public part of the control module.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/common.h"

namespace flotilla::control {

// Replicas by version, then by state ("ready", "starting", ...).
using ReplicaCounts = std::map<std::string, std::map<std::string, int64_t>>;

// One second of an endpoint.
struct EndpointSecond {
  LoadSample load;
  ReplicaCounts replicas;
  std::optional<int64_t> desired_replicas;  // the autoscaler's, when it runs
  std::optional<double> target_concurrency;
};

// The longest window the history answers for, and the default.
inline constexpr int64_t kMetricsWindowMaxSeconds = 3600;
inline constexpr int64_t kMetricsWindowDefaultSeconds = 300;

// A window as the metrics route takes it: whole seconds, or a count with "s", "m" or "h"
// ("90", "90s", "15m", "1h"), from 1 s to an hour. Errors: kInvalidArgument saying so.
Result<int64_t> parse_metrics_window(std::string_view text);

// Thread-safe: the reconciler records while the API reads.
class MetricsHistory {
 public:
  explicit MetricsHistory(size_t kept = kMetricsWindowMaxSeconds) : kept_(kept) {}
  MetricsHistory(const MetricsHistory&) = delete;
  MetricsHistory& operator=(const MetricsHistory&) = delete;

  // Adds the samples newer than the endpoint's newest one, each with the replicas and the
  // autoscaler's decision as they are now; keeps the newest `kept` seconds.
  void record(const std::string& endpoint, const std::vector<LoadSample>& samples,
              const ReplicaCounts& replicas, std::optional<int64_t> desired_replicas,
              std::optional<double> target_concurrency);
  // Forgets the endpoints not named.
  void retain(const std::vector<std::string>& endpoints);

  // The seconds that ended in the `seconds` before `now_unix_ms`, oldest first.
  std::vector<EndpointSecond> window(const std::string& endpoint, int64_t now_unix_ms,
                                     int64_t seconds) const;

 private:
  const size_t kept_;
  mutable Mutex mutex_;
  std::map<std::string, std::deque<EndpointSecond>> endpoints_ FLOTILLA_GUARDED_BY(mutex_);
};

// The metrics route's answer (docs/control-plane.md): the window's seconds, and a summary of
// the whole window (requests/s, by code, p50/p99 over every response in it).
nlohmann::json metrics_window_to_json(const std::string& endpoint, int64_t window_seconds,
                                      const std::vector<EndpointSecond>& seconds);

}  // namespace flotilla::control

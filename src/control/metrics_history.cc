#include <algorithm>

#include "control/control_metrics.h"

namespace flotilla::control {
namespace {

using nlohmann::json;

json codes_to_json(const std::map<int, uint64_t>& codes) {
  json object = json::object();
  for (const auto& [code, count] : codes) {
    object[std::to_string(code)] = count;
  }
  return object;
}

json replicas_to_json(const ReplicaCounts& replicas) {
  json object = json::object();
  for (const auto& [version, states] : replicas) {
    object[version] = states;
  }
  return object;
}

double milliseconds(double seconds) {
  return seconds * 1e3;
}

// The autoscaler's fields of a second or of the summary; absent when it does not run.
void add_scale(const EndpointSecond& second, json& into) {
  if (second.desired_replicas) {
    into["desired_replicas"] = *second.desired_replicas;
  }
  if (second.target_concurrency) {
    into["target_concurrency"] = *second.target_concurrency;
  }
}

}  // namespace

Result<int64_t> parse_metrics_window(std::string_view text) {
  const std::optional<int64_t> seconds =
      parse_duration_seconds(text, "smh", /*bare_seconds=*/true, kMetricsWindowMaxSeconds);
  if (!seconds) {
    return invalid_argument(
        "window: seconds, or a count with s, m or h (\"90\", \"15m\", \"1h\"), "
        "from 1 s to 1 h; got '" +
        std::string(text) + "'");
  }
  return *seconds;
}

void MetricsHistory::record(const std::string& endpoint, const std::vector<LoadSample>& samples,
                            const ReplicaCounts& replicas, std::optional<int64_t> desired_replicas,
                            std::optional<double> target_concurrency) {
  MutexLock lock(mutex_);
  std::deque<EndpointSecond>& seconds = endpoints_[endpoint];
  for (const LoadSample& sample : samples) {
    if (!seconds.empty() && sample.unix_ms <= seconds.back().load.unix_ms) {
      continue;
    }
    seconds.push_back({sample, replicas, desired_replicas, target_concurrency});
    if (seconds.size() > kept_) {
      seconds.pop_front();
    }
  }
}

void MetricsHistory::retain(const std::vector<std::string>& endpoints) {
  MutexLock lock(mutex_);
  std::erase_if(endpoints_, [&](const auto& entry) {
    return std::find(endpoints.begin(), endpoints.end(), entry.first) == endpoints.end();
  });
}

std::vector<EndpointSecond> MetricsHistory::window(const std::string& endpoint, int64_t now_unix_ms,
                                                   int64_t seconds) const {
  MutexLock lock(mutex_);
  const auto found = endpoints_.find(endpoint);
  if (found == endpoints_.end()) {
    return {};
  }
  const int64_t since = now_unix_ms - seconds * 1000;
  const auto first = std::find_if(found->second.begin(), found->second.end(),
                                  [&](const EndpointSecond& s) { return s.load.unix_ms > since; });
  return {first, found->second.end()};
}

json metrics_window_to_json(const std::string& endpoint, int64_t window_seconds,
                            const std::vector<EndpointSecond>& seconds) {
  json samples = json::array();
  ResponseCounts all;
  for (const EndpointSecond& second : seconds) {
    const ResponseCounts& responses = second.load.responses;
    all.merge(responses);
    json sample = {{"timestamp", second.load.unix_ms},
                   {"requests", responses.responses()},
                   {"codes", codes_to_json(responses.codes)},
                   {"latency_p50_ms", milliseconds(responses.latency_quantile(0.5))},
                   {"latency_p99_ms", milliseconds(responses.latency_quantile(0.99))},
                   {"in_flight", second.load.concurrency},
                   {"queued", second.load.queued},
                   {"arrivals", second.load.arrivals},
                   {"rejected", second.load.rejected},
                   {"replicas", replicas_to_json(second.replicas)}};
    add_scale(second, sample);
    samples.push_back(std::move(sample));
  }
  json summary = {
      {"seconds", seconds.size()},
      {"requests_per_second", seconds.empty() ? 0.0
                                              : static_cast<double>(all.responses()) /
                                                    static_cast<double>(seconds.size())},
      {"codes", codes_to_json(all.codes)},
      {"latency_p50_ms", milliseconds(all.latency_quantile(0.5))},
      {"latency_p99_ms", milliseconds(all.latency_quantile(0.99))}};
  if (!seconds.empty()) {
    // Gauges: as the newest second saw them.
    const EndpointSecond& newest = seconds.back();
    summary["in_flight"] = newest.load.concurrency;
    summary["queued"] = newest.load.queued;
    summary["replicas"] = replicas_to_json(newest.replicas);
    add_scale(newest, summary);
  }
  return {{"name", endpoint},
          {"window_seconds", window_seconds},
          {"resolution_seconds", 1},
          {"summary", std::move(summary)},
          {"samples", std::move(samples)}};
}

}  // namespace flotilla::control

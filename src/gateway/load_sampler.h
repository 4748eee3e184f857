// One endpoint's load, sampled: the control thread reads the endpoint's counters every tick
// (100 ms) and closes a 1 s LoadSample every `ticks_per_sample` ticks (mean in-flight and
// queued over the ticks; arrivals, completions and rejections since the last sample; the mean
// upstream latency of the answers since then; the responses since then by code and latency). The
// last `kept` samples are kept for samples() and the autoscaler.
//
// Private to the gateway module.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "common/common.h"

namespace flotilla::gateway {

using LatencyCounts = std::array<uint64_t, ResponseCounts::kLatencyBuckets>;

// Every response's latency since the endpoint's start, counted in ResponseCounts' buckets:
// lock-free, for the request path.
class LatencyTotals {
 public:
  void observe(double seconds) {
    counts_[ResponseCounts::latency_bucket(seconds)].fetch_add(1, std::memory_order_relaxed);
  }
  LatencyCounts read() const {
    LatencyCounts counts{};
    for (size_t i = 0; i < counts.size(); ++i) {
      counts[i] = counts_[i].load(std::memory_order_relaxed);
    }
    return counts;
  }

 private:
  std::array<std::atomic<uint64_t>, ResponseCounts::kLatencyBuckets> counts_{};
};

// One tick's reading of an endpoint's counters; the totals count from the endpoint's start.
struct LoadReading {
  int64_t in_flight = 0;
  int64_t queued = 0;  // may read below 0 for a moment; counts as 0
  uint64_t arrivals = 0;
  uint64_t completions = 0;
  uint64_t rejected = 0;
  uint64_t upstream_answers = 0;
  uint64_t upstream_us = 0;  // summed time of those answers at the replicas
  // Read only for the tick that closes a sample (the others ignore them): responses by status
  // code and by latency bucket.
  std::map<int, uint64_t> codes;
  LatencyCounts latency{};
};

class LoadSampler {
 public:
  static constexpr size_t kSamplesKept = 600;
  static constexpr int kTicksPerSample = 10;

  // `clock` (samples' timestamps) is kept alive by the caller.
  explicit LoadSampler(const Clock& clock, size_t kept = kSamplesKept,
                       int ticks_per_sample = kTicksPerSample)
      : clock_(clock), kept_(kept), ticks_per_sample_(ticks_per_sample) {}
  LoadSampler(const LoadSampler&) = delete;
  LoadSampler& operator=(const LoadSampler&) = delete;

  // One tick, on the control thread only; true when it closed a sample.
  bool tick(const LoadReading& reading);
  // Whether the next tick closes a sample (and reads the reading's responses). Control thread.
  bool closes_on_next_tick() const { return ticks_ + 1 >= ticks_per_sample_; }

  // The latest `seconds` samples, oldest first. Any thread.
  std::vector<LoadSample> latest(size_t seconds) const;

 private:
  const Clock& clock_;
  const size_t kept_;
  const int ticks_per_sample_;

  // The control thread's.
  double concurrency_sum_ = 0;
  double queued_sum_ = 0;
  int ticks_ = 0;
  uint64_t last_arrivals_ = 0;
  uint64_t last_completions_ = 0;
  uint64_t last_rejected_ = 0;
  uint64_t last_upstream_answers_ = 0;
  uint64_t last_upstream_us_ = 0;
  std::map<int, uint64_t> last_codes_;
  LatencyCounts last_latency_{};

  mutable Mutex mutex_;
  std::deque<LoadSample> samples_ FLOTILLA_GUARDED_BY(mutex_);
};

}  // namespace flotilla::gateway

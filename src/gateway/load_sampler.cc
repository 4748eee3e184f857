#include "gateway/load_sampler.h"

#include <algorithm>

namespace flotilla::gateway {

bool LoadSampler::tick(const LoadReading& reading) {
  concurrency_sum_ += static_cast<double>(reading.in_flight);
  queued_sum_ += static_cast<double>(std::max<int64_t>(0, reading.queued));
  if (++ticks_ < ticks_per_sample_) {
    return false;
  }
  LoadSample sample;
  sample.unix_ms = clock_.unix_ms();
  sample.concurrency = concurrency_sum_ / ticks_;
  sample.queued = queued_sum_ / ticks_;
  sample.arrivals = reading.arrivals - last_arrivals_;
  sample.completions = reading.completions - last_completions_;
  sample.rejected = reading.rejected - last_rejected_;
  last_arrivals_ = reading.arrivals;
  last_completions_ = reading.completions;
  last_rejected_ = reading.rejected;
  if (reading.upstream_answers > last_upstream_answers_) {
    sample.latency_ms = static_cast<double>(reading.upstream_us - last_upstream_us_) / 1e3 /
                        static_cast<double>(reading.upstream_answers - last_upstream_answers_);
  }
  for (const auto& [code, total] : reading.codes) {
    uint64_t& last = last_codes_[code];
    if (total > last) {
      sample.responses.codes[code] = total - last;
    }
    last = total;
  }
  for (size_t bucket = 0; bucket < reading.latency.size(); ++bucket) {
    if (reading.latency[bucket] > last_latency_[bucket]) {
      sample.responses.latency[static_cast<int>(bucket)] =
          reading.latency[bucket] - last_latency_[bucket];
    }
  }
  last_latency_ = reading.latency;
  last_upstream_answers_ = reading.upstream_answers;
  last_upstream_us_ = reading.upstream_us;
  concurrency_sum_ = 0;
  queued_sum_ = 0;
  ticks_ = 0;
  MutexLock lock(mutex_);
  samples_.push_back(sample);
  if (samples_.size() > kept_) {
    samples_.pop_front();
  }
  return true;
}

std::vector<LoadSample> LoadSampler::latest(size_t seconds) const {
  MutexLock lock(mutex_);
  const size_t count = std::min(seconds, samples_.size());
  return {samples_.end() - static_cast<std::ptrdiff_t>(count), samples_.end()};
}

}  // namespace flotilla::gateway

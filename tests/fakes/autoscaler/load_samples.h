// Gateway sample builders and APA settings (helpers, not fakes) that the autoscaler's and the
// control plane's autoscaling tests share.
#pragma once

#include <cstdint>
#include <vector>

#include "autoscaler/autoscaler.h"
#include "common/common.h"

namespace flotilla::sample_builders {

// One gateway sample per second from `from_ms` for `seconds` (ending at from_ms + seconds s),
// each with `concurrency` in flight at a steady state (arrivals = completions) and
// `latency_ms`.
inline std::vector<LoadSample> steady(int64_t from_ms, int seconds, double concurrency,
                                      double latency_ms = 10) {
  std::vector<LoadSample> samples;
  for (int i = 1; i <= seconds; ++i) {
    LoadSample sample;
    sample.unix_ms = from_ms + i * 1'000;
    sample.concurrency = concurrency;
    sample.arrivals = static_cast<uint64_t>(concurrency * 100);
    sample.completions = sample.arrivals;
    sample.latency_ms = latency_ms;
    samples.push_back(sample);
  }
  return samples;
}

// APA on its full 5 s cycle alone (the fast path has tests of its own), a 20 s up window and a
// 60 s down window.
inline autoscaler::ApaOptions full_cycles() {
  autoscaler::ApaOptions options;
  options.period = autoscaler::Millis(5'000);
  options.fast_period = autoscaler::Millis(0);
  options.up_window = autoscaler::Millis(20'000);
  options.down_window = autoscaler::Millis(60'000);
  return options;
}

// Replicas at 10% CPU with nothing queued inside them.
inline autoscaler::ReplicaUsage light_usage() {
  return {.cpu_utilization = 0.1, .queued = 0};
}

}  // namespace flotilla::sample_builders

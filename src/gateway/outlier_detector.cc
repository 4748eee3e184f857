#include "gateway/outlier_detector.h"

#include <algorithm>
#include <cstdint>

namespace flotilla::gateway {

std::optional<Ejection> OutlierDetector::put_failure(OutlierState& state) const {
  const int failures = state.consecutive_failures_.fetch_add(1) + 1;
  if (failures < options_.eject_after_failures || state.ejected_.exchange(true)) {
    return std::nullopt;
  }
  const int count = std::min(state.ejection_count_.fetch_add(1), 16);
  const auto delay =
      std::min(options_.ejection_time * (int64_t{1} << count), options_.max_ejection_time);
  return Ejection{delay, clock_.now() + delay, failures};
}

std::optional<Ejection> OutlierDetector::put_probe_result(
    OutlierState& state, bool healthy, std::chrono::milliseconds last_delay) const {
  if (healthy) {
    state.consecutive_failures_.store(0);
    state.ejected_.store(false);
    return std::nullopt;
  }
  const auto delay = std::min(last_delay * 2, options_.max_ejection_time);
  return Ejection{delay, clock_.now() + delay, state.consecutive_failures_.load()};
}

}  // namespace flotilla::gateway

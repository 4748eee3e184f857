// Replica-count arithmetic shared by the policies. Private to the autoscaler module.
#pragma once

#include <algorithm>
#include <cmath>

#include "autoscaler/autoscaler.h"

namespace flotilla::autoscaler::detail {

// ceil() that ignores floating-point dust: 2.0000000001 replicas is 2 (common's ceil_div).
inline int64_t ceil_replicas(double value) {
  return ceil_div(value, 1);
}

// Into the range; below 1 only for endpoints that may scale to zero.
inline int64_t clamp_to(const ReplicaRange& range, int64_t desired) {
  const int64_t floor =
      range.scale_to_zero ? std::max<int64_t>(range.min, 0) : std::max<int64_t>(range.min, 1);
  return std::clamp(desired, floor, std::max(floor, range.max));
}

// What a policy scales from: its last decision, or what exists before it made one.
inline int64_t current_of(const Fleet& fleet) {
  return fleet.desired > 0 ? fleet.desired : fleet.ready + fleet.pending;
}

}  // namespace flotilla::autoscaler::detail

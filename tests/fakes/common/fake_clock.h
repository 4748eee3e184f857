// A Clock that moves only when the test says so: periods, deadlines and backoffs are then
// tested without sleeping. Thread-safe (a test thread advances it while the code under test
// reads it).
#pragma once

#include <chrono>
#include <mutex>

#include "common/common.h"

namespace flotilla::testing {

class FakeClock final : public Clock {
 public:
  // Starts at an arbitrary steady time and at 2026-01-01T00:00:00Z on the wall clock.
  FakeClock() = default;

  TimePoint now() const override {
    std::lock_guard lock(mutex_);
    return steady_;
  }
  std::chrono::system_clock::time_point system_now() const override {
    std::lock_guard lock(mutex_);
    return system_;
  }

  // Moves both clocks forward by `by`.
  void advance(std::chrono::nanoseconds by) {
    std::lock_guard lock(mutex_);
    steady_ += by;
    system_ += std::chrono::duration_cast<std::chrono::system_clock::duration>(by);
  }

 private:
  mutable std::mutex mutex_;
  TimePoint steady_{std::chrono::hours(1'000)};
  std::chrono::system_clock::time_point system_{std::chrono::seconds(1'767'225'600)};
};

}  // namespace flotilla::testing

// Outlier detection, shaped like Envoy's consecutive-5xx detector: the results of attempts on a
// replica go in, ejection decisions come out. A replica is ejected after
// `eject_after_failures` consecutive failures and probed back after `ejection_time`, doubling
// per repeated ejection (without a success in between) up to `max_ejection_time`; a probe that
// fails waits twice as long for the next, with the same cap. Sending probes and arming timers
// is the caller's (the gateway's) job.
//
// Private to the gateway module.
#pragma once

#include <atomic>
#include <chrono>
#include <optional>

#include "common/common.h"

namespace flotilla::gateway {

// How an attempt on a replica ended, as outlier detection counts it.
enum class AttemptResult {
  kSuccess,       // an answer other than 502, 503 or 504
  kFailure,       // no answer, a cut stream, or an answer of 502, 503 or 504
  kLocalFailure,  // the gateway's own failure (out of descriptors): says nothing of the replica
};

struct OutlierOptions {
  int eject_after_failures = 3;
  std::chrono::milliseconds ejection_time{1'000};
  std::chrono::milliseconds max_ejection_time{30'000};
};

// One replica's outlier state, kept inline in the replica's runtime. Shared between the worker
// threads: every field is atomic, and a healthy replica's fields are only read.
class OutlierState {
 public:
  OutlierState() = default;
  OutlierState(const OutlierState&) = delete;
  OutlierState& operator=(const OutlierState&) = delete;

  // Ejected: sent probes, not requests.
  bool ejected() const { return ejected_.load(std::memory_order_relaxed); }
  int consecutive_failures() const { return consecutive_failures_.load(); }

 private:
  friend class OutlierDetector;
  std::atomic<int> consecutive_failures_{0};
  std::atomic<bool> ejected_{false};
  std::atomic<int> ejection_count_{0};  // ejections since the last success
};

// A decision to keep a replica out: probe it after `delay`, at `until`.
struct Ejection {
  std::chrono::milliseconds delay{0};
  Clock::TimePoint until;
  int consecutive_failures = 0;  // at the time of the decision
};

class OutlierDetector {
 public:
  // `clock` is kept alive by the caller (real_clock() in the gateway).
  OutlierDetector(const OutlierOptions& options, const Clock& clock)
      : options_(options), clock_(clock) {}

  // The result of one attempt on the replica of `state`. An Ejection when this result ejects
  // it (once: failures while ejected do not eject it again); the caller then probes it after
  // the Ejection's delay. On the request path: a success costs two relaxed loads.
  std::optional<Ejection> put_result(OutlierState& state, AttemptResult result) const {
    switch (result) {
      case AttemptResult::kSuccess:
        put_success(state);
        return std::nullopt;
      case AttemptResult::kFailure:
        return put_failure(state);
      case AttemptResult::kLocalFailure:
        return std::nullopt;
    }
    return std::nullopt;
  }

  // The answer to a probe of an ejected replica: `healthy` brings it back in (its failures
  // count from zero, its ejection count stays until a request succeeds); otherwise the next
  // probe comes after twice `last_delay`, capped at max_ejection_time.
  std::optional<Ejection> put_probe_result(OutlierState& state, bool healthy,
                                           std::chrono::milliseconds last_delay) const;

  // The replica left the table while ejected: no more probes, and it is no longer ejected.
  void forget(OutlierState& state) const { state.ejected_.store(false); }

  const OutlierOptions& options() const { return options_; }

 private:
  static void put_success(OutlierState& state) {
    // Read first: a healthy replica's counters are zero and stay unwritten (no shared-line
    // stores).
    if (state.consecutive_failures_.load(std::memory_order_relaxed) != 0) {
      state.consecutive_failures_.store(0, std::memory_order_relaxed);
    }
    if (state.ejection_count_.load(std::memory_order_relaxed) != 0) {
      state.ejection_count_.store(0, std::memory_order_relaxed);
    }
  }
  std::optional<Ejection> put_failure(OutlierState& state) const;

  const OutlierOptions options_;
  const Clock& clock_;
};

}  // namespace flotilla::gateway

// The gateway's policies (DESIGN.md §1 "Request path"), the light part of its contract: the
// balancers, pure functions of the replicas' load and a Random&, and the admission queue, the
// waiting room of requests that found no replica with room. The fleet simulator and unit tests
// drive the same code the gateway runs; this header (and flotilla_gateway_policy) brings in
// nothing but common: no Boost, OpenSSL or yaml. gateway/gateway.h includes it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "common/common.h"

namespace flotilla::gateway {

// Milliseconds on the caller's clock (the gateway's steady clock, the simulator's time), kept
// in 32 bits: only differences are taken, modulo 2^32, so the clock may wrap (every 49 days).
using Millis = uint32_t;

// A replica's response time, peak-EWMA (Finagle's PeakEwma, Linkerd's balancer): a response
// slower than the estimate replaces it at once, so a replica that turns slow is avoided from
// its next response; a faster one pulls it down by a moving average whose weight is the time
// since the last response over the decay time. Read, it decays toward zero with the time since
// the last response, so a replica that was slow and gets no traffic for it is tried again
// after a while. A plain value (8 bytes): the gateway keeps one per replica in an atomic
// (runtime_state.h), the simulator one per replica and gateway.
struct PeakEwma {
  float seconds = 0;  // 0: no response yet
  Millis at = 0;      // when `seconds` was last updated

  // Finagle's and Linkerd's default decay time.
  static constexpr double kDecaySeconds = 10;

  // The estimate after a response that took `latency` seconds, at `now`.
  PeakEwma observe(double latency, Millis now) const;
  // The estimate at `now` (0 before the first response).
  double at_time(Millis now) const;
};

// What a balancer knows of one replica when it picks.
struct Candidate {
  bool ready = true;
  int64_t in_flight = 0;  // requests sent to it and not yet answered
  int64_t cap = 0;        // its concurrency cap; 0 means no cap
  PeakEwma latency;       // its response time so far
};

inline bool has_room(const Candidate& candidate) {
  return candidate.ready && (candidate.cap <= 0 || candidate.in_flight < candidate.cap);
}

enum class BalancerKind {
  kPowerOfTwo,          // the production policy: of two random eligible replicas, the one with
                        // the lower (in flight + 1) x peak-EWMA response time
  kPowerOfTwoInFlight,  // of two, the one with fewer in flight; for comparison only
  kRoundRobin,          // for comparison only
  kLeastRequest,        // full scan; for comparison only
};

Result<BalancerKind> parse_balancer_kind(std::string_view name);

// Picks the replica for one request among `candidates` (one endpoint version's replicas):
// only ready replicas below their cap are eligible. Returns the index, or nullopt when none
// is eligible (the request then waits in the admission queue). `now` ages the latency
// estimates. Not thread-safe: a balancer may keep state (round robin's cursor); use one per
// worker thread.
class Balancer {
 public:
  virtual ~Balancer() = default;
  virtual std::optional<size_t> pick(std::span<const Candidate> candidates, Random& random,
                                     Millis now) = 0;
};

std::unique_ptr<Balancer> make_balancer(BalancerKind kind);

// Picks a version by traffic weight: index i with probability weights[i] / sum. Weights of
// zero or less are never picked; nullopt when no weight is positive.
std::optional<size_t> pick_by_weight(std::span<const int64_t> weights, Random& random);

// The per-endpoint queue of requests waiting for a replica slot (DESIGN.md §1): bounded, FIFO,
// each entry with a deadline. Deadlines must not decrease in push order (an endpoint has one
// queue timeout), so the oldest entry always expires first. Pure: time comes in as an argument.
// Not thread-safe: the gateway guards each endpoint's queue with a mutex (why a mutex: see
// "Locking" at Gateway in gateway/gateway.h). `Time` is any ordered time type: the gateway's
// steady clock, the simulator's seconds.
template <typename T, typename Time = std::chrono::steady_clock::time_point>
class AdmissionQueue {
 public:
  using TimePoint = Time;

  explicit AdmissionQueue(size_t capacity) : capacity_(capacity) {}

  // Queues `item` until `deadline`. When the queue is full the item is not taken: it comes
  // back so the caller can still answer its client (429).
  std::optional<T> push(T&& item, TimePoint deadline) {
    if (entries_.size() >= capacity_) {
      return std::move(item);
    }
    FLOTILLA_DCHECK(entries_.empty() || entries_.back().deadline <= deadline);
    entries_.push_back(Entry{std::move(item), deadline});
    return std::nullopt;
  }

  // Puts `item` back ahead of every waiter, beyond the capacity (it held a place already): a
  // request that was dispatched before them and lost its replica (the simulator's crash
  // retry). Its deadline may be later than those behind it (several crashed requests go back
  // in reverse order); expire() stops at the first entry not due, so a waiter behind one can
  // expire up to that entry's deadline late. The simulator's crash figures are measured so.
  void push_front(T&& item, TimePoint deadline) {
    entries_.push_front(Entry{std::move(item), deadline});
  }

  // The oldest waiting item, to dispatch the moment a slot frees; nullopt when empty.
  std::optional<T> pop() {
    if (entries_.empty()) {
      return std::nullopt;
    }
    T item = std::move(entries_.front().item);
    entries_.pop_front();
    return item;
  }

  // The oldest waiting item for which `accepts(item)` holds (a slot on a replica that some
  // waiters must not be sent to again); the others keep their places. nullopt when none.
  template <typename Predicate>
  std::optional<T> pop_first(Predicate&& accepts) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (accepts(std::as_const(it->item))) {
        T item = std::move(it->item);
        entries_.erase(it);
        return item;
      }
    }
    return std::nullopt;
  }

  // The oldest waiting item, left in place; null when empty.
  const T* front() const { return entries_.empty() ? nullptr : &entries_.front().item; }

  // Removes the entry equal to `item` (a waiter that left); false when it is not queued.
  bool remove(const T& item) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->item == item) {
        entries_.erase(it);
        return true;
      }
    }
    return false;
  }

  // Removes the items whose deadline is at or before `now`, oldest first.
  std::vector<T> expire(TimePoint now) {
    std::vector<T> expired;
    while (!entries_.empty() && entries_.front().deadline <= now) {
      expired.push_back(std::move(entries_.front().item));
      entries_.pop_front();
    }
    return expired;
  }

  // When the next expiry is due (one timer per queue suffices); nullopt when empty.
  std::optional<TimePoint> next_deadline() const {
    return entries_.empty() ? std::nullopt : std::optional<TimePoint>(entries_.front().deadline);
  }

  // The newest entry's deadline: a later push must not be earlier. nullopt when empty.
  std::optional<TimePoint> last_deadline() const {
    return entries_.empty() ? std::nullopt : std::optional<TimePoint>(entries_.back().deadline);
  }

  size_t size() const { return entries_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  struct Entry {
    T item;
    TimePoint deadline;
  };
  size_t capacity_;
  std::deque<Entry> entries_;
};

}  // namespace flotilla::gateway

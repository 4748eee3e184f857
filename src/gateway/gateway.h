// The gateway module's contract (DESIGN.md §1 "Request path", §2). This first part holds the
// balancing policies: pure functions of the replicas' load and a Random&, so that unit tests
// and the fleet simulator drive the same code the gateway runs. The HTTP proxy, endpoint
// table, retries and auth build on it (issue #3). The admission queue below is its waiting
// room.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/common.h"

namespace flotilla::gateway {

// What a balancer knows of one replica when it picks.
struct Candidate {
  bool ready = true;
  int64_t in_flight = 0;  // requests sent to it and not yet answered
  int64_t cap = 0;        // its concurrency cap; 0 means no cap
};

inline bool has_room(const Candidate& candidate) {
  return candidate.ready && (candidate.cap <= 0 || candidate.in_flight < candidate.cap);
}

enum class BalancerKind {
  kPowerOfTwo,    // the production policy: the less loaded of two random eligible replicas
  kRoundRobin,    // for comparison only
  kLeastRequest,  // full scan; for comparison only
};

Result<BalancerKind> parse_balancer_kind(std::string_view name);

// Picks the replica for one request among `candidates` (one endpoint version's replicas):
// only ready replicas below their cap are eligible. Returns the index, or nullopt when none
// is eligible (the request then waits in the admission queue). Not thread-safe: a balancer
// may keep state (round robin's cursor); use one per worker thread.
class Balancer {
 public:
  virtual ~Balancer() = default;
  virtual std::optional<size_t> pick(std::span<const Candidate> candidates, Random& random) = 0;
};

std::unique_ptr<Balancer> make_balancer(BalancerKind kind);

// Picks a version by traffic weight: index i with probability weights[i] / sum. Weights of
// zero or less are never picked; nullopt when no weight is positive.
std::optional<size_t> pick_by_weight(std::span<const int64_t> weights, Random& random);

// ---- Endpoint table: endpoint → versions with traffic weights → replicas ----------------------

enum class ReplicaState { kReady, kStarting, kDraining };

struct ReplicaEntry {
  std::string id;
  std::string host;
  uint16_t port = 0;
  int64_t max_in_flight = 0;  // the per-replica cap; 0 means none
  ReplicaState state = ReplicaState::kReady;
};

struct VersionEntry {
  std::string name;
  int64_t traffic = 0;  // percent; an endpoint's versions sum to 100
  std::vector<ReplicaEntry> replicas;
};

struct EndpointEntry {
  std::string name;
  std::vector<VersionEntry> versions;
};

// An immutable snapshot of every endpoint, swapped as a whole (std::shared_ptr<const ...>).
struct EndpointTable {
  std::vector<EndpointEntry> endpoints;
  const EndpointEntry* find(std::string_view name) const;
};

// Checks a table: names present and unique, traffic in [0, 100] summing to 100 per endpoint,
// replica ids unique per endpoint, addresses with a host and a port, caps >= 0. Errors name
// the field ("endpoints[0].versions[1].traffic: ...").
Status validate_endpoint_table(const EndpointTable& table);

// Reads the YAML form used by `flotilla gateway --config` (docs/gateway.md) and validates it.
Result<EndpointTable> parse_endpoint_table_yaml(std::string_view text);

// The per-endpoint queue of requests waiting for a replica slot (DESIGN.md §1): bounded, FIFO,
// each entry with a deadline. Deadlines must not decrease in push order (an endpoint has one
// queue timeout), so the oldest entry always expires first. Pure: time comes in as an argument.
// Not thread-safe: confined to its owner's thread.
template <typename T>
class AdmissionQueue {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

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

  // The oldest waiting item, to dispatch the moment a slot frees; nullopt when empty.
  std::optional<T> pop() {
    if (entries_.empty()) {
      return std::nullopt;
    }
    T item = std::move(entries_.front().item);
    entries_.pop_front();
    return item;
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

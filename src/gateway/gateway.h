// The gateway module's contract (DESIGN.md §1 "Request path", §2). This first part holds the
// balancing policies: pure functions of the replicas' load and a Random&, so that unit tests
// and the fleet simulator drive the same code the gateway runs. The HTTP proxy, endpoint
// table, admission queue, retries and auth build on it (issue #3).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

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

}  // namespace flotilla::gateway

// Balancing policies. Power of two choices (Mitzenmacher, "The Power of Two Choices in
// Randomized Load Balancing", 2001): sampling two replicas and sending to the less loaded
// keeps the maximum load near the average without the herding of least-request (every
// balancer sending to the same idle replica) or the blindness of round robin (a slow
// replica gets its full share). Which of the two is less loaded weighs its requests in flight by
// its response time (peak-EWMA, PeakEwma below), so a slow replica is sent less.
#include <algorithm>
#include <cmath>

#include "common/common.h"
#include "gateway/gateway_policy.h"

namespace flotilla::gateway {
namespace {

// Draws of a random eligible replica before falling back to a scan: with half the replicas
// eligible, eight draws all miss with probability 1/256.
constexpr int kRandomDraws = 8;

// A uniformly random eligible index other than `except`, or nullopt if there is none.
std::optional<size_t> random_eligible(std::span<const Candidate> candidates, Random& random,
                                      std::optional<size_t> except) {
  for (int draw = 0; draw < kRandomDraws; ++draw) {
    const size_t index = random.uniform(candidates.size());
    if (index != except && has_room(candidates[index])) {
      return index;
    }
  }
  // Few eligible: count them, then take the k-th, so the choice stays uniform.
  size_t eligible = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    eligible += (i != except && has_room(candidates[i])) ? 1 : 0;
  }
  if (eligible == 0) {
    return std::nullopt;
  }
  size_t wanted = random.uniform(eligible);
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (i != except && has_room(candidates[i]) && wanted-- == 0) {
      return i;
    }
  }
  return std::nullopt;
}

// Seconds from `from` to `to`; 0 when `to` is earlier (another thread stamped a later time
// between this one's reading the clock and the estimate).
double seconds_since(Millis from, Millis to) {
  const Millis elapsed = to - from;
  return elapsed < (Millis{1} << 31) ? elapsed / 1000.0 : 0.0;
}

// Whether `a` is less loaded than `b`, ties false. By expected wait, (in flight + 1) x response
// time, where both have answered before; by in flight alone where either has not, so a new
// replica (whose first responses may be slow, a cold cache) is neither flooded nor starved.
bool less_loaded(const Candidate& a, const Candidate& b, Millis now) {
  if (a.latency.seconds > 0 && b.latency.seconds > 0) {
    return static_cast<double>(a.in_flight + 1) * a.latency.at_time(now) <
           static_cast<double>(b.in_flight + 1) * b.latency.at_time(now);
  }
  return a.in_flight < b.in_flight;
}

class PowerOfTwoBalancer final : public Balancer {
 public:
  explicit PowerOfTwoBalancer(bool weigh_latency) : weigh_latency_(weigh_latency) {}

  std::optional<size_t> pick(std::span<const Candidate> candidates, Random& random,
                             Millis now) override {
    if (candidates.empty()) {
      return std::nullopt;
    }
    const std::optional<size_t> first = random_eligible(candidates, random, std::nullopt);
    if (!first) {
      return std::nullopt;
    }
    const std::optional<size_t> second = random_eligible(candidates, random, first);
    if (!second) {
      return first;
    }
    // Ties go to the first draw, which is itself random.
    const Candidate& a = candidates[*second];
    const Candidate& b = candidates[*first];
    const bool second_better = weigh_latency_ ? less_loaded(a, b, now) : a.in_flight < b.in_flight;
    return second_better ? second : first;
  }

 private:
  const bool weigh_latency_;
};

class RoundRobinBalancer final : public Balancer {
 public:
  std::optional<size_t> pick(std::span<const Candidate> candidates, Random&, Millis) override {
    for (size_t step = 0; step < candidates.size(); ++step) {
      const size_t index = (next_ + step) % candidates.size();
      if (has_room(candidates[index])) {
        next_ = index + 1;
        return index;
      }
    }
    return std::nullopt;
  }

 private:
  size_t next_ = 0;
};

class LeastRequestBalancer final : public Balancer {
 public:
  std::optional<size_t> pick(std::span<const Candidate> candidates, Random&, Millis) override {
    std::optional<size_t> best;
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (has_room(candidates[i]) &&
          (!best || candidates[i].in_flight < candidates[*best].in_flight)) {
        best = i;
      }
    }
    return best;
  }
};

}  // namespace

PeakEwma PeakEwma::observe(double latency, Millis now) const {
  // A zero sample would read as "no response yet".
  const double sample = std::max(latency, 1e-6);
  if (seconds <= 0 || sample > seconds) {
    return {static_cast<float>(sample), now};
  }
  const double keep = std::exp(-seconds_since(at, now) / kDecaySeconds);
  return {static_cast<float>(seconds * keep + sample * (1 - keep)), now};
}

double PeakEwma::at_time(Millis now) const {
  return seconds * std::exp(-seconds_since(at, now) / kDecaySeconds);
}

Result<BalancerKind> parse_balancer_kind(std::string_view name) {
  if (name == "p2c")
    return BalancerKind::kPowerOfTwo;
  if (name == "p2c_in_flight")
    return BalancerKind::kPowerOfTwoInFlight;
  if (name == "round_robin")
    return BalancerKind::kRoundRobin;
  if (name == "least_request")
    return BalancerKind::kLeastRequest;
  return invalid_argument("unknown balancer '" + std::string(name) +
                          "' (use p2c, p2c_in_flight, round_robin or least_request)");
}

std::unique_ptr<Balancer> make_balancer(BalancerKind kind) {
  switch (kind) {
    case BalancerKind::kPowerOfTwo:
      return std::make_unique<PowerOfTwoBalancer>(true);
    case BalancerKind::kPowerOfTwoInFlight:
      return std::make_unique<PowerOfTwoBalancer>(false);
    case BalancerKind::kRoundRobin:
      return std::make_unique<RoundRobinBalancer>();
    case BalancerKind::kLeastRequest:
      return std::make_unique<LeastRequestBalancer>();
  }
  return std::make_unique<PowerOfTwoBalancer>(true);
}

std::optional<size_t> pick_by_weight(std::span<const int64_t> weights, Random& random) {
  uint64_t total = 0;
  for (int64_t weight : weights) {
    total += weight > 0 ? static_cast<uint64_t>(weight) : 0;
  }
  if (total == 0) {
    return std::nullopt;
  }
  uint64_t point = random.uniform(total);
  for (size_t i = 0; i < weights.size(); ++i) {
    const uint64_t weight = weights[i] > 0 ? static_cast<uint64_t>(weights[i]) : 0;
    if (point < weight) {
      return i;
    }
    point -= weight;
  }
  return std::nullopt;  // unreachable: point < total
}

}  // namespace flotilla::gateway

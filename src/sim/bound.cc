// The offline bound (sim.h): the fewest bad requests any replica schedule can have at each cost,
// for arrivals known in advance, on a fluid relaxation of the fleet.
//
// The relaxation, each step optimistic so no policy can beat the result:
// - A ready replica serves at most `rate` requests a second within the SLO: its saturation
//   point's throughput at full speed (no slow replicas, no crashes, no service-time spread), and
//   a second's arrivals may also use the SLO's share of the next second (rate x (1 + SLO)).
// - Requests are fluid: second t loses max(0, arrivals - rate x ready), and of the rest the
//   expected share whose own service time alone passes the SLO (a lognormal spread's tail);
//   no queueing delay below that capacity.
// - A replica costs its mean cold start once when it starts and nothing to stop (no drain).
// Minimising bad + lambda x cost over integer schedules is a dynamic program over the ready
// count, O(seconds x replicas) per lambda; sweeping lambda gives the lower convex hull of the
// cost-versus-bad frontier, itself below the frontier of integer schedules.
#include <algorithm>
#include <cmath>
#include <limits>

#include "sim/sim.h"

namespace flotilla::sim {
namespace {

struct Totals {
  double cost = 0;  // replica-seconds
  double bad = 0;   // requests
};

// The schedule minimising bad + lambda x cost, and its two totals.
Totals solve(const BoundInput& in, double lambda) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const int64_t top = in.max_replicas;
  const auto width = static_cast<size_t>(top + 1);
  const auto cold_seconds = static_cast<size_t>(std::ceil(in.cold_start_s));
  const double start_cost = lambda * in.cold_start_s;
  // value[r]: the best objective with r ready in the last second; totals[r]: its path's totals.
  std::vector<double> value(width, kInf);
  std::vector<Totals> totals(width);
  value[static_cast<size_t>(std::clamp(in.initial_replicas, int64_t{0}, top))] = 0;
  std::vector<double> next(width);
  std::vector<Totals> next_totals(width);
  std::vector<double> above(width);
  std::vector<size_t> from_above(width);
  for (size_t t = 0; t < in.arrivals.size(); ++t) {
    const double arrivals = in.arrivals[t];
    // Within the first cold start no replica started at 0 is ready yet.
    const int64_t highest = t < cold_seconds ? std::min(top, in.initial_replicas) : top;
    // From r' >= r (stop some: free): the best value at or above r.
    double best_above = kInf;
    size_t best_above_at = 0;
    for (int64_t r = top; r >= 0; --r) {
      const auto i = static_cast<size_t>(r);
      if (value[i] < best_above) {
        best_above = value[i];
        best_above_at = i;
      }
      above[i] = best_above;
      from_above[i] = best_above_at;
    }
    // From r' < r (start r - r'): value[r'] + start_cost x (r - r'), best over r' below r.
    double best_below = kInf;  // of value[r'] - start_cost x r'
    size_t best_below_at = 0;
    for (int64_t r = 0; r <= top; ++r) {
      const auto i = static_cast<size_t>(r);
      double base = above[i];
      size_t from = from_above[i];
      const double via_start = best_below + start_cost * static_cast<double>(r);
      if (via_start < base) {
        base = via_start;
        from = best_below_at;
      }
      if (value[i] - start_cost * static_cast<double>(r) < best_below) {
        best_below = value[i] - start_cost * static_cast<double>(r);
        best_below_at = i;
      }
      if (r < in.min_replicas || r > highest || base == kInf) {
        next[i] = kInf;
        continue;
      }
      const double dropped = std::max(0.0, arrivals - in.rate * static_cast<double>(r));
      const double lost = dropped + in.slow_share * (arrivals - dropped);
      const auto started =
          static_cast<double>(std::max<int64_t>(0, r - static_cast<int64_t>(from)));
      next[i] = base + lost + lambda * static_cast<double>(r);
      next_totals[i] = {totals[from].cost + static_cast<double>(r) + in.cold_start_s * started,
                        totals[from].bad + lost};
    }
    value.swap(next);
    totals.swap(next_totals);
  }
  size_t best = 0;
  for (size_t i = 1; i < width; ++i) {
    if (value[i] < value[best]) {
      best = i;
    }
  }
  return totals[best];
}

}  // namespace

BoundInput bound_input(const Scenario& scenario, std::span<const uint64_t> arrivals) {
  const ReplicaModel& model = scenario.replica;
  const double slo_s = scenario.slo_ms / 1000;
  double rate = 0;  // requests a second one replica completes within the SLO, at best
  if (model.max_batch > 0) {
    const auto steps = static_cast<double>(std::max<int64_t>(model.steps_per_request, 1));
    for (int64_t batch = 1; batch <= model.max_batch; ++batch) {
      const double request_ms =
          steps * (model.step_ms + model.step_ms_per_item * static_cast<double>(batch));
      if (request_ms <= scenario.slo_ms) {
        rate = std::max(rate, static_cast<double>(batch) * 1000 / request_ms);
      }
    }
  } else if (model.service_ms <= scenario.slo_ms || model.service_sigma > 0) {
    rate = model.saturation * 1000 / model.service_ms;
  }
  BoundInput in;
  if (model.max_batch == 0 && model.service_sigma > 0 && rate > 0) {
    // The lognormal tail (mean service_ms) past the SLO: P(X > slo) for ln X ~ N(mu, sigma^2),
    // mu = ln(service_ms) - sigma^2 / 2.
    const double sigma = model.service_sigma;
    const double z = (std::log(scenario.slo_ms / model.service_ms) + sigma * sigma / 2) / sigma;
    in.slow_share = 0.5 * std::erfc(z / std::sqrt(2.0));
  }
  in.arrivals.assign(arrivals.begin(), arrivals.end());
  in.rate = rate * (1 + slo_s);
  in.cold_start_s = model.cold_start_s;
  in.min_replicas = scenario.min_replicas;
  in.initial_replicas = scenario.initial_replicas;
  // More replicas than the busiest second needs cannot help.
  const uint64_t peak = arrivals.empty() ? 0 : *std::max_element(arrivals.begin(), arrivals.end());
  const auto useful =
      in.rate > 0 ? static_cast<int64_t>(std::ceil(static_cast<double>(peak) / in.rate)) : 0;
  in.max_replicas = std::max(
      {std::min(scenario.max_replicas, useful), scenario.min_replicas, scenario.initial_replicas});
  return in;
}

std::vector<BoundPoint> offline_bound(const BoundInput& in) {
  double total = 0;
  for (double a : in.arrivals) {
    total += a;
  }
  // lambda: bad requests one replica-second is worth. Past `rate` (what a replica-second can
  // save) nothing is worth a replica; below a millionth of it everything is.
  const double high = std::max(in.rate, 1e-9) * 2;
  std::vector<BoundPoint> points;
  for (double lambda = high; lambda > high * 1e-7; lambda /= 1.25) {
    const Totals t = solve(in, lambda);
    if (points.empty() || t.cost > points.back().replica_seconds + 1e-9) {
      points.push_back({t.cost, t.bad, total > 0 ? 100 * t.bad / total : 0});
    }
  }
  return points;
}

double bound_bad_pct_at(const std::vector<BoundPoint>& frontier, double replica_seconds) {
  if (frontier.empty()) {
    return 0;
  }
  if (replica_seconds <= frontier.front().replica_seconds) {
    return frontier.front().bad_pct;  // below the cheapest schedule: at least its misses
  }
  for (size_t i = 1; i < frontier.size(); ++i) {
    const BoundPoint& a = frontier[i - 1];
    const BoundPoint& b = frontier[i];
    if (replica_seconds <= b.replica_seconds) {
      const double f =
          (replica_seconds - a.replica_seconds) / (b.replica_seconds - a.replica_seconds);
      return a.bad_pct + f * (b.bad_pct - a.bad_pct);
    }
  }
  return frontier.back().bad_pct;
}

}  // namespace flotilla::sim

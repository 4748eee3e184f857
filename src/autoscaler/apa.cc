// APA, Flotilla's autoscaler: the horizontal replica policy and the vertical target policy.
#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "autoscaler/autoscaler.h"
#include "autoscaler/replica_math.h"

namespace flotilla::autoscaler {
namespace {

using detail::ceil_replicas;
using detail::clamp_to;
using detail::current_of;

// A second whose mean in flight is this share of the gateway's cap had every slot taken but for
// the moments between a completion and the next dispatch.
constexpr double kFullShare = 0.98;

class ApaPolicy final : public Policy {
 public:
  ApaPolicy(const ApaOptions& options, const double* target) : options_(options), target_(target) {}

  std::string_view name() const override { return "apa"; }
  // Called at the fast path's cadence when it is on; the full cycle still runs every period.
  Millis period() const override { return apa_decision_period(options_); }

  Decision decide(Millis now, const SampleWindow& samples, const Fleet& fleet) override {
    const int64_t current = current_of(fleet);
    const double target = std::max(*target_ * options_.utilization, 1e-6);
    const auto recent = samples.max_offered(now, options_.up_window);
    if (!recent) {
      return {clamp_to(options_.range, current), "no samples yet: keep"};
    }
    // Between full cycles only the fast path runs: up, and only while the newest second asks
    // for more than the ready replicas are sized for (in flight plus waiting over ready x
    // target). Down waits for the full cycle and its window.
    // With nothing starting, a second in which at least one request waited on average past what
    // the ready replicas hold asks for one more replica at least: Little's law sees closed-loop
    // clients' queue only once it has stood for the standing window.
    // Both queue rules below count a queue only where it is one: the ready replicas' slots were
    // taken all through the newest second (their mean in flight within 2% of the gateway's cap:
    // closed-loop clients held back, a load past the fleet), or its requests waited at least as
    // long as they are then served (a step of load within the second). A queue while slots
    // stand free is what an open-loop fleet near its cap always has (Poisson arrivals on 32
    // slots at 94% keep about 10 waiting, 3 ms each against a 10 ms service), which no replica
    // held through the down window is worth.
    const std::optional<Sample> newest = samples.newest(now);
    const double cap = static_cast<double>(fleet.ready * gateway_cap(*target_));
    const bool queue_is_demand = !newest || newest->concurrency >= kFullShare * cap ||
                                 samples.wait_over_service(now).value_or(1) >= 1;
    const bool full_cycle = !last_full_cycle_ || now - *last_full_cycle_ >= options_.period;
    bool one_more = false;
    if (!full_cycle) {
      const double newest = samples.max_demand(now, Millis(1'000)).value_or(0);
      const double short_by = newest - static_cast<double>(fleet.ready) * target;
      if (short_by <= 0) {
        return {clamp_to(options_.range, current), "fast path: the ready replicas suffice"};
      }
      one_more = short_by >= 1 && fleet.pending == 0 && queue_is_demand;
    } else {
      last_full_cycle_ = now;
    }
    const std::string_view path = full_cycle ? "up" : "fast up";
    // A standing queue with no capacity on its way is demand too: closed-loop clients keep a
    // queue that Little's law on arrivals and completions does not see. Counted only when it
    // held through the whole standing window without shrinking (not a burst, not a backlog
    // being served) and nothing is starting (while replicas start, the queue is theirs).
    const Millis standing = std::min(options_.standing_window, options_.up_window);
    const double waiting = fleet.pending == 0 && queue_is_demand
                               ? samples.standing_demand(now, standing).value_or(0)
                               : 0;
    // A trend counts past the tolerance only: noise in the arrivals is not a ramp.
    double growth =
        samples.arrival_growth(now, options_.up_window, options_.lead_time).value_or(1.0);
    growth = growth >= 1 + options_.trend_tolerance ? growth : 1.0;
    const double projected = *recent * growth;
    const double needed = std::max({*recent, waiting, projected});
    const bool slow_starts = fleet.start_ms < 0 || Millis(fleet.start_ms) > options_.spare_start;
    const int64_t spare =
        recent_failures(now, fleet.failures) > 0 && needed > 0 && slow_starts ? 1 : 0;
    const int64_t wanted_up =
        std::max(ceil_replicas(needed / target) + spare, one_more ? current + 1 : int64_t{0});
    if (wanted_up > current) {
      // What the scale-up was for, so the down rule does not take it back within its window;
      // a replica added for a waiting queue counts as the concurrency it adds.
      const bool for_the_queue = wanted_up > ceil_replicas(needed / target) + spare;
      ups_.emplace_back(now,
                        for_the_queue ? static_cast<double>(wanted_up - spare) * target : needed);
      const int64_t limit =
          std::max(ceil_replicas(static_cast<double>(current) * options_.max_up_factor),
                   current + options_.min_up_step);
      const int64_t desired = clamp_to(options_.range, std::min(wanted_up, limit));
      const std::string need =
          projected > std::max(*recent, waiting)
              ? fmt::format(
                    "busiest second needs concurrency {:.1f} over {} s, x{:.2f} "
                    "for the arrival trend over {} s",
                    *recent, options_.up_window.count() / 1000, growth,
                    options_.lead_time.count() / 1000)
              : fmt::format("busiest second needs concurrency {:.1f} over {} s", *recent,
                            options_.up_window.count() / 1000);
      return {desired,
              fmt::format("{}: {} / target {:.2f} = {}{}{}{}", path, need, target, wanted_up,
                          spare > 0 ? " (with a spare: a replica failed)" : "",
                          for_the_queue ? " (one more: requests wait, nothing is starting)" : "",
                          wanted_up > limit ? fmt::format(" (capped at {})", limit) : "")};
    }
    if (!full_cycle) {
      return {clamp_to(options_.range, current),
              fmt::format("fast path: capacity on its way ({} asked for)", current)};
    }
    // Down only when the whole down window asks for fewer: its busiest second, and what every
    // scale-up in it was for (a trend or a standing queue need not show in any one second), so
    // a replica added is not taken back at the next cycle.
    const double busiest =
        std::max(samples.max_offered(now, options_.down_window).value_or(0), largest_up(now));
    const int64_t wanted_down = ceil_replicas(busiest / target) + (busiest > 0 ? spare : 0);
    if (wanted_down < current && samples.covers(now, options_.down_window)) {
      const int64_t step =
          std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(current) *
                                                               options_.max_down_fraction)));
      const int64_t desired = clamp_to(options_.range, std::max(wanted_down, current - step));
      return {desired,
              fmt::format("down: busiest second {:.1f} over {} s / target {:.2f} = {} "
                          "(at most -{} per cycle)",
                          busiest, options_.down_window.count() / 1000, target, wanted_down, step)};
    }
    return {clamp_to(options_.range, current),
            fmt::format("hold: busiest second needs concurrency {:.1f} / target {:.2f} = {}",
                        *recent, target, wanted_up)};
  }

 private:
  // The largest concurrency a scale-up in the down window was for.
  double largest_up(Millis now) {
    while (!ups_.empty() && ups_.front().first <= now - options_.down_window) {
      ups_.pop_front();
    }
    double largest = 0;
    for (const auto& [time, needed] : ups_) {
      largest = std::max(largest, needed);
    }
    return largest;
  }

  // Replica failures within the down window, from the fleet's running count.
  int64_t recent_failures(Millis now, int64_t failures_total) {
    if (failures_.empty() || failures_.back().second != failures_total) {
      failures_.emplace_back(now, failures_total);
    }
    while (failures_.size() > 1 && failures_[1].first <= now - options_.down_window) {
      failures_.pop_front();
    }
    // The oldest entry is the count at (or before) the window's start.
    return failures_total - failures_.front().second;
  }

  ApaOptions options_;
  const double* target_;
  std::optional<Millis> last_full_cycle_;
  std::deque<std::pair<Millis, double>> ups_;        // (when, concurrency needed), oldest first
  std::deque<std::pair<Millis, int64_t>> failures_;  // (when, Fleet::failures then)
};

}  // namespace

Millis apa_decision_period(const ApaOptions& options) {
  return options.fast_period > Millis(0) ? std::min(options.fast_period, options.period)
                                         : options.period;
}

std::unique_ptr<Policy> make_apa_policy(const ApaOptions& options,
                                        const double* target_concurrency) {
  FLOTILLA_CHECK(target_concurrency != nullptr);
  return std::make_unique<ApaPolicy>(options, target_concurrency);
}

namespace {

constexpr double kShortMargin = 0.03;

// What a throughput curve says: its knee, and where it was seen.
struct Knee {
  double concurrency = 0;  // the smallest concurrency at the fraction of the best throughput
  double best = 0;         // the best throughput per replica, per second
  double best_at = 0;      // the concurrency where it was seen
  double lowest = 0;       // the smallest and largest concurrency seen
  double top = 0;
  bool below_seen = false;  // a concurrency short of the fraction was seen under the knee
};

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// A bin of the curve as one point: the medians of its readings' (concurrency, throughput).
template <typename Readings>
std::pair<double, double> point_of(const Readings& readings) {
  std::vector<double> concurrency;
  std::vector<double> throughput;
  for (const auto& reading : readings) {
    concurrency.push_back(reading.concurrency);
    throughput.push_back(reading.throughput);
  }
  return {median_of(std::move(concurrency)), median_of(std::move(throughput))};
}

// nullopt while the curve is empty.
template <typename Curve>
std::optional<Knee> knee_of(const Curve& curve, double fraction) {
  std::vector<std::pair<double, double>> points;  // (concurrency, throughput), ascending
  for (const auto& [bin, readings] : curve) {
    points.push_back(point_of(readings));
  }
  if (points.empty()) {
    return std::nullopt;
  }
  Knee knee;
  knee.lowest = points.front().first;
  knee.top = points.back().first;
  // The best: the highest median of three neighbouring points (one cycle's noise at the top of
  // a flat curve would set it alone otherwise, and make the knee's neighbours look short).
  for (size_t i = 0; i < points.size(); ++i) {
    std::vector<double> around = {points[i].second};
    if (i > 0) {
      around.push_back(points[i - 1].second);
    }
    if (i + 1 < points.size()) {
      around.push_back(points[i + 1].second);
    }
    const double smoothed = points.size() < 3 ? points[i].second : median_of(around);
    if (smoothed > knee.best) {
      knee.best = smoothed;
      knee.best_at = points[i].first;
    }
  }
  const double goal = fraction * knee.best;
  for (size_t i = 0; i < points.size(); ++i) {
    if (points[i].second >= goal) {
      knee.concurrency = points[i].first;
      if (i > 0) {
        // Linear between the last point short of the goal and the first one at it.
        const auto [c0, x0] = points[i - 1];
        const auto [c1, x1] = points[i];
        knee.concurrency = c0 + (c1 - c0) * (goal - x0) / std::max(x1 - x0, 1e-12);
      }
      // Seen below: a point short of the goal by a margin (noise on a gently rising curve is
      // not the knee).
      for (size_t j = 0; j < i; ++j) {
        knee.below_seen = knee.below_seen || points[j].second < goal * (1 - kShortMargin);
      }
      break;
    }
  }
  return knee;
}

}  // namespace

VerticalPolicy::VerticalPolicy(const VerticalOptions& options)
    : options_(options),
      target_(std::clamp(options.initial_target, options.min_target, options.max_target)),
      baseline_ms_(options.initial_baseline_ms) {
  if (baseline_ms_) {
    baseline_window_.push_back(*baseline_ms_);
  }
}

Decision VerticalPolicy::decide_target(const ReplicaSignals& signals) {
  // Requests waiting inside replicas for room (a full batch, busy slots) are overload: the
  // replicas were given more than they take at once. (The LLM engine does not count a request
  // that waits for the next step of a batch with room: that wait is its batching.)
  const bool queueing = signals.queued_in_replica >= 1;
  const bool saturated = signals.cpu_utilization >= options_.cpu_saturated;
  // The baseline: a low percentile of recent cycles' latency while nothing queued and the CPU
  // had room.
  if (signals.latency_ms > 0 && signals.queued_in_replica < 0.5 && !saturated) {
    baseline_window_.push_back(signals.latency_ms);
    while (baseline_window_.size() >
           static_cast<size_t>(std::max(1, options_.baseline_window_cycles))) {
      baseline_window_.pop_front();
    }
    std::vector<double> sorted(baseline_window_.begin(), baseline_window_.end());
    std::sort(sorted.begin(), sorted.end());
    const double rank =
        std::clamp(options_.baseline_percentile, 0.0, 1.0) * static_cast<double>(sorted.size() - 1);
    baseline_ms_ = sorted[static_cast<size_t>(std::floor(rank))];
  }
  // The throughput curve. Little's law holds at any load, so a cycle below the target is a
  // point of the curve too (at its own concurrency).
  bool bought_throughput = false;  // this cycle's throughput beat every lower concurrency's
  if (signals.concurrency > 0 && signals.latency_ms > 0) {
    const int bin = static_cast<int>(std::lround(
        std::log(signals.concurrency) / std::log(std::max(1.01, options_.curve_bin_ratio))));
    const double throughput = signals.concurrency / signals.latency_ms * 1000;
    // Judged against the bins from half this concurrency up: a replica saturated at 2 in flight
    // gives twice at 8 what it gave at 1, and nothing between would say that 2 gave as much.
    double best_below = 0;
    for (auto it = curve_.begin(); it != curve_.end() && it->first < bin; ++it) {
      const auto [concurrency, usual] = point_of(it->second);
      if (concurrency >= signals.concurrency / 2) {
        best_below = std::max(best_below, usual);
      }
    }
    bought_throughput = best_below > 0 && throughput > best_below * (1 + kShortMargin);
    if (const auto& readings = curve_[bin]; readings.size() >= 3) {
      const double usual = point_of(readings).second;
      drift_streak_ =
          std::abs(throughput / usual - 1) > options_.relearn_drift ? drift_streak_ + 1 : 0;
    }
    if (drift_streak_ >= std::max(1, options_.relearn_cycles)) {
      drift_streak_ = 0;
      curve_.clear();
      explored_above_ = false;
      explored_below_ = false;
    }
    auto& kept = curve_[bin];
    kept.push_back({signals.concurrency, throughput});
    while (kept.size() > static_cast<size_t>(std::max(1, options_.curve_samples))) {
      kept.pop_front();
    }
  }
  const std::optional<Knee> knee = knee_of(curve_, options_.knee_fraction);
  // Known above: seen far enough past the knee and past where the best throughput was (a
  // curve still rising at the top of what was seen has its best, and so its knee, further up:
  // a live XGBoost replica read flat from 2 to 11 in flight, its best at 24).
  explored_above_ =
      explored_above_ || target_ >= options_.max_target ||
      (knee && knee->top >= std::min(0.9 * options_.max_target,
                                     std::max(options_.explored_above_factor * knee->concurrency,
                                              options_.explored_past_best_factor * knee->best_at)));
  explored_below_ =
      explored_below_ || (knee && (knee->below_seen || knee->concurrency <= options_.min_target));
  const bool knee_known = knee && explored_above_ && explored_below_;

  // Slow means slower by a ratio and by an absolute floor, under load; but latency that bought
  // throughput (more than any lower concurrency gave) is its price, not overload (an LLM's
  // latency climbs from one request in flight while its throughput rises to 16 and more: the
  // latency rule alone stopped a live probe at 15 with the knee at 15.5), and so is the latency
  // at or below a knee known from both sides.
  const bool loaded = signals.peak_concurrency >= options_.overload_busy_fraction * target_;
  const bool slow = baseline_ms_ && loaded &&
                    signals.latency_ms > *baseline_ms_ * options_.overload_latency_ratio &&
                    signals.latency_ms - *baseline_ms_ >= options_.overload_min_excess_ms &&
                    !bought_throughput &&
                    !(knee_known && target_ <= knee->concurrency * (1 + options_.knee_band));
  const bool overload = slow || queueing;
  overload_streak_ = overload ? overload_streak_ + 1 : 0;
  if (overload) {
    if (overload_streak_ < options_.decrease_cycles) {
      return {0, ""};
    }
    overload_streak_ = 0;
    explored_above_ = true;
    const double next = std::max(options_.min_target, target_ * options_.decrease_factor);
    if (next < target_) {
      Decision decision{0, fmt::format("target {:.2f} -> {:.2f}: overload (latency {:.1f} ms vs "
                                       "baseline {:.1f} ms, queued {:.1f}, cpu {:.0f}%)",
                                       target_, next, signals.latency_ms, baseline_ms_.value_or(0),
                                       signals.queued_in_replica, signals.cpu_utilization * 100)};
      target_ = next;
      return decision;
    }
    return {0, ""};
  }

  // The curve moves the target only under load: the busiest second filled the replicas, and
  // the cycle ran near the target; both against the gateway's cap, the target rounded (a
  // replica capped at 3 never fills 90% of 3.45).
  const double cap = static_cast<double>(gateway_cap(target_));
  const bool full = signals.peak_concurrency >= options_.busy_fraction * cap &&
                    signals.concurrency >= options_.probe_mean_fraction * cap;
  if (!full || !knee) {
    return {0, ""};
  }
  double next = target_;
  std::string_view why;
  // A probe moves the gateway's cap (the target rounded) by one at least: below 4, 25% of the
  // target would leave it where it is, and the replica would never fill a target above it.
  if (!explored_below_) {
    next = std::min(target_ * (1 - options_.max_change), std::round(target_) - 1);
    why = "probe down";
  } else if (!explored_above_) {
    next = std::max(target_ * (1 + options_.max_change), std::round(target_) + 1);
    why = "probe up";
  } else if (target_ > knee->concurrency * (1 + options_.knee_band)) {
    // With nothing short of the goal below it in the curve as it reads now (the short reading
    // that ended the probe down was noise, and newer ones replaced it), the knee is only the
    // lowest concurrency seen: the way down is a probe, not one bin a cycle (live, an XGBoost
    // target took 5 cycles from 36 to 24 with its knee at 10).
    next = knee->below_seen ? std::max(knee->concurrency, target_ * (1 - options_.max_change))
                            : target_ * (1 - options_.max_change);
    why = knee->below_seen ? "down to the knee" : "probe down";
  } else if (target_ < knee->concurrency * (1 - options_.knee_band)) {
    next = std::min(knee->concurrency, target_ * (1 + options_.max_change));
    why = "up to the knee";
  }
  next = std::clamp(next, options_.min_target, options_.max_target);
  if (next == target_) {
    return {0, ""};
  }
  Decision decision{
      0,
      fmt::format("target {:.2f} -> {:.2f}: {} (knee {:.1f}: {:.0f}% of the best {:.1f}/s a "
                  "replica, seen {:.1f} to {:.1f} in flight; latency {:.1f} ms, cpu {:.0f}%)",
                  target_, next, why, knee->concurrency, options_.knee_fraction * 100, knee->best,
                  knee->lowest, knee->top, signals.latency_ms, signals.cpu_utilization * 100)};
  target_ = next;
  return decision;
}

}  // namespace flotilla::autoscaler

// The autoscalers Flotilla is compared with, as their sources have them (each rule cites the
// file it comes from): Kubernetes HPA v2, Knative KPA, Ray Serve, and static provisioning. The
// options default to each one's published defaults; the simulator also runs each configured as
// a user would for the endpoint (src/sim/sim.h).
#include <algorithm>
#include <cmath>
#include <deque>

#include <fmt/format.h>

#include "autoscaler/autoscaler.h"
#include "autoscaler/replica_math.h"

namespace flotilla::autoscaler {
namespace {

using detail::ceil_replicas;
using detail::clamp_to;
using detail::current_of;

// Kubernetes HPA v2 (kubernetes/kubernetes, master as read in 2026), one step per rule:
// - the sync period: --horizontal-pod-autoscaler-sync-period, 15 s;
// - the recommendation (pkg/controller/podautoscaler/replica_calculator.go,
//   GetMetricReplicas / calcPlainMetricReplicas for a Pods metric with an AverageValue
//   target): ratio = mean usage per ready pod / target; within the 10% tolerance
//   (--horizontal-pod-autoscaler-tolerance) keep the count, else ceil(ratio x ready);
// - the stabilization (horizontal.go, stabilizeRecommendationWithBehaviors): up, the least
//   recommendation of the scale-up window (0 s by default: the newest); down, the greatest of
//   the scale-down window (300 s);
// - the rate limits (horizontal.go, convertDesiredReplicasWithBehaviorRate, with the default
//   behaviors of pkg/apis/autoscaling/v2/defaults.go): up by at most max(4 pods, 100%) per
//   15 s, down by at most 100% per 15 s.
class HpaPolicy final : public Policy {
 public:
  explicit HpaPolicy(const HpaOptions& options) : options_(options) {}
  std::string_view name() const override { return "hpa"; }
  Millis period() const override { return options_.period; }

  Decision decide(Millis now, const SampleWindow& samples, const Fleet& fleet) override {
    const int64_t current = current_of(fleet);
    const auto usage = samples.mean_demand(now, options_.period);
    if (!usage) {
      return {clamp_to(options_.range, current), "no metrics: keep"};
    }
    int64_t recommendation = current;
    double ratio = 0;
    if (fleet.ready > 0) {
      ratio = *usage / static_cast<double>(fleet.ready) / options_.target_per_replica;
      if (std::abs(ratio - 1) > options_.tolerance) {
        recommendation = ceil_replicas(ratio * static_cast<double>(fleet.ready));
      }
    } else {
      recommendation = std::max<int64_t>(current, 1);  // HPA cannot scale from zero ready pods
    }
    recommendations_.push_back({now, recommendation});
    while (!recommendations_.empty() &&
           recommendations_.front().first <= now - options_.down_stabilization) {
      recommendations_.pop_front();
    }
    int64_t desired = current;
    if (recommendation > current) {
      const int64_t limit =
          std::max(current + options_.up_pods,
                   ceil_replicas(static_cast<double>(current) * (1 + options_.up_percent / 100)));
      desired = std::min(recommendation, limit);
    } else {
      int64_t stabilized = recommendation;
      for (const auto& [time, value] : recommendations_) {
        stabilized = std::max(stabilized, value);
      }
      const int64_t floor = current - static_cast<int64_t>(std::floor(static_cast<double>(current) *
                                                                      options_.down_percent / 100));
      desired = std::max(std::min(current, stabilized), floor);
    }
    desired = clamp_to(options_.range, desired);
    return {desired, fmt::format("usage {:.1f} on {} ready, ratio {:.2f}: recommend {}, desired {}",
                                 *usage, fleet.ready, ratio, recommendation, desired)};
  }

 private:
  HpaOptions options_;
  std::deque<std::pair<Millis, int64_t>> recommendations_;
};

// Knative KPA (knative/serving, master as read in 2026: pkg/autoscaler/scaling/autoscaler.go,
// with the config-autoscaler defaults of pkg/autoscaler/config/config.go; not modelled: the
// activator's target-burst-capacity): every tick-interval (2 s), the stable
// (stable-window, 60 s) and panic (panic-window-percentage 10%: 6 s) averages of concurrency
// against a target of container-concurrency-target-percentage (70%) of the container
// concurrency (container-concurrency-target-default, 100, when the revision sets none); panic
// when the panic window wants >= panic-threshold-percentage (200%) of the ready pods, during
// which the count never goes down, left a stable window after the last tick over the
// threshold; bounded to max-scale-up-rate (x1000) up and max-scale-down-rate (/2) down; zero
// after scale-to-zero-grace-period (30 s) with no demand.
class KpaPolicy final : public Policy {
 public:
  explicit KpaPolicy(const KpaOptions& options) : options_(options) {}
  std::string_view name() const override { return "kpa"; }
  Millis period() const override { return options_.period; }

  Decision decide(Millis now, const SampleWindow& samples, const Fleet& fleet) override {
    const int64_t current = current_of(fleet);
    const double target = options_.container_concurrency * options_.target_utilization;
    const auto stable = samples.mean_demand(now, options_.stable_window);
    const auto panic = samples.mean_demand(now, options_.panic_window);
    if (!stable || !panic) {
      return {clamp_to(options_.range, current), "no metrics: keep"};
    }
    const int64_t want_stable = ceil_replicas(*stable / target);
    const int64_t want_panic = ceil_replicas(*panic / target);
    const double ready = static_cast<double>(std::max<int64_t>(fleet.ready, 1));
    if (static_cast<double>(want_panic) / ready >= options_.panic_threshold) {
      panicking_ = true;
      last_over_threshold_ = now;
    } else if (panicking_ && now - last_over_threshold_ >= options_.stable_window) {
      panicking_ = false;
    }
    int64_t desired = panicking_ ? std::max(want_panic, current) : want_stable;
    desired = std::min(desired, ceil_replicas(ready * options_.max_up_rate));
    desired = std::max(desired, static_cast<int64_t>(std::floor(static_cast<double>(fleet.ready) /
                                                                options_.max_down_rate)));
    if (desired == 0) {
      // Zero only after the grace period with no demand; until then keep one.
      if (!idle_since_) {
        idle_since_ = now;
      }
      if (!options_.range.scale_to_zero || now - *idle_since_ < options_.scale_to_zero_grace) {
        desired = 1;
      }
    } else {
      idle_since_.reset();
    }
    desired = clamp_to(options_.range, desired);
    return {desired, fmt::format("{}stable {:.1f} -> {}, panic {:.1f} -> {}, desired {}",
                                 panicking_ ? "PANIC: " : "", *stable, want_stable, *panic,
                                 want_panic, desired)};
  }

 private:
  KpaOptions options_;
  bool panicking_ = false;
  Millis last_over_threshold_{0};
  std::optional<Millis> idle_since_;
};

// Ray Serve (python/ray/serve/autoscaling_policy.py, master of 2026), one step per rule:
// - the cold start fast path (_get_cold_start_scale_up_replicas): with no running replica and
//   requests waiting, max(ceil(1 x upscaling_factor), the current target) at once, no delay;
// - the core policy (_core_replica_queue_length_policy): desired = running x (requests /
//   (target_ongoing_requests x running)), requests being ongoing + queued averaged over
//   look_back_period_s;
// - the scaling factors (_apply_scaling_factors): ceil(running + factor x (desired - running)),
//   one less when a scale-down would otherwise be stuck at the running count;
// - the bounds (_apply_bounds): [min_replicas, max_replicas];
// - the delays (_apply_delay_logic): a decision counter, +1 per control loop that wants more
//   than the current target and -1 per loop that wants fewer (reset when the direction
//   changes or nothing is wanted); the new count applies once the counter passes
//   upscale_delay_s / CONTROL_LOOP_INTERVAL_S (downscale_delay_s, or
//   downscale_to_zero_delay_s for 1 -> 0; below 1 only from 1).
class RayPolicy final : public Policy {
 public:
  explicit RayPolicy(const RayOptions& options) : options_(options) {}
  std::string_view name() const override { return "ray"; }
  Millis period() const override { return options_.period; }

  Decision decide(Millis now, const SampleWindow& samples, const Fleet& fleet) override {
    const int64_t target = current_of(fleet);
    const int64_t running = fleet.ready;
    const auto requests = samples.mean_demand(now, options_.look_back);
    if (!requests) {
      return {target, "no metrics: keep"};
    }
    if (running == 0) {
      const int64_t desired =
          *requests > 0 ? std::max(ceil_replicas(options_.upscaling_factor), target) : target;
      counter_ = 0;
      return {desired, fmt::format("cold start: {:.1f} requests, no running replica: {}", *requests,
                                   desired)};
    }
    const double wanted = *requests / options_.target_ongoing_requests;
    const double delta = wanted - static_cast<double>(running);
    const double factor = delta > 0 ? options_.upscaling_factor : options_.downscaling_factor;
    int64_t scaled = ceil_replicas(static_cast<double>(running) + factor * delta);
    if (ceil_replicas(wanted) < running && scaled == running) {
      scaled -= 1;
    }
    int64_t bounded =
        std::clamp(scaled, options_.range.min, std::max(options_.range.min, options_.range.max));
    int64_t desired = target;
    if (bounded > target) {
      counter_ = std::max<int64_t>(counter_, 0) + 1;
      if (counter_ > loops(options_.upscale_delay)) {
        counter_ = 0;
        desired = bounded;
      }
    } else if (bounded < target) {
      counter_ = std::min<int64_t>(counter_, 0) - 1;
      Millis delay = options_.downscale_delay;
      if (target == 1) {
        delay = options_.downscale_to_zero_delay.value_or(options_.downscale_delay);
      } else {
        bounded = std::max<int64_t>(bounded, 1);
      }
      if (counter_ < -loops(delay)) {
        counter_ = 0;
        desired = bounded;
      }
    } else {
      counter_ = 0;
    }
    return {desired, fmt::format("{:.1f} requests / {:.1f} per replica on {} running: {}, "
                                 "counter {}, desired {}",
                                 *requests, options_.target_ongoing_requests, running, bounded,
                                 counter_, desired)};
  }

 private:
  // int(delay_s / CONTROL_LOOP_INTERVAL_S): the control loops a decision must last.
  int64_t loops(Millis delay) const { return delay.count() / options_.period.count(); }

  RayOptions options_;
  int64_t counter_ = 0;
};

class StaticPolicy final : public Policy {
 public:
  explicit StaticPolicy(int64_t replicas) : replicas_(replicas) {}
  std::string_view name() const override { return "static"; }
  Millis period() const override { return Millis(60'000); }
  Decision decide(Millis, const SampleWindow&, const Fleet&) override {
    return {replicas_, fmt::format("static: {}", replicas_)};
  }

 private:
  int64_t replicas_;
};

}  // namespace

std::unique_ptr<Policy> make_hpa_policy(const HpaOptions& options) {
  return std::make_unique<HpaPolicy>(options);
}
std::unique_ptr<Policy> make_kpa_policy(const KpaOptions& options) {
  return std::make_unique<KpaPolicy>(options);
}
RayOptions ray_auto_options() {
  RayOptions options;
  options.target_ongoing_requests = 2;
  options.range = {1, 100, false};
  return options;
}
std::unique_ptr<Policy> make_ray_policy(const RayOptions& options) {
  return std::make_unique<RayPolicy>(options);
}
std::unique_ptr<Policy> make_static_policy(int64_t replicas) {
  return std::make_unique<StaticPolicy>(replicas);
}

}  // namespace flotilla::autoscaler

// The autoscalers Flotilla is compared with, at their published defaults: Kubernetes HPA v2,
// Knative KPA, Ray Serve, and static provisioning.
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

// Kubernetes HPA v2 (pkg/controller/podautoscaler): every 15 s, desired = ceil(ratio x ready)
// unless the ratio is within the tolerance; scale-up at once, bounded by max(+4 pods, +100%)
// per period; scale-down to the highest recommendation of the last 300 s.
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

// Knative KPA (pkg/autoscaler/scaling/autoscaler.go): every 2 s, stable (60 s) and panic (6 s)
// averages against a target of 0.7 x container concurrency; panic mode when the panic window
// wants >= 2x the ready replicas, during which the count never goes down, left 60 s after the
// last tick over the threshold; rates bounded to x1000 up and /2 down; zero after 30 s idle.
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

// Ray Serve (serve/autoscaling_policy.py): desired = (ongoing + queued) / target over a 30 s
// look-back, applied only when wanted continuously for 30 s (up) or 600 s (down).
class RayPolicy final : public Policy {
 public:
  explicit RayPolicy(const RayOptions& options) : options_(options) {}
  std::string_view name() const override { return "ray"; }
  Millis period() const override { return options_.period; }

  Decision decide(Millis now, const SampleWindow& samples, const Fleet& fleet) override {
    const int64_t current = current_of(fleet);
    const auto demand = samples.mean_demand(now, options_.look_back);
    if (!demand) {
      return {clamp_to(options_.range, current), "no metrics: keep"};
    }
    const int64_t wanted =
        clamp_to(options_.range, ceil_replicas(*demand / options_.target_ongoing_requests));
    int64_t desired = current;
    if (wanted > current) {
      down_since_.reset();
      up_since_ = up_since_.value_or(now);
      if (now - *up_since_ >= options_.upscale_delay) {
        desired = wanted;
        up_since_.reset();
      }
    } else if (wanted < current) {
      up_since_.reset();
      down_since_ = down_since_.value_or(now);
      if (now - *down_since_ >= options_.downscale_delay) {
        desired = wanted;
        down_since_.reset();
      }
    } else {
      up_since_.reset();
      down_since_.reset();
    }
    return {clamp_to(options_.range, desired),
            fmt::format("demand {:.1f} / {:.1f} per replica = {}, desired {}", *demand,
                        options_.target_ongoing_requests, wanted, desired)};
  }

 private:
  RayOptions options_;
  std::optional<Millis> up_since_;
  std::optional<Millis> down_since_;
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
std::unique_ptr<Policy> make_ray_policy(const RayOptions& options) {
  return std::make_unique<RayPolicy>(options);
}
std::unique_ptr<Policy> make_static_policy(int64_t replicas) {
  return std::make_unique<StaticPolicy>(replicas);
}

}  // namespace flotilla::autoscaler

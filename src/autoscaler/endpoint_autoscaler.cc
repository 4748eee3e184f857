// EndpointAutoscaler: APA's horizontal and vertical policies wired into one endpoint's loop,
// the same for `flotilla up` and the simulator.
#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "autoscaler/autoscaler.h"
#include "autoscaler/replica_math.h"

namespace flotilla::autoscaler {

EndpointAutoscaler::EndpointAutoscaler(const ApaOptions& horizontal,
                                       const VerticalOptions& vertical, RangeFor range_for,
                                       int64_t replicas, Millis now,
                                       const ForecastOptions& forecast)
    : horizontal_period_(apa_decision_period(horizontal)),
      vertical_period_(vertical.period),
      range_for_(std::move(range_for)),
      vertical_(std::make_unique<VerticalPolicy>(vertical)),
      target_(vertical_->target()),
      utilization_(horizontal.utilization),
      forecaster_(forecast),
      forecast_enabled_(forecast.enabled),
      spare_start_(horizontal.spare_start),
      start_hedge_(horizontal.start_hedge),
      next_horizontal_(now + horizontal_period_),
      next_vertical_(now + vertical.period) {
  decide_on_samples_ = horizontal.fast_period > Millis(0);
  ApaOptions open = horizontal;
  open.range = ReplicaRange{0, std::numeric_limits<int64_t>::max(), /*scale_to_zero=*/true};
  horizontal_ = make_apa_policy(open, &target_);
  replicas_ = std::max(replicas, range_for_(target_).min);
}

void EndpointAutoscaler::set_range(RangeFor range_for) {
  range_for_ = std::move(range_for);
  const ReplicaRange range = range_for_(target_);
  replicas_ = std::clamp(replicas_, range.min, range.max);
}

void EndpointAutoscaler::restart_vertical(const VerticalOptions& vertical) {
  vertical_ = std::make_unique<VerticalPolicy>(vertical);
  target_ = vertical_->target();
}

void EndpointAutoscaler::add_samples(std::span<const LoadSample> samples, int64_t ready) {
  const double replicas = static_cast<double>(std::max<int64_t>(ready, 1));
  for (const LoadSample& sample : samples) {
    if (sample.unix_ms <= last_sample_unix_ms_) {
      continue;
    }
    last_sample_unix_ms_ = sample.unix_ms;
    window_.add(Sample{Millis(sample.unix_ms), sample.concurrency, sample.queued,
                       static_cast<double>(sample.arrivals),
                       static_cast<double>(sample.completions)});
    forecaster_.add(Millis(sample.unix_ms),
                    window_.max_offered(Millis(sample.unix_ms), Millis(1'000)).value_or(0));
    latency_weighted_sum_ += sample.latency_ms * static_cast<double>(sample.completions);
    completions_sum_ += static_cast<double>(sample.completions);
    concurrency_sum_ += sample.concurrency;
    sample_count_ += 1;
    const double per_replica = sample.concurrency / replicas;
    if (sample.completions > 0 && per_replica > peak_concurrency_) {
      peak_concurrency_ = per_replica;
      peak_latency_ms_ = sample.latency_ms;
    }
  }
}

std::vector<std::string> EndpointAutoscaler::tick(Millis now, int64_t ready, int64_t pending,
                                                  int64_t failures,
                                                  const std::function<ReplicaUsage()>& usage) {
  std::vector<std::string> changes;
  if (now >= next_vertical_) {
    next_vertical_ = now + vertical_period_;
    // Read on every due tick, idle ones too, so that the first busy cycle has a reading to
    // difference against (a replica's queue is known from its second reading on).
    const ReplicaUsage used = ready > 0 ? usage() : ReplicaUsage{};
    if (completions_sum_ > 0 && ready > 0 && used.queued) {
      ReplicaSignals signals;
      signals.latency_ms = latency_weighted_sum_ / completions_sum_;
      signals.concurrency = concurrency_sum_ /
                            static_cast<double>(std::max<int64_t>(1, sample_count_)) /
                            static_cast<double>(ready);
      signals.peak_concurrency = peak_concurrency_;
      signals.peak_latency_ms = peak_latency_ms_;
      signals.cpu_utilization = used.cpu_utilization;
      signals.queued_in_replica = *used.queued;
      const Decision decision = vertical_->decide_target(signals);
      if (!decision.reason.empty()) {
        changes.push_back("vertical: " + decision.reason);
        target_ = vertical_->target();  // the horizontal policy and its range follow at once
      }
    }
    latency_weighted_sum_ = 0;
    completions_sum_ = 0;
    concurrency_sum_ = 0;
    sample_count_ = 0;
    peak_concurrency_ = 0;
    peak_latency_ms_ = 0;
  }
  const bool new_sample = decide_on_samples_ && last_sample_unix_ms_ > decided_through_unix_ms_;
  if (now >= next_horizontal_ || new_sample) {
    next_horizontal_ = now + horizontal_period_;
    decided_through_unix_ms_ = last_sample_unix_ms_;
    const Fleet fleet{ready, pending, replicas_, failures, start_ms_};
    Decision decision = horizontal_->decide(now, window_, fleet);
    const ReplicaRange range = range_for_(target_);
    int64_t desired = detail::clamp_to(range, decision.desired);
    if (auto floor = forecast_floor(now, range); floor && floor->desired > desired) {
      desired = floor->desired;
      decision.reason = std::move(floor->reason);
    }
    // While nothing is ready (a cold start, scale from zero) capacity is on its way: a window
    // of idle seconds must not cancel it.
    const bool hold = desired < replicas_ && ready == 0;
    if (desired != replicas_ && !hold) {
      changes.push_back("horizontal: " + std::to_string(replicas_) + " -> " +
                        std::to_string(desired) + " replicas: " + decision.reason);
      replicas_ = desired;
    }
  }
  if (std::optional<std::string> hedged = hedge_starts(ready)) {
    changes.push_back(std::move(*hedged));
  }
  return changes;
}

std::optional<std::string> EndpointAutoscaler::hedge_starts(int64_t ready) {
  const int64_t before = hedge_;
  const int64_t missing = replicas_ - ready;
  hedge_ = 0;
  if (start_hedge_ > 0 && start_ms_ >= 0 && Millis(start_ms_) > spare_start_ && missing > 0) {
    const int64_t room = std::max<int64_t>(0, range_for_(target_).max - replicas_);
    hedge_ = std::min(detail::ceil_replicas(static_cast<double>(missing) * start_hedge_), room);
  }
  if (hedge_ <= before) {
    return std::nullopt;
  }
  return fmt::format(
      "hedged starts: {} replicas: {} more start beside the {} not yet ready (starts take {:.1f} "
      "s; the first ready serve, the rest are cancelled)",
      replicas_ + hedge_, hedge_, missing, static_cast<double>(start_ms_) / 1000);
}

std::optional<Decision> EndpointAutoscaler::forecast_floor(Millis now,
                                                           const ReplicaRange& range) const {
  if (!forecast_enabled_) {
    return std::nullopt;
  }
  const std::optional<Forecast> forecast = forecaster_.forecast(now);
  if (!forecast || forecast->concurrency <= 0) {
    return std::nullopt;
  }
  const double target = std::max(target_ * utilization_, 1e-6);
  const int64_t wanted = detail::ceil_replicas(forecast->concurrency / target);
  return Decision{
      detail::clamp_to(range, wanted),
      fmt::format("forecast: the busiest second in the next {:g} s at this time {} needs "
                  "concurrency {:.1f} (the median of the last {} {}) / target {:.2f} = {}",
                  static_cast<double>(forecaster_.options().lead.count()) / 1000,
                  forecast->weekly ? "of the week" : "of day", forecast->concurrency,
                  forecast->seasons, forecast->weekly ? "weeks" : "days", target, wanted)};
}

bool EndpointAutoscaler::request_capacity() {
  if (replicas_ > 0) {
    return false;
  }
  replicas_ = 1;
  return true;
}

}  // namespace flotilla::autoscaler

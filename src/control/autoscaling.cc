#include <algorithm>
#include <cmath>
#include <optional>

#include <nlohmann/json.hpp>

#include "control/control_scaling.h"

namespace flotilla::control {

int64_t version_replicas(const ServedModelSpec& served, const std::optional<Scale>& scale) {
  if (!scale) {
    return provisioned_replicas(served);
  }
  const int64_t own_min =
      served.scale_to_zero && served.concurrency.min == 0
          ? 0
          : std::max<int64_t>(1,
                              ceil_div(static_cast<double>(served.concurrency.min), scale->target));
  if (served.traffic <= 0) {
    return own_min;
  }
  const int64_t share = ceil_div(static_cast<double>(scale->replicas * served.traffic), 100.0);
  return std::max(own_min, share);
}

int64_t replica_cap(const ServedModelSpec& served, const std::optional<Scale>& scale) {
  return scale ? autoscaler::gateway_cap(scale->target) : initial_target_concurrency(served);
}

ConcurrencyRange target_bounds(const EndpointSpec& spec) {
  ConcurrencyRange bounds{1, 4096};
  for (const ServedModelSpec& served : spec.served_models) {
    const ConcurrencyRange own = per_replica_bounds(served);
    bounds.min = std::max(bounds.min, own.min);
    bounds.max = std::min(bounds.max, own.max);
  }
  bounds.max = std::max(bounds.max, bounds.min);
  return bounds;
}

autoscaler::ReplicaRange replica_range(const EndpointSpec& spec, double target) {
  double min_concurrency = 0;
  double max_concurrency = 0;
  bool scale_to_zero = true;
  for (const ServedModelSpec& served : spec.served_models) {
    min_concurrency += static_cast<double>(served.concurrency.min);
    max_concurrency += static_cast<double>(served.concurrency.max);
    scale_to_zero = scale_to_zero && served.scale_to_zero;
  }
  autoscaler::ReplicaRange range;
  range.scale_to_zero = scale_to_zero && min_concurrency == 0;
  range.min = std::max<int64_t>(range.scale_to_zero ? 0 : 1, ceil_div(min_concurrency, target));
  range.max = std::max(range.min, std::max<int64_t>(1, ceil_div(max_concurrency, target)));
  return range;
}

int64_t replicas_matching(const EndpointSpec& spec, const std::vector<int64_t>& running) {
  int64_t matching = 0;
  for (size_t i = 0; i < spec.served_models.size() && i < running.size(); ++i) {
    const int64_t traffic = spec.served_models[i].traffic;
    if (traffic > 0 && running[i] > 0) {
      // The least R with ceil(R * traffic / 100) >= running[i].
      matching = std::max(matching, (running[i] - 1) * 100 / traffic + 1);
    }
  }
  return matching;
}

std::string learned_target_to_json(const LearnedTarget& learned) {
  nlohmann::json json = {{"models", learned.models}, {"target", learned.target}};
  if (learned.baseline_ms) {
    json["baseline_ms"] = *learned.baseline_ms;
  }
  return json.dump();
}

std::optional<LearnedTarget> learned_target_from_json(const std::string& text) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("models") || !json["models"].is_string() ||
      !json.contains("target") || !json["target"].is_number() || !(json["target"] > 0)) {
    return std::nullopt;
  }
  LearnedTarget learned{json["models"].get<std::string>(), json["target"].get<double>(), {}};
  if (json.contains("baseline_ms")) {
    if (!json["baseline_ms"].is_number() || !(json["baseline_ms"] > 0)) {
      return std::nullopt;
    }
    learned.baseline_ms = json["baseline_ms"].get<double>();
  }
  return learned;
}

std::string learned_for(const EndpointSpec& spec) {
  std::vector<std::string> keys;
  for (const ServedModelSpec& served : spec.served_models) {
    keys.push_back(deployment_key(spec.name, served));
  }
  std::sort(keys.begin(), keys.end());
  const ConcurrencyRange bounds = target_bounds(spec);
  std::string identity = std::to_string(bounds.min) + ".." + std::to_string(bounds.max);
  for (const std::string& key : keys) {
    identity += " " + key;
  }
  return identity;
}

EndpointScaler::EndpointScaler(const EndpointSpec& spec, const AutoscalingOptions& options,
                               int64_t current_replicas, autoscaler::Millis now,
                               const std::optional<LearnedTarget>& saved)
    : options_(options), spec_(spec), learned_for_(learned_for(spec)) {
  autoscaler::VerticalOptions vertical;
  if (saved && saved->models == learned_for_) {
    vertical = vertical_options(saved->target, saved->baseline_ms);  // clamped to the bounds
  } else {
    double target = 0;
    for (const ServedModelSpec& served : spec.served_models) {
      target = std::max(target, static_cast<double>(initial_target_concurrency(served)));
    }
    vertical = vertical_options(target, std::nullopt);
  }
  autoscaler::ApaOptions horizontal;
  horizontal.period = options_.horizontal_period;
  horizontal.fast_period = options_.fast_period;
  horizontal.up_window = options_.up_window;
  horizontal.down_window = options_.down_window;
  horizontal.start_hedge = options_.hedge_starts ? horizontal.start_hedge : 0;
  autoscaler_ = std::make_unique<autoscaler::EndpointAutoscaler>(
      horizontal, vertical, range_for(), current_replicas, now,
      autoscaler::forecast_options_for_day(options_.forecast_day, spec.autoscaling.forecast));
}

void EndpointScaler::restore_demand(
    const std::vector<std::pair<autoscaler::Millis, double>>& buckets) {
  for (const auto& [start, peak] : buckets) {
    autoscaler_->forecaster().restore(start, peak);
  }
}

std::vector<std::pair<autoscaler::Millis, double>> EndpointScaler::take_closed_demand() {
  return autoscaler_->forecaster().take_closed();
}

autoscaler::Millis EndpointScaler::demand_kept_from(autoscaler::Millis now) const {
  return now - autoscaler_->forecaster().retention();
}

autoscaler::VerticalOptions EndpointScaler::vertical_options(
    double target, std::optional<double> baseline_ms) const {
  const ConcurrencyRange bounds = target_bounds(spec_);
  autoscaler::VerticalOptions vertical;
  vertical.period = options_.vertical_period;
  vertical.min_target = static_cast<double>(bounds.min);
  vertical.max_target = static_cast<double>(bounds.max);
  vertical.initial_target = target;
  vertical.initial_baseline_ms = baseline_ms;
  return vertical;
}

autoscaler::RangeFor EndpointScaler::range_for() const {
  return [spec = spec_](double target) {
    return replica_range(spec, target);
  };
}

Scale EndpointScaler::scale() const {
  return Scale{autoscaler_->replicas(), autoscaler_->target()};
}

LearnedTarget EndpointScaler::learned() const {
  return LearnedTarget{learned_for_, autoscaler_->target(), autoscaler_->baseline_ms()};
}

void EndpointScaler::update_spec(const EndpointSpec& spec) {
  if (spec == spec_) {
    return;
  }
  // The vertical policy's learned baseline belongs to the models that ran: it is kept through
  // a change of traffic or concurrency, and learned anew when a model or the bounds change.
  std::string identity = learned_for(spec);
  const bool same_models = identity == learned_for_;
  spec_ = spec;
  learned_for_ = std::move(identity);
  autoscaler_->set_forecast_enabled(spec_.autoscaling.forecast);
  if (!same_models) {
    const ConcurrencyRange bounds = target_bounds(spec_);
    const double target = std::clamp(autoscaler_->target(), static_cast<double>(bounds.min),
                                     static_cast<double>(bounds.max));
    autoscaler_->restart_vertical(vertical_options(target, std::nullopt));
  }
  autoscaler_->set_range(range_for());
}

void EndpointScaler::add_samples(const std::vector<LoadSample>& samples, int64_t ready) {
  autoscaler_->add_samples(samples, ready);
}

std::vector<std::string> EndpointScaler::tick(autoscaler::Millis now, int64_t ready,
                                              int64_t pending, int64_t failures,
                                              const std::function<ReplicaUsage()>& usage) {
  return autoscaler_->tick(now, ready, pending, failures, usage);
}

bool EndpointScaler::request_capacity() {
  return autoscaler_->request_capacity();
}

ReplicaUsage usage_from_changes(const std::vector<UsageChange>& changes) {
  double cpu_sum = 0;
  double queued_sum = 0;
  int cpu_measured = 0;
  int queue_measured = 0;
  int queue_unknown = 0;  // replicas that report a queue, read once so far
  for (const UsageChange& change : changes) {
    const UsageCounters& now = change.now;
    if (now.queue_wait_seconds && !(change.before && change.before->queue_wait_seconds)) {
      queue_unknown += 1;
    }
    if (!change.before) {
      continue;
    }
    const UsageCounters& before = *change.before;
    const double wall = std::chrono::duration<double>(now.at - before.at).count();
    // A counter that went back is a restarted process (a container keeps its pod's name):
    // no rate from it this time.
    if (wall > 0 && now.cpu_seconds >= before.cpu_seconds && before.cpu_seconds >= 0 &&
        now.cores > 0) {
      cpu_sum += (now.cpu_seconds - before.cpu_seconds) / wall / now.cores;
      cpu_measured += 1;
    }
    if (wall > 0 && now.queue_wait_seconds && before.queue_wait_seconds) {
      queued_sum += std::max(0.0, *now.queue_wait_seconds - *before.queue_wait_seconds) / wall;
      queue_measured += 1;
    }
  }
  ReplicaUsage usage;
  usage.cpu_utilization = cpu_measured > 0 ? std::clamp(cpu_sum / cpu_measured, 0.0, 1.0) : 0.0;
  if (queue_measured > 0) {
    usage.queued = queued_sum / queue_measured;
  } else if (queue_unknown > 0) {
    usage.queued = std::nullopt;
  }
  return usage;
}

}  // namespace flotilla::control

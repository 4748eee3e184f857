#include "control/autoscaling.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>

#include <nlohmann/json.hpp>

namespace flotilla::control {

std::optional<double> metric_value(std::string_view text, std::string_view name) {
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (line.size() > name.size() && line.starts_with(name) && line[name.size()] == ' ') {
      line.remove_prefix(name.size() + 1);
      double value = 0;
      const auto [rest, error] = std::from_chars(line.data(), line.data() + line.size(), value);
      const bool ends = rest == line.data() + line.size() || *rest == ' ' || *rest == '\r';
      return error == std::errc() && ends ? std::optional(value) : std::nullopt;
    }
  }
  return std::nullopt;
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
  if (saved && saved->models == learned_for_) {
    rebuild_policies(saved->target, saved->baseline_ms);  // the policy clamps it to the bounds
  } else {
    double target = 0;
    for (const ServedModelSpec& served : spec.served_models) {
      target = std::max(target, static_cast<double>(initial_target_concurrency(served)));
    }
    rebuild_policies(target);
  }
  const double target = vertical_->target();
  // Not capped by the range's maximum: the replicas running may come from another target (a
  // model changed while the control plane was down); the first decisions bring the count into
  // the range.
  scale_ = Scale{std::max(current_replicas, replica_range(spec_, target).min), target};
  next_horizontal_ = now + options_.horizontal_period;
  next_vertical_ = now + options_.vertical_period;
}

LearnedTarget EndpointScaler::learned() const {
  return LearnedTarget{learned_for_, vertical_->target(), vertical_->baseline_ms()};
}

void EndpointScaler::rebuild_policies(double target, std::optional<double> baseline_ms) {
  const ConcurrencyRange bounds = target_bounds(spec_);
  autoscaler::VerticalOptions vertical;
  vertical.period = options_.vertical_period;
  vertical.min_target = static_cast<double>(bounds.min);
  vertical.max_target = static_cast<double>(bounds.max);
  vertical.initial_target = target;
  vertical.initial_baseline_ms = baseline_ms;
  vertical_ = std::make_unique<autoscaler::VerticalPolicy>(vertical);
  rebuild_horizontal();
}

void EndpointScaler::rebuild_horizontal() {
  autoscaler::ApaOptions apa;
  apa.period = options_.horizontal_period;
  apa.up_window = options_.up_window;
  apa.down_window = options_.down_window;
  apa.range = replica_range(spec_, vertical_->target());
  horizontal_ = autoscaler::make_apa_policy(apa, vertical_->target_ptr());
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
  const ConcurrencyRange bounds = target_bounds(spec_);
  const double target = std::clamp(vertical_->target(), static_cast<double>(bounds.min),
                                   static_cast<double>(bounds.max));
  if (same_models) {
    rebuild_horizontal();
  } else {
    rebuild_policies(target);
  }
  const autoscaler::ReplicaRange range = replica_range(spec_, target);
  scale_ = Scale{std::clamp(scale_.replicas, range.min, range.max), target};
}

void EndpointScaler::add_samples(const std::vector<LoadSample>& samples) {
  for (const LoadSample& sample : samples) {
    if (sample.unix_ms <= last_sample_unix_ms_) {
      continue;
    }
    last_sample_unix_ms_ = sample.unix_ms;
    autoscaler::Sample converted;
    converted.time = autoscaler::Millis(sample.unix_ms);
    converted.concurrency = sample.concurrency;
    converted.queued = sample.queued;
    converted.arrivals = static_cast<double>(sample.arrivals);
    converted.completions = static_cast<double>(sample.completions);
    window_.add(converted);
    latency_weighted_sum_ += sample.latency_ms * static_cast<double>(sample.completions);
    completions_sum_ += static_cast<double>(sample.completions);
    concurrency_sum_ += sample.concurrency;
    sample_count_ += 1;
    if (sample.completions > 0 && sample.concurrency > peak_concurrency_) {
      peak_concurrency_ = sample.concurrency;
      peak_latency_ms_ = sample.latency_ms;
    }
  }
}

std::vector<std::string> EndpointScaler::tick(autoscaler::Millis now, int64_t ready,
                                              int64_t pending, int64_t failures,
                                              const std::function<ReplicaUsage()>& usage) {
  std::vector<std::string> changes;
  if (now >= next_vertical_) {
    next_vertical_ = now + options_.vertical_period;
    // Read on every due tick, idle ones too, so that the first busy cycle has a reading to
    // difference against (a replica's queue is known from its second reading on).
    const ReplicaUsage used = ready > 0 ? usage() : ReplicaUsage{};
    if (completions_sum_ > 0 && ready > 0 && used.queued) {
      autoscaler::ReplicaSignals signals;
      signals.latency_ms = latency_weighted_sum_ / completions_sum_;
      signals.concurrency = concurrency_sum_ /
                            static_cast<double>(std::max<int64_t>(1, sample_count_)) /
                            static_cast<double>(ready);
      signals.peak_concurrency = peak_concurrency_ / static_cast<double>(ready);
      signals.peak_latency_ms = peak_latency_ms_;
      signals.cpu_utilization = used.cpu_utilization;
      signals.queued_in_replica = *used.queued;
      const autoscaler::Decision decision = vertical_->decide_target(signals);
      if (!decision.reason.empty()) {
        changes.push_back("vertical: " + decision.reason);
        scale_.target = vertical_->target();
        // The range in replicas follows the target; the vertical policy keeps its baseline.
        rebuild_horizontal();
      }
    }
    latency_weighted_sum_ = 0;
    completions_sum_ = 0;
    concurrency_sum_ = 0;
    sample_count_ = 0;
    peak_concurrency_ = 0;
    peak_latency_ms_ = 0;
  }
  if (now >= next_horizontal_) {
    next_horizontal_ = now + options_.horizontal_period;
    autoscaler::Fleet fleet{ready, pending, scale_.replicas, failures};
    const autoscaler::Decision decision = horizontal_->decide(now, window_, fleet);
    // While nothing is ready (a cold start, scale from zero) capacity is on its way: a window
    // of idle seconds must not cancel it.
    const bool hold = decision.desired < scale_.replicas && ready == 0;
    if (decision.desired != scale_.replicas && !hold) {
      changes.push_back("horizontal: " + std::to_string(scale_.replicas) + " -> " +
                        std::to_string(decision.desired) + " replicas: " + decision.reason);
      scale_.replicas = decision.desired;
    }
  }
  return changes;
}

bool EndpointScaler::request_capacity() {
  if (scale_.replicas > 0) {
    return false;
  }
  scale_.replicas = 1;
  return true;
}

}  // namespace flotilla::control

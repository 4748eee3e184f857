// The autoscaler's live loop for one endpoint (DESIGN.md §4, issue #5; docs/autoscaler.md):
// the APA horizontal policy on the gateway's 1-second samples and the APA vertical policy on the
// replicas' latency and CPU, turned into a replica count and a per-replica concurrency target
// that the reconciler applies. Private to the control module. Not thread-safe: the control
// plane's reconciler thread owns every EndpointScaler.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "autoscaler/autoscaler.h"
#include "control/control.h"
#include "control/reconciler.h"
#include "control/spec.h"
#include "gateway/gateway.h"

namespace flotilla::control {

// The replica range and the per-replica bounds of an endpoint's spec (the sum over its served
// models): concurrency range / target, at least 1 replica unless every served model may scale
// to zero and asks for no minimum.
autoscaler::ReplicaRange replica_range(const EndpointSpec& spec, double target);
ConcurrencyRange target_bounds(const EndpointSpec& spec);

// The least endpoint replica count that version_replicas() turns into at least `running` (live
// replicas per served model, in spec order): after a restart, the scaler starts where the fleet
// already is, removing nothing.
int64_t replicas_matching(const EndpointSpec& spec, const std::vector<int64_t>& running);

// What the vertical policy learned, kept across restarts of the control plane: valid for the
// models and per-replica bounds it was learned on (`models`, see learned_for()).
struct LearnedTarget {
  std::string models;
  double target = 0;
  std::optional<double> baseline_ms;
  bool operator==(const LearnedTarget&) const = default;
};

// As stored: {"models", "target", "baseline_ms"}; nullopt for anything else.
std::string learned_target_to_json(const LearnedTarget& learned);
std::optional<LearnedTarget> learned_target_from_json(const std::string& json);

// The identity of what a learned target applies to: the endpoint's deployment keys (a model
// and its runtime settings) and its per-replica bounds.
std::string learned_for(const EndpointSpec& spec);

// The value of the unlabelled sample `name` in a Prometheus text exposition (a line
// `name value`); nullopt when there is none or its value is not a number.
std::optional<double> metric_value(std::string_view text, std::string_view name);

// What an endpoint's ready replicas did over an interval, as the vertical policy reads it.
struct ReplicaUsage {
  double cpu_utilization = 0;  // mean over the replicas, 0..1 of the cores each may use
  // Mean requests waiting inside a replica for its engine (a full batch); nullopt when the
  // replicas report a queue but none has been read twice yet (unknown, not zero). Replicas
  // that report none (an external server) count as 0.
  std::optional<double> queued = 0;
};

class EndpointScaler {
 public:
  // Starts at `saved`'s target and baseline when it was learned for this spec's models and
  // bounds, else at the spec's initial target; and at `current_replicas` (what already runs,
  // so a restart of the control plane does not scale anything down), clamped to the range.
  EndpointScaler(const EndpointSpec& spec, const AutoscalingOptions& options,
                 int64_t current_replicas, autoscaler::Millis now,
                 const std::optional<LearnedTarget>& saved = std::nullopt);

  // A new spec for the endpoint: its range and bounds apply from the next decision. The learned
  // latency baseline is kept unless a model (a deployment key) or the per-replica bounds change.
  void update_spec(const EndpointSpec& spec);

  // Adds the gateway's samples newer than the last one seen.
  void add_samples(const std::vector<LoadSample>& samples);

  // Runs whichever policy is due at `now` (the horizontal every horizontal_period, the vertical
  // every vertical_period). `ready`/`pending`: the endpoint's replicas serving and starting;
  // `failures`: how many of its replicas ever failed (a running count); `usage` is called when
  // the vertical policy is due and returns what the ready replicas did since its previous
  // call (a cycle whose queue is unknown decides nothing: its latency may be queueing). Returns the
  // reasons of the decisions that changed something (to record as events).
  std::vector<std::string> tick(autoscaler::Millis now, int64_t ready, int64_t pending,
                                int64_t failures, const std::function<ReplicaUsage()>& usage);

  // Scale from zero: a request waits for an endpoint with no ready replica. Asks for one at
  // once; true when that changed the scale.
  bool request_capacity();

  const Scale& scale() const { return scale_; }
  LearnedTarget learned() const;

 private:
  // Makes both policies for the current spec; the vertical one starts from `target` (and
  // `baseline_ms`, if known).
  void rebuild_policies(double target, std::optional<double> baseline_ms = std::nullopt);
  // Makes the horizontal policy for the current spec and target (its range follows both).
  void rebuild_horizontal();

  AutoscalingOptions options_;
  EndpointSpec spec_;
  std::string learned_for_;  // learned_for(spec_): computed once per spec, read every pass
  std::unique_ptr<autoscaler::VerticalPolicy> vertical_;
  std::unique_ptr<autoscaler::Policy> horizontal_;  // reads vertical_'s target through a pointer
  autoscaler::SampleWindow window_;
  // Since the last vertical decision: completion-weighted latency, mean concurrency, and the
  // busiest second.
  double latency_weighted_sum_ = 0;
  double completions_sum_ = 0;
  double concurrency_sum_ = 0;
  int64_t sample_count_ = 0;
  double peak_concurrency_ = 0;  // the endpoint's, in the busiest second
  double peak_latency_ms_ = 0;   // in that second
  int64_t last_sample_unix_ms_ = 0;
  autoscaler::Millis next_horizontal_{0};
  autoscaler::Millis next_vertical_{0};
  Scale scale_;
};

}  // namespace flotilla::control

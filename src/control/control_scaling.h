// The autoscaler's live loop for one endpoint (DESIGN.md §4, issue #5; docs/autoscaler.md):
// autoscaler::EndpointAutoscaler (the same glue the simulator runs) on an endpoint's spec,
// turned into a replica count and a per-replica concurrency target, and each served model's
// share of them. A light part of the control module's contract: `flotilla up`'s reconciler and
// Kubernetes mode's controller both scale through it. Not thread-safe: one thread owns each
// EndpointScaler.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "autoscaler/autoscaler.h"
#include "control/control_spec.h"

namespace flotilla::control {

// The autoscaler's live loop (DESIGN.md §4 defaults; tests and experiments shorten them).
struct AutoscalingOptions {
  bool enabled = true;  // false: every version keeps its provisioned minimum (issue #4 rule)
  std::chrono::milliseconds horizontal_period{5'000};
  std::chrono::milliseconds fast_period{1'000};  // APA's fast scale-up path; 0: off
  std::chrono::milliseconds up_window{20'000};
  std::chrono::milliseconds down_window{300'000};
  std::chrono::milliseconds vertical_period{30'000};
  // The season the forecast learns (a day; its buckets a 1,440th of it). Shorter only for tests
  // and experiments that compress days.
  std::chrono::milliseconds forecast_day{86'400'000};
  // Hedged starts (autoscaler::ApaOptions::start_hedge) where replicas start slowly: on where
  // they start on many nodes (Kubernetes mode); off on one host, where a second start competes
  // with the first for the same cores and disk.
  bool hedge_starts = false;
};

// What the autoscaler decided for an endpoint.
struct Scale {
  int64_t replicas = 1;  // for the whole endpoint, split across versions by traffic
  double target = 1;     // per-replica concurrency: the horizontal denominator, the gateway cap
  bool operator==(const Scale&) const = default;
};

// Replicas of `served` for an endpoint scaled to `scale`: its traffic share of the endpoint's
// replicas, at least its own minimum (ceil(concurrency.min / target), 1 unless it may scale to
// zero). Without a scale: provisioned_replicas().
int64_t version_replicas(const ServedModelSpec& served, const std::optional<Scale>& scale);

// The per-replica cap the gateway enforces: the scale's target, else the initial target.
int64_t replica_cap(const ServedModelSpec& served, const std::optional<Scale>& scale);

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

// What an endpoint's ready replicas did over an interval, as the vertical policy reads it.
// Replicas that report no queue (an external server) count as 0.
using ReplicaUsage = autoscaler::ReplicaUsage;

// One replica's counters as read at one moment: what its usage over an interval is made of.
struct UsageCounters {
  double cpu_seconds = -1;  // CPU time used (user + system); -1: unknown
  // Seconds requests waited inside the replica for its engine, summed
  // (flotilla_replica_queue_wait_seconds_total); nullopt: not reported or not read.
  std::optional<double> queue_wait_seconds;
  double cores = 1;  // the cores the replica may use
  std::chrono::steady_clock::time_point at{};
};
// One replica's reading now and its previous one (nullopt: read for the first time).
struct UsageChange {
  std::optional<UsageCounters> before;
  UsageCounters now;
};
// An endpoint's usage from its replicas' changes: the mean CPU utilization (of the cores each
// may use, clamped to 0..1) and the mean engine queue (the rate of the queue-wait counter) over
// the replicas read twice. `queued` is nullopt (unknown, not zero) while the only replicas that
// report a queue have been read once.
ReplicaUsage usage_from_changes(const std::vector<UsageChange>& changes);

// An endpoint's autoscaler::EndpointAutoscaler on its spec: the replica range and the per-replica
// bounds follow the spec, and the learned target and baseline are kept across restarts.
class EndpointScaler {
 public:
  // Starts at `saved`'s target and baseline when it was learned for this spec's models and
  // bounds, else at the spec's initial target; and at `current_replicas` (what already runs,
  // so a restart of the control plane does not scale anything down), raised to the range.
  EndpointScaler(const EndpointSpec& spec, const AutoscalingOptions& options,
                 int64_t current_replicas, autoscaler::Millis now,
                 const std::optional<LearnedTarget>& saved = std::nullopt);

  // A new spec for the endpoint: its range and bounds apply from the next decision. The learned
  // latency baseline is kept unless a model (a deployment key) or the per-replica bounds change.
  void update_spec(const EndpointSpec& spec);

  // Adds the gateway's samples newer than the last one seen; `ready`: the endpoint's replicas
  // serving now (the samples are of the last seconds).
  void add_samples(const std::vector<LoadSample>& samples, int64_t ready);

  // Runs whichever policy is due at `now` (autoscaler::EndpointAutoscaler::tick): the
  // horizontal every horizontal_period, the vertical every vertical_period.
  std::vector<std::string> tick(autoscaler::Millis now, int64_t ready, int64_t pending,
                                int64_t failures, const std::function<ReplicaUsage()>& usage);

  // How long the endpoint's newest replica took to become ready (APA's spare after a failure).
  void observe_start(autoscaler::Millis took) { autoscaler_->observe_start(took); }

  // Scale from zero: a request waits for an endpoint with no ready replica. Asks for one at
  // once; true when that changed the scale.
  bool request_capacity();

  Scale scale() const;
  LearnedTarget learned() const;

  // The demand history the forecast reads: restored after a restart (from the store), and
  // the buckets closed since the last call, to store (autoscaler::Forecaster).
  void restore_demand(const std::vector<std::pair<autoscaler::Millis, double>>& buckets);
  std::vector<std::pair<autoscaler::Millis, double>> take_closed_demand();
  // Buckets that start before this are read by no forecast again (to prune from the store).
  autoscaler::Millis demand_kept_from(autoscaler::Millis now) const;

 private:
  // The vertical policy's options for the current spec, starting from `target` (and
  // `baseline_ms`, if known).
  autoscaler::VerticalOptions vertical_options(double target,
                                               std::optional<double> baseline_ms) const;
  // The replica range for a target under the current spec.
  autoscaler::RangeFor range_for() const;

  AutoscalingOptions options_;
  EndpointSpec spec_;
  std::string learned_for_;  // learned_for(spec_): computed once per spec, read every pass
  std::unique_ptr<autoscaler::EndpointAutoscaler> autoscaler_;
};

}  // namespace flotilla::control

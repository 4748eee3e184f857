// The autoscaler module's contract (DESIGN.md §4): scaling policies as deterministic state
// machines driven by explicit time and 1-second load samples, so the live loop, the fleet
// simulator (issue #5) and unit tests run the same code. Nothing here reads a clock, sleeps or
// does I/O. A policy object is not thread-safe: one per endpoint, called from one thread.
//
// Policies: Flotilla's own (APA: horizontal + vertical), and the baselines it is compared with,
// faithful to their published defaults: Kubernetes HPA v2, Knative KPA, Ray Serve, static.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/common.h"

namespace flotilla::autoscaler {

using Millis = std::chrono::milliseconds;  // time since an arbitrary epoch (simulated or real)

// One second of an endpoint's load, as the gateway samples it.
struct Sample {
  Millis time{0};          // end of the second
  double concurrency = 0;  // mean requests in flight at replicas
  double queued = 0;       // mean requests waiting at the gateway
  double arrivals = 0;     // requests that arrived in the second
  double completions = 0;  // requests the replicas finished in the second

  // What the baselines scale on: in flight plus waiting (Knative and Ray count the queue).
  double demand() const { return concurrency + queued; }
};

// The last samples of an endpoint, oldest first, bounded to `capacity` (enough for the longest
// window of any policy: 600 s).
class SampleWindow {
 public:
  explicit SampleWindow(size_t capacity = 900) : capacity_(capacity) {}
  void add(const Sample& sample);
  // Mean of concurrency + queued over samples with time in (now - window, now]; nullopt when
  // there is none.
  std::optional<double> mean_demand(Millis now, Millis window) const;
  // Largest concurrency + queued of one sample in (now - window, now]; nullopt when none.
  std::optional<double> max_demand(Millis now, Millis window) const;
  // The same two over the concurrency the offered load would need (APA): what is in flight,
  // and while requests wait (the replicas are full), the arrival rate times the replicas'
  // latency (Little's law over the newest seconds with 100 completions, at most 60), plus the
  // backlog served within 5 s. With nothing completing yet (scale from zero), waiting requests
  // ask for one replica: how many more are needed shows once it serves. Computed as each
  // sample is added, from it and the seconds before it.
  std::optional<double> mean_offered(Millis now, Millis window) const;
  std::optional<double> max_offered(Millis now, Millis window) const;
  // How much the arrival rate grows from now to `ahead` of now, on the trend of the samples
  // in (now - window, now]: the smaller of the robust (Theil-Sen) slopes of the window's older
  // and newer halves, so a step is not read as a trend; 1 when the rise is within the noise
  // (twice the arrivals' robust spread around the lines). Arrivals, not the offered concurrency,
  // which also moves while replicas start and a backlog drains. nullopt with fewer than 6
  // samples or no arrivals.
  std::optional<double> arrival_growth(Millis now, Millis window, Millis ahead) const;
  // A standing queue's demand: the smallest concurrency + queued of one sample in
  // (now - window, now] when requests queued through it and the queue did not shrink across it
  // (the newest sample queues at least as many as the oldest); nullopt otherwise.
  std::optional<double> standing_demand(Millis now, Millis window) const;
  // The newest sample when it is of the second ending at or just before `now`.
  std::optional<Sample> newest(Millis now) const;
  // The newest second's mean wait at the gateway over the requests' service time, both by
  // Little's law (queued over the arrival rate; the latency as max_offered's): 0 without a
  // queue, nullopt when no sample is that new or nothing completed or arrived to measure by.
  std::optional<double> wait_over_service(Millis now) const;
  // Whether samples cover the whole window (the oldest is at or before now - window + 1 s).
  bool covers(Millis now, Millis window) const;
  size_t size() const { return samples_.size(); }

 private:
  // What the newest sample says once the seconds before it are known.
  struct Derived {
    double offered = 0;  // as max_offered describes
    std::optional<double> wait_over_service;
  };
  Derived newest_derived() const;

  size_t capacity_;
  std::deque<Sample> samples_;
  std::deque<double> offered_;  // per sample
  std::optional<double> newest_wait_over_service_;
};

struct Fleet {
  int64_t ready = 0;     // replicas serving
  int64_t pending = 0;   // replicas starting (count toward capacity already asked for)
  int64_t desired = 0;   // the last desired count this policy returned (its own state of record)
  int64_t failures = 0;  // replicas that ever failed (crashed, timed out): a running count
  // How long the newest replica took from its start to ready, ms; -1 unknown (none yet, or an
  // orchestrator that does not say).
  int64_t start_ms = -1;
};

// A scaling decision and its inputs, to record as an event ("why it scaled").
struct Decision {
  int64_t desired = 0;
  std::string reason;
};

// The replica range of an endpoint, from its spec (DESIGN.md §7: concurrency min/max divided
// by the per-replica concurrency).
struct ReplicaRange {
  int64_t min = 1;
  int64_t max = 1000;
  bool scale_to_zero = false;  // min may be 0 only then
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;
  // How often decide() is called (the policy's sync period).
  virtual Millis period() const = 0;
  // The replica count wanted now, clamped to the policy's range. Called every period(), with
  // `now` increasing; `samples` holds the endpoint's recent 1-second samples.
  virtual Decision decide(Millis now, const SampleWindow& samples, const Fleet& fleet) = 0;
};

// ---- APA: Flotilla's horizontal policy (DESIGN.md §4) ------------------------------------------

struct ApaOptions {
  Millis period{5'000};
  // The fast path (issue 21): between full cycles, scale up at this cadence (the gateway's
  // sample cadence) whenever the newest second asks for more than the ready replicas are sized
  // for; the same sizing and per-decision cap as a full cycle. A warm-pool replica is ready in
  // milliseconds, so waiting for the next 5 s cycle (made for pods) leaves seconds of misses.
  // 0: off, every decision on the full period. Scale-down keeps the full cycle and its window.
  Millis fast_period{1'000};
  Millis up_window{20'000};
  Millis down_window{300'000};
  double max_up_factor = 2.0;       // at most double per cycle
  int64_t min_up_step = 4;          // ... or this many more, for tiny fleets
  double max_down_fraction = 0.25;  // at most this share of replicas removed per cycle
  // Scale-up also sizes for the load's trend this far ahead: what a replica asked for now
  // meets (a decision period plus a cold start).
  Millis lead_time{10'000};
  double trend_tolerance = 0.1;  // growth over lead_time below this is noise
  // A queue that held this long (at most up_window) without shrinking, with nothing starting,
  // is demand. Not the period: a shorter period must not read a one-second queue as standing.
  Millis standing_window{5'000};
  // The share of the per-replica target the fleet is sized for: 1 sizes at the target (which is
  // also the gateway's cap); below 1 keeps headroom. The knob a cost-versus-misses sweep turns.
  double utilization = 1.0;
  // The spare after a failure (N+1) only where replicas take longer than this to start. A
  // replacement ready within the fast path's cadence (a warm-pool start) is back before any
  // decision could see the gap, and a spare held through the down window for it costs that
  // window's replica-seconds for nothing. Unknown start times keep the spare.
  Millis spare_start{1'000};
  // Hedged starts where replicas start slowly (a start timed past spare_start): while fewer are
  // ready than asked for, this many more per missing replica start beside them; the first ready
  // serve and the rest are cancelled as the count comes back down (orchestrators stop replicas
  // not yet ready first, as Kubernetes' ReplicaSets do). Start times spread (scheduling, image
  // pulls): the N-th ready of 2N comes near the median start, the N-th of N at the slowest.
  // Not where the start is unknown (before a first replica was ready): an LLM replica loading
  // its weights twice is no bargain unless starts are known to be slow. 0: off.
  double start_hedge = 1.0;
  ReplicaRange range;
};

// The per-replica cap the gateway enforces for a target concurrency: the target rounded, 1 at
// least.
inline int64_t gateway_cap(double target) {
  return std::max<int64_t>(1, std::llround(target));
}

// Horizontal: desired = ceil(offered concurrency / target_concurrency) (SampleWindow::max_offered).
// Up: the busiest second of `up_window`, grown by the arrival rate's trend over `lead_time` (a
// ramp outruns a policy that sizes for the present), acted on at once, bounded
// by max(x2, +min_up_step) of the count already asked for. Down: only
// when even the busiest second of `down_window` asks for fewer, at most max_down_fraction per
// cycle. While a replica failed within `down_window`, one spare replica on top (N+1: a fleet
// sized at its targets queues for a whole cold start when one replica dies), where starts take
// longer than `spare_start`. Clamped to the
// range. `target_concurrency` is read through the pointer each cycle,
// so the vertical policy can move it.
std::unique_ptr<Policy> make_apa_policy(const ApaOptions& options,
                                        const double* target_concurrency);
// How often APA's policy is called: the fast path's cadence when it is on, else the period.
Millis apa_decision_period(const ApaOptions& options);

// ---- APA vertical: the per-replica target concurrency ---------------------------------------

struct ReplicaSignals {
  double latency_ms = 0;         // replica-side latency (p50) over the cycle
  double concurrency = 0;        // mean in-flight per ready replica over the cycle
  double queued_in_replica = 0;  // mean requests queued inside a replica (batcher backlog)
  double cpu_utilization = 0;    // 0..1, mean over ready replicas
  // The cycle's busiest second: in-flight per ready replica, and the replicas' latency then.
  double peak_concurrency = 0;
  double peak_latency_ms = 0;
};

struct VerticalOptions {
  Millis period{30'000};
  double min_target = 1;
  double max_target = 64;
  double initial_target = 4;
  std::optional<double> initial_baseline_ms;  // a baseline learned before (a restart)
  double overload_latency_ratio = 1.5;        // latency above baseline x this is overload ...
  // ... when it is also this many ms above the baseline (0.2 ms against 0.1 ms is noise, not a
  // replica past its knee) ...
  double overload_min_excess_ms = 1.0;
  // ... and the cycle was loaded: its busiest second had at least this share of the target in
  // flight per replica (an idle replica's latency says nothing about its capacity).
  double overload_busy_fraction = 0.5;
  double cpu_saturated = 0.95;
  double decrease_factor = 0.75;  // multiplicative decrease (-25%, the per-cycle bound)
  double max_change = 0.25;       // a probe or a move to the knee: at most +-25% a cycle
  double busy_fraction = 0.9;     // probe only when the busiest second filled replicas this far
  // ... and the cycle's mean did this far: a probe up reads the curve at the target, and a
  // fleet that the horizontal policy has not yet sized for it runs below it (the busiest second
  // alone moved a simulated target to 2x the knee, one scale-down at a time).
  double probe_mean_fraction = 0.8;
  int decrease_cycles = 1;  // cycles in a row an overload must last before a decrease
  // The baseline: this percentile (nearest rank) of the latencies of the last
  // baseline_window_cycles cycles that qualified (nothing queued, the CPU not saturated).
  int baseline_window_cycles = 20;
  double baseline_percentile = 0.1;
  // The throughput curve: each cycle's throughput per replica, by Little's law (in flight over
  // latency), kept per concurrency in bins curve_bin_ratio wide (the median of a bin's newest
  // curve_samples cycles). The knee: the smallest concurrency whose throughput reaches
  // knee_fraction of the best seen, interpolated between bins: past it, more requests in
  // flight buy at most 1/knee_fraction more throughput and cost latency in proportion.
  double knee_fraction = 0.9;
  double curve_bin_ratio = 1.1;
  int curve_samples = 5;
  // The curve is known above the knee once a concurrency this many times the knee and
  // explored_past_best_factor times where the best throughput was seen were seen (or 90% of
  // the max target, or an overload); a target within knee_band of the knee holds.
  double explored_above_factor = 4;
  double explored_past_best_factor = 2;
  double knee_band = 0.1;
  // Once known, the curve is kept (no probe while nothing changes) until the replicas' throughput
  // at a concurrency moves by more than relearn_drift from the median of that bin's readings for
  // relearn_cycles cycles in a row (a model or a machine that became faster or slower): then it
  // is learned anew.
  double relearn_drift = 0.25;
  int relearn_cycles = 3;
};

// Moves the per-replica target to the knee of the replicas' throughput curve, learned from
// the cycles themselves: each cycle's throughput per replica (in flight over latency, Little's
// law) is kept per concurrency. Under load (the cycle's busiest second filled replicas to
// busy_fraction of the target) the target probes: down (x0.75) until a concurrency below the
// knee was seen, up (x1.25) until the curve is known above it (explored_above_factor x the
// knee and explored_past_best_factor x the best's concurrency, 90% of the max, or an overload);
// then it moves to the knee (at most +-25% a cycle) and holds within knee_band of it. Nothing
// changes without load, nor while the knee holds still. (Latency against a baseline alone would
// leave real replicas near where they started: an LLM's CPU is saturated at any load, which made
// every cycle say nothing; its latency climbs from one request in flight while its throughput still
// rises 2.7x; and a target that starts past the knee learns its baseline there. bench/RESULTS.md,
// "Vertical on real models".) Overload cuts at once (x0.75): a request queued inside replicas on
// average (waiting for room); or latency past overload_latency_ratio x a learned baseline (a low
// percentile of the latencies of recent cycles without queueing or CPU saturation) by
// overload_min_excess_ms too, while the busiest second filled replicas to overload_busy_fraction of
// the target; except when that latency bought throughput (3% more than every bin from half the
// concurrency up gave), and at or below a knee known from both sides (its throughput is worth its
// latency). Always within [min, max].
class VerticalPolicy {
 public:
  explicit VerticalPolicy(const VerticalOptions& options);
  // Called every period(); returns the new target and why (reason empty when unchanged).
  Decision decide_target(const ReplicaSignals& signals);
  double target() const { return target_; }
  const double* target_ptr() const { return &target_; }
  std::optional<double> baseline_ms() const { return baseline_ms_; }

 private:
  VerticalOptions options_;
  double target_;
  std::optional<double> baseline_ms_;
  std::deque<double> baseline_window_;  // qualifying cycle latencies, oldest first
  int overload_streak_ = 0;
  // The throughput curve: bin index (log of the concurrency, base curve_bin_ratio) to the
  // newest readings in it, oldest first.
  struct Reading {
    double concurrency = 0;
    double throughput = 0;  // per replica, per second
  };
  std::map<int, std::deque<Reading>> curve_;
  // Whether the curve was seen past the knee (or an overload) and short of it; kept until the
  // curve is learned anew, so a knee that moves with new readings does not start a probe.
  bool explored_above_ = false;
  bool explored_below_ = false;
  int drift_streak_ = 0;  // cycles in a row whose throughput left their bin's median
};

// ---- Forecast: a floor raised ahead of a predictable peak (issue 21) -------------------------

struct ForecastOptions {
  bool enabled = false;
  // The history's resolution: each bucket keeps its busiest second's offered concurrency.
  Millis bucket{60'000};
  Millis season{86'400'000};  // a day
  int64_t seasons_per_week = 7;
  // A peak must have shown at this time on at least this many past seasons (days; or the same
  // weekday of past weeks, once that many weeks are known) before it raises anything ...
  int64_t min_seasons = 2;
  int64_t max_seasons = 7;  // ... looking back at most this many
  // ... and the floor is this quantile (nearest rank, rounded down) of the past seasons' peaks:
  // the median by default, so one odd day neither raises nor lowers it; with two days, the lower.
  double quantile = 0.5;
  // How far ahead the floor looks: a decision period plus a cold start (ApaOptions::lead_time),
  // so the replicas are ready when the peak comes, not asked for when it does.
  Millis lead{10'000};
};

// The forecast on a day of `day` (shorter in simulations and tests that compress days): its
// buckets a 1,440th of it, a minute of a real day.
ForecastOptions forecast_options_for_day(Millis day, bool enabled);

// What the seasonal model expects over the next `lead`.
struct Forecast {
  double concurrency = 0;  // the offered concurrency to be ready for
  int64_t seasons = 0;     // how many past seasons it stands on
  bool weekly = false;     // the same weekday of past weeks (else past days)
};

// A seasonal quantile of an endpoint's own history. Why this model and not Holt-Winters: the
// floor only raises, and must not raise on anything but a repeated pattern. A quantile of
// the same time on past days needs no fitting, cannot extrapolate a trend into a peak that
// never came, ignores one odd day (an incident, a one-off campaign), and says nothing until the
// pattern has repeated `min_seasons` times. What it does not follow: a level that moved since
// last week (the reactive policy does, on top of the floor).
// Deterministic and clock-free like the policies: fed the endpoint's 1 s samples in order.
class Forecaster {
 public:
  explicit Forecaster(const ForecastOptions& options);
  // One second's offered concurrency; `time` is the end of the second (LoadSample::unix_ms).
  void add(Millis time, double offered);
  // A bucket of history kept from before (a restart): its start and its busiest second.
  void restore(Millis bucket_start, double peak);
  // The buckets that closed since the last call (a newer second arrived), oldest first, as
  // (start, busiest second): what to keep across restarts.
  std::vector<std::pair<Millis, double>> take_closed();
  // The busiest second expected in (now, now + lead]: for each past season with history there,
  // the busiest bucket of the same span a season (or a week) back; their quantile. nullopt
  // before `min_seasons` seasons have history at this time.
  std::optional<Forecast> forecast(Millis now) const;
  const ForecastOptions& options() const { return options_; }
  // How far back history is read (the farthest season looked back, and the span ahead).
  Millis retention() const;

 private:
  // The busiest bucket in [from, to] (times), nullopt when none has history.
  std::optional<double> busiest(Millis from, Millis to) const;
  int64_t index_of(Millis time) const;

  ForecastOptions options_;
  std::map<int64_t, double> peaks_;  // bucket index -> its busiest second
  int64_t closed_through_ = std::numeric_limits<int64_t>::min();  // take_closed() handed out
};

// ---- One endpoint's autoscaler: APA horizontal and vertical, wired together ------------------

// What an endpoint's ready replicas did over a vertical cycle, from outside the gateway (the
// orchestrator's usage query; the simulator's replica model).
struct ReplicaUsage {
  double cpu_utilization = 0;  // mean over the replicas, 0..1 of the cores each may use
  // Mean requests waiting inside a replica for its engine (a full batch); nullopt when the
  // replicas report a queue but none has been read twice yet (unknown, not zero).
  std::optional<double> queued = 0;
};

// The endpoint's replica range for a per-replica target (a spec's concurrency range divided by
// the target; or a fixed range).
using RangeFor = std::function<ReplicaRange(double target)>;

// The glue both `flotilla up` (control/control_scaling.h) and the simulator run, so the two make
// the same decisions from the same samples: the gateway's 1-second samples in, decisions out (the
// replica count, and the per-replica target that is also the gateway's cap). Driven by explicit
// time: `now` in every call, on the samples' time base (their unix_ms); it reads no clock.
// Not thread-safe: one per endpoint, called from one thread.
//
// Every `horizontal.period` the APA horizontal policy sizes the fleet on the sample window;
// every `vertical.period` the vertical policy moves the target from the cycle's signals:
// latency (completion-weighted), the busiest second's in-flight per ready replica and its
// latency, and the replicas' usage. The horizontal range follows the target (`range_for`).
class EndpointAutoscaler {
 public:
  // Starts at `replicas` (what already runs: a restart scales nothing down; raised to the
  // range's minimum, not capped at its maximum: the first decisions bring it into range) and
  // at `vertical`'s initial target and baseline. The first decisions are a period after `now`.
  // `horizontal.range` is not used: `range_for` gives it.
  // `forecast`: its history is kept whether or not it is enabled (so turning it on finds the
  // past days); enabled, the forecast is a floor under every horizontal decision.
  EndpointAutoscaler(const ApaOptions& horizontal, const VerticalOptions& vertical,
                     RangeFor range_for, int64_t replicas, Millis now,
                     const ForecastOptions& forecast = {});

  // Adds the samples newer than the last one seen; `ready`: the endpoint's replicas serving when
  // they were measured (a second's in-flight per replica is its concurrency over `ready`).
  void add_samples(std::span<const LoadSample> samples, int64_t ready);

  // Runs whichever policy is due at `now`, the vertical first. `ready`/`pending`: replicas
  // serving and starting; `failures`: how many of the endpoint's replicas ever failed (a
  // running count). `usage` is called only when the vertical policy is due and a replica is
  // ready; a cycle with no completions, no ready replica or an unknown queue decides nothing
  // (its latency may be queueing). While nothing is ready, no scale-down: capacity is on its
  // way. Returns the reasons of the decisions that changed something (to record as events).
  std::vector<std::string> tick(Millis now, int64_t ready, int64_t pending, int64_t failures,
                                const std::function<ReplicaUsage()>& usage);

  // How long the endpoint's newest replica took from its start to ready (Fleet::start_ms).
  void observe_start(Millis took) { start_ms_ = took.count(); }

  // Scale from zero: a request waits with no replica asked for. Asks for one at once; true when
  // that changed the count.
  bool request_capacity();

  // A new range (the spec changed): the count is clamped into it at once.
  void set_range(RangeFor range_for);
  // Learns the target anew from `vertical` (the models changed: the baseline is theirs no more).
  void restart_vertical(const VerticalOptions& vertical);
  // Whether the forecast raises the floor (a spec's `autoscaling.forecast`); history is kept.
  void set_forecast_enabled(bool enabled) { forecast_enabled_ = enabled; }
  // The demand history: to restore from and persist (Forecaster::restore, take_closed).
  Forecaster& forecaster() { return forecaster_; }
  const Forecaster& forecaster() const { return forecaster_; }

  // What the orchestrator should run: the decided count and the hedged starts beside it.
  int64_t replicas() const { return replicas_ + hedge_; }
  double target() const { return target_; }
  std::optional<double> baseline_ms() const { return vertical_->baseline_ms(); }
  // When each policy is next due (the simulator schedules its events there).
  Millis next_horizontal() const { return next_horizontal_; }
  Millis next_vertical() const { return next_vertical_; }

 private:
  // The replicas the forecast asks for now (within `range`) and why; nullopt when it is off or
  // has nothing to say.
  std::optional<Decision> forecast_floor(Millis now, const ReplicaRange& range) const;
  // Sets hedge_ for `ready` replicas; the reason when it starts more than before.
  std::optional<std::string> hedge_starts(int64_t ready);

  Millis horizontal_period_;
  Millis vertical_period_;
  RangeFor range_for_;
  std::unique_ptr<VerticalPolicy> vertical_;
  // The vertical policy's target, which the horizontal policy reads through a pointer; copied
  // after each vertical decision, so the vertical policy can be replaced under it.
  double target_ = 1;
  // Made once with an open range: its state (what past scale-ups were for, recent failures)
  // outlives target and spec changes; decisions are clamped to range_for_(target_) here.
  std::unique_ptr<Policy> horizontal_;
  double utilization_ = 1;  // ApaOptions::utilization: the forecast floor sizes as APA does
  Forecaster forecaster_;
  bool forecast_enabled_ = false;
  SampleWindow window_;
  int64_t replicas_ = 0;  // the decided count
  int64_t hedge_ = 0;     // starts beside it while it is short of ready (ApaOptions::start_hedge)
  Millis spare_start_;
  double start_hedge_ = 0;
  int64_t start_ms_ = -1;  // Fleet::start_ms
  // Since the last vertical decision: completion-weighted latency and the busiest second.
  double latency_weighted_sum_ = 0;
  double completions_sum_ = 0;
  double concurrency_sum_ = 0;
  int64_t sample_count_ = 0;
  double peak_concurrency_ = 0;  // in flight per ready replica in the busiest second
  double peak_latency_ms_ = 0;   // in that second
  int64_t last_sample_unix_ms_ = 0;
  // The fast path decides on each new sample as soon as it arrives (not on a timer of its own,
  // which could wait most of a second more); the newest sample a decision has seen.
  bool decide_on_samples_ = false;
  int64_t decided_through_unix_ms_ = 0;
  Millis next_horizontal_{0};
  Millis next_vertical_{0};
};

// ---- Baselines -------------------------------------------------------------------------------

struct HpaOptions {
  Millis period{15'000};
  double tolerance = 0.1;
  double target_per_replica = 1;  // the metric target: concurrent requests per replica
  Millis down_stabilization{300'000};
  int64_t up_pods = 4;  // scale-up: at most max(+4 pods, +100%) per period
  double up_percent = 100;
  double down_percent = 100;  // scale-down: at most -100% per period
  ReplicaRange range;
};
std::unique_ptr<Policy> make_hpa_policy(const HpaOptions& options);

struct KpaOptions {
  Millis period{2'000};
  Millis stable_window{60'000};
  Millis panic_window{6'000};
  double panic_threshold = 2.0;  // panic when the panic window wants >= 2x the ready replicas
  double max_up_rate = 1000;
  double max_down_rate = 2;
  double container_concurrency = 1;  // per-replica concurrency; the target is 0.7 of it
  double target_utilization = 0.7;
  Millis scale_to_zero_grace{30'000};
  ReplicaRange range;
};
std::unique_ptr<Policy> make_kpa_policy(const KpaOptions& options);

// Ray Serve's request-based autoscaler, as python/ray/serve/autoscaling_policy.py
// (replica_queue_length_autoscaling_policy and the _apply_* steps around it) and
// python/ray/serve/config.py (AutoscalingConfig) have it on Ray's master branch of 2026. The
// defaults are AutoscalingConfig's: one replica at most, which never scales; ray_auto_options()
// is what `num_replicas="auto"` sets.
struct RayOptions {
  Millis period{100};  // CONTROL_LOOP_INTERVAL_S: the controller decides every 0.1 s
  double target_ongoing_requests = 2;
  Millis look_back{30'000};  // look_back_period_s: the mean of ongoing + queued over it
  Millis upscale_delay{30'000};
  Millis downscale_delay{600'000};
  std::optional<Millis> downscale_to_zero_delay;  // 1 -> 0; unset: downscale_delay
  double upscaling_factor = 1;                    // unset in the config: 1
  double downscaling_factor = 1;
  ReplicaRange range{1, 1, false};  // min_replicas 1, max_replicas 1
};
// doc/source/serve/autoscaling-guide.md: num_replicas="auto" is target_ongoing_requests 2 with
// min_replicas 1 and max_replicas 100 (and max_ongoing_requests 5, which the simulator's
// per-replica cap stands for).
RayOptions ray_auto_options();
std::unique_ptr<Policy> make_ray_policy(const RayOptions& options);

// Always `replicas` (provisioned for the peak).
std::unique_ptr<Policy> make_static_policy(int64_t replicas);

}  // namespace flotilla::autoscaler

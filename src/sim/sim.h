// The sim module's contract (DESIGN.md §3, §8): a discrete-event simulator of one endpoint's
// fleet behind the gateway, driving the production autoscaler policies and the gateway's
// balancer code. Deterministic for a seed; single-threaded; no I/O except reading trace files.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "autoscaler/autoscaler.h"
#include "common/common.h"
#include "gateway/gateway_policy.h"

namespace flotilla::sim {

// Offered load: requests per second as a piecewise-linear function of time, or a per-second
// series (a trace). Arrivals are Poisson at the current rate.
struct LoadShape {
  std::vector<std::pair<double, double>> points;  // (seconds, requests/s), sorted by time
  std::vector<double> per_second;                 // if not empty: rate of second i
  double rate_at(double seconds) const;
  double end_seconds() const;
};

// How a replica serves. By default processor sharing with a saturation point: a request alone
// takes `service_ms`; up to `saturation` concurrent requests run without slowing each other;
// past it each takes longer in proportion (evaluated when the request starts). With
// `max_batch` > 0 it is a batched engine instead (an LLM's continuous batching, or a dynamic
// batcher with steps_per_request 1): it runs steps of (step_ms + step_ms_per_item x batch); a
// request needs `steps_per_request` steps, joins the batch at the next step and waits inside
// the replica while the batch is full (the in-replica queueing the vertical policy watches).
struct ReplicaModel {
  double service_ms = 10;
  // Processor sharing: 0, every request takes service_ms alone; else each request's own time
  // alone is lognormal with this sigma and mean service_ms (a real model's spread).
  double service_sigma = 0;
  // Processor sharing: false, a request's time is fixed when it starts (what it would take at
  // the count then); true, exact: every running request slows and speeds as the count moves
  // (costlier; for studies where replicas run past their saturation point).
  bool exact_sharing = false;
  double saturation = 8;
  int64_t max_batch = 0;  // 0: processor sharing; else the batch size of a batched engine
  double step_ms = 0;
  double step_ms_per_item = 0;
  int64_t steps_per_request = 1;
  double cold_start_s = 5;   // mean (a pod; scenarios set their runtime's); lognormal, sigma 0.25
  double slow_fraction = 0;  // share of replicas that are slower (heterogeneous fleet)
  double slow_factor = 3;    // how much slower they are
  int64_t slow_first = 0;    // the first this many replicas started are slow, whatever the draw
  // Mean seconds a ready replica runs before it crashes (exponential); 0: never. Requests in
  // flight there are retried once on another replica, as the gateway does; the orchestrator
  // restarts the replica at once, with a cold start.
  double crash_mtbf_s = 0;
};

struct Scenario {
  std::string name;
  std::string description;
  LoadShape load;
  ReplicaModel replica;
  double slo_ms = 100;  // a request over this (or rejected) misses the SLO
  int64_t min_replicas = 1;
  int64_t max_replicas = 10'000;
  int64_t initial_replicas = 1;
  double queue_timeout_s = 5;
  int64_t queue_capacity = 100'000;
  // The per-replica concurrency a user would configure for the baselines (their target), and
  // APA's starting point for its learned target: usually the model's saturation point, unless
  // the scenario is about learning it.
  double configured_concurrency = 8;
  // The gateways in front (DESIGN.md §8: several gateway replicas behind a Service; docs/fleet.md).
  // Each request arrives at one of them, uniformly at random. Each balances (power of two
  // choices) and enforces the per-replica cap on its own view of in-flight requests: its own,
  // exact, plus every other gateway's as that gateway last published it; each publishes every
  // `gateway_sample_ms` (0: the views are exact and shared, the ideal). Each has its own
  // admission queue of `queue_capacity`. One gateway: the single gateway of `flotilla up`.
  int64_t gateways = 1;
  double gateway_sample_ms = 0;
  // Instead: no sharing; each gateway balances on its own counts alone and caps them at its
  // share, max(1, cap / gateways) (the cap split, as gateways that exchange nothing would).
  bool gateway_own_view = false;
  // A day as the scenario runs it: the season APA's forecaster learns (its buckets a 1,440th of
  // it: a minute of a real day). Scenarios that compress days shorten it with them.
  double season_s = 86'400;
};

// The scenarios shipped with the simulator (spike, diurnal, ramp, zero, unknown-capacity,
// hetero, batched, crashes, steady, fleet, fleet-1m); nullopt for an unknown name.
std::optional<Scenario> find_scenario(std::string_view name);
std::vector<std::string> scenario_names();

// A scenario replaying a trace: a CSV whose first column holds request timestamps
// ("YYYY-MM-DD HH:MM:SS[.fraction]" or seconds); the header line is skipped. The per-second
// request counts, times `rate_scale`, become the offered load.
Result<Scenario> trace_scenario(const std::string& path, double rate_scale);

// Multiplies the offered load, and the starting and maximum replica counts with it.
void scale_rate(Scenario& scenario, double factor);

// Plays the load `times` times in a row (each time its own Poisson arrivals), each play a day:
// the season APA's forecaster learns. A trace of one hour replayed as the same hour of
// successive days.
void repeat_load(Scenario& scenario, int64_t times);

// The baselines run two ways: configured as a user would for the endpoint (kHpa, kKpa, kRay: the
// endpoint's per-replica target and replica range), and at their published defaults (kKpaDefault:
// Knative's container-concurrency-target-default of 100 at 70%, from zero and unbounded;
// kRayAuto: Ray Serve's num_replicas="auto", 2 ongoing requests a replica in [1, 100]). HPA has
// no default target for a custom metric, so it runs the first way only.
// What bounds them all is not a policy: offline_bound() below.
enum class PolicyKind { kApa, kHpa, kKpa, kKpaDefault, kRay, kRayAuto, kStatic };
Result<PolicyKind> parse_policy_kind(std::string_view name);
std::string_view policy_name(PolicyKind kind);

struct SimOptions {
  PolicyKind policy = PolicyKind::kApa;
  gateway::BalancerKind balancer = gateway::BalancerKind::kPowerOfTwo;  // the gateway's
  uint64_t seed = 1;
  int64_t static_replicas = 0;  // for kStatic; 0: provision for the scenario's peak
  // What-if overrides of APA's scale-up limits (0: DESIGN.md §4's 5 s period and x2 cap), to
  // measure what each costs; never the defaults.
  int64_t apa_period_ms = 0;
  double apa_max_up_factor = 0;
  int64_t apa_down_window_ms = 0;  // and of its scale-down window (0: DESIGN.md's 300 s)
  bool apa_no_fast_path = false;   // APA's ups on the full period only (ApaOptions::fast_period)
  bool apa_no_forecast = false;    // APA without its seasonal floor (ForecastOptions::enabled)
  // The knob a cost-versus-misses sweep turns, the share of the per-replica target each policy
  // sizes the fleet for: APA's ApaOptions::utilization; HPA's and Ray's target, this share of the
  // configured concurrency; KPA's target utilization; static: provisioned for the peak at this
  // share. 0: each as configured by default (APA 1, HPA 0.7, KPA 0.7, Ray 1, static 0.7). The
  // published-defaults runs (kKpaDefault, kRayAuto) ignore it: they are what they are.
  double utilization = 0;
};

// One simulated second.
struct SecondStats {
  int64_t second = 0;
  uint64_t arrivals = 0;
  int64_t ready = 0;
  int64_t pending = 0;
  double in_flight = 0;  // mean over the second
  double queued = 0;     // mean over the second
  double p50_ms = 0;     // of requests completed in the second (0 if none)
  double p99_ms = 0;
  uint64_t rejected = 0;
  uint64_t failed = 0;  // lost in a crash after their one retry
  double target_concurrency = 0;
};

struct Summary {
  uint64_t requests = 0;
  uint64_t completed = 0;
  uint64_t rejected = 0;    // 429: queue full or past its deadline
  uint64_t failed = 0;      // lost in a crash after their one retry
  uint64_t unfinished = 0;  // still at a replica or queued when the simulation ended
  double over_slo_pct = 0;  // completed over the SLO, plus rejected or failed, over all requests
  double rejected_pct = 0;
  double failed_pct = 0;  // lost in a crash after their one retry (the client saw a 5xx)
  int64_t crashes = 0;
  double replica_seconds = 0;  // ready + starting replicas, integrated over time
  int64_t scale_events = 0;    // changes of the desired replica count
  double p99_ms = 0;           // of completed requests
  double p50_ms = 0;
  double p999_ms = 0;
  uint64_t queued = 0;      // arrivals that waited in a gateway's admission queue
  uint64_t over_cap = 0;    // dispatches to a replica already at its cap (a stale view's overshoot)
  double final_target = 0;  // the per-replica target at the end (APA learns it)
  uint64_t events = 0;      // discrete events processed
  double wall_seconds = 0;  // how long the simulation took to run
};

struct SimResult {
  std::vector<SecondStats> seconds;
  Summary summary;
};

SimResult simulate(const Scenario& scenario, const SimOptions& options);

// The APA autoscaler simulate() runs for `scenario` (its periods, windows, range and vertical
// bounds), starting at simulated time 0: `flotilla up`'s glue with the simulator's settings, for
// tests that feed it the same samples as the control plane's.
std::unique_ptr<autoscaler::EndpointAutoscaler> make_apa_autoscaler(const Scenario& scenario,
                                                                    const SimOptions& options);

// ---- The offline bound -------------------------------------------------------------------------

// What no policy can do better than, on the arrivals of one run (every policy meets the same
// arrivals for a seed): for each cost, the fewest bad requests (over the SLO, rejected or failed)
// of any replica schedule that knows the arrivals in advance, under the scenario's cold start and
// replica range. A fluid relaxation, optimistic at each step (bound.cc), so it lies below every
// policy's (cost, bad) point; solved by dynamic programming over the per-second ready count.
struct BoundInput {
  std::vector<double> arrivals;  // per second
  double rate = 0;               // requests one ready replica serves within the SLO in a second
  double cold_start_s = 0;       // from asking for a replica to its being ready, and its cost
  int64_t min_replicas = 0;
  int64_t max_replicas = 0;
  int64_t initial_replicas = 0;  // ready at 0
  // The expected share of requests whose own service time alone passes the SLO (lognormal
  // service times): bad whatever the schedule.
  double slow_share = 0;
};
BoundInput bound_input(const Scenario& scenario, std::span<const uint64_t> arrivals);

struct BoundPoint {
  double replica_seconds = 0;
  double bad_requests = 0;
  double bad_pct = 0;  // of all arrivals
};
// The frontier's lower convex hull, cheapest first (bad falling as the cost rises).
std::vector<BoundPoint> offline_bound(const BoundInput& input);
// The hull's bad % at `replica_seconds` (linear between its points; flat past its ends).
double bound_bad_pct_at(const std::vector<BoundPoint>& frontier, double replica_seconds);

// The per-second rows as CSV (with a header line).
std::string to_csv(const SimResult& result);

}  // namespace flotilla::sim

#include <cstdio>
#include <fstream>
#include <vector>

#include <gtest/gtest.h>

#include "sim/sim.h"

namespace flotilla::sim {
namespace {

Scenario small_spike() {
  Scenario scenario = *find_scenario("spike");
  scenario.load.points = {{0, 500}, {60, 500}, {62, 5000}, {150, 5000}, {152, 500}, {240, 500}};
  return scenario;
}

TEST(SimulatorTest, SameSeedSameRun) {
  const Scenario scenario = small_spike();
  SimOptions options;
  options.seed = 7;
  const SimResult a = simulate(scenario, options);
  const SimResult b = simulate(scenario, options);
  EXPECT_EQ(to_csv(a), to_csv(b));
  EXPECT_EQ(a.summary.requests, b.summary.requests);
  options.seed = 8;
  EXPECT_NE(to_csv(simulate(scenario, options)), to_csv(a));
}

TEST(SimulatorTest, OffersTheLoadOfTheShape) {
  const Scenario scenario = small_spike();
  // The integral of the piecewise-linear rate.
  double expected = 0;
  const auto& p = scenario.load.points;
  for (size_t i = 1; i < p.size(); ++i) {
    expected += (p[i].first - p[i - 1].first) * (p[i].second + p[i - 1].second) / 2;
  }
  const SimResult result = simulate(scenario, SimOptions{});
  EXPECT_NEAR(static_cast<double>(result.summary.requests), expected, expected * 0.01);
  uint64_t per_second = 0;
  for (const SecondStats& s : result.seconds) {
    per_second += s.arrivals;
  }
  EXPECT_LE(per_second, result.summary.requests);
}

TEST(SimulatorTest, EnoughStaticReplicasServeAtTheModelsLatency) {
  Scenario scenario = *find_scenario("hetero");
  scenario.replica.slow_fraction = 0;
  SimOptions options;
  options.policy = PolicyKind::kStatic;
  options.static_replicas = 20;  // 3K req/s x 10 ms = 30 in flight, 160 slots
  const SimResult result = simulate(scenario, options);
  EXPECT_EQ(result.summary.rejected_pct, 0);
  EXPECT_EQ(result.summary.over_slo_pct, 0);
  EXPECT_NEAR(result.summary.p99_ms, 10, 1);  // within the histogram's 5% buckets
}

// The balancer's property (issue #25), on run-peers.sh MODE=hetero's fleet: weighing in flight
// by response time keeps requests off the slow replica, where counting in flight alone (as
// HAProxy's leastconn does, with a full scan) sends it its share of the queue. Deterministic
// for the seed.
TEST(SimulatorTest, LatencyAwareBalancingRoutesAroundASlowReplica) {
  Scenario scenario = *find_scenario("slow-replica");
  SimOptions options;
  options.policy = PolicyKind::kStatic;
  options.static_replicas = 4;
  const auto p99 = [&](gateway::BalancerKind kind) {
    options.balancer = kind;
    const Summary summary = simulate(scenario, options).summary;
    EXPECT_EQ(summary.completed + summary.unfinished, summary.requests);
    return summary.p99_ms;
  };
  const double weighed = p99(gateway::BalancerKind::kPowerOfTwo);
  const double in_flight = p99(gateway::BalancerKind::kPowerOfTwoInFlight);
  const double least = p99(gateway::BalancerKind::kLeastRequest);
  EXPECT_LT(weighed, 0.7 * least);
  EXPECT_LT(weighed, 0.7 * in_flight);
  // Within 1.3x of the fleet without the slow replica (its p99 is the fast replicas' own).
  scenario.replica.slow_first = 0;
  const double uniform = p99(gateway::BalancerKind::kPowerOfTwo);
  EXPECT_LT(weighed, 1.3 * uniform);
}

// The property the autoscaler is for, measured: on a 10x spike APA misses the SLO for fewer
// requests than HPA and uses fewer replica-seconds (deterministic for the seed).
TEST(SimulatorTest, ApaAbsorbsASpikeBetterThanHpa) {
  const Scenario scenario = small_spike();
  SimOptions options;
  options.policy = PolicyKind::kApa;
  const Summary apa = simulate(scenario, options).summary;
  options.policy = PolicyKind::kHpa;
  const Summary hpa = simulate(scenario, options).summary;
  EXPECT_LT(apa.over_slo_pct, hpa.over_slo_pct);
  EXPECT_LT(apa.replica_seconds, hpa.replica_seconds);
}

// The fast path and the what-if overrides reach the policy: against ups on the 5 s cycle alone,
// ups every second, a shorter period or a looser per-decision cap scale up sooner, so fewer
// requests miss.
TEST(SimulatorTest, ApaFastPathAndWhatIfOverridesScaleUpSooner) {
  const Scenario scenario = small_spike();
  SimOptions options;
  options.apa_no_fast_path = true;
  const double design = simulate(scenario, options).summary.over_slo_pct;
  options.apa_period_ms = 1000;
  EXPECT_LT(simulate(scenario, options).summary.over_slo_pct, design);
  options.apa_period_ms = 0;
  options.apa_max_up_factor = 100;
  EXPECT_LT(simulate(scenario, options).summary.over_slo_pct, design);
  options.apa_max_up_factor = 0;
  options.apa_no_fast_path = false;
  EXPECT_LT(simulate(scenario, options).summary.over_slo_pct, design);
}

// Every policy meets the same arrivals for a seed (they draw from their own stream), so one
// offline bound serves them all.
TEST(SimulatorTest, EveryPolicyMeetsTheSameArrivals) {
  const Scenario scenario = small_spike();
  SimOptions options;
  options.policy = PolicyKind::kHpa;
  const SimResult hpa = simulate(scenario, options);
  options.policy = PolicyKind::kRay;
  const SimResult ray = simulate(scenario, options);
  ASSERT_EQ(hpa.seconds.size(), ray.seconds.size());
  for (size_t i = 0; i < hpa.seconds.size(); ++i) {
    EXPECT_EQ(hpa.seconds[i].arrivals, ray.seconds[i].arrivals) << "second " << i;
  }
}

// Worked by hand: a replica serves 10 a second; 1 ready at 0, a cold start of 1 s.
TEST(OfflineBoundTest, CheapestAndMissFreeSchedulesOfAWorkedExample) {
  BoundInput in;
  in.arrivals = {10, 10, 30, 30, 10};
  in.rate = 10;
  in.cold_start_s = 1;
  in.min_replicas = 1;
  in.max_replicas = 5;
  in.initial_replicas = 1;
  const std::vector<BoundPoint> frontier = offline_bound(in);
  ASSERT_GE(frontier.size(), 2u);
  // One replica throughout: 5 replica-seconds, 20 + 20 lost.
  EXPECT_DOUBLE_EQ(frontier.front().replica_seconds, 5);
  EXPECT_DOUBLE_EQ(frontier.front().bad_requests, 40);
  EXPECT_DOUBLE_EQ(frontier.front().bad_pct, 100.0 * 40 / 90);
  // 1, 1, 3, 3, 1: 9 ready-seconds and two cold starts, nothing lost.
  EXPECT_DOUBLE_EQ(frontier.back().replica_seconds, 11);
  EXPECT_DOUBLE_EQ(frontier.back().bad_requests, 0);
  for (size_t i = 1; i < frontier.size(); ++i) {
    EXPECT_GT(frontier[i].replica_seconds, frontier[i - 1].replica_seconds);
    EXPECT_LT(frontier[i].bad_requests, frontier[i - 1].bad_requests);
  }
  EXPECT_DOUBLE_EQ(bound_bad_pct_at(frontier, 4), 100.0 * 40 / 90);   // cheaper than any
  EXPECT_NEAR(bound_bad_pct_at(frontier, 8), 100.0 * 20 / 90, 1e-9);  // halfway along the hull
  EXPECT_DOUBLE_EQ(bound_bad_pct_at(frontier, 20), 0);
}

// The bound knows what is coming: it starts replicas a cold start ahead of a burst, and stops
// the idle one meanwhile (min 0), which no policy that reacts can do.
TEST(OfflineBoundTest, StartsAheadOfABurst) {
  BoundInput in;
  in.arrivals = {0, 0, 0, 30};
  in.rate = 10;
  in.cold_start_s = 2;
  in.min_replicas = 0;
  in.max_replicas = 10;
  in.initial_replicas = 1;
  const std::vector<BoundPoint> frontier = offline_bound(in);
  ASSERT_FALSE(frontier.empty());
  // 0, 0, 0, 3: three started at 1 s, ready at 3 s (3 + 3 x 2); keeping the first costs more.
  EXPECT_DOUBLE_EQ(frontier.back().replica_seconds, 9);
  EXPECT_DOUBLE_EQ(frontier.back().bad_requests, 0);
  EXPECT_DOUBLE_EQ(frontier.front().replica_seconds, 0);
  EXPECT_DOUBLE_EQ(frontier.front().bad_requests, 30);
}

// A replica that cannot meet the SLO even alone serves nothing within it: all is bad.
TEST(OfflineBoundTest, AModelSlowerThanItsSloMissesEverything) {
  Scenario scenario = small_spike();
  scenario.replica.service_ms = 2 * scenario.slo_ms;
  const std::vector<uint64_t> arrivals = {5, 5, 5};
  const BoundInput in = bound_input(scenario, arrivals);
  EXPECT_EQ(in.rate, 0);
  const std::vector<BoundPoint> frontier = offline_bound(in);
  ASSERT_FALSE(frontier.empty());
  EXPECT_DOUBLE_EQ(frontier.back().bad_pct, 100);
}

std::vector<uint64_t> arrivals_of(const SimResult& result) {
  std::vector<uint64_t> arrivals;
  for (const SecondStats& second : result.seconds) {
    arrivals.push_back(second.arrivals);
  }
  return arrivals;
}

// Lognormal service times: the tail past the SLO is bad whatever the schedule. 23 s image
// requests (sigma 0.65) against a 60 s SLO: z = (ln(60 / 23) + 0.65^2 / 2) / 0.65 = 1.800, so
// 3.59% miss; a fleet of ample static replicas misses as many (seed 1: within 0.4 points).
TEST(OfflineBoundTest, CountsTheServiceTimeTailPastTheSlo) {
  Scenario scenario = *find_scenario("steady");
  scenario.load.points = {{0, 2}, {3000, 2}};
  scenario.replica.service_ms = 23'000;
  scenario.replica.service_sigma = 0.65;
  scenario.replica.saturation = 1;
  scenario.configured_concurrency = 1;  // one request a replica: no sharing slows any
  scenario.slo_ms = 60'000;
  scenario.queue_timeout_s = 60;
  SimOptions options;
  options.policy = PolicyKind::kStatic;
  options.static_replicas = 200;  // 46 in flight on average
  const SimResult run = simulate(scenario, options);
  const BoundInput in = bound_input(scenario, arrivals_of(run));
  EXPECT_NEAR(in.slow_share, 0.0359, 0.0005);
  const std::vector<BoundPoint> frontier = offline_bound(in);
  ASSERT_FALSE(frontier.empty());
  EXPECT_NEAR(frontier.back().bad_pct, 3.59, 0.01);
  EXPECT_NEAR(run.summary.over_slo_pct, 3.59, 0.4);
}

// The bound lies below every policy's point, at two settings of the sweep's knob, on a spike
// and on crashing replicas (which the bound does not model: it is optimistic).
TEST(OfflineBoundTest, LiesBelowEveryPolicy) {
  Scenario crashes = *find_scenario("crashes");
  crashes.load.points = {{0, 1000}, {240, 1000}};
  for (const Scenario& scenario : {small_spike(), crashes}) {
    SimOptions options;
    const std::vector<BoundPoint> frontier =
        offline_bound(bound_input(scenario, arrivals_of(simulate(scenario, options))));
    for (PolicyKind policy : {PolicyKind::kApa, PolicyKind::kHpa, PolicyKind::kKpa,
                              PolicyKind::kRay, PolicyKind::kStatic}) {
      for (double utilization : {0.5, 1.0}) {
        options.policy = policy;
        options.utilization = utilization;
        const Summary s = simulate(scenario, options).summary;
        EXPECT_LE(bound_bad_pct_at(frontier, s.replica_seconds), s.over_slo_pct)
            << scenario.name << " " << policy_name(policy) << " at " << utilization << ": "
            << s.replica_seconds << " replica-seconds";
      }
    }
  }
}

// The knob sets the headroom: on steady load (50 in flight on replicas of 8), sized at half the
// target every policy holds about twice the replicas, and misses no more. (On a short spike the
// lean setting can cost more: a fleet that falls behind sees its queue and overshoots.)
TEST(SimulatorTest, UtilizationKnobBuysHeadroom) {
  Scenario scenario = *find_scenario("steady");
  scenario.load.points = {{0, 5000}, {240, 5000}};
  scenario.initial_replicas = 7;
  for (PolicyKind policy : {PolicyKind::kApa, PolicyKind::kHpa, PolicyKind::kKpa, PolicyKind::kRay,
                            PolicyKind::kStatic}) {
    SimOptions options;
    options.policy = policy;
    options.utilization = 1.0;
    const Summary lean = simulate(scenario, options).summary;
    options.utilization = 0.5;
    const Summary padded = simulate(scenario, options).summary;
    EXPECT_GT(padded.replica_seconds, 1.3 * lean.replica_seconds) << policy_name(policy);
    EXPECT_LE(padded.over_slo_pct, lean.over_slo_pct) << policy_name(policy);
  }
}

// A batched engine alone: each request takes its steps at the single-item step time.
TEST(SimulatorTest, BatchedReplicaStepsAtItsBatchsStepTime) {
  Scenario scenario = *find_scenario("batched");
  scenario.load.points = {{0, 1}, {300, 1}};  // 1 req/s: mostly alone in the batch
  SimOptions options;
  options.policy = PolicyKind::kStatic;
  options.static_replicas = 1;
  const Summary summary = simulate(scenario, options).summary;
  // 50 steps x (20 + 0.5 x 1) ms = 1025 ms, within the histogram's 5% buckets.
  EXPECT_NEAR(summary.p99_ms, 1025 * 1.2, 1025 * 0.25);
  EXPECT_GT(summary.p99_ms, 1025);
  EXPECT_EQ(summary.over_slo_pct, 0);
}

// Configured for twice the batch, replicas queue requests inside; APA's vertical axis sees the
// queue and the latency and lowers the per-replica target to within 15% of the batch (a few
// queued inside still meet the 3 s SLO: 36 on most seeds), and serves
// the SLO better than HPA on the configured concurrency.
TEST(SimulatorTest, VerticalAxisLearnsABatchedEnginesCapacity) {
  const Scenario scenario = *find_scenario("batched");
  SimOptions options;
  const Summary apa = simulate(scenario, options).summary;
  EXPECT_LE(apa.final_target, 32 * 1.15);  // within 15% of the batch (issue 21's bar)
  EXPECT_GE(apa.final_target, 16);
  EXPECT_EQ(apa.completed + apa.rejected + apa.failed + apa.unfinished, apa.requests);
  options.policy = PolicyKind::kHpa;
  const Summary hpa = simulate(scenario, options).summary;
  EXPECT_LT(apa.over_slo_pct, hpa.over_slo_pct);
}

// Every request is answered once: completed, rejected, or failed after its retry.
TEST(SimulatorTest, CrashedReplicasRequestsAreRetriedOnceThenFail) {
  Scenario scenario = *find_scenario("crashes");
  scenario.load.points = {{0, 3000}, {120, 3000}};
  SimOptions options;
  options.policy = PolicyKind::kStatic;
  options.static_replicas = 8;
  const Summary summary = simulate(scenario, options).summary;
  EXPECT_GT(summary.crashes, 0);
  EXPECT_EQ(summary.failed_pct, 0);  // a retry lost again needs a second crash meanwhile
  EXPECT_EQ(summary.completed + summary.rejected + summary.failed + summary.unfinished,
            summary.requests);

  scenario.replica.crash_mtbf_s = 0.05;  // replicas die within a few requests
  const Summary chaos = simulate(scenario, options).summary;
  EXPECT_GT(chaos.failed_pct, 0);
  EXPECT_GE(chaos.over_slo_pct, chaos.failed_pct + chaos.rejected_pct);
  EXPECT_EQ(chaos.completed + chaos.rejected + chaos.failed + chaos.unfinished, chaos.requests);
}

TEST(SimulatorTest, ReadsTraceTimestamps) {
  const std::string path = ::testing::TempDir() + "/trace.csv";
  {
    std::ofstream out(path);
    out << "TIMESTAMP,tokens\n"
        << "2023-11-16 18:15:46.00,1\n2023-11-16 18:15:46.50,1\n2023-11-16 18:15:48.20,1\n";
  }
  auto scenario = trace_scenario(path, 10);
  ASSERT_TRUE(scenario.is_ok()) << scenario.status().message();
  EXPECT_EQ(scenario->load.per_second, (std::vector<double>{20, 0, 10}));
  {
    std::ofstream out(path, std::ios::app);
    out << "yesterday,1\n";
  }
  auto bad = trace_scenario(path, 1);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find(":5: 'yesterday' is not a timestamp"), std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(trace_scenario(path + ".missing", 1).is_ok());
  EXPECT_FALSE(trace_scenario(path, 0).is_ok());
  std::remove(path.c_str());
}

// Played again, a load is a day each time: its season is the load's length.
TEST(SimulatorTest, RepeatsALoadAsDays) {
  Scenario trace;
  trace.load.per_second = {1, 2, 3};
  repeat_load(trace, 3);
  EXPECT_EQ(trace.load.per_second, (std::vector<double>{1, 2, 3, 1, 2, 3, 1, 2, 3}));
  EXPECT_EQ(trace.season_s, 3);
  Scenario shape;
  shape.load.points = {{0, 10}, {5, 20}, {10, 10}};
  repeat_load(shape, 2);
  EXPECT_DOUBLE_EQ(shape.load.end_seconds(), 20);
  EXPECT_DOUBLE_EQ(shape.load.rate_at(15), 20);
  EXPECT_NEAR(shape.load.rate_at(12.5), 15, 0.01);
  EXPECT_EQ(shape.season_s, 10);
}

// Issue 21's forecast on the days scenario with pods' starts (at a fifth of its load, to keep
// the test short): from the third day the batch job's replicas are there when it starts, so
// fewer requests miss, and at no more cost (the reactive scale-up's overshoot is avoided).
TEST(SimulatorTest, TheForecastMeetsADailyPeakReactiveScalingMisses) {
  Scenario scenario = *find_scenario("days-pod");
  scale_rate(scenario, 0.2);
  SimOptions options;
  options.apa_no_forecast = true;
  const Summary reactive = simulate(scenario, options).summary;
  options.apa_no_forecast = false;
  const Summary forecast = simulate(scenario, options).summary;
  EXPECT_LT(forecast.over_slo_pct, reactive.over_slo_pct * 0.8);
  EXPECT_LE(forecast.replica_seconds, reactive.replica_seconds);
}

TEST(SimulatorTest, KnowsItsScenariosAndPolicies) {
  for (const char* name : {"spike", "diurnal", "days", "days-pod", "ramp", "zero",
                           "unknown-capacity", "hetero", "batched", "crashes", "slow-replica"}) {
    EXPECT_TRUE(find_scenario(name).has_value()) << name;
  }
  EXPECT_FALSE(find_scenario("nope").has_value());
  for (const char* name : {"apa", "hpa", "kpa", "kpa-default", "ray", "ray-auto", "static"}) {
    auto kind = parse_policy_kind(name);
    ASSERT_TRUE(kind.is_ok());
    EXPECT_EQ(policy_name(*kind), name);
  }
  EXPECT_FALSE(parse_policy_kind("vpa").is_ok());
}

}  // namespace
}  // namespace flotilla::sim

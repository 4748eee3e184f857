// Several gateways in front of one fleet (Scenario::gateways, docs/fleet.md): exact shared views
// balance as one gateway does; stale ones overshoot the caps and queue on a hot fleet; own views
// with the cap split never overshoot. Deterministic for the seeds: no timing.
#include <gtest/gtest.h>

#include "sim/sim.h"

namespace flotilla::sim {
namespace {

// The fleet study's replicas (5 ms lognormal requests, 8 slots each, exact processor sharing)
// scaled down: 16 replicas, 5 s. `rate` 20K req/s: 100 in flight on 128 slots (78%).
Scenario small_fleet(double rate) {
  Scenario scenario = *find_scenario("fleet");
  scenario.load.points = {{0, rate}, {5, rate}};
  scenario.min_replicas = 16;
  scenario.initial_replicas = 16;
  return scenario;
}

Summary run(Scenario scenario, int64_t gateways, double sample_ms, uint64_t seed,
            bool own_view = false) {
  scenario.gateways = gateways;
  scenario.gateway_sample_ms = sample_ms;
  scenario.gateway_own_view = own_view;
  SimOptions options;
  options.policy = PolicyKind::kStatic;
  options.static_replicas = 16;
  options.seed = seed;
  return simulate(scenario, options).summary;
}

// Exact shared views: 8 gateways balance as well as one, over three seeds. The tolerance is one
// histogram bucket (5%) on p50 and p99, and queueing within 1% of the requests.
TEST(FleetTest, GatewaysOnExactViewsBalanceAsOne) {
  const Scenario scenario = small_fleet(20'000);
  for (uint64_t seed : {1, 2, 3}) {
    const Summary one = run(scenario, 1, 0, seed);
    const Summary eight = run(scenario, 8, 0, seed);
    SCOPED_TRACE(seed);
    EXPECT_EQ(one.over_cap, 0u);
    EXPECT_EQ(eight.over_cap, 0u);  // exact views never send past a cap
    EXPECT_LE(eight.p50_ms, one.p50_ms * 1.051);
    EXPECT_LE(eight.p99_ms, one.p99_ms * 1.051);
    EXPECT_LE(static_cast<double>(eight.queued),
              static_cast<double>(one.queued) + 0.01 * static_cast<double>(one.requests));
    EXPECT_EQ(eight.rejected, 0u);
  }
}

// A hot fleet (23K req/s: 115 in flight on 128 slots, 90%) behind 8 gateways that publish every
// 100 ms: the views are older than many service times, so gateways send past caps they cannot
// see and hold requests for slots they think taken. Measurably worse than exact views.
TEST(FleetTest, StaleViewsAreWorseOnAHotFleet) {
  const Scenario scenario = small_fleet(23'000);
  for (uint64_t seed : {1, 2, 3}) {
    const Summary exact = run(scenario, 8, 0, seed);
    const Summary stale = run(scenario, 8, 100, seed);
    SCOPED_TRACE(seed);
    EXPECT_EQ(exact.over_cap, 0u);
    EXPECT_GT(stale.over_cap, stale.requests / 20);  // over 5% of requests sent past a cap
    EXPECT_GT(stale.p99_ms, exact.p99_ms * 1.5);
    EXPECT_GT(stale.queued, exact.queued);
  }
}

// Fresher samples are better: 1 ms (a fifth of a service time) is far closer to exact than 100.
TEST(FleetTest, FresherSamplesAreBetter) {
  const Scenario scenario = small_fleet(23'000);
  const Summary fresh = run(scenario, 8, 1, 1);
  const Summary stale = run(scenario, 8, 100, 1);
  EXPECT_LT(fresh.p99_ms * 2, stale.p99_ms);
  EXPECT_LT(fresh.p50_ms, stale.p50_ms);
  EXPECT_LT(fresh.queued, stale.queued);
}

// Own views with the cap split: 4 gateways each hold at most 8 / 4 at a replica, so together
// never past its cap, whatever they do not see of each other.
TEST(FleetTest, OwnViewsWithASplitCapNeverOvershoot) {
  const Scenario scenario = small_fleet(23'000);
  const Summary own = run(scenario, 4, 0, 1, /*own_view=*/true);
  EXPECT_EQ(own.over_cap, 0u);
  EXPECT_GT(own.completed, own.requests * 99 / 100);
  // 16 gateways cannot split 8 slots: each keeps one, and together they can overshoot.
  EXPECT_GT(run(scenario, 16, 0, 1, /*own_view=*/true).over_cap, 0u);
}

// One gateway's results do not depend on the sample period: it has no one to hear from.
TEST(FleetTest, OneGatewayIgnoresTheSamplePeriod) {
  const Scenario scenario = small_fleet(20'000);
  const Summary exact = run(scenario, 1, 0, 1);
  const Summary sampled = run(scenario, 1, 100, 1);
  EXPECT_EQ(exact.requests, sampled.requests);
  EXPECT_EQ(exact.p99_ms, sampled.p99_ms);
  EXPECT_EQ(exact.queued, sampled.queued);
}

// Exact processor sharing: below saturation a request takes its own time; near capacity (one
// replica of 8 slots, 1600 req/s, offered 1500 with a cap well above) it keeps up, serving at its
// saturation throughput while more than 8 are in flight.
TEST(FleetTest, ExactSharingKeepsUpNearCapacity) {
  Scenario scenario = small_fleet(1500);
  scenario.replica.service_sigma = 0;
  scenario.configured_concurrency = 10'000;
  scenario.queue_timeout_s = 100;
  scenario.load.points = {{0, 1500}, {20, 1500}};
  SimOptions options;
  options.policy = PolicyKind::kStatic;
  options.static_replicas = 1;
  const Summary near = simulate(scenario, options).summary;
  EXPECT_GT(near.completed, near.requests * 998 / 1000);
  EXPECT_GT(near.p99_ms, 10);  // it did run past its saturation point
  // 400 req/s of 5 ms: 2 in flight on average, past 8 for under 0.1% of requests.
  scenario.load.points = {{0, 400}, {10, 400}};
  const Summary below = simulate(scenario, options).summary;
  EXPECT_NEAR(below.p99_ms, 5, 5 * 0.051);  // within the histogram's 5% buckets
}

}  // namespace
}  // namespace flotilla::sim

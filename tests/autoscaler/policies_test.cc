// Hand-computed cases for every policy: windows, caps, clamps, asymmetry and safeguards.
#include <functional>
#include <random>

#include <gtest/gtest.h>

#include "autoscaler/autoscaler.h"

namespace flotilla::autoscaler {
namespace {

Millis sec(int64_t s) {
  return Millis(s * 1000);
}

// One sample per second for seconds [from, to], demand from `f` (all in flight, none queued).
void fill(SampleWindow& window, int64_t from, int64_t to, const std::function<double(int64_t)>& f) {
  for (int64_t s = from; s <= to; ++s) {
    window.add(Sample{sec(s), f(s), 0});
  }
}

void fill_constant(SampleWindow& window, int64_t from, int64_t to, double demand) {
  fill(window, from, to, [demand](int64_t) { return demand; });
}

// ---- SampleWindow ----------------------------------------------------------------------------

TEST(SampleWindowTest, MeanAndMaxOverTheWindowOnly) {
  SampleWindow window;
  fill(window, 1, 10, [](int64_t s) { return static_cast<double>(s); });
  EXPECT_DOUBLE_EQ(*window.mean_demand(sec(10), sec(4)), (7 + 8 + 9 + 10) / 4.0);
  EXPECT_DOUBLE_EQ(*window.max_demand(sec(8), sec(3)), 8);
  EXPECT_FALSE(window.mean_demand(sec(30), sec(5)).has_value());
  EXPECT_TRUE(window.covers(sec(10), sec(10)));
  EXPECT_FALSE(window.covers(sec(10), sec(11)));
}

// The newest second's wait over the service time, both by Little's law.
TEST(SampleWindowTest, WaitOverServiceByLittlesLaw) {
  SampleWindow window;
  EXPECT_FALSE(window.wait_over_service(sec(1)).has_value());
  window.add(Sample{sec(1), 10, 0, 1000, 1000});
  EXPECT_DOUBLE_EQ(window.wait_over_service(sec(1)).value(), 0);  // no queue
  window.add(Sample{sec(2), 10, 20, 1000, 1000});                 // 20 ms waits, 10 ms of service
  EXPECT_DOUBLE_EQ(window.wait_over_service(sec(2)).value(), 2);
  EXPECT_FALSE(window.wait_over_service(sec(3)).has_value());  // nothing that new
  SampleWindow from_zero;
  from_zero.add(Sample{sec(1), 0, 3, 3, 0});  // nothing served yet: no service time to compare
  EXPECT_FALSE(from_zero.wait_over_service(sec(1)).has_value());
}

TEST(SampleWindowTest, QueuedRequestsCountAsDemand) {
  SampleWindow window;
  window.add(Sample{sec(1), 3, 5});
  EXPECT_DOUBLE_EQ(*window.mean_demand(sec(1), sec(1)), 8);
}

// ---- APA horizontal --------------------------------------------------------------------------

struct ApaCase {
  const char* name;
  int64_t current;
  double demand;    // constant demand over the filled seconds
  int64_t seconds;  // how many seconds of samples (ending at now = 400 s)
  int64_t expected;
};

class ApaHorizontalTest : public ::testing::TestWithParam<ApaCase> {};

TEST_P(ApaHorizontalTest, Decides) {
  const ApaCase& c = GetParam();
  double target = 2;
  ApaOptions options;
  options.range = {1, 100, false};
  auto policy = make_apa_policy(options, &target);
  SampleWindow window;
  fill_constant(window, 400 - c.seconds + 1, 400, c.demand);
  const Decision decision = policy->decide(sec(400), window, Fleet{c.current, 0, c.current});
  EXPECT_EQ(decision.desired, c.expected) << decision.reason;
  EXPECT_FALSE(decision.reason.empty());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ApaHorizontalTest,
    ::testing::Values(
        ApaCase{"NoSamplesKeeps", 3, 0, 0, 3}, ApaCase{"AtTargetHolds", 5, 10, 400, 5},
        // 20 / 2 = 10 wanted; one cycle may go to max(2 x 2, 2 + 4) = 6.
        ApaCase{"SpikeBoundedBySmallStep", 2, 20, 30, 6},
        // 100 / 2 = 50 wanted; max(2 x 10, 10 + 4) = 20.
        ApaCase{"SpikeBoundedByDoubling", 10, 100, 30, 20}, ApaCase{"UpWithinBound", 4, 14, 30, 7},
        // 2 / 2 = 1 wanted, the whole 300 s agrees: -25% of 10, floored = 2 per cycle.
        ApaCase{"DownBoundedFraction", 10, 2, 400, 8},
        // Not 300 s of evidence yet: hold.
        ApaCase{"DownNeedsTheWholeWindow", 10, 2, 100, 10},
        ApaCase{"ClampedToMax", 80, 1000, 30, 100}, ApaCase{"ClampedToMin", 1, 0, 400, 1}),
    [](const ::testing::TestParamInfo<ApaCase>& info) { return info.param.name; });

TEST(ApaHorizontalTest, OneBusySecondInTheDownWindowBlocksScaleDown) {
  double target = 2;
  auto policy = make_apa_policy(ApaOptions{}, &target);
  SampleWindow window;
  fill(window, 1, 400, [](int64_t s) { return s == 150 ? 20.0 : 2.0; });  // 150 is 250 s ago
  EXPECT_EQ(policy->decide(sec(400), window, Fleet{10, 0, 10}).desired, 10);
  // Once that second has left the 300 s window, down it goes.
  fill_constant(window, 401, 460, 2);
  EXPECT_EQ(policy->decide(sec(460), window, Fleet{10, 0, 10}).desired, 8);
}

TEST(ApaHorizontalTest, CountsTurnedAwayLoadAndBacklogByLittlesLaw) {
  double target = 2;
  auto policy = make_apa_policy(ApaOptions{}, &target);
  SampleWindow window;
  // Replicas full at 4 in flight serve 400/s while 800/s arrive and the rest wait (1 on average,
  // turned away at the deadline): 8 would be in flight, plus 1 x 10 ms / 5 s for the queue.
  window.add(Sample{sec(1), 4, 1, 800, 400});
  EXPECT_DOUBLE_EQ(window.max_offered(sec(1), sec(20)).value(), 8.002);
  EXPECT_EQ(policy->decide(sec(1), window, Fleet{2, 0, 2}).desired, 5);
  // A backlog of 4000 at 10 ms each (4 / 400 per s) served within 5 s needs 8 more.
  window.add(Sample{sec(2), 4, 4000, 400, 400});
  EXPECT_DOUBLE_EQ(window.max_offered(sec(2), sec(1)).value(), 12);
}

// With no queue every arrival is in flight already: a fleet filling up with 23 s requests (70
// arrivals, 1 completion this second) needs what it holds, not 70 times it.
TEST(ApaHorizontalTest, WithoutAQueueInFlightIsTheDemand) {
  SampleWindow window;
  window.add(Sample{sec(1), 30, 0, 70, 1});
  EXPECT_DOUBLE_EQ(window.max_offered(sec(1), sec(20)).value(), 30);
}

// Between full cycles (every 5 s) the fast path runs each second: up when the newest second asks
// for more than the ready replicas hold, never down, and not again while capacity is starting.
TEST(ApaHorizontalTest, FastPathScalesUpBetweenCyclesOnly) {
  double target = 2;
  auto policy = make_apa_policy(ApaOptions{}, &target);
  EXPECT_EQ(policy->period(), sec(1));
  SampleWindow window;
  fill_constant(window, 1, 10, 4);
  EXPECT_EQ(policy->decide(sec(10), window, Fleet{2, 0, 2}).desired, 2);  // a full cycle
  // 4 in flight and 6 waiting on 2 replicas of 2: short. 400/s served at 10 ms: Little's law
  // gives 4, the backlog 6 x 10 ms / 5 s more.
  window.add(Sample{sec(11), 4, 6, 400, 400});
  const Decision up = policy->decide(sec(11), window, Fleet{2, 0, 2});
  EXPECT_EQ(up.desired, 3) << up.reason;
  EXPECT_NE(up.reason.find("fast up"), std::string::npos) << up.reason;
  // The third replica is starting and the queue holds: it is on its way, nothing more.
  window.add(Sample{sec(12), 4, 6, 400, 400});
  EXPECT_EQ(policy->decide(sec(12), window, Fleet{2, 1, 3}).desired, 3);
  // Idle now, but down waits for a full cycle (and then for its window).
  fill_constant(window, 13, 14, 0);
  EXPECT_EQ(policy->decide(sec(14), window, Fleet{3, 0, 3}).desired, 3);
  // Closed-loop clients: 5.5 in flight on average (the step came within the second), 20
  // waiting, arrivals = completions, nothing starting. Little's law asks for 3 (5.54 / 2); the
  // queue asks for one more than what runs.
  fill_constant(window, 15, 20, 4);
  EXPECT_EQ(policy->decide(sec(20), window, Fleet{3, 0, 3}).desired, 3);  // a full cycle
  window.add(Sample{sec(21), 5.5, 20, 550, 550});
  const Decision queue = policy->decide(sec(21), window, Fleet{3, 0, 3});
  EXPECT_EQ(queue.desired, 4) << queue.reason;
  EXPECT_NE(queue.reason.find("one more"), std::string::npos) << queue.reason;
  // Off: nothing between cycles, whatever the load.
  ApaOptions slow;
  slow.fast_period = Millis(0);
  auto full_only = make_apa_policy(slow, &target);
  EXPECT_EQ(full_only->period(), sec(5));
}

// A replica the fast path added for a waiting queue is what the down window protects: the next
// full cycle, on samples Little's law sizes at 2, does not take it back.
TEST(ApaHorizontalTest, AReplicaAddedForAQueueIsKeptThroughTheDownWindow) {
  double target = 2;
  ApaOptions options;
  options.down_window = sec(10);
  auto policy = make_apa_policy(options, &target);
  SampleWindow window;
  fill_constant(window, 1, 20, 4);
  EXPECT_EQ(policy->decide(sec(20), window, Fleet{2, 0, 2}).desired, 2);  // a full cycle
  window.add(Sample{sec(21), 3.5, 20, 350, 350});  // 3.54 by Little's law: one more, for the queue
  EXPECT_EQ(policy->decide(sec(21), window, Fleet{2, 0, 2}).desired, 3);
  fill_constant(window, 22, 25, 4);
  EXPECT_EQ(policy->decide(sec(25), window, Fleet{3, 0, 3}).desired, 3);  // the next full cycle
}

// An open-loop fleet near its cap: 2750/s of 10 ms requests on 3 replicas capped at 10 keep 27.5
// in flight (92% of the slots) and a few waiting, each for a fraction of its service. Neither
// queue rule (the standing queue, one more on the fast path) reads that as demand: Little's law
// asks for 3. Closed-loop clients a few past the cap keep every slot taken with the same queue:
// that is demand.
TEST(ApaHorizontalTest, AQueueWhileSlotsStandFreeIsNoReasonForAnotherReplica) {
  for (const double in_flight : {27.5, 29.8}) {
    double target = 10;
    auto policy = make_apa_policy(ApaOptions{}, &target);
    SampleWindow window;
    for (int64_t s = 1; s <= 20; ++s) {
      const double rate = in_flight * 100;  // 10 ms each
      window.add(Sample{sec(s), in_flight, 4.0 + static_cast<double>(s % 3), rate, rate});
    }
    const int64_t expected = in_flight < 29 ? 3 : 4;
    // A full cycle: the queue stood through the standing window, 2 ms a request.
    EXPECT_EQ(policy->decide(sec(20), window, Fleet{3, 0, 3}).desired, expected) << in_flight;
    // Between cycles, 8 waiting (3 ms each) on the 3 replicas: one more only with every slot taken.
    window.add(Sample{sec(21), in_flight, 8, in_flight * 100, in_flight * 100});
    const Decision fast = policy->decide(sec(21), window, Fleet{3, 0, 3});
    EXPECT_EQ(fast.desired, expected) << fast.reason;
  }
}

TEST(ApaHorizontalTest, StandingQueueIsDemandWhenNothingIsStarting) {
  // Closed-loop clients: 24 of them on 1 replica capped at 4. Arrivals follow completions, so
  // Little's law sees 4 (plus a small backlog term); the queue of 20 stands through the period.
  double target = 4;
  ApaOptions options;
  options.min_up_step = 100;  // no per-cycle cap here: the test is about the demand
  auto policy = make_apa_policy(options, &target);
  SampleWindow window;
  for (int64_t s = 1; s <= 5; ++s) {
    window.add(Sample{sec(s), 4, 20, 80, 80});
  }
  EXPECT_EQ(policy->decide(sec(5), window, Fleet{1, 0, 1}).desired, 6);  // (4 + 20) / 4
  // While replicas start, the queue is theirs: Little's law only.
  EXPECT_EQ(policy->decide(sec(5), window, Fleet{1, 2, 3}).desired, 3);
  // A backlog being served (the queue shrinks) is not standing.
  SampleWindow draining;
  for (int64_t s = 1; s <= 5; ++s) {
    draining.add(Sample{sec(s), 4, static_cast<double>(100 - 20 * s), 80, 80});
  }
  EXPECT_FALSE(draining.standing_demand(sec(5), sec(5)).has_value());
  EXPECT_LT(policy->decide(sec(5), draining, Fleet{1, 0, 1}).desired, 6);
}

// With decisions every second, a queue must still stand for the standing window (5 s), not
// one period: a queue that appeared a second ago is what the replicas just started serve.
TEST(ApaHorizontalTest, StandingMeansTheStandingWindowNotThePeriod) {
  double target = 4;
  ApaOptions options;
  options.period = sec(1);
  options.min_up_step = 100;
  auto policy = make_apa_policy(options, &target);
  SampleWindow window;
  for (int64_t s = 1; s <= 5; ++s) {
    window.add(Sample{sec(s), 4, s >= 4 ? 20.0 : 0.0, 80, 80});
  }
  EXPECT_LT(policy->decide(sec(5), window, Fleet{1, 0, 1}).desired, 6);
  for (int64_t s = 6; s <= 9; ++s) {
    window.add(Sample{sec(s), 4, 20, 80, 80});
  }
  EXPECT_EQ(policy->decide(sec(9), window, Fleet{1, 0, 1}).desired, 6);  // stood 5 s now
}

TEST(SampleWindowTest, ArrivalGrowthFollowsARampButNotAStep) {
  // Arrivals 1000 + 100/s: in 10 s the rate grows from 3000 to 4000.
  SampleWindow ramp;
  for (int64_t s = 1; s <= 20; ++s) {
    ramp.add(Sample{sec(s), 1, 0, 1000 + 100.0 * static_cast<double>(s), 0});
  }
  EXPECT_NEAR(ramp.arrival_growth(sec(20), sec(20), sec(10)).value(), 4000.0 / 3000, 1e-9);
  // A step 8 s ago (a spike): both halves of the window are flat, so no trend.
  SampleWindow step;
  for (int64_t s = 1; s <= 20; ++s) {
    step.add(Sample{sec(s), 1, 0, s <= 12 ? 1000.0 : 5000.0, 0});
  }
  EXPECT_DOUBLE_EQ(step.arrival_growth(sec(20), sec(20), sec(10)).value(), 1);
  // A few outliers do not tilt it (Theil-Sen).
  SampleWindow noisy;
  for (int64_t s = 1; s <= 20; ++s) {
    noisy.add(Sample{sec(s), 1, 0, s % 7 == 0 ? 9000.0 : 1000.0, 0});
  }
  EXPECT_DOUBLE_EQ(noisy.arrival_growth(sec(20), sec(20), sec(10)).value(), 1);
  SampleWindow short_window;
  fill_constant(short_window, 1, 5, 1);
  EXPECT_FALSE(short_window.arrival_growth(sec(5), sec(20), sec(10)).has_value());
}

TEST(ApaHorizontalTest, SizesARampForWhereItWillBe) {
  double target = 10;
  ApaOptions options;
  options.min_up_step = 100;  // no per-cycle cap here: the test is about the demand
  auto policy = make_apa_policy(options, &target);
  // 30 in flight now, arrivals growing from 2000 to 3000/s over the window (50/s): in the
  // 10 s lead time 3000 -> 3500, x7/6, so the busiest second's 30 becomes 35: 4 replicas.
  SampleWindow window;
  for (int64_t s = 1; s <= 20; ++s) {
    const double arrivals = 2000 + 50.0 * static_cast<double>(s);
    window.add(Sample{sec(s), s == 20 ? 30.0 : 20.0, 0, arrivals, arrivals});
  }
  const Decision decision = policy->decide(sec(20), window, Fleet{3, 0, 3});
  EXPECT_EQ(decision.desired, 4) << decision.reason;
  EXPECT_NE(decision.reason.find("arrival trend"), std::string::npos) << decision.reason;
  // Growth within the tolerance (under 10% in the lead time) is noise: sized for now, 3.
  SampleWindow slow;
  for (int64_t s = 1; s <= 20; ++s) {
    const double arrivals = 3000 + 2.0 * static_cast<double>(s);
    slow.add(Sample{sec(s), s == 20 ? 30.0 : 20.0, 0, arrivals, arrivals});
  }
  EXPECT_EQ(policy->decide(sec(20), slow, Fleet{3, 0, 3}).desired, 3);
}

// N+1 after a failure: while a replica failed within the down window, one spare on top (start
// times unknown count as slow).
TEST(ApaHorizontalTest, KeepsASpareWhileAReplicaFailedRecently) {
  double target = 10;
  auto policy = make_apa_policy(ApaOptions{}, &target);
  SampleWindow window;
  fill_constant(window, 1, 400, 30);                                          // 3 replicas' worth
  EXPECT_EQ(policy->decide(sec(400), window, Fleet{3, 0, 3, 5}).desired, 3);  // 5 failed before
  const Decision decision = policy->decide(sec(405), window, Fleet{3, 0, 3, 6});  // one more
  EXPECT_EQ(decision.desired, 4) << decision.reason;
  EXPECT_NE(decision.reason.find("spare"), std::string::npos) << decision.reason;
  fill_constant(window, 401, 700, 30);
  EXPECT_EQ(policy->decide(sec(700), window, Fleet{4, 0, 4, 6}).desired, 4);  // 295 s later
  // Once the failure has left the 300 s window, the spare goes.
  EXPECT_EQ(policy->decide(sec(706), window, Fleet{4, 0, 4, 6}).desired, 3);
}

// The spare covers the gap while a replacement starts: where replicas start within the fast
// path's cadence (a warm pool) there is no gap to cover; where they take seconds, there is.
TEST(ApaHorizontalTest, KeepsASpareOnlyWhereReplicasStartSlowly) {
  double target = 10;
  SampleWindow window;
  fill_constant(window, 1, 400, 30);  // 3 replicas' worth
  auto warm = make_apa_policy(ApaOptions{}, &target);
  EXPECT_EQ(warm->decide(sec(400), window, Fleet{3, 0, 3, 5, 25}).desired, 3);
  const Decision fast = warm->decide(sec(405), window, Fleet{3, 0, 3, 6, 25});
  EXPECT_EQ(fast.desired, 3) << fast.reason;
  auto pods = make_apa_policy(ApaOptions{}, &target);
  EXPECT_EQ(pods->decide(sec(400), window, Fleet{3, 0, 3, 5, 5'000}).desired, 3);
  const Decision slow = pods->decide(sec(405), window, Fleet{3, 0, 3, 6, 5'000});
  EXPECT_EQ(slow.desired, 4) << slow.reason;
  EXPECT_NE(slow.reason.find("spare"), std::string::npos) << slow.reason;
}

TEST(ApaHorizontalTest, ReadsTheTargetEachCycle) {
  double target = 2;
  auto policy = make_apa_policy(ApaOptions{}, &target);
  SampleWindow window;
  fill_constant(window, 1, 20, 8);
  EXPECT_EQ(policy->decide(sec(20), window, Fleet{4, 0, 4}).desired, 4);
  target = 1;  // the vertical axis learned that replicas take less
  EXPECT_EQ(policy->decide(sec(25), window, Fleet{4, 0, 4}).desired, 8);
}

TEST(ApaHorizontalTest, ScalesToZeroOnlyWhenAllowed) {
  double target = 2;
  ApaOptions options;
  options.range = {0, 10, true};
  auto policy = make_apa_policy(options, &target);
  SampleWindow window;
  fill_constant(window, 1, 400, 0);
  EXPECT_EQ(policy->decide(sec(400), window, Fleet{1, 0, 1}).desired, 0);
  // From zero, requests waiting at the gateway bring a first replica back.
  window.add(Sample{sec(401), 0, 3});
  EXPECT_EQ(policy->decide(sec(401), window, Fleet{0, 0, 0}).desired, 1);
}

// ---- APA vertical ----------------------------------------------------------------------------

// Signals of a cycle whose load was steady: the busiest second looked like the mean.
ReplicaSignals steady(double latency_ms, double concurrency, double queued, double cpu) {
  return ReplicaSignals{latency_ms, concurrency, queued, cpu, concurrency, latency_ms};
}

TEST(VerticalPolicyTest, DecreasesFastOnOverload) {
  VerticalPolicy policy(VerticalOptions{});
  EXPECT_TRUE(policy.decide_target(steady(10, 1, 0, 0.3)).reason.empty());  // the baseline
  EXPECT_EQ(policy.baseline_ms(), 10);
  // 4.5x the baseline, and 4 in flight give less throughput than 1 did (89/s, not 100/s).
  const Decision decision = policy.decide_target(steady(45, 4, 0, 0.6));
  EXPECT_DOUBLE_EQ(policy.target(), 3);  // 4 x 0.75
  EXPECT_NE(decision.reason.find("overload"), std::string::npos) << decision.reason;
  policy.decide_target(steady(10, 3, 2, 0.5));  // queueing inside the replica is overload too
  EXPECT_DOUBLE_EQ(policy.target(), 2.25);
}

// Latency that bought throughput is its price, not overload: an LLM's latency climbs from one
// request in flight while its throughput still rises (live, the latency rule alone stopped a
// probe at 15 with the knee at 15.5).
TEST(VerticalPolicyTest, LatencyThatBoughtThroughputIsNotOverload) {
  VerticalPolicy policy(VerticalOptions{});
  policy.decide_target(steady(10, 2, 0, 0.3));  // the baseline: 200/s
  // 1.6x the baseline at 4 in flight, 250/s: no cut.
  EXPECT_EQ(policy.decide_target(steady(16, 4, 0, 0.6)).reason.find("overload"), std::string::npos);
  EXPECT_GE(policy.target(), 4);
  // Against nothing nearer than 1 in flight, 8 at 4x the latency for 2x the throughput is
  // overload: a replica saturated at 2 gives that (integration_control's "remembered" model).
  VerticalOptions options;
  options.initial_target = 8;
  VerticalPolicy saturated(options);
  saturated.decide_target(steady(50, 1, 0, 0.1));                             // 20/s
  const Decision decision = saturated.decide_target(steady(200, 8, 0, 0.1));  // 40/s
  EXPECT_NE(decision.reason.find("overload"), std::string::npos) << decision.reason;
}

// The curve moves the target only under load: a cycle whose busiest second did not fill the
// replicas to 90% of the target is a point of the curve, never a probe.
TEST(VerticalPolicyTest, ProbesOnlyWhenTheBusiestSecondWasFull) {
  VerticalPolicy policy(VerticalOptions{});  // target 4
  // Throughput in proportion to the concurrency: no knee in sight, but no load either.
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(policy.decide_target({10, 1, 0, 0.2, 1, 10}).reason.empty());
    EXPECT_TRUE(policy.decide_target({10, 3, 0, 0.4, 3.5, 10}).reason.empty());
  }
  EXPECT_DOUBLE_EQ(policy.target(), 4);
  // Full: the curve is known below (1 in flight gave a third of 3's throughput), not above.
  const Decision decision = policy.decide_target({10, 3.8, 0, 1.0, 3.6, 10});
  EXPECT_DOUBLE_EQ(policy.target(), 5);
  EXPECT_NE(decision.reason.find("probe up"), std::string::npos) << decision.reason;
}

TEST(VerticalPolicyTest, StartsFromALearnedBaseline) {
  VerticalOptions options;
  options.initial_baseline_ms = 10;
  VerticalPolicy policy(options);
  EXPECT_EQ(policy.baseline_ms(), 10);
  policy.decide_target(steady(20, 4, 0, 0.5));  // 2x: overload at once
  EXPECT_DOUBLE_EQ(policy.target(), 3);
}

TEST(VerticalPolicyTest, StaysWithinBounds) {
  VerticalOptions options;
  options.min_target = 2;
  options.max_target = 5;
  VerticalPolicy policy(options);  // target 4
  for (int i = 0; i < 10; ++i) {
    policy.decide_target(steady(50, policy.target(), 3, 1.0));  // queueing: down to the min
  }
  EXPECT_DOUBLE_EQ(policy.target(), 2);
  // A replica whose throughput never stops rising: up to the max at most.
  VerticalPolicy rising(options);
  for (int i = 0; i < 20; ++i) {
    rising.decide_target(steady(10, rising.target(), 0, 0.3));
    EXPECT_LE(rising.target(), 5);
    EXPECT_GE(rising.target(), 2);
  }
  EXPECT_GE(rising.target(), 3.5);  // near 90% of the max: the knee of a line seen up to it
}

// A model whose latency grows past 8 concurrent requests per replica (processor sharing with a
// saturation point): the target converges within 20% of 8 from below and from above.
TEST(VerticalPolicyTest, ConvergesOnTheSaturationPoint) {
  for (const double start : {2.0, 30.0}) {
    VerticalOptions options;
    options.initial_target = start;
    VerticalPolicy policy(options);
    policy.decide_target(steady(10, 1, 0, 0.1));  // baseline at low load
    for (int cycle = 0; cycle < 60; ++cycle) {
      const double load = policy.target();  // the horizontal axis keeps replicas at target
      const double latency = 10 * std::max(1.0, load / 8);
      policy.decide_target(steady(latency, load, load > 8 ? load - 8 : 0, std::min(1.0, load / 8)));
    }
    EXPECT_NEAR(policy.target(), 8, 8 * 0.2) << "from " << start;
  }
}

// Issue 18: on a nearly idle xgboost endpoint the policy lowered the target 16 -> 12 -> 9 ->
// 6.75 in three cycles, each "overload (latency 0.2 ms vs baseline 0.1 ms, queued 0.0, cpu 0%)".
TEST(VerticalPolicyTest, AnIdleEndpointNeverLowersTheTarget) {
  VerticalOptions options;
  options.initial_target = 16;
  VerticalPolicy policy(options);
  policy.decide_target({0.1, 0.02, 0, 0, 0.1, 0.1});  // the baseline: 0.1 ms
  for (int cycle = 0; cycle < 50; ++cycle) {
    // Twice the baseline, one request in flight now and then.
    EXPECT_TRUE(policy.decide_target({0.2, 0.02, 0, 0, 1, 0.2}).reason.empty()) << cycle;
  }
  EXPECT_DOUBLE_EQ(policy.target(), 16);
}

// At 10% of the target a slower cycle (a cold cache, a noisy neighbour) is not overload, even
// when it is many ms past the baseline: the replicas are nowhere near their capacity.
TEST(VerticalPolicyTest, LightLoadNeverLowersTheTarget) {
  VerticalOptions options;
  options.initial_target = 16;
  VerticalPolicy policy(options);
  policy.decide_target({10, 1.6, 0, 0.1, 2, 10});
  for (int cycle = 0; cycle < 50; ++cycle) {
    const double latency = cycle % 2 == 0 ? 30 : 0.3;  // 3x the baseline, or far below it
    EXPECT_TRUE(policy.decide_target({latency, 1.6, 0, 0.1, 3, latency}).reason.empty()) << cycle;
  }
  EXPECT_DOUBLE_EQ(policy.target(), 16);
}

// Loaded replicas whose latency doubles from 0.1 to 0.2 ms are within the absolute floor
// (overload_min_excess_ms): no decrease. The same ratio over 1 ms is overload.
TEST(VerticalPolicyTest, OverloadNeedsAnAbsoluteExcess) {
  VerticalOptions options;
  options.initial_target = 16;
  VerticalPolicy policy(options);
  policy.decide_target({0.1, 1, 0, 0.1, 1, 0.1});
  // Fewer cycles than would make 0.2 ms the baseline's percentile. Loaded (14 of 16 in flight
  // at the busiest second) but not full: no probe either.
  for (int cycle = 0; cycle < 8; ++cycle) {
    EXPECT_TRUE(policy.decide_target({0.2, 13, 0, 0.5, 14, 0.2}).reason.empty()) << cycle;
  }
  EXPECT_DOUBLE_EQ(policy.target(), 16);
  const Decision decision = policy.decide_target({1.5, 13, 0, 0.6, 14, 1.5});
  EXPECT_DOUBLE_EQ(policy.target(), 12);
  EXPECT_NE(decision.reason.find("overload"), std::string::npos) << decision.reason;
}

// True overload is still seen at once: replicas filled to the target, latency 8x the baseline
// and 70 ms over it, for no more throughput than 2 in flight gave (188/s, not 200/s); and
// queueing inside replicas needs no latency evidence.
TEST(VerticalPolicyTest, TrueOverloadIsStillDetected) {
  VerticalOptions options;
  options.initial_target = 16;
  VerticalPolicy policy(options);
  policy.decide_target({10, 2, 0, 0.1, 3, 10});
  policy.decide_target({80, 15, 0, 0.9, 16, 90});
  EXPECT_DOUBLE_EQ(policy.target(), 12);
  const Decision decision = policy.decide_target({10, 12, 7, 0.9, 12, 10});  // 7 of 12 queued
  EXPECT_DOUBLE_EQ(policy.target(), 9);
  EXPECT_NE(decision.reason.find("overload"), std::string::npos) << decision.reason;
}

// The baseline is a low percentile of recent cycles, not the lowest latency ever seen: one
// cycle at 1 ms among cycles at 10 ms leaves the window and the baseline returns to 10 ms.
TEST(VerticalPolicyTest, BaselineIsALowPercentileOfRecentCycles) {
  VerticalOptions options;
  options.initial_target = 16;
  VerticalPolicy policy(options);
  policy.decide_target({1, 1, 0, 0.1, 1, 1});
  EXPECT_EQ(policy.baseline_ms(), 1);
  for (int cycle = 0; cycle < options.baseline_window_cycles; ++cycle) {
    policy.decide_target({10, 1, 0, 0.1, 1, 10});
  }
  EXPECT_EQ(policy.baseline_ms(), 10);
  // Within the window, a low outlier among 20 is the 0th percentile, not the 10th.
  policy.decide_target({2, 1, 0, 0.1, 1, 2});
  EXPECT_EQ(policy.baseline_ms(), 10);
  policy.decide_target({2, 1, 0, 0.1, 1, 2});
  EXPECT_EQ(policy.baseline_ms(), 2);
}

// Issue 21, item 6: a replica's throughput at c in flight, the CPU it reads under load, and the
// bounds; the policy runs closed-loop on it (the replica full at the target, as under more
// clients than it takes) and must settle within 15% of the knee by the capacity sweep's
// definition (bench/control/live_vertical.py: the smallest concurrency at 90% of the best
// throughput over [1, max]) from 4x below and 4x above, in a bounded number of changes, and
// then hold. `noise` multiplies each cycle's latency by a seeded factor in [1 - noise, 1 + noise].
struct KneeCase {
  std::string name;
  std::function<double(double)> throughput;  // per second
  double cpu;
  double max_target;
  double noise;
};

double sweep_knee(const std::function<double(double)>& throughput, double max) {
  double best = 0;
  for (double c = 1; c <= max; c += 0.01) {
    best = std::max(best, throughput(c));
  }
  for (double c = 1; c <= max; c += 0.01) {
    if (throughput(c) >= 0.9 * best) {
      return c;
    }
  }
  return max;
}

TEST(VerticalPolicyTest, ConvergesOnTheKneeOfTheThroughputCurve) {
  const auto sharp = [](double c) {
    return 100 * std::min(c, 16.0);
  };
  // bench-50m on two cores: continuous batching, throughput rising to 64 in flight.
  const auto batched = [](double c) {
    return 16 * c / (c + 3.5);
  };
  // A live XGBoost replica's sweep (bench/RESULTS.md, "Vertical on real models"): flat from 2
  // to 6 in flight, rising again to its best at 24; the knee at 10.3, far past the first flat.
  const auto two_plateaus = [](double c) {
    const std::vector<std::pair<double, double>> points = {{1, 5717},   {2, 9982},   {6, 9980},
                                                           {8, 12053},  {12, 13650}, {16, 14138},
                                                           {24, 14428}, {64, 13973}};
    for (size_t i = 1; i < points.size(); ++i) {
      if (c <= points[i].first) {
        const auto [c0, x0] = points[i - 1];
        const auto [c1, x1] = points[i];
        return x0 + (x1 - x0) * (c - c0) / (c1 - c0);
      }
    }
    return points.back().second;
  };
  const std::vector<KneeCase> cases = {
      {"sharp knee at 16, cpu saturated (no baseline)", sharp, 1.0, 64, 0},
      {"two plateaus, cpu 50%", two_plateaus, 0.5, 64, 0},
      {"two plateaus, 5% noise", two_plateaus, 0.5, 64, 0.05},
      {"sharp knee at 16, cpu 50%", sharp, 0.5, 64, 0},
      {"batched, cpu saturated", batched, 1.0, 64, 0},
      {"sharp knee, 5% noise", sharp, 1.0, 64, 0.05},
      // Flat at the top: 90% of the best is ill-conditioned there (a 3% error in the best moves
      // it by 25%, for the sweep as for the policy), so less noise.
      {"batched, 2% noise", batched, 1.0, 64, 0.02},
  };
  for (const KneeCase& c : cases) {
    const double knee = sweep_knee(c.throughput, c.max_target);
    for (const double start : {knee / 4, std::min(c.max_target, knee * 4)}) {
      SCOPED_TRACE(c.name + ", from " + std::to_string(start));
      VerticalOptions options;
      options.max_target = c.max_target;
      options.initial_target = start;
      VerticalPolicy policy(options);
      std::mt19937 random(7);
      std::uniform_real_distribution<double> noise(1 - c.noise, 1 + c.noise);
      int changes = 0;
      int changes_late = 0;
      for (int cycle = 0; cycle < 100; ++cycle) {
        const double load = std::max(1.0, std::round(policy.target()));  // the gateway's cap
        const double latency_ms = load / c.throughput(load) * 1000 * noise(random);
        if (!policy.decide_target({latency_ms, load, 0, c.cpu, load, latency_ms}).reason.empty()) {
          changes += 1;
          changes_late += cycle >= 60 ? 1 : 0;
        }
      }
      EXPECT_NEAR(policy.target() / knee, 1, 0.15) << "knee " << knee;
      EXPECT_LE(changes, 25);
      EXPECT_EQ(changes_late, 0);  // steady load, no change
    }
  }
}

// A knee that is only the lowest concurrency seen is no floor: once the short reading that
// ended the probe down is outvoted (it was noise), the way down is a probe (x0.75), not one
// bin a cycle (live, an XGBoost target took 5 cycles from 36 to 24 with its knee at 10).
TEST(VerticalPolicyTest, TheLowestConcurrencySeenIsNoFloor) {
  VerticalOptions options;
  options.max_target = 44;  // 40 in flight is 90% of it: the curve is known above from there
  options.initial_target = 40;
  VerticalPolicy policy(options);
  // A cycle at `concurrency` in flight on average, the busiest second at the gateway's cap.
  auto cycle = [&](double concurrency, double throughput) {
    const double latency_ms = concurrency / throughput * 1000;
    return policy.decide_target(
        {latency_ms, concurrency, 0, 0.5, std::round(policy.target()), latency_ms});
  };
  cycle(40, 1000);
  EXPECT_DOUBLE_EQ(policy.target(), 30);      // probe down
  cycle(30, 800);                             // noise, short of 90% of the best
  EXPECT_DOUBLE_EQ(policy.target(), 35);      // up to the knee read between 30 and 40
  const Decision decision = cycle(30, 1000);  // outvoted: 30 reads 90% of the best
  EXPECT_NE(decision.reason.find("probe down"), std::string::npos) << decision.reason;
  EXPECT_DOUBLE_EQ(policy.target(), 26.25);
}

// The gateway caps a replica at the target rounded: at 3.45 it holds 3, and a probe must read
// that as full (it stopped a live xgboost endpoint at 3.45 on its way down).
TEST(VerticalPolicyTest, AFractionalTargetIsFullAtItsRoundedCap) {
  VerticalOptions options;
  options.initial_target = 3.45;
  VerticalPolicy policy(options);
  // Throughput flat from 1 in flight: the knee is below; the replica holds 3 at its cap.
  const Decision decision = policy.decide_target({10, 3, 0, 0.5, 3, 10});
  EXPECT_NE(decision.reason.find("probe down"), std::string::npos) << decision.reason;
  EXPECT_DOUBLE_EQ(policy.target(), 2);
}

// A known curve is kept while the replicas' throughput holds (no probe), and learned anew when
// it moves: replicas that became twice as fast (5 ms a request, saturated at 16 in flight, not
// 10 ms at 8) end within 15% of their new knee.
TEST(VerticalPolicyTest, AFasterModelIsLearnedAgain) {
  VerticalOptions options;
  options.initial_target = 8;
  VerticalPolicy policy(options);
  double service_ms = 10;
  double saturation = 8;
  int late_changes = 0;
  for (int cycle = 0; cycle < 150; ++cycle) {
    if (cycle == 50) {
      EXPECT_NEAR(policy.target(), 8, 8 * 0.15);
      EXPECT_EQ(late_changes, 0);
      service_ms = 5;
      saturation = 16;
    }
    const double load = policy.target();
    const double latency_ms = service_ms * std::max(1.0, load / saturation);
    const Decision decision = policy.decide_target({latency_ms, load, 0, 1.0, load, latency_ms});
    late_changes += (cycle >= 30 && cycle < 50 && !decision.reason.empty()) ? 1 : 0;
  }
  EXPECT_NEAR(policy.target(), 16, 16 * 0.15);
}

// ---- Kubernetes HPA --------------------------------------------------------------------------

TEST(HpaPolicyTest, IgnoresChangesWithinTheTolerance) {
  auto policy = make_hpa_policy(HpaOptions{});
  SampleWindow window;
  fill_constant(window, 1, 15, 4.2);  // ratio 1.05 on 4 ready
  EXPECT_EQ(policy->decide(sec(15), window, Fleet{4, 0, 4}).desired, 4);
}

TEST(HpaPolicyTest, ScalesUpByAtMostFourPodsOrDouble) {
  auto policy = make_hpa_policy(HpaOptions{});
  SampleWindow window;
  fill_constant(window, 1, 15, 40);
  EXPECT_EQ(policy->decide(sec(15), window, Fleet{2, 0, 2}).desired, 6);  // +4 > x2
  fill_constant(window, 16, 30, 40);
  EXPECT_EQ(policy->decide(sec(30), window, Fleet{10, 0, 10}).desired, 20);  // x2 > +4
}

TEST(HpaPolicyTest, ScaleDownWaitsForTheStabilizationWindow) {
  auto policy = make_hpa_policy(HpaOptions{});
  SampleWindow window;
  fill_constant(window, 1, 15, 10);
  EXPECT_EQ(policy->decide(sec(15), window, Fleet{10, 0, 10}).desired, 10);
  fill_constant(window, 16, 315, 2);
  // 2 is recommended from t=30 s on, but 10 (t=15 s) is in the 300 s window until t=315 s.
  for (int64_t t = 30; t < 315; t += 15) {
    EXPECT_EQ(policy->decide(sec(t), window, Fleet{10, 0, 10}).desired, 10) << t;
  }
  EXPECT_EQ(policy->decide(sec(315), window, Fleet{10, 0, 10}).desired, 2);
}

// ---- Knative KPA -----------------------------------------------------------------------------

TEST(KpaPolicyTest, StableModeTargetsSeventyPercent) {
  auto policy = make_kpa_policy(KpaOptions{});
  SampleWindow window;
  fill_constant(window, 1, 60, 7);
  EXPECT_EQ(policy->decide(sec(60), window, Fleet{10, 0, 10}).desired, 10);  // 7 / 0.7
}

TEST(KpaPolicyTest, PanicScalesOnTheShortWindowAndNeverDown) {
  auto policy = make_kpa_policy(KpaOptions{});
  SampleWindow window;
  fill_constant(window, 1, 54, 1);
  fill_constant(window, 55, 60, 7);  // the last 6 s want 10 on 2 ready: >= 2x
  Decision decision = policy->decide(sec(60), window, Fleet{2, 0, 2});
  EXPECT_EQ(decision.desired, 10) << decision.reason;
  EXPECT_NE(decision.reason.find("PANIC"), std::string::npos);
  // Load gone: still no scale-down while panicking (60 s after the last over-threshold tick).
  fill_constant(window, 61, 118, 0.5);
  decision = policy->decide(sec(118), window, Fleet{10, 0, 10});
  EXPECT_EQ(decision.desired, 10) << decision.reason;
  fill_constant(window, 119, 120, 0.5);
  decision = policy->decide(sec(120), window, Fleet{10, 0, 10});
  EXPECT_EQ(decision.desired, 5) << decision.reason;  // out of panic; at most /2 per decision
}

TEST(KpaPolicyTest, ScalesToZeroAfterTheGracePeriod) {
  KpaOptions options;
  options.range = {0, 10, true};
  auto policy = make_kpa_policy(options);
  SampleWindow window;
  fill_constant(window, 1, 100, 0);
  EXPECT_EQ(policy->decide(sec(100), window, Fleet{1, 0, 1}).desired, 1);  // idle from now
  fill_constant(window, 101, 120, 0);
  EXPECT_EQ(policy->decide(sec(120), window, Fleet{1, 0, 1}).desired, 1);
  fill_constant(window, 121, 130, 0);
  EXPECT_EQ(policy->decide(sec(130), window, Fleet{1, 0, 1}).desired, 0);  // 30 s of grace
}

// ---- Ray Serve -------------------------------------------------------------------------------

// Decides every control loop (0.1 s) from `from` up to `to` (ms), on `fleet` (its desired count
// following the decisions); returns the time of the first decision other than `fleet.desired`
// and that count, or {-1, desired} when none.
std::pair<int64_t, int64_t> run_loops(Policy& policy, const SampleWindow& window, int64_t from,
                                      int64_t to, Fleet fleet) {
  for (int64_t t = from; t < to; t += policy.period().count()) {
    const int64_t desired = policy.decide(Millis(t), window, fleet).desired;
    if (desired != fleet.desired) {
      return {t, desired};
    }
  }
  return {-1, fleet.desired};
}

TEST(RayPolicyTest, ItsDefaultsNeverScale) {
  // AutoscalingConfig's min_replicas = max_replicas = 1.
  auto policy = make_ray_policy(RayOptions{});
  EXPECT_EQ(policy->period(), Millis(100));
  SampleWindow window;
  fill_constant(window, 1, 200, 50);
  EXPECT_EQ(run_loops(*policy, window, 30'000, 120'000, Fleet{1, 0, 1}).first, -1);
}

TEST(RayPolicyTest, ScalesUpOnceThirtySecondsOfControlLoopsWantedIt) {
  // upscale_delay_s 30: the decision counter must pass 30 / 0.1 = 300 loops.
  auto policy = make_ray_policy(ray_auto_options());
  SampleWindow window;
  fill_constant(window, 1, 200, 20);  // 20 requests / 2 per replica = 10
  const auto [at, desired] = run_loops(*policy, window, 30'000, 120'000, Fleet{1, 0, 1});
  EXPECT_EQ(at, 30'000 + 300 * 100);
  EXPECT_EQ(desired, 10);
}

TEST(RayPolicyTest, AChangeOfDirectionStartsTheCountAgain) {
  auto policy = make_ray_policy(ray_auto_options());
  SampleWindow up;
  fill_constant(up, 1, 200, 20);
  SampleWindow same;
  fill_constant(same, 1, 200, 2);  // wants exactly the 1 there is
  EXPECT_EQ(run_loops(*policy, up, 30'000, 50'000, Fleet{1, 0, 1}).first, -1);
  EXPECT_EQ(run_loops(*policy, same, 50'000, 50'100, Fleet{1, 0, 1}).first, -1);  // reset
  // 20 s counted before the reset do not count: another full 30 s.
  EXPECT_EQ(run_loops(*policy, up, 50'100, 120'000, Fleet{1, 0, 1}).first, 50'100 + 300 * 100);
}

TEST(RayPolicyTest, ScalesDownAfterTenMinutesAndToZeroOnlyFromOne) {
  RayOptions options = ray_auto_options();
  options.range = {0, 100, true};
  options.downscale_to_zero_delay = Millis(60'000);
  auto policy = make_ray_policy(options);
  SampleWindow idle;
  fill_constant(idle, 1, 900, 0);
  // downscale_delay_s 600 from 10; a scale-down other than 1 -> 0 stops at 1.
  auto [at, desired] = run_loops(*policy, idle, 30'000, 900'000, Fleet{10, 0, 10});
  EXPECT_EQ(at, 30'000 + 6'000 * 100);
  EXPECT_EQ(desired, 1);
  // Then 1 -> 0 after downscale_to_zero_delay_s.
  std::tie(at, desired) = run_loops(*policy, idle, 700'000, 900'000, Fleet{1, 0, 1});
  EXPECT_EQ(at, 700'000 + 600 * 100);
  EXPECT_EQ(desired, 0);
}

TEST(RayPolicyTest, NoRunningReplicaAndRequestsWaitingScalesAtOnce) {
  RayOptions options = ray_auto_options();
  options.range = {0, 100, true};
  auto policy = make_ray_policy(options);
  SampleWindow window;
  fill_constant(window, 1, 40, 3);
  const Decision decision = policy->decide(sec(40), window, Fleet{0, 0, 0});
  EXPECT_EQ(decision.desired, 1) << decision.reason;  // the cold start path: no delay
  EXPECT_NE(decision.reason.find("cold start"), std::string::npos);
}

TEST(RayPolicyTest, TheUpscalingFactorTakesPartOfTheStep) {
  RayOptions options = ray_auto_options();
  options.upscale_delay = Millis(0);
  options.upscaling_factor = 0.5;
  auto policy = make_ray_policy(options);
  SampleWindow window;
  fill_constant(window, 1, 40, 40);  // 20 wanted on 4 running: 4 + 0.5 x 16 = 12
  EXPECT_EQ(policy->decide(sec(40), window, Fleet{4, 0, 4}).desired, 12);
  // A scale-down the factor would leave stuck at the running count still takes one.
  options.downscale_delay = Millis(0);
  options.downscaling_factor = 0.1;
  policy = make_ray_policy(options);
  SampleWindow lower;
  fill_constant(lower, 1, 40, 14);  // 7 wanted on 8: 8 - 0.1 rounds up to 8, so 7
  EXPECT_EQ(policy->decide(sec(40), lower, Fleet{8, 0, 8}).desired, 7);
}

TEST(StaticPolicyTest, AlwaysTheSameCount) {
  auto policy = make_static_policy(12);
  SampleWindow window;
  fill_constant(window, 1, 10, 500);
  EXPECT_EQ(policy->decide(sec(10), window, Fleet{1, 0, 1}).desired, 12);
}

}  // namespace
}  // namespace flotilla::autoscaler

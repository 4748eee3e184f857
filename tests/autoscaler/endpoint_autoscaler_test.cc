#include <gtest/gtest.h>

#include "autoscaler/autoscaler.h"
#include "fakes/autoscaler/load_samples.h"

namespace flotilla::autoscaler {
namespace {

ReplicaRange fixed_range(int64_t min, int64_t max) {
  return ReplicaRange{min, max, min == 0};
}

VerticalOptions vertical(double target = 16) {
  VerticalOptions options;
  options.period = Millis(30'000);
  options.initial_target = target;
  options.min_target = 1;
  options.max_target = 64;
  return options;
}

using sample_builders::full_cycles;
using sample_builders::light_usage;
using sample_builders::steady;

TEST(EndpointAutoscalerTest, DecidesOnlyWhenAPeriodIsDue) {
  EndpointAutoscaler scaler(
      full_cycles(), vertical(), [](double) { return fixed_range(1, 100); }, 1, Millis(1'000));
  EXPECT_EQ(scaler.next_horizontal(), Millis(6'000));
  EXPECT_EQ(scaler.next_vertical(), Millis(31'000));
  scaler.add_samples(steady(1'000, 4, 40), 1);
  EXPECT_TRUE(scaler.tick(Millis(5'999), 1, 0, 0, light_usage).empty());
  EXPECT_EQ(scaler.replicas(), 1);
  EXPECT_FALSE(scaler.tick(Millis(6'000), 1, 0, 0, light_usage).empty());
  EXPECT_EQ(scaler.replicas(), 3);  // ceil(40 / 16)
  EXPECT_EQ(scaler.next_horizontal(), Millis(11'000));
}

// With the fast path on, the loop decides every second: a second that asks for more than the
// ready replicas hold scales up before the next full cycle.
TEST(EndpointAutoscalerTest, FastPathDecidesEverySecond) {
  ApaOptions options = full_cycles();
  options.fast_period = Millis(1'000);
  EndpointAutoscaler scaler(
      options, vertical(), [](double) { return fixed_range(1, 100); }, 1, Millis(1'000));
  EXPECT_EQ(scaler.next_horizontal(), Millis(2'000));
  scaler.add_samples(steady(0, 2, 4), 1);
  EXPECT_TRUE(scaler.tick(Millis(2'000), 1, 0, 0, light_usage).empty());  // 4 of 16: enough
  scaler.add_samples(steady(2'000, 1, 40), 1);
  EXPECT_FALSE(scaler.tick(Millis(3'000), 1, 0, 0, light_usage).empty());
  EXPECT_EQ(scaler.replicas(), 3);  // ceil(40 / 16), two seconds before the full cycle
  EXPECT_EQ(scaler.next_horizontal(), Millis(4'000));
}

TEST(EndpointAutoscalerTest, ScalesDownOnlyAfterTheDownWindow) {
  EndpointAutoscaler scaler(
      full_cycles(), vertical(), [](double) { return fixed_range(1, 100); }, 4, Millis(0));
  scaler.add_samples(steady(0, 55, 1), 4);
  for (int64_t t = 5'000; t <= 55'000; t += 5'000) {
    scaler.tick(Millis(t), 4, 0, 0, light_usage);
    EXPECT_EQ(scaler.replicas(), 4) << t;  // the down window (60 s) is not covered yet
  }
  scaler.add_samples(steady(55'000, 6, 1), 4);
  scaler.tick(Millis(61'000), 4, 0, 0, light_usage);
  EXPECT_EQ(scaler.replicas(), 3);  // at most -25% per cycle
}

// The spare after a failure follows the replicas' measured start: none for a warm-pool start.
TEST(EndpointAutoscalerTest, KeepsASpareAfterAFailureOnlyWhereStartsAreSlow) {
  for (const int64_t start_ms : {25, 5'000}) {
    ApaOptions no_hedge = full_cycles();
    no_hedge.start_hedge = 0;  // the decided count alone
    EndpointAutoscaler scaler(
        no_hedge, vertical(), [](double) { return fixed_range(1, 100); }, 2, Millis(0));
    scaler.observe_start(Millis(start_ms));
    scaler.add_samples(steady(0, 10, 32), 2);
    scaler.tick(Millis(5'000), 2, 0, 0, light_usage);
    EXPECT_EQ(scaler.replicas(), 2);
    scaler.tick(Millis(10'000), 2, 0, 1, light_usage);  // a replica failed since
    EXPECT_EQ(scaler.replicas(), start_ms > 1'000 ? 3 : 2) << start_ms;
  }
}

// Where starts are known to be slow, as many more start beside the replicas not yet ready
// (within the range's maximum); once enough are ready the count is the decided one again. Not
// for fast or untimed starts.
TEST(EndpointAutoscalerTest, HedgesStartsOnlyWhereTheyAreKnownToBeSlow) {
  for (const int64_t start_ms : {-1, 25, 5'000}) {
    EndpointAutoscaler scaler(
        full_cycles(), vertical(), [](double) { return fixed_range(1, 9); }, 2, Millis(0));
    if (start_ms >= 0) {
      scaler.observe_start(Millis(start_ms));
    }
    scaler.add_samples(steady(0, 5, 96), 2);  // 96 in flight over a target of 16: 6 replicas
    const auto changes = scaler.tick(Millis(5'000), 2, 0, 0, light_usage);
    if (start_ms < 5'000) {
      EXPECT_EQ(scaler.replicas(), 6) << start_ms;
      continue;
    }
    // 6 asked for, 2 ready: 4 more beside them, but 9 at most.
    EXPECT_EQ(scaler.replicas(), 9);
    ASSERT_EQ(changes.size(), 2u);
    EXPECT_NE(changes[1].find("hedged starts: 9 replicas: 3 more"), std::string::npos)
        << changes[1];
    scaler.add_samples(steady(5'000, 1, 96), 5);
    scaler.tick(Millis(6'000), 5, 4, 0, light_usage);  // one short: one more beside it
    EXPECT_EQ(scaler.replicas(), 7);
    scaler.add_samples(steady(6'000, 1, 96), 6);
    scaler.tick(Millis(7'000), 6, 1, 0, light_usage);  // all 6 ready: the hedge is cancelled
    EXPECT_EQ(scaler.replicas(), 6);
  }
}

TEST(EndpointAutoscalerTest, ScalesToZeroWhenTheRangeAllowsAndNotWhileStarting) {
  EndpointAutoscaler scaler(
      full_cycles(), vertical(), [](double) { return fixed_range(0, 10); }, 1, Millis(0));
  scaler.add_samples(steady(0, 61, 0), 1);
  scaler.tick(Millis(61'000), 1, 0, 0, light_usage);
  EXPECT_EQ(scaler.replicas(), 0);
  EXPECT_TRUE(scaler.request_capacity());
  EXPECT_FALSE(scaler.request_capacity());
  scaler.add_samples(steady(61'000, 5, 0), 0);
  scaler.tick(Millis(66'000), 0, 1, 0, light_usage);  // idle seconds, the replica still starting
  EXPECT_EQ(scaler.replicas(), 1);
}

TEST(EndpointAutoscalerTest, VerticalMovesTheTargetAndTheRangeFollows) {
  // The range in replicas is a concurrency range over the target.
  EndpointAutoscaler scaler(
      full_cycles(), vertical(),
      [](double target) { return fixed_range(1, static_cast<int64_t>(64 / target)); }, 2,
      Millis(0));
  int reads = 0;
  const auto usage = [&] {
    ++reads;
    return light_usage();
  };
  scaler.add_samples(steady(0, 29, 20, 10), 2);  // baseline: 10 ms
  scaler.tick(Millis(29'000), 2, 0, 0, usage);
  EXPECT_EQ(reads, 0);  // not due
  scaler.add_samples(steady(29'000, 1, 20, 10), 2);
  scaler.tick(Millis(30'000), 2, 0, 0, usage);
  EXPECT_EQ(reads, 1);
  EXPECT_EQ(scaler.baseline_ms(), 10);
  scaler.add_samples(steady(30'000, 30, 32, 25), 2);  // 2.5x the baseline, loaded
  const auto changes = scaler.tick(Millis(60'000), 2, 0, 0, usage);
  ASSERT_FALSE(changes.empty());
  EXPECT_NE(changes[0].find("vertical: target 16.00 -> 12.00"), std::string::npos) << changes[0];
  EXPECT_EQ(scaler.target(), 12);
  // 32 in flight over the new target: 3 replicas, and the range is 64 / 12 = 5 now.
  EXPECT_EQ(scaler.replicas(), 3);
}

TEST(EndpointAutoscalerTest, PeakPerReplicaIsOfTheReplicasReadyInThatSecond) {
  // 20 in flight on 2 replicas (10 each) is the busiest second, not 20 over the 4 ready later.
  EndpointAutoscaler scaler(
      full_cycles(), vertical(16), [](double) { return fixed_range(1, 100); }, 2, Millis(0));
  scaler.add_samples(steady(0, 30, 6, 10), 2);
  scaler.tick(Millis(30'000), 2, 0, 0, light_usage);  // baseline 10 ms
  scaler.add_samples(steady(30'000, 10, 20, 25), 2);
  scaler.add_samples(steady(40'000, 20, 8, 25), 4);
  // Loaded (the busiest second filled replicas to 10 >= 8) and slow: lowered. Over the 4
  // ready at the end it would read 5 in flight each: not loaded, nothing learned.
  const auto changes = scaler.tick(Millis(60'000), 4, 0, 0, light_usage);
  ASSERT_FALSE(changes.empty());
  EXPECT_EQ(scaler.target(), 12);
}

TEST(EndpointAutoscalerTest, NoVerticalDecisionWithoutCompletionsOrAQueueReading) {
  EndpointAutoscaler scaler(
      full_cycles(), vertical(), [](double) { return fixed_range(1, 100); }, 2, Millis(0));
  scaler.add_samples(steady(0, 30, 32, 66), 2);
  const auto unknown = [] {
    return ReplicaUsage{.cpu_utilization = 0.1, .queued = std::nullopt};
  };
  EXPECT_TRUE(scaler.tick(Millis(30'000), 2, 0, 0, unknown).empty());
  EXPECT_FALSE(scaler.baseline_ms().has_value());
}

}  // namespace
}  // namespace flotilla::autoscaler

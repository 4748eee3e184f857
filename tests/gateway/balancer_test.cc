#include <array>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "fakes/common/scripted_random.h"
#include "gateway/gateway_policy.h"

namespace flotilla::gateway {
namespace {

using flotilla::testing::ScriptedRandom;

std::vector<Candidate> loads(std::initializer_list<int64_t> in_flight, int64_t cap = 0) {
  std::vector<Candidate> out;
  for (int64_t load : in_flight) {
    out.push_back({true, load, cap, {}});
  }
  return out;
}

TEST(PowerOfTwoBalancerTest, PicksLessLoadedOfTwo) {
  struct Case {
    std::vector<int64_t> in_flight;
    uint64_t first, second;
    size_t expected;
  };
  const Case cases[] = {
      {{5, 1, 9}, 0, 1, 1},  // second draw less loaded
      {{5, 1, 9}, 1, 2, 1},  // first draw less loaded
      {{3, 3, 3}, 2, 0, 2},  // tie: the first draw
      {{0, 7}, 1, 0, 0},
  };
  for (const Case& c : cases) {
    auto balancer = make_balancer(BalancerKind::kPowerOfTwo);
    std::vector<Candidate> candidates;
    for (int64_t load : c.in_flight) {
      candidates.push_back({true, load, 0, {}});
    }
    ScriptedRandom random{c.first, c.second};
    EXPECT_EQ(balancer->pick(candidates, random, 0), c.expected);
    EXPECT_EQ(random.remaining(), 0u);
  }
}

TEST(PowerOfTwoBalancerTest, SkipsReplicasThatAreNotReadyOrAtCap) {
  auto balancer = make_balancer(BalancerKind::kPowerOfTwo);
  std::vector<Candidate> candidates = {
      {false, 0, 4, {}}, {true, 4, 4, {}}, {true, 3, 4, {}}, {true, 2, 4, {}}};
  SeededRandom random(1);
  for (int i = 0; i < 200; ++i) {
    auto pick = balancer->pick(candidates, random, 0);
    ASSERT_TRUE(pick.has_value());
    EXPECT_TRUE(*pick == 2 || *pick == 3);
  }
}

TEST(PowerOfTwoBalancerTest, ReturnsTheOnlyEligibleOrNothing) {
  auto balancer = make_balancer(BalancerKind::kPowerOfTwo);
  SeededRandom random(2);
  std::vector<Candidate> one = {{true, 9, 9, {}}, {true, 1, 2, {}}, {false, 0, 0, {}}};
  EXPECT_EQ(balancer->pick(one, random, 0), 1u);
  std::vector<Candidate> none = {{true, 9, 9, {}}, {false, 0, 0, {}}};
  EXPECT_EQ(balancer->pick(none, random, 0), std::nullopt);
  EXPECT_EQ(balancer->pick(std::span<const Candidate>(), random, 0), std::nullopt);
}

TEST(PowerOfTwoBalancerTest, NeverSendsToTheMostLoadedOfMany) {
  // With distinct loads, the most loaded replica loses every comparison.
  auto balancer = make_balancer(BalancerKind::kPowerOfTwo);
  auto candidates = loads({1, 2, 3, 4, 5, 6, 7, 50});
  SeededRandom random(3);
  std::array<int, 8> picks{};
  for (int i = 0; i < 10000; ++i) {
    ++picks[*balancer->pick(candidates, random, 0)];
  }
  EXPECT_EQ(picks[7], 0);
  // The least loaded wins whenever it is drawn: 2 of 8 slots, 7/28 + 7/28 of ordered pairs.
  EXPECT_GT(picks[0], picks[6]);
  EXPECT_NEAR(picks[0] / 10000.0, 0.25, 0.03);
}

// A candidate with `in_flight` requests whose last response, at time 0, took `seconds`.
Candidate answered(int64_t in_flight, double seconds) {
  return {true, in_flight, 0, PeakEwma{}.observe(seconds, 0)};
}

TEST(PowerOfTwoBalancerTest, WeighsInFlightByResponseTime) {
  // Idle but 10 ms against 2 in flight at 2 ms: (0+1) x 10 > (2+1) x 2.
  const std::vector<Candidate> candidates = {answered(0, 0.010), answered(2, 0.002)};
  ScriptedRandom random{0, 1};
  EXPECT_EQ(make_balancer(BalancerKind::kPowerOfTwo)->pick(candidates, random, 5), 1u);
  // Counting in flight alone, the idle slow one.
  ScriptedRandom again{0, 1};
  EXPECT_EQ(make_balancer(BalancerKind::kPowerOfTwoInFlight)->pick(candidates, again, 5), 0u);
}

TEST(PowerOfTwoBalancerTest, ComparesInFlightWhereEitherHasNotAnswered) {
  // The new replica (no response yet) is neither flooded nor starved: in flight decides.
  const std::vector<Candidate> candidates = {answered(1, 0.001), {true, 2, 0, {}}};
  ScriptedRandom random{1, 0};
  EXPECT_EQ(make_balancer(BalancerKind::kPowerOfTwo)->pick(candidates, random, 5), 0u);
  const std::vector<Candidate> idle_new = {answered(1, 0.001), {true, 0, 0, {}}};
  ScriptedRandom again{0, 1};
  EXPECT_EQ(make_balancer(BalancerKind::kPowerOfTwo)->pick(idle_new, again, 5), 1u);
}

TEST(PowerOfTwoBalancerTest, AvoidsASlowReplicaUntilItsEstimateDecays) {
  // 3 replicas at 2 ms and one at 10 ms, all idle: the slow one loses every comparison.
  auto balancer = make_balancer(BalancerKind::kPowerOfTwo);
  std::vector<Candidate> candidates = {answered(0, 0.002), answered(0, 0.002), answered(0, 0.002),
                                       answered(0, 0.010)};
  SeededRandom random(7);
  std::array<int, 4> picks{};
  for (int i = 0; i < 1000; ++i) {
    ++picks[*balancer->pick(candidates, random, 10)];
  }
  EXPECT_EQ(picks[3], 0);
  // A minute without a response later (the fast ones answered just now), its estimate is down
  // to 10 ms x e^-6 = 25 µs: it is tried again.
  for (int i = 0; i < 3; ++i) {
    candidates[i].latency = candidates[i].latency.observe(0.002, 60'000);
  }
  ScriptedRandom later{3, 0};
  EXPECT_EQ(balancer->pick(candidates, later, 60'000), 3u);
}

TEST(PeakEwmaTest, PeaksAtOnceAndDecaysWithTime) {
  const PeakEwma none;
  EXPECT_EQ(none.at_time(1000), 0);
  const PeakEwma first = none.observe(0.004, 1000);
  EXPECT_FLOAT_EQ(first.at_time(1000), 0.004);
  // Slower: replaces the estimate, however recent it is.
  EXPECT_FLOAT_EQ(first.observe(0.050, 1000).at_time(1000), 0.050);
  // Faster: weighted by the time since the last response over the 10 s decay time.
  EXPECT_FLOAT_EQ(first.observe(0.001, 1000).at_time(1000), 0.004);
  EXPECT_NEAR(first.observe(0.001, 11'000).at_time(11'000),
              0.004 * std::exp(-1.0) + 0.001 * (1 - std::exp(-1.0)), 1e-9);
  // Read later, it decays toward zero.
  EXPECT_NEAR(first.at_time(21'000), 0.004 * std::exp(-2.0), 1e-9);
  // A zero sample still counts as a response.
  EXPECT_GT(none.observe(0, 5).at_time(5), 0);
}

TEST(PeakEwmaTest, ToleratesAWrappingClockAndAnEarlierReader) {
  const PeakEwma late = PeakEwma{}.observe(0.010, 0xFFFF'FF00u);
  // 0x100 is 512 ms after 0xFFFFFF00, modulo 2^32.
  EXPECT_NEAR(late.at_time(0x100), 0.010 * std::exp(-0.512 / PeakEwma::kDecaySeconds), 1e-9);
  // A reader whose clock is behind the last update's sees no decay, not a huge one.
  EXPECT_FLOAT_EQ(late.at_time(0xFFFF'FE00u), 0.010);
}

TEST(RoundRobinBalancerTest, CyclesOverEligibleReplicas) {
  auto balancer = make_balancer(BalancerKind::kRoundRobin);
  std::vector<Candidate> candidates = {
      {true, 0, 0, {}}, {false, 0, 0, {}}, {true, 5, 5, {}}, {true, 0, 0, {}}};
  SeededRandom random(4);
  std::vector<size_t> order;
  for (int i = 0; i < 4; ++i) {
    order.push_back(*balancer->pick(candidates, random, 0));
  }
  EXPECT_EQ(order, (std::vector<size_t>{0, 3, 0, 3}));
}

TEST(LeastRequestBalancerTest, PicksTheMinimumEligible) {
  auto balancer = make_balancer(BalancerKind::kLeastRequest);
  std::vector<Candidate> candidates = {
      {true, 4, 0, {}}, {false, 0, 0, {}}, {true, 2, 2, {}}, {true, 3, 0, {}}};
  SeededRandom random(5);
  EXPECT_EQ(balancer->pick(candidates, random, 0), 3u);  // index 2 is at its cap
}

TEST(BalancerKindTest, ParsesNames) {
  EXPECT_EQ(parse_balancer_kind("p2c").value(), BalancerKind::kPowerOfTwo);
  EXPECT_EQ(parse_balancer_kind("p2c_in_flight").value(), BalancerKind::kPowerOfTwoInFlight);
  EXPECT_EQ(parse_balancer_kind("round_robin").value(), BalancerKind::kRoundRobin);
  EXPECT_EQ(parse_balancer_kind("least_request").value(), BalancerKind::kLeastRequest);
  EXPECT_FALSE(parse_balancer_kind("random").is_ok());
}

TEST(PickByWeightTest, FollowsTrafficWeights) {
  const std::vector<int64_t> weights = {90, 0, 10};
  SeededRandom random(6);
  std::array<int, 3> picks{};
  for (int i = 0; i < 20000; ++i) {
    ++picks[*pick_by_weight(weights, random)];
  }
  EXPECT_EQ(picks[1], 0);
  EXPECT_NEAR(picks[0] / 20000.0, 0.9, 0.01);
}

TEST(PickByWeightTest, MapsDrawsToCumulativeRanges) {
  const std::vector<int64_t> weights = {3, -1, 2};
  ScriptedRandom random{0, 2, 3, 4};
  EXPECT_EQ(pick_by_weight(weights, random), 0u);
  EXPECT_EQ(pick_by_weight(weights, random), 0u);
  EXPECT_EQ(pick_by_weight(weights, random), 2u);
  EXPECT_EQ(pick_by_weight(weights, random), 2u);
  SeededRandom seeded(7);
  EXPECT_EQ(pick_by_weight(std::vector<int64_t>{0, -5}, seeded), std::nullopt);
}

TEST(SeededRandomTest, UniformStaysInRangeAndRepeatsPerSeed) {
  SeededRandom a(42), b(42);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t value = a.uniform(7);
    EXPECT_LT(value, 7u);
    EXPECT_EQ(value, b.uniform(7));
  }
}

}  // namespace
}  // namespace flotilla::gateway

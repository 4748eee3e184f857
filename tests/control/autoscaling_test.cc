#include <gtest/gtest.h>

#include "control/control_scaling.h"
#include "fakes/autoscaler/load_samples.h"

namespace flotilla::control {
namespace {

using autoscaler::Millis;

ServedModelSpec served(int64_t min_concurrency, int64_t max_concurrency, int64_t traffic = 100) {
  ServedModelSpec spec;
  spec.name = "v" + std::to_string(traffic);
  spec.model = "/m/model.json";
  spec.runtime = "xgboost";  // initial target 16
  spec.concurrency = {min_concurrency, max_concurrency};
  spec.traffic = traffic;
  return spec;
}

EndpointSpec endpoint(std::vector<ServedModelSpec> versions) {
  return EndpointSpec{"fraud", std::move(versions), {}, {}};
}

AutoscalingOptions fast_options() {
  AutoscalingOptions options;
  options.horizontal_period = Millis(5'000);
  options.up_window = Millis(20'000);
  options.down_window = Millis(60'000);
  options.vertical_period = Millis(30'000);
  return options;
}

using sample_builders::light_usage;
using sample_builders::steady;

// The forecast's history comes back from the store (restore_demand) and the spec turns the floor
// on and off without losing it. A "day" of 1,440 s: buckets of a second.
TEST(EndpointScalerTest, TheForecastRestoresItsHistoryAndFollowsTheSpec) {
  AutoscalingOptions options = fast_options();
  options.forecast_day = Millis(1'440'000);
  EndpointSpec spec = endpoint({served(1, 256)});
  spec.autoscaling.forecast = false;
  const Millis day2(2 * 1'440'000);
  EndpointScaler scaler(spec, options, 1, day2);
  // Two past days with 48 in flight from 100 s to 110 s into the day.
  std::vector<std::pair<Millis, double>> history;
  for (int64_t day = 0; day < 2; ++day) {
    for (int64_t second = 0; second < 1'440; ++second) {
      history.emplace_back(Millis(day * 1'440'000 + second * 1'000),
                           second >= 100 && second < 110 ? 48 : 2);
    }
  }
  scaler.restore_demand(history);
  EXPECT_TRUE(scaler.take_closed_demand().empty());  // already stored
  EXPECT_EQ(scaler.demand_kept_from(day2), day2 - Millis(50 * 1'440'000 + 10'000 + 1'000));
  scaler.add_samples(steady(day2.count() + 90'000, 5, 2), 1);
  scaler.tick(day2 + Millis(95'000), 1, 0, 0, light_usage);
  EXPECT_EQ(scaler.scale().replicas, 1);  // off: 2 in flight asks for one
  spec.autoscaling.forecast = true;
  scaler.update_spec(spec);
  const auto changes = scaler.tick(day2 + Millis(100'000), 1, 0, 0, light_usage);
  EXPECT_EQ(scaler.scale().replicas, 3);  // ceil(48 / 16), before the peak
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_NE(changes[0].find("forecast:"), std::string::npos) << changes[0];
}

TEST(ReplicaRangeTest, SumsServedModelsOverTheTarget) {
  const auto range = replica_range(endpoint({served(40, 200, 50), served(8, 56, 50)}), 16);
  EXPECT_EQ(range.min, 3);   // 48 / 16
  EXPECT_EQ(range.max, 16);  // 256 / 16
  EXPECT_FALSE(range.scale_to_zero);
}

TEST(ReplicaRangeTest, ZeroOnlyWhenEveryServedModelMayScaleToZero) {
  ServedModelSpec a = served(0, 64);
  a.scale_to_zero = true;
  EXPECT_EQ(replica_range(endpoint({a}), 16).min, 0);
  EXPECT_EQ(replica_range(endpoint({served(0, 64)}), 16).min, 1);
}

TEST(VersionReplicasTest, SplitsByTrafficWithEachVersionsMinimum) {
  const Scale scale{10, 16};
  EXPECT_EQ(version_replicas(served(1, 64, 70), scale), 7);
  EXPECT_EQ(version_replicas(served(1, 64, 30), scale), 3);
  EXPECT_EQ(version_replicas(served(64, 64, 30), scale), 4);  // its own minimum: 64 / 16
  EXPECT_EQ(version_replicas(served(1, 64, 0), scale), 1);    // no traffic: the minimum
  EXPECT_EQ(version_replicas(served(40, 64), std::nullopt), provisioned_replicas(served(40, 64)));
  EXPECT_EQ(replica_cap(served(1, 64), Scale{1, 6.4}), 6);
}

TEST(ReplicasMatchingTest, ReproducesTheRunningSplitWithoutGrowingIt) {
  const EndpointSpec split = endpoint({served(1, 64, 30), served(1, 64, 70)});
  EXPECT_EQ(replicas_matching(split, {1, 1}), 1);  // both at their own minimum
  const int64_t ten = replicas_matching(split, {3, 7});
  EXPECT_EQ(version_replicas(split.served_models[0], Scale{ten, 16}), 3);
  EXPECT_EQ(version_replicas(split.served_models[1], Scale{ten, 16}), 7);
  // A version that lost its replicas does not pull the other one down.
  const EndpointSpec mostly_a = endpoint({served(1, 640, 90), served(1, 640, 10)});
  const int64_t nine = replicas_matching(mostly_a, {9, 0});
  EXPECT_EQ(version_replicas(mostly_a.served_models[0], Scale{nine, 16}), 9);
  EXPECT_EQ(replicas_matching(endpoint({served(1, 64, 100)}), {4}), 4);
  EXPECT_EQ(replicas_matching(endpoint({served(1, 64, 100)}), {0}), 0);
}

TEST(UsageFromChangesTest, RatesOverTheReplicasReadTwiceAndAQueueUnknownUntilThen) {
  const auto t0 = std::chrono::steady_clock::time_point{} + std::chrono::seconds(100);
  const auto t1 = t0 + std::chrono::seconds(2);
  // Two cores, 2 CPU seconds in 2 s: half of them; 3 s of waiting in 2 s: 1.5 queued.
  const UsageChange busy{UsageCounters{10, 4.0, 2, t0}, UsageCounters{12, 7.0, 2, t1}};
  // One core, fully used; its queue counter went back (a restarted process): counted as 0.
  const UsageChange restarted{UsageCounters{5, 9.0, 1, t0}, UsageCounters{7, 1.0, 1, t1}};
  ReplicaUsage usage = usage_from_changes({busy, restarted});
  EXPECT_DOUBLE_EQ(usage.cpu_utilization, 0.75);
  ASSERT_TRUE(usage.queued.has_value());
  EXPECT_DOUBLE_EQ(*usage.queued, 0.75);

  // Read once only: no rate yet; its queue is unknown rather than empty.
  const UsageChange first{std::nullopt, UsageCounters{3, 1.0, 1, t1}};
  usage = usage_from_changes({first});
  EXPECT_DOUBLE_EQ(usage.cpu_utilization, 0);
  EXPECT_FALSE(usage.queued.has_value());
  // A replica that reports no queue at all (an external server) counts as none queued.
  usage = usage_from_changes(
      {{UsageCounters{1, std::nullopt, 1, t0}, UsageCounters{1.5, std::nullopt, 1, t1}}});
  EXPECT_DOUBLE_EQ(usage.cpu_utilization, 0.25);
  ASSERT_TRUE(usage.queued.has_value());
  EXPECT_DOUBLE_EQ(*usage.queued, 0);
  // A CPU counter that went back (a container restarted under the same pod name) gives no
  // rate, rather than a negative one.
  usage = usage_from_changes({busy, {UsageCounters{50, 1.0, 1, t0}, UsageCounters{1, 1.0, 1, t1}}});
  EXPECT_DOUBLE_EQ(usage.cpu_utilization, 0.5);
}

TEST(EndpointScalerTest, AdoptedFleetLargerThanTheDefaultRangeIsKept) {
  EndpointScaler scaler(endpoint({served(1, 256)}), fast_options(), 40, Millis(0));
  EXPECT_EQ(scaler.scale().replicas, 40);  // 256 / 16 = 16 would cut 24 at once
}

TEST(EndpointScalerTest, NoScaleDownWhileNothingIsReady) {
  ServedModelSpec spec = served(0, 64);
  spec.scale_to_zero = true;
  EndpointScaler scaler(endpoint({spec}), fast_options(), 0, Millis(0));
  scaler.add_samples(steady(0, 61, 0), 0);
  ASSERT_TRUE(scaler.request_capacity());
  scaler.tick(Millis(61'000), 0, 1, 0, light_usage);  // the replica is still starting
  EXPECT_EQ(scaler.scale().replicas, 1);
}

// The fast path decides on a sample as soon as it arrives: 40 in flight is more than one
// replica of 16 holds.
TEST(EndpointScalerTest, ScalesUpOnTheBusiestSecondAtTheNextDecision) {
  EndpointScaler scaler(endpoint({served(1, 256)}), fast_options(), 1, Millis(0));
  EXPECT_EQ(scaler.scale(), (Scale{1, 16}));
  EXPECT_TRUE(scaler.tick(Millis(500), 1, 0, 0, light_usage).empty());  // nothing new, not due
  scaler.add_samples(steady(0, 1, 40), 1);
  const auto changes = scaler.tick(Millis(1'020), 1, 0, 0, light_usage);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_NE(changes[0].find("1 -> 3 replicas"), std::string::npos) << changes[0];
  EXPECT_EQ(scaler.scale().replicas, 3);  // ceil(40 / 16)
}

// Hedged starts only where the options turn them on (Kubernetes mode): the same scale-up,
// 1 -> 3 replicas that take 5 s to start, starts 2 more beside the 2 missing only then.
TEST(EndpointScalerTest, HedgesStartsOnlyWhereTheOptionsSay) {
  for (const bool hedge : {false, true}) {
    AutoscalingOptions options = fast_options();
    options.hedge_starts = hedge;
    EndpointScaler scaler(endpoint({served(1, 256)}), options, 1, Millis(0));
    scaler.observe_start(Millis(5'000));
    scaler.add_samples(steady(0, 1, 40), 1);
    scaler.tick(Millis(1'020), 1, 0, 0, light_usage);
    EXPECT_EQ(scaler.scale().replicas, hedge ? 5 : 3) << hedge;
  }
}

TEST(EndpointScalerTest, ScalesDownOnlyAfterTheWholeDownWindowAsksForFewer) {
  EndpointScaler scaler(endpoint({served(1, 256)}), fast_options(), 4, Millis(0));
  EXPECT_EQ(scaler.scale().replicas, 4);  // what runs after a restart stays
  scaler.add_samples(steady(0, 30, 1), 4);
  EXPECT_TRUE(scaler.tick(Millis(30'000), 4, 0, 0, light_usage).empty());  // window not covered
  scaler.add_samples(steady(30'000, 31, 1), 4);
  const auto changes = scaler.tick(Millis(61'000), 4, 0, 0, light_usage);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(scaler.scale().replicas, 3);  // at most -25% per cycle
}

TEST(EndpointScalerTest, StaysWithinTheSpecRange) {
  EndpointScaler scaler(endpoint({served(1, 32)}), fast_options(), 1, Millis(0));
  scaler.add_samples(steady(0, 5, 500), 1);
  scaler.tick(Millis(5'000), 1, 0, 0, light_usage);
  EXPECT_EQ(scaler.scale().replicas, 2);  // 32 / 16
  scaler.update_spec(endpoint({served(1, 16)}));
  EXPECT_EQ(scaler.scale().replicas, 1);
}

TEST(EndpointScalerTest, ScaleFromZeroAsksForOneReplicaAtOnce) {
  ServedModelSpec spec = served(0, 64);
  spec.scale_to_zero = true;
  EndpointScaler scaler(endpoint({spec}), fast_options(), 0, Millis(0));
  EXPECT_EQ(scaler.scale().replicas, 0);
  EXPECT_TRUE(scaler.request_capacity());
  EXPECT_EQ(scaler.scale().replicas, 1);
  EXPECT_FALSE(scaler.request_capacity());  // already has one
}

TEST(EndpointScalerTest, VerticalLowersTheTargetOnOverloadAndTheCapFollows) {
  EndpointScaler scaler(endpoint({served(1, 256)}), fast_options(), 2, Millis(0));
  scaler.add_samples(steady(0, 30, 20, 10), 2);  // baseline: 10 ms
  scaler.tick(Millis(30'000), 2, 0, 0, light_usage);
  EXPECT_EQ(scaler.scale().target, 16);
  scaler.add_samples(steady(30'000, 30, 32, 25), 2);  // 2.5x the baseline
  const auto changes = scaler.tick(Millis(60'000), 2, 0, 0, light_usage);
  ASSERT_FALSE(changes.empty());
  EXPECT_NE(changes[0].find("vertical: target 16.00 -> 12.00"), std::string::npos) << changes[0];
  EXPECT_EQ(scaler.scale().target, 12);
}

TEST(EndpointScalerTest, TrafficChangeKeepsTheLearnedBaseline) {
  EndpointScaler scaler(endpoint({served(1, 256, 50), served(1, 256, 50)}), fast_options(), 2,
                        Millis(0));
  scaler.add_samples(steady(0, 30, 20, 10), 2);  // baseline: 10 ms
  scaler.tick(Millis(30'000), 2, 0, 0, light_usage);
  scaler.update_spec(endpoint({served(1, 256, 50), served(1, 200, 50)}));  // concurrency only
  scaler.add_samples(steady(30'000, 30, 32, 25), 2);  // 2.5x the baseline learned before
  const auto changes = scaler.tick(Millis(60'000), 2, 0, 0, light_usage);
  ASSERT_FALSE(changes.empty());
  EXPECT_NE(changes[0].find("overload"), std::string::npos) << changes[0];
}

// A restart of the control plane starts from what was learned, for the same models only.
TEST(EndpointScalerTest, StartsFromASavedTargetLearnedForTheSameModels) {
  EndpointScaler learning(endpoint({served(1, 256)}), fast_options(), 2, Millis(0));
  learning.add_samples(steady(0, 30, 20, 10), 2);  // baseline: 10 ms
  learning.tick(Millis(30'000), 2, 0, 0, light_usage);
  learning.add_samples(steady(30'000, 30, 32, 25), 2);
  learning.tick(Millis(60'000), 2, 0, 0, light_usage);  // 16 -> 12
  const LearnedTarget saved = learning.learned();
  EXPECT_EQ(saved.target, 12);
  EXPECT_EQ(saved.baseline_ms, 10);
  const std::optional<LearnedTarget> stored =
      learned_target_from_json(learned_target_to_json(saved));
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(*stored, saved);

  EndpointScaler restarted(endpoint({served(1, 256)}), fast_options(), 2, Millis(0), stored);
  EXPECT_EQ(restarted.scale().target, 12);
  EXPECT_EQ(restarted.learned(), saved);
  // The baseline came along: 25 ms is overload at once, without relearning 10 ms first.
  restarted.add_samples(steady(0, 30, 24, 25), 2);
  const auto changes = restarted.tick(Millis(30'000), 2, 0, 0, light_usage);
  ASSERT_FALSE(changes.empty());
  EXPECT_NE(changes[0].find("target 12.00 -> 9.00"), std::string::npos) << changes[0];

  // Another model (or other per-replica bounds): the runtime's default again.
  ServedModelSpec other = served(1, 256);
  other.model = "/m/other.json";
  EXPECT_EQ(EndpointScaler(endpoint({other}), fast_options(), 2, Millis(0), stored).scale().target,
            16);
  ServedModelSpec bounded = served(1, 256);
  bounded.per_replica_concurrency = ConcurrencyRange{2, 8};
  EXPECT_EQ(
      EndpointScaler(endpoint({bounded}), fast_options(), 2, Millis(0), stored).scale().target, 8);
}

TEST(EndpointScalerTest, UnreadableSavedStateIsRefused) {
  for (const char* text : {"", "[]", "{}", R"({"models": "m"})", R"({"models": 1, "target": 2})",
                           R"({"models": "m", "target": 0})", R"({"models": "m", "target": -3})",
                           R"({"models": "m", "target": 2, "baseline_ms": "x"})",
                           R"({"models": "m", "target": 2, "baseline_ms": 0})", "{"}) {
    EXPECT_FALSE(learned_target_from_json(text).has_value()) << text;
  }
  EXPECT_TRUE(learned_target_from_json(R"({"models": "m", "target": 2})").has_value());
}

TEST(EndpointScalerTest, UsageIsReadOnlyWhenTheVerticalPolicyIsDue) {
  EndpointScaler scaler(endpoint({served(1, 256)}), fast_options(), 1, Millis(0));
  int reads = 0;
  auto usage = [&] {
    ++reads;
    return ReplicaUsage{.cpu_utilization = 0.5, .queued = 0};
  };
  scaler.add_samples(steady(0, 29, 4), 1);
  scaler.tick(Millis(29'000), 1, 0, 0, usage);
  EXPECT_EQ(reads, 0);
  scaler.add_samples(steady(29'000, 1, 4), 1);
  scaler.tick(Millis(30'000), 1, 0, 0, usage);
  EXPECT_EQ(reads, 1);
}

// Requests queued inside the replicas are overload even when latency stays under the
// threshold (a replica with a full batch and one request waiting: latency 1.25x).
TEST(EndpointScalerTest, VerticalLowersTheTargetOnInReplicaQueueing) {
  EndpointScaler scaler(endpoint({served(1, 256)}), fast_options(), 2, Millis(0));
  scaler.add_samples(steady(0, 30, 20, 10), 2);  // baseline: 10 ms
  scaler.tick(Millis(30'000), 2, 0, 0, light_usage);
  scaler.add_samples(steady(30'000, 30, 32, 12.5), 2);
  const auto queued = [] {
    return ReplicaUsage{.cpu_utilization = 0.1, .queued = 1.5};
  };
  const auto changes = scaler.tick(Millis(60'000), 2, 0, 0, queued);
  ASSERT_FALSE(changes.empty());
  EXPECT_NE(changes[0].find("target 16.00 -> 12.00"), std::string::npos) << changes[0];
  EXPECT_NE(changes[0].find("queued 1.5"), std::string::npos) << changes[0];
}

// The first busy cycle after a replica came: its queue is not known yet (one reading), so
// its latency may be queueing and must not become the baseline. Without the wait the target
// would rise (66 ms learned as the baseline is headroom) before the queue showed.
TEST(EndpointScalerTest, VerticalWaitsForAQueueReading) {
  EndpointScaler scaler(endpoint({served(1, 256)}), fast_options(), 2, Millis(0));
  scaler.add_samples(steady(0, 30, 32, 66), 2);
  const auto unknown = [] {
    return ReplicaUsage{.cpu_utilization = 0.1, .queued = std::nullopt};
  };
  EXPECT_TRUE(scaler.tick(Millis(30'000), 2, 0, 0, unknown).empty());
  EXPECT_FALSE(scaler.learned().baseline_ms.has_value());
  scaler.add_samples(steady(30'000, 30, 32, 66), 2);
  const auto queued = [] {
    return ReplicaUsage{.cpu_utilization = 0.1, .queued = 2};
  };
  const auto changes = scaler.tick(Millis(60'000), 2, 0, 0, queued);
  ASSERT_FALSE(changes.empty());
  EXPECT_NE(changes[0].find("target 16.00 -> 12.00: overload"), std::string::npos) << changes[0];
}

}  // namespace
}  // namespace flotilla::control

// The endpoints' 1 s history behind GET .../metrics, the dashboard and `flotilla top`.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "control/control_metrics.h"

namespace flotilla::control {
namespace {

LoadSample second(int64_t unix_ms, uint64_t ok, uint64_t failed, double latency_seconds) {
  LoadSample sample;
  sample.unix_ms = unix_ms;
  sample.concurrency = 2.5;
  sample.queued = 1;
  sample.responses.codes = {{200, ok}};
  if (failed > 0) {
    sample.responses.codes[503] = failed;
  }
  sample.responses.latency = {{ResponseCounts::latency_bucket(latency_seconds), ok + failed}};
  return sample;
}

TEST(MetricsWindowTest, ParsesSecondsMinutesAndHoursUpToAnHour) {
  EXPECT_EQ(parse_metrics_window("1").value(), 1);
  EXPECT_EQ(parse_metrics_window("45s").value(), 45);
  EXPECT_EQ(parse_metrics_window("2m").value(), 120);
  EXPECT_EQ(parse_metrics_window("1h").value(), 3600);
  for (const char* bad : {"", "0", "0s", "3601", "61m", "2h", "h", "-1", "1d", "1.5", " 5", "5 "}) {
    EXPECT_EQ(parse_metrics_window(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(MetricsHistoryTest, KeepsEachSecondOnceAndOnlyTheNewest) {
  MetricsHistory history(/*kept=*/3);
  const ReplicaCounts replicas = {{"v1", {{"ready", 2}}}};
  history.record("fraud", {second(1'000, 1, 0, 0.001), second(2'000, 2, 0, 0.001)}, replicas, 2,
                 8.0);
  // The gateway sends its last seconds again each pass: only newer ones are added.
  history.record("fraud", {second(2'000, 99, 0, 0.001), second(3'000, 3, 0, 0.001)}, replicas, 3,
                 8.0);
  history.record("fraud", {second(4'000, 4, 0, 0.001)}, replicas, 3, 8.0);
  const std::vector<EndpointSecond> all = history.window("fraud", 4'000, 3600);
  ASSERT_EQ(all.size(), 3u);  // the oldest went
  EXPECT_EQ(all[0].load.unix_ms, 2'000);
  EXPECT_EQ(all[0].load.responses.codes.at(200), 2u);
  EXPECT_EQ(all[0].desired_replicas, 2);
  EXPECT_EQ(all[1].desired_replicas, 3);
  // A window counts back from now.
  ASSERT_EQ(history.window("fraud", 4'000, 2).size(), 2u);
  EXPECT_EQ(history.window("fraud", 4'000, 2)[0].load.unix_ms, 3'000);
  EXPECT_TRUE(history.window("fraud", 10'000, 5).empty());
  EXPECT_TRUE(history.window("other", 4'000, 60).empty());
  history.retain({"other"});
  EXPECT_TRUE(history.window("fraud", 4'000, 3600).empty());
}

TEST(MetricsHistoryTest, TheJsonGivesEachSecondAndASummaryOfTheWindow) {
  std::vector<EndpointSecond> seconds;
  seconds.push_back({second(1'000, 98, 0, 0.002), {{"v1", {{"ready", 1}}}}, 1, 4.0});
  seconds.push_back(
      {second(2'000, 0, 2, 0.3), {{"v1", {{"ready", 1}}}, {"v2", {{"starting", 1}}}}, 2, 4.0});
  const nlohmann::json view = metrics_window_to_json("fraud", 60, seconds);
  EXPECT_EQ(view["name"], "fraud");
  EXPECT_EQ(view["window_seconds"], 60);
  ASSERT_EQ(view["samples"].size(), 2u);
  const nlohmann::json& first = view["samples"][0];
  EXPECT_EQ(first["timestamp"], 1'000);
  EXPECT_EQ(first["requests"], 98);
  EXPECT_EQ(first["codes"]["200"], 98);
  EXPECT_NEAR(first["latency_p50_ms"].get<double>(), 2.0, 0.2);
  EXPECT_DOUBLE_EQ(first["in_flight"].get<double>(), 2.5);
  EXPECT_EQ(first["replicas"]["v1"]["ready"], 1);
  EXPECT_EQ(first["desired_replicas"], 1);
  EXPECT_EQ(view["samples"][1]["codes"]["503"], 2);

  const nlohmann::json& summary = view["summary"];
  EXPECT_EQ(summary["seconds"], 2);
  EXPECT_DOUBLE_EQ(summary["requests_per_second"].get<double>(), 50.0);
  EXPECT_EQ(summary["codes"]["200"], 98);
  EXPECT_EQ(summary["codes"]["503"], 2);
  EXPECT_NEAR(summary["latency_p50_ms"].get<double>(), 2.0, 0.2);
  EXPECT_NEAR(summary["latency_p99_ms"].get<double>(), 300.0, 30.0);
  EXPECT_EQ(summary["replicas"]["v2"]["starting"], 1);  // gauges: the newest second's
  EXPECT_EQ(summary["desired_replicas"], 2);

  const nlohmann::json empty = metrics_window_to_json("idle", 60, {});
  EXPECT_EQ(empty["summary"]["seconds"], 0);
  EXPECT_EQ(empty["summary"]["requests_per_second"], 0.0);
  EXPECT_TRUE(empty["samples"].empty());
  EXPECT_FALSE(empty["summary"].contains("desired_replicas"));
}

}  // namespace
}  // namespace flotilla::control

// The fleet's load samples: a gateway's report on the wire, and the controller's per-second sums
// over the gateways that its autoscaler reads.
#include <gtest/gtest.h>

#include "cluster/cluster.h"

namespace flotilla::cluster {
namespace {

LoadSample sample(int64_t unix_ms, double concurrency, uint64_t completions, double latency_ms) {
  LoadSample s;
  s.unix_ms = unix_ms;
  s.concurrency = concurrency;
  s.queued = concurrency / 2;
  s.arrivals = completions;
  s.completions = completions;
  s.rejected = 1;
  s.latency_ms = latency_ms;
  return s;
}

TEST(FleetSamplesTest, SumsTheGatewaysOfEachSecond) {
  FleetSamples fleet(std::chrono::milliseconds(2'000));
  // Two gateways whose seconds end 200 ms apart: both count in the second nearest their end.
  fleet.add("gw-a", "fraud", {sample(10'000, 3, 100, 10), sample(11'000, 1, 10, 5)});
  fleet.add("gw-b", "fraud", {sample(10'200, 5, 300, 30)});
  const std::vector<LoadSample> taken = fleet.take("fraud", 12'500);
  ASSERT_EQ(taken.size(), 1u) << "11 s has not settled at 12.5 s";
  EXPECT_EQ(taken[0].unix_ms, 10'000);
  EXPECT_DOUBLE_EQ(taken[0].concurrency, 8);
  EXPECT_DOUBLE_EQ(taken[0].queued, 4);
  EXPECT_EQ(taken[0].arrivals, 400u);
  EXPECT_EQ(taken[0].completions, 400u);
  EXPECT_EQ(taken[0].rejected, 2u);
  EXPECT_DOUBLE_EQ(taken[0].latency_ms, (100 * 10 + 300 * 30) / 400.0) << "by completions";
  EXPECT_TRUE(fleet.take("fraud", 12'500).empty()) << "a second is taken once";
  EXPECT_TRUE(fleet.take("other", 12'500).empty());
}

TEST(FleetSamplesTest, AResentSecondCountsOnceAndALateOneNotAtAll) {
  FleetSamples fleet(std::chrono::milliseconds(2'000));
  // Each report carries the last seconds again: the latest copy of a second stands.
  fleet.add("gw-a", "fraud", {sample(10'000, 3, 100, 10)});
  fleet.add("gw-a", "fraud", {sample(10'000, 4, 120, 10), sample(11'000, 2, 50, 10)});
  std::vector<LoadSample> taken = fleet.take("fraud", 13'000);
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_DOUBLE_EQ(taken[0].concurrency, 4);
  EXPECT_EQ(taken[0].completions, 120u);
  EXPECT_DOUBLE_EQ(taken[1].concurrency, 2);
  // A gateway whose copy of a taken second arrives late is not added to it after the fact.
  fleet.add("gw-b", "fraud", {sample(11'000, 9, 900, 10), sample(12'000, 1, 5, 10)});
  taken = fleet.take("fraud", 14'000);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].unix_ms, 12'000);
  EXPECT_DOUBLE_EQ(taken[0].concurrency, 1);
}

TEST(FleetSamplesTest, TwoSamplesOfOneGatewayInOneSecondBothCount) {
  FleetSamples fleet(std::chrono::milliseconds(2'000));
  // A gateway's ticks drift: 9.55 s and 10.45 s both round to 10 s. Counts add up, the gauges
  // are the mean of the two; a resend of either changes nothing.
  fleet.add("gw-a", "fraud", {sample(9'550, 2, 100, 10), sample(10'450, 4, 300, 30)});
  fleet.add("gw-a", "fraud", {sample(10'450, 4, 300, 30)});
  fleet.add("gw-b", "fraud", {sample(10'000, 5, 100, 10)});
  const std::vector<LoadSample> taken = fleet.take("fraud", 12'500);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_DOUBLE_EQ(taken[0].concurrency, 3 + 5);
  EXPECT_EQ(taken[0].completions, 500u);
  EXPECT_EQ(taken[0].rejected, 3u);
  EXPECT_DOUBLE_EQ(taken[0].latency_ms, (100 * 10 + 300 * 30 + 100 * 10) / 500.0);
}

TEST(FleetSamplesTest, SecondsFarAheadOfTheClockAreDropped) {
  FleetSamples fleet(std::chrono::milliseconds(0));
  fleet.add("gw-a", "fraud", {sample(10'000, 1, 1, 1), sample(500'000, 9, 9, 9)});
  ASSERT_EQ(fleet.take("fraud", 10'000).size(), 1u);
  EXPECT_TRUE(fleet.take("fraud", 600'000).empty()) << "the future second was kept";
}

TEST(FleetSamplesTest, RetainForgetsDeletedEndpoints) {
  FleetSamples fleet(std::chrono::milliseconds(0));
  fleet.add("gw-a", "fraud", {sample(10'000, 3, 100, 10)});
  fleet.add("gw-a", "gone", {sample(10'000, 3, 100, 10)});
  fleet.retain({"fraud"});
  EXPECT_TRUE(fleet.take("gone", 20'000).empty());
  EXPECT_EQ(fleet.take("fraud", 20'000).size(), 1u);
}

TEST(SampleReportTest, RoundTripsThroughItsJson) {
  SampleReport report;
  report.gateway = "gw-a";
  report.endpoints["fraud"] = {sample(10'000, 2.5, 7, 3.25)};
  report.endpoints["fraud"][0].responses.codes = {{200, 6}, {503, 1}};
  report.endpoints["fraud"][0].responses.latency = {{0, 1}, {40, 6}};
  report.endpoints["idle"] = {};
  report.capacity = {"idle"};
  Result<SampleReport> parsed = parse_sample_report(sample_report_to_json(report));
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
  EXPECT_EQ(parsed->gateway, "gw-a");
  EXPECT_EQ(parsed->capacity, std::vector<std::string>{"idle"});
  ASSERT_EQ(parsed->endpoints.size(), 2u);
  const LoadSample& got = parsed->endpoints["fraud"].at(0);
  EXPECT_EQ(got.unix_ms, 10'000);
  EXPECT_DOUBLE_EQ(got.concurrency, 2.5);
  EXPECT_DOUBLE_EQ(got.queued, 1.25);
  EXPECT_EQ(got.completions, 7u);
  EXPECT_EQ(got.rejected, 1u);
  EXPECT_DOUBLE_EQ(got.latency_ms, 3.25);
  EXPECT_EQ(got.responses, report.endpoints["fraud"][0].responses);
}

TEST(FleetSamplesTest, SumsTheResponsesOfEachSecond) {
  FleetSamples fleet(std::chrono::milliseconds(0));
  LoadSample a = sample(10'000, 1, 3, 1);
  a.responses.codes = {{200, 3}};
  a.responses.latency = {{10, 3}};
  LoadSample b = sample(10'000, 1, 2, 1);
  b.responses.codes = {{200, 1}, {429, 1}};
  b.responses.latency = {{10, 1}, {1, 1}};
  fleet.add("gw-a", "fraud", {a});
  fleet.add("gw-b", "fraud", {b});
  const std::vector<LoadSample> taken = fleet.take("fraud", 20'000);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].responses.codes, (std::map<int, uint64_t>{{200, 4}, {429, 1}}));
  EXPECT_EQ(taken[0].responses.latency, (std::map<int, uint64_t>{{1, 1}, {10, 4}}));
}

TEST(SampleReportTest, BadReportsAreRefusedNamingWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "JSON object"},
      {"[]", "JSON object"},
      {R"({"endpoints": {}})", "gateway"},
      {R"({"gateway": ""})", "gateway"},
      {R"({"gateway": "g", "endpoints": []})", "endpoints"},
      {R"({"gateway": "g", "endpoints": {"e": {}}})", "endpoints.e"},
      {R"({"gateway": "g", "endpoints": {"e": [7]}})", "endpoints.e[0]"},
      {R"({"gateway": "g", "endpoints": {"e": [{"unix_ms": 1}]}})", "concurrency"},
      {R"({"gateway": "g", "endpoints": {"e": [{"unix_ms": 1, "concurrency": -1}]}})",
       "concurrency"},
      {R"({"gateway": "g", "endpoints": {"e": [{"unix_ms": 1.5}]}})", "unix_ms"},
      {R"({"gateway": "g", "endpoints": {"e": [{"unix_ms": 9223372036854775807}]}})",
       "unix_ms: past the year 2286"},
      {R"({"gateway": "g", "endpoints": {"e": [{"unix_ms": 1, "concurrency": 0, "queued": 0, )"
       R"("arrivals": 0, "completions": 0, "rejected": 0, "latency_ms": 0, "codes": {"2x": 1}}]}})",
       "codes.2x"},
      {R"({"gateway": "g", "endpoints": {"e": [{"unix_ms": 1, "concurrency": 0, "queued": 0, )"
       R"("arrivals": 0, "completions": 0, "rejected": 0, "latency_ms": 0, )"
       R"("latency_buckets": [[100, 1]]}]}})",
       "latency_buckets"},
      {R"({"gateway": "g", "capacity": "e"})", "capacity"},
      {R"({"gateway": "g", "capacity": [1]})", "capacity"},
  };
  for (const auto& [body, named] : cases) {
    Result<SampleReport> parsed = parse_sample_report(body);
    ASSERT_FALSE(parsed.is_ok()) << body;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << body;
    EXPECT_NE(parsed.status().message().find(named), std::string::npos)
        << body << ": " << parsed.status().message();
  }
}

}  // namespace
}  // namespace flotilla::cluster

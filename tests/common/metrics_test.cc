#include <cmath>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/common.h"

namespace flotilla {
namespace {

using ::testing::HasSubstr;

TEST(HistogramTest, CountsIntoBucketsByUpperBound) {
  Histogram histogram({1, 2, 4});
  for (double value : {0.5, 1.0, 1.5, 4.0, 9.0}) {
    histogram.observe(value);
  }
  EXPECT_THAT(histogram.bucket_counts(), ::testing::ElementsAre(2, 1, 1, 1));
  EXPECT_EQ(histogram.count(), 5u);
  EXPECT_DOUBLE_EQ(histogram.sum(), 16.0);
}

TEST(HistogramTest, ExponentialBucketsGrowByFactor) {
  EXPECT_THAT(exponential_buckets(1, 2, 4), ::testing::ElementsAre(1, 2, 4, 8));
}

TEST(MetricsRegistryTest, RendersPrometheusTextFormat) {
  MetricsRegistry registry;
  registry.counter("app_requests_total", "Requests.", {{"route", "infer"}, {"code", "200"}}).inc(3);
  registry.gauge("app_in_flight", "In flight.").set(2);
  auto& latency = registry.histogram("app_latency_seconds", "Latency.", {0.1, 1}, {{"route", "x"}});
  latency.observe(0.05);
  latency.observe(0.5);
  latency.observe(5);
  registry.callback("app_up", "Up.", "gauge", [] { return 1.0; });

  const std::string text = registry.render();
  EXPECT_THAT(text,
              HasSubstr("# HELP app_requests_total Requests.\n# TYPE app_requests_total counter\n"
                        "app_requests_total{route=\"infer\",code=\"200\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("app_in_flight 2\n"));
  EXPECT_THAT(text, HasSubstr("app_latency_seconds_bucket{route=\"x\",le=\"0.1\"} 1\n"
                              "app_latency_seconds_bucket{route=\"x\",le=\"1\"} 2\n"
                              "app_latency_seconds_bucket{route=\"x\",le=\"+Inf\"} 3\n"
                              "app_latency_seconds_sum{route=\"x\"} 5.55\n"
                              "app_latency_seconds_count{route=\"x\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE app_up gauge\napp_up 1\n"));
}

TEST(MetricsRegistryTest, EscapesLabelValues) {
  MetricsRegistry registry;
  registry.counter("x_total", "X.", {{"path", "a\"b\\c\nd"}}).inc();
  EXPECT_THAT(registry.render(), HasSubstr("x_total{path=\"a\\\"b\\\\c\\nd\"} 1\n"));
}

TEST(MetricsRegistryTest, SameLabelsReturnSameCounter) {
  MetricsRegistry registry;
  Counter& a = registry.counter("y_total", "Y.", {{"k", "v"}});
  Counter& b = registry.counter("y_total", "Y.", {{"k", "v"}});
  EXPECT_EQ(&a, &b);
}

TEST(MetricsRegistryTest, RetiredSeriesLeaveTheOutputButStayUsable) {
  MetricsRegistry registry;
  Counter& gone = registry.counter("c_total", "help", {{"endpoint", "e"}, {"replica", "r1"}});
  Counter& coded =
      registry.counter("c_total", "help", {{"endpoint", "e"}, {"replica", "r1"}, {"code", "200"}});
  Counter& kept = registry.counter("c_total", "help", {{"endpoint", "e"}, {"replica", "r10"}});
  Gauge& gauge = registry.gauge("g", "help", {{"replica", "r1"}, {"endpoint", "e"}});
  Counter& other = registry.counter("c_total", "help", {{"endpoint", "f"}, {"replica", "r1"}});
  registry.retire({{"endpoint", "e"}, {"replica", "r1"}});
  gone.inc();  // still valid for a holder
  coded.inc();
  gauge.set(3);
  kept.inc();
  other.inc();
  const std::string text = registry.render();
  EXPECT_EQ(text.find("endpoint=\"e\",replica=\"r1\""), std::string::npos) << text;
  EXPECT_EQ(text.find("replica=\"r1\",endpoint=\"e\""), std::string::npos) << text;
  EXPECT_NE(text.find("c_total{endpoint=\"e\",replica=\"r10\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("c_total{endpoint=\"f\",replica=\"r1\"} 1"), std::string::npos) << text;
  // The same labels again: a fresh series from zero.
  Counter& again = registry.counter("c_total", "help", {{"endpoint", "e"}, {"replica", "r1"}});
  EXPECT_NE(&again, &gone);
  EXPECT_EQ(again.value(), 0u);
}

TEST(MetricsRegistryTest, CountsFromManyThreadsWithoutLoss) {
  MetricsRegistry registry;
  Counter& counter = registry.counter("z_total", "Z.");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&counter] {
      for (int i = 0; i < 10000; ++i) {
        counter.inc();
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  EXPECT_EQ(counter.value(), 40000u);
}

TEST(ProcessMetricsTest, ReportsMemoryAndCpu) {
  MetricsRegistry registry;
  register_process_metrics(registry);
  const std::string text = registry.render();
  EXPECT_THAT(text, HasSubstr("# TYPE process_cpu_seconds_total counter"));
  EXPECT_THAT(text, HasSubstr("process_resident_memory_bytes "));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("process_resident_memory_bytes 0\n")));
}

TEST(ResponseCountsTest, BucketsAreAQuarterOctaveWide) {
  EXPECT_EQ(ResponseCounts::latency_bucket(0), 0);
  EXPECT_EQ(ResponseCounts::latency_bucket(-1), 0);
  EXPECT_EQ(ResponseCounts::latency_bucket(std::nan("")), 0);
  EXPECT_EQ(ResponseCounts::latency_bucket(49e-6), 0);
  EXPECT_EQ(ResponseCounts::latency_bucket(50e-6), 1);
  EXPECT_EQ(ResponseCounts::latency_bucket(100e-6), 5);
  EXPECT_EQ(ResponseCounts::latency_bucket(1e9), ResponseCounts::kLatencyBuckets - 1);
  for (double seconds : {0.0003, 0.0021, 0.047, 0.5, 3.0, 70.0}) {
    const double middle =
        ResponseCounts::latency_bucket_middle(ResponseCounts::latency_bucket(seconds));
    EXPECT_NEAR(middle / seconds, 1.0, 0.1) << seconds;
  }
}

TEST(ResponseCountsTest, QuantilesReadOffTheBucketsAndMergeAdds) {
  ResponseCounts counts;
  EXPECT_EQ(counts.latency_quantile(0.5), 0);
  for (int i = 0; i < 98; ++i) {
    counts.latency[ResponseCounts::latency_bucket(0.002)] += 1;
  }
  counts.latency[ResponseCounts::latency_bucket(0.2)] += 2;
  counts.codes = {{200, 99}, {500, 1}};
  EXPECT_NEAR(counts.latency_quantile(0.5), 0.002, 0.0002);
  EXPECT_NEAR(counts.latency_quantile(0.98), 0.002, 0.0002);
  EXPECT_NEAR(counts.latency_quantile(0.99), 0.2, 0.02);
  EXPECT_NEAR(counts.latency_quantile(1.0), 0.2, 0.02);
  ResponseCounts more;
  more.codes = {{200, 1}, {429, 2}};
  more.latency = {{3, 3}};
  counts.merge(more);
  EXPECT_EQ(counts.codes, (std::map<int, uint64_t>{{200, 100}, {429, 2}, {500, 1}}));
  EXPECT_EQ(counts.responses(), 103u);
  EXPECT_EQ(counts.latency[3], 3u);
}

// Another process's /metrics, as the orchestrator reads a replica's queue.
TEST(MetricValueTest, ReadsAnUnlabelledSample) {
  const std::string text =
      "# HELP flotilla_replica_queue_wait_seconds_total Seconds.\n"
      "# TYPE flotilla_replica_queue_wait_seconds_total counter\n"
      "flotilla_replica_queue_wait_seconds_total_other 7\n"
      "flotilla_replica_queue_wait_seconds_total{route=\"x\"} 5\n"
      "flotilla_replica_queue_wait_seconds_total 12.5\n"
      "process_open_fds 9";
  EXPECT_EQ(metric_value(text, "flotilla_replica_queue_wait_seconds_total"), 12.5);
  EXPECT_EQ(metric_value(text, "process_open_fds"), 9);      // the last line, with no newline
  EXPECT_EQ(metric_value("a 1 1700000000000\r\n", "a"), 1);  // with a timestamp, CRLF
  EXPECT_FALSE(metric_value(text, "flotilla_missing").has_value());
  EXPECT_FALSE(metric_value("a lots\n", "a").has_value());
  EXPECT_FALSE(metric_value("a 1x\n", "a").has_value());
  EXPECT_FALSE(metric_value("", "a").has_value());
}

}  // namespace
}  // namespace flotilla

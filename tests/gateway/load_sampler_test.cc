#include "gateway/load_sampler.h"

#include <chrono>
#include <vector>

#include <gtest/gtest.h>

#include "fakes/common/fake_clock.h"

namespace flotilla::gateway {
namespace {

using flotilla::testing::FakeClock;

// Ticks `sampler` `ticks` times with `reading`, 100 ms apart on `clock`; the samples closed.
int run(LoadSampler& sampler, FakeClock& clock, const LoadReading& reading, int ticks) {
  int closed = 0;
  for (int i = 0; i < ticks; ++i) {
    clock.advance(std::chrono::milliseconds(100));
    closed += sampler.tick(reading) ? 1 : 0;
  }
  return closed;
}

TEST(LoadSamplerTest, ClosesASampleEveryTenTicks) {
  FakeClock clock;
  LoadSampler sampler(clock);
  EXPECT_FALSE(sampler.closes_on_next_tick());
  EXPECT_EQ(run(sampler, clock, {}, 9), 0);
  EXPECT_TRUE(sampler.closes_on_next_tick());
  EXPECT_TRUE(sampler.latest(10).empty());
  EXPECT_EQ(run(sampler, clock, {}, 1), 1);
  ASSERT_EQ(sampler.latest(10).size(), 1u);
  EXPECT_EQ(sampler.latest(10)[0].unix_ms, clock.unix_ms());
  EXPECT_EQ(run(sampler, clock, {}, 20), 2);
  EXPECT_EQ(sampler.latest(10).size(), 3u);
}

TEST(LoadSamplerTest, AveragesConcurrencyAndQueueOverTheTicks) {
  FakeClock clock;
  LoadSampler sampler(clock, 600, 4);
  for (int64_t in_flight : {1, 2, 3, 6}) {
    LoadReading reading;
    reading.in_flight = in_flight;
    reading.queued = in_flight == 6 ? -1 : in_flight * 2;  // a negative reading counts as 0
    sampler.tick(reading);
  }
  const std::vector<LoadSample> samples = sampler.latest(1);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_DOUBLE_EQ(samples[0].concurrency, 3.0);
  EXPECT_DOUBLE_EQ(samples[0].queued, 3.0);  // (2 + 4 + 6 + 0) / 4
}

TEST(LoadSamplerTest, CountsSinceTheLastSample) {
  FakeClock clock;
  LoadSampler sampler(clock, 600, 1);
  LoadReading reading;
  reading.arrivals = 10;
  reading.completions = 8;
  reading.rejected = 1;
  reading.upstream_answers = 4;
  reading.upstream_us = 40'000;
  ASSERT_TRUE(sampler.tick(reading));
  reading.arrivals = 25;
  reading.completions = 20;
  reading.rejected = 4;
  reading.upstream_answers = 6;
  reading.upstream_us = 70'000;
  ASSERT_TRUE(sampler.tick(reading));
  ASSERT_TRUE(sampler.tick(reading));  // nothing new

  const std::vector<LoadSample> samples = sampler.latest(3);
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples[0].arrivals, 10u);
  EXPECT_DOUBLE_EQ(samples[0].latency_ms, 10.0);
  EXPECT_EQ(samples[1].arrivals, 15u);
  EXPECT_EQ(samples[1].completions, 12u);
  EXPECT_EQ(samples[1].rejected, 3u);
  EXPECT_DOUBLE_EQ(samples[1].latency_ms, 15.0);  // 30 ms over 2 answers
  EXPECT_EQ(samples[2].arrivals, 0u);
  EXPECT_EQ(samples[2].completions, 0u);
  EXPECT_DOUBLE_EQ(samples[2].latency_ms, 0.0);  // no answers: 0
}

TEST(LoadSamplerTest, CountsResponsesByCodeAndLatencySinceTheLastSample) {
  FakeClock clock;
  LoadSampler sampler(clock, 600, 1);
  LatencyTotals latency;
  latency.observe(0.001);
  latency.observe(0.001);
  LoadReading reading;
  reading.codes = {{200, 2}};
  reading.latency = latency.read();
  ASSERT_TRUE(sampler.tick(reading));
  latency.observe(0.1);
  reading.codes = {{200, 2}, {503, 1}};
  reading.latency = latency.read();
  ASSERT_TRUE(sampler.tick(reading));

  const std::vector<LoadSample> samples = sampler.latest(2);
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].responses.codes, (std::map<int, uint64_t>{{200, 2}}));
  EXPECT_EQ(samples[0].responses.latency,
            (std::map<int, uint64_t>{{ResponseCounts::latency_bucket(0.001), 2}}));
  EXPECT_EQ(samples[1].responses.codes, (std::map<int, uint64_t>{{503, 1}}));
  EXPECT_EQ(samples[1].responses.latency,
            (std::map<int, uint64_t>{{ResponseCounts::latency_bucket(0.1), 1}}));
}

TEST(LoadSamplerTest, KeepsTheLatestOldestFirst) {
  FakeClock clock;
  LoadSampler sampler(clock, 3, 1);
  for (uint64_t i = 1; i <= 5; ++i) {
    LoadReading reading;
    reading.arrivals = i * (i + 1) / 2;  // arrivals per sample: 1, 2, 3, 4, 5
    clock.advance(std::chrono::seconds(1));
    ASSERT_TRUE(sampler.tick(reading));
  }
  const std::vector<LoadSample> all = sampler.latest(10);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].arrivals, 3u);
  EXPECT_EQ(all[1].arrivals, 4u);
  EXPECT_EQ(all[2].arrivals, 5u);
  EXPECT_EQ(all[2].unix_ms, clock.unix_ms());
  EXPECT_EQ(all[1].unix_ms, clock.unix_ms() - 1'000);
  const std::vector<LoadSample> last = sampler.latest(2);
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[0].arrivals, 4u);
  EXPECT_EQ(last[1].arrivals, 5u);
}

}  // namespace
}  // namespace flotilla::gateway

#include <gtest/gtest.h>

#include "autoscaler/autoscaler.h"
#include "fakes/autoscaler/load_samples.h"

namespace flotilla::autoscaler {
namespace {

// Small seasons keep the tests short: a "day" of 100 s in buckets of 1 s, looking 5 s ahead.
constexpr int64_t kDayMs = 100'000;

ForecastOptions small_days() {
  ForecastOptions options;
  options.enabled = true;
  options.bucket = Millis(1'000);
  options.season = Millis(kDayMs);
  options.lead = Millis(5'000);
  return options;
}

// One day of seconds at `base` concurrency, with `peak` from second 50 to 59 when given.
void feed_day(Forecaster& forecaster, int64_t day, double base, std::optional<double> peak) {
  for (int64_t second = 1; second <= 100; ++second) {
    const bool in_peak = peak && second > 50 && second <= 60;
    forecaster.add(Millis(day * kDayMs + second * 1'000), in_peak ? *peak : base);
  }
}

TEST(ForecasterTest, SaysNothingUntilThePatternHasRepeated) {
  Forecaster forecaster(small_days());
  feed_day(forecaster, 0, 2, 40);
  // Day 1, just before the peak's time: one past day is not a pattern.
  EXPECT_FALSE(forecaster.forecast(Millis(kDayMs + 47'000)));
  feed_day(forecaster, 1, 2, 40);
  const auto forecast = forecaster.forecast(Millis(2 * kDayMs + 47'000));
  ASSERT_TRUE(forecast);
  EXPECT_DOUBLE_EQ(forecast->concurrency, 40);
  EXPECT_EQ(forecast->seasons, 2);
  EXPECT_FALSE(forecast->weekly);
}

// The span ahead is (now, now + lead]: the peak shows `lead` before its time, not earlier, and
// the quiet hours before it forecast the quiet level.
TEST(ForecasterTest, LooksExactlyTheLeadAhead) {
  Forecaster forecaster(small_days());
  feed_day(forecaster, 0, 2, 40);
  feed_day(forecaster, 1, 2, 40);
  const Millis day2(2 * kDayMs);
  EXPECT_DOUBLE_EQ(forecaster.forecast(day2 + Millis(30'000))->concurrency, 2);
  // The peak's first second is (50 s, 51 s]: in the span from now = 46 s on.
  EXPECT_DOUBLE_EQ(forecaster.forecast(day2 + Millis(44'999))->concurrency, 2);
  EXPECT_DOUBLE_EQ(forecaster.forecast(day2 + Millis(46'000))->concurrency, 40);
  EXPECT_DOUBLE_EQ(forecaster.forecast(day2 + Millis(59'000))->concurrency, 40);
  EXPECT_DOUBLE_EQ(forecaster.forecast(day2 + Millis(61'000))->concurrency, 2);
}

// The median of past days: one odd day (a one-off peak, or a day without it) moves nothing;
// with two days, the lower of the two.
TEST(ForecasterTest, OneOddDayMovesNothing) {
  Forecaster one_off(small_days());
  feed_day(one_off, 0, 2, std::nullopt);
  feed_day(one_off, 1, 2, 90);  // a campaign, once
  feed_day(one_off, 2, 2, std::nullopt);
  EXPECT_DOUBLE_EQ(one_off.forecast(Millis(3 * kDayMs + 50'000))->concurrency, 2);

  Forecaster missed(small_days());
  feed_day(missed, 0, 2, 40);
  feed_day(missed, 1, 2, std::nullopt);  // a holiday
  feed_day(missed, 2, 2, 44);
  EXPECT_DOUBLE_EQ(missed.forecast(Millis(3 * kDayMs + 50'000))->concurrency, 40);

  Forecaster two(small_days());
  feed_day(two, 0, 2, 40);
  feed_day(two, 1, 2, 60);
  EXPECT_DOUBLE_EQ(two.forecast(Millis(2 * kDayMs + 50'000))->concurrency, 40);
}

// A day with no history at that time (the control plane was down) is not a day of zeros.
TEST(ForecasterTest, ADayWithoutHistoryDoesNotCount) {
  Forecaster forecaster(small_days());
  feed_day(forecaster, 0, 2, 40);
  // Day 1: only its first 30 s were seen.
  for (int64_t second = 1; second <= 30; ++second) {
    forecaster.add(Millis(kDayMs + second * 1'000), 2);
  }
  EXPECT_FALSE(forecaster.forecast(Millis(2 * kDayMs + 50'000)));
  feed_day(forecaster, 2, 2, 40);
  const auto forecast = forecaster.forecast(Millis(3 * kDayMs + 50'000));
  ASSERT_TRUE(forecast);
  EXPECT_EQ(forecast->seasons, 2);  // days 0 and 2
  EXPECT_DOUBLE_EQ(forecast->concurrency, 40);
}

// `days` days whose weekdays peak at 40 and whose weekends (days 5 and 6 of each week) do not.
Forecaster weekdays_peak(int64_t days) {
  Forecaster forecaster(small_days());
  for (int64_t day = 0; day < days; ++day) {
    feed_day(forecaster, day, 2, day % 7 >= 5 ? std::nullopt : std::optional(40.0));
  }
  return forecaster;
}

// Once two weeks are known, the same weekday decides: weekdays peak, weekends do not.
TEST(ForecasterTest, WeeklyOnceTwoWeeksAreKnown) {
  // Day 19 is a Saturday (19 % 7 == 5): its past days mostly peaked, its past Saturdays did not.
  const auto saturday = weekdays_peak(19).forecast(Millis(19 * kDayMs + 50'000));
  ASSERT_TRUE(saturday);
  EXPECT_TRUE(saturday->weekly);
  EXPECT_EQ(saturday->seasons, 2);
  EXPECT_DOUBLE_EQ(saturday->concurrency, 2);
  // Day 12, a Saturday with only one past Saturday: by day, whose median peaks.
  const auto by_day = weekdays_peak(12).forecast(Millis(12 * kDayMs + 50'000));
  ASSERT_TRUE(by_day);
  EXPECT_FALSE(by_day->weekly);
  EXPECT_DOUBLE_EQ(by_day->concurrency, 40);
}

// What take_closed() hands out restores the same forecast after a restart, and what was
// restored is not handed out again.
TEST(ForecasterTest, HistorySurvivesARestart) {
  Forecaster before(small_days());
  feed_day(before, 0, 2, 40);
  feed_day(before, 1, 3, 50);
  const auto closed = before.take_closed();
  ASSERT_EQ(closed.size(), 199u);  // the newest bucket is still filling
  EXPECT_EQ(closed.front().first, Millis(0));
  EXPECT_TRUE(before.take_closed().empty());
  before.add(Millis(2 * kDayMs + 1'000), 3);
  EXPECT_EQ(before.take_closed().size(), 1u);  // day 1's last second closed

  Forecaster after(small_days());
  for (const auto& [start, peak] : closed) {
    after.restore(start, peak);
  }
  const Millis now(2 * kDayMs + 48'000);
  EXPECT_DOUBLE_EQ(after.forecast(now)->concurrency, before.forecast(now)->concurrency);
  after.add(Millis(2 * kDayMs + 1'000), 3);
  after.add(Millis(2 * kDayMs + 2'000), 3);
  const auto again = after.take_closed();
  ASSERT_EQ(again.size(), 1u);  // only the second just closed, not the restored history
  EXPECT_EQ(again.front().first, Millis(2 * kDayMs));
}

TEST(ForecasterTest, RefusesNonsenseSamples) {
  Forecaster forecaster(small_days());
  forecaster.add(Millis(1'000), -1);
  forecaster.add(Millis(2'000), std::numeric_limits<double>::quiet_NaN());
  forecaster.add(Millis(3'000), std::numeric_limits<double>::infinity());
  forecaster.add(Millis(4'000), 1);
  EXPECT_EQ(forecaster.take_closed().size(), 0u);  // only the newest, still filling
}

// ---- The floor in the endpoint's loop -------------------------------------------------------

using sample_builders::full_cycles;

VerticalOptions target_of(double target) {
  VerticalOptions options;
  options.period = Millis(1'000'000);  // never due here
  options.initial_target = target;
  options.min_target = 1;
  options.max_target = 64;
  return options;
}

// Two days of 4 in flight with 40 from second 50 to 59, and day 2's first 40 s.
void feed_history(EndpointAutoscaler& scaler) {
  for (int64_t day = 0; day < 3; ++day) {
    for (int64_t second = 1; second <= (day < 2 ? 100 : 40); ++second) {
      const bool peak = day < 2 && second > 50 && second <= 60;
      scaler.add_samples(
          sample_builders::steady(day * kDayMs + (second - 1) * 1'000, 1, peak ? 40 : 4),
          peak ? 5 : 1);
    }
  }
}

TEST(EndpointAutoscalerForecastTest, RaisesTheFloorALeadAheadOfTheDailyPeak) {
  EndpointAutoscaler scaler(
      full_cycles(), target_of(8),
      [](double) {
        return ReplicaRange{1, 100, false};
      },
      1, Millis(2 * kDayMs), small_days());
  feed_history(scaler);
  const auto light = sample_builders::light_usage;
  // Day 2 at 40 s: the peak is 10 s away, past the 5 s lead: nothing yet.
  EXPECT_TRUE(scaler.tick(Millis(2 * kDayMs + 40'000), 1, 0, 0, light).empty());
  EXPECT_EQ(scaler.replicas(), 1);
  scaler.add_samples(sample_builders::steady(2 * kDayMs + 40'000, 5, 4), 1);
  const auto changes = scaler.tick(Millis(2 * kDayMs + 46'000), 1, 0, 0, light);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(scaler.replicas(), 5);  // ceil(40 / 8), before any of the peak's load arrived
  EXPECT_NE(changes[0].find("horizontal: 1 -> 5 replicas: forecast:"), std::string::npos)
      << changes[0];
  EXPECT_NE(changes[0].find("concurrency 40.0"), std::string::npos) << changes[0];
  EXPECT_NE(changes[0].find("last 2 days"), std::string::npos) << changes[0];
}

TEST(EndpointAutoscalerForecastTest, OffRaisesNothingAndTheRangeBoundsTheFloor) {
  ForecastOptions off = small_days();
  off.enabled = false;
  EndpointAutoscaler without(
      full_cycles(), target_of(8),
      [](double) {
        return ReplicaRange{1, 100, false};
      },
      1, Millis(2 * kDayMs), off);
  feed_history(without);
  without.add_samples(sample_builders::steady(2 * kDayMs + 40'000, 5, 4), 1);
  EXPECT_TRUE(
      without.tick(Millis(2 * kDayMs + 46'000), 1, 0, 0, sample_builders::light_usage).empty());
  EXPECT_EQ(without.replicas(), 1);
  // Turned on (a spec change), the same history raises the floor at once.
  without.set_forecast_enabled(true);
  without.tick(Millis(2 * kDayMs + 51'000), 1, 0, 0, sample_builders::light_usage);
  EXPECT_EQ(without.replicas(), 5);

  EndpointAutoscaler capped(
      full_cycles(), target_of(8),
      [](double) {
        return ReplicaRange{1, 3, false};
      },
      1, Millis(2 * kDayMs), small_days());
  feed_history(capped);
  capped.add_samples(sample_builders::steady(2 * kDayMs + 40'000, 5, 4), 1);
  capped.tick(Millis(2 * kDayMs + 46'000), 1, 0, 0, sample_builders::light_usage);
  EXPECT_EQ(capped.replicas(), 3);  // the user's maximum
}

}  // namespace
}  // namespace flotilla::autoscaler

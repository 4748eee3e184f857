#include <cstdlib>
#include <thread>
#include <utility>

#include <gtest/gtest.h>

#include "common/common.h"
#include "fakes/common/fake_clock.h"

namespace flotilla {
namespace {

Result<int> parse_positive(int value) {
  if (value <= 0) {
    return invalid_argument("value must be positive");
  }
  return value;
}

Result<int> doubled(int value) {
  FLOTILLA_ASSIGN_OR_RETURN(int parsed, parse_positive(value));
  return parsed * 2;
}

Status check_both(int a, int b) {
  FLOTILLA_RETURN_IF_ERROR(parse_positive(a).status());
  FLOTILLA_RETURN_IF_ERROR(parse_positive(b).status().with_context("second"));
  return Status::ok();
}

TEST(StatusTest, MapsCodesToHttpStatuses) {
  EXPECT_EQ(http_status_for(StatusCode::kOk), 200);
  EXPECT_EQ(http_status_for(StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(http_status_for(StatusCode::kNotFound), 404);
  EXPECT_EQ(http_status_for(StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(http_status_for(StatusCode::kInternal), 500);
  EXPECT_EQ(http_status_for(StatusCode::kUnavailable), 503);
  EXPECT_EQ(http_status_for(StatusCode::kDeadlineExceeded), 504);
}

TEST(StatusTest, AssignOrReturnPropagatesErrors) {
  EXPECT_EQ(doubled(4).value(), 8);
  Result<int> failed = doubled(-1);
  ASSERT_FALSE(failed.is_ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kInvalidArgument);
}

TEST(StatusTest, ReturnIfErrorAddsContext) {
  EXPECT_TRUE(check_both(1, 1).is_ok());
  Status status = check_both(1, -1);
  EXPECT_EQ(status.message(), "second: value must be positive");
  EXPECT_EQ(status.to_string(), "invalid argument: second: value must be positive");
}

TEST(StatusTest, ResultFromOkStatusBecomesInternalError) {
  Result<int> result{Status::ok()};
  EXPECT_FALSE(result.is_ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInternal);
}

TEST(ResultDeathTest, ValueOfAnErrorIsACheckFailureNamingTheStatus) {
  Result<int> result = not_found("model 'm'");
  EXPECT_DEATH((void)result.value(), "value\\(\\) of a Result holding an error: .*model 'm'");
}

TEST(ClockTest, FakeClockMovesOnlyWhenAdvanced) {
  testing::FakeClock clock;
  const Clock::TimePoint start = clock.now();
  const int64_t start_ms = clock.unix_ms();
  EXPECT_EQ(clock.now(), start);
  clock.advance(std::chrono::milliseconds(1'500));
  EXPECT_EQ(clock.now() - start, std::chrono::milliseconds(1'500));
  EXPECT_EQ(clock.unix_ms() - start_ms, 1'500);
}

TEST(ClockTest, RealClockIsMonotonicAndNearTheSystemTime) {
  Clock& clock = real_clock();
  const Clock::TimePoint a = clock.now();
  EXPECT_LE(a, clock.now());
  const int64_t system_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
  EXPECT_LE(std::abs(clock.unix_ms() - system_ms), 1'000);
}

TEST(CeilDivTest, IgnoresFloatingPointDust) {
  EXPECT_EQ(ceil_div(0.1 * 3 * 160 / 3, 16), 1);
  EXPECT_EQ(ceil_div(17, 16), 2);
  EXPECT_EQ(ceil_div(0, 16), 0);
  EXPECT_EQ(ceil_div(32, 16), 2);
}

TEST(ParseDurationSecondsTest, ReadsACountAndOneOfTheUnitsAllowedWithinTheBound) {
  EXPECT_EQ(parse_duration_seconds("90s", "smhd", false, 1'000'000), 90);
  EXPECT_EQ(parse_duration_seconds("15m", "smhd", false, 1'000'000), 900);
  EXPECT_EQ(parse_duration_seconds("2h", "smhd", false, 1'000'000), 7'200);
  EXPECT_EQ(parse_duration_seconds("7d", "smhd", false, 1'000'000), 604'800);
  EXPECT_EQ(parse_duration_seconds("45", "smh", true, 3'600), 45);
  EXPECT_EQ(parse_duration_seconds("60m", "smh", true, 3'600), 3'600);
  for (const char* bad : {"", "s", "0s", "-1s", "+1s", "1.5h", " 5s", "5s ", "5x", "5"}) {
    EXPECT_EQ(parse_duration_seconds(bad, "smhd", false, 1'000'000), std::nullopt) << bad;
  }
  EXPECT_EQ(parse_duration_seconds("1d", "smh", true, 1'000'000), std::nullopt);  // not allowed
  EXPECT_EQ(parse_duration_seconds("61m", "smh", true, 3'600), std::nullopt);     // over
  EXPECT_EQ(parse_duration_seconds("3601", "smh", true, 3'600), std::nullopt);
  // No overflow on the way to the bound.
  EXPECT_EQ(parse_duration_seconds("9223372036854775807d", "d", false, 1'000'000), std::nullopt);
}

TEST(CondVarTest, WaitReturnsWhenAnotherThreadSignals) {
  Mutex mutex;
  CondVar cv;
  bool ready = false;
  std::thread signaller([&] {
    MutexLock lock(mutex);
    ready = true;
    cv.notify_all();
  });
  {
    MutexLock lock(mutex);
    while (!ready) {
      cv.wait(mutex);
    }
    EXPECT_TRUE(ready);
  }
  signaller.join();
}

// The one Status -> HTTP table (common.h), every code: the replica's data plane and the control
// REST API both answer through it (a conflict is 409 RESOURCE_ALREADY_EXISTS on the API; a full
// queue 429 and a replica that is not ready 503 on the data plane).
TEST(StatusTest, HttpStatusTableCoversEveryCode) {
  const std::pair<StatusCode, int> table[] = {
      {StatusCode::kOk, 200},
      {StatusCode::kInvalidArgument, 400},
      {StatusCode::kNotFound, 404},
      {StatusCode::kFailedPrecondition, 409},
      {StatusCode::kResourceExhausted, 429},
      {StatusCode::kInternal, 500},
      {StatusCode::kUnimplemented, 501},
      {StatusCode::kUnavailable, 503},
      {StatusCode::kDeadlineExceeded, 504},
  };
  for (const auto& [code, http] : table) {
    EXPECT_EQ(http_status_for(code), http) << status_code_name(code);
  }
  // Out-of-range values (a corrupted code) answer 500 rather than anything that looks like success.
  EXPECT_EQ(http_status_for(static_cast<StatusCode>(99)), 500);
}

TEST(CheckNameTest, AllowsLettersDigitsAndThreeMarksUpTo128) {
  EXPECT_TRUE(check_name("fraud-v2_a.b", "name").is_ok());
  EXPECT_TRUE(check_name(std::string(128, 'a'), "name").is_ok());
  EXPECT_EQ(check_name("", "endpoints[0].name").message(),
            "endpoints[0].name: must be 1 to 128 characters");
  EXPECT_FALSE(check_name(std::string(129, 'a'), "name").is_ok());
  EXPECT_EQ(check_name("a/b", "endpoints[1]").message(),
            "endpoints[1]: 'a/b' may hold only letters, digits, '-', '_' and '.'");
}

}  // namespace
}  // namespace flotilla

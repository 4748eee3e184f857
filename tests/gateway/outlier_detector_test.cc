#include "gateway/outlier_detector.h"

#include <chrono>
#include <optional>

#include <gtest/gtest.h>

#include "fakes/common/fake_clock.h"

namespace flotilla::gateway {
namespace {

using flotilla::testing::FakeClock;
using std::chrono::milliseconds;

constexpr OutlierOptions kOptions{3, milliseconds(1'000), milliseconds(30'000)};

class OutlierDetectorTest : public ::testing::Test {
 protected:
  // Fails `times` times; the ejection of the last failure, if any.
  std::optional<Ejection> fail(int times) {
    std::optional<Ejection> last;
    for (int i = 0; i < times; ++i) {
      last = detector_.put_result(state_, AttemptResult::kFailure);
    }
    return last;
  }
  // Ejects the replica (it must not be ejected) and returns the ejection's delay.
  milliseconds eject() {
    EXPECT_FALSE(state_.ejected());
    std::optional<Ejection> ejection;
    for (int i = 0; i < kOptions.eject_after_failures && !ejection; ++i) {
      ejection = detector_.put_result(state_, AttemptResult::kFailure);
    }
    EXPECT_TRUE(ejection.has_value());
    EXPECT_TRUE(state_.ejected());
    return ejection ? ejection->delay : milliseconds(-1);
  }
  void probe_back(milliseconds delay) {
    clock_.advance(delay);
    EXPECT_FALSE(detector_.put_probe_result(state_, true, delay).has_value());
    EXPECT_FALSE(state_.ejected());
  }

  FakeClock clock_;
  OutlierDetector detector_{kOptions, clock_};
  OutlierState state_;
};

TEST_F(OutlierDetectorTest, EjectsAfterConsecutiveFailures) {
  EXPECT_FALSE(fail(2).has_value());
  EXPECT_FALSE(state_.ejected());
  const Clock::TimePoint now = clock_.now();
  const std::optional<Ejection> ejection = fail(1);
  ASSERT_TRUE(ejection.has_value());
  EXPECT_TRUE(state_.ejected());
  EXPECT_EQ(ejection->delay, milliseconds(1'000));
  EXPECT_EQ(ejection->until, now + milliseconds(1'000));
  EXPECT_EQ(ejection->consecutive_failures, 3);
}

TEST_F(OutlierDetectorTest, FailuresWhileEjectedDoNotEjectAgain) {
  ASSERT_TRUE(fail(3).has_value());
  EXPECT_FALSE(fail(5).has_value());
  EXPECT_TRUE(state_.ejected());
  EXPECT_EQ(state_.consecutive_failures(), 8);
}

TEST_F(OutlierDetectorTest, SuccessResetsTheCount) {
  EXPECT_FALSE(fail(2).has_value());
  EXPECT_FALSE(detector_.put_result(state_, AttemptResult::kSuccess).has_value());
  EXPECT_EQ(state_.consecutive_failures(), 0);
  EXPECT_FALSE(fail(2).has_value());
  EXPECT_FALSE(state_.ejected());
  EXPECT_TRUE(fail(1).has_value());
}

TEST_F(OutlierDetectorTest, LocalFailuresNeverEject) {
  for (int i = 0; i < 10; ++i) {
    EXPECT_FALSE(detector_.put_result(state_, AttemptResult::kLocalFailure).has_value());
  }
  EXPECT_FALSE(state_.ejected());
  EXPECT_EQ(state_.consecutive_failures(), 0);
  // Nor do they break a run of real failures or reset it.
  EXPECT_FALSE(fail(2).has_value());
  EXPECT_FALSE(detector_.put_result(state_, AttemptResult::kLocalFailure).has_value());
  EXPECT_EQ(state_.consecutive_failures(), 2);
  EXPECT_TRUE(fail(1).has_value());
}

TEST_F(OutlierDetectorTest, ProbeBackAfterEjectionTime) {
  const Clock::TimePoint start = clock_.now();
  const std::optional<Ejection> ejection = fail(3);
  ASSERT_TRUE(ejection.has_value());
  EXPECT_EQ(ejection->until - start, kOptions.ejection_time);
  clock_.advance(ejection->delay);
  EXPECT_GE(clock_.now(), ejection->until);
  EXPECT_FALSE(detector_.put_probe_result(state_, true, ejection->delay).has_value());
  EXPECT_FALSE(state_.ejected());
  EXPECT_EQ(state_.consecutive_failures(), 0);
}

TEST_F(OutlierDetectorTest, FailedProbesBackOffUpToTheCap) {
  milliseconds delay = eject();
  const milliseconds expected[] = {milliseconds(2'000),  milliseconds(4'000),
                                   milliseconds(8'000),  milliseconds(16'000),
                                   milliseconds(30'000), milliseconds(30'000)};
  for (milliseconds want : expected) {
    clock_.advance(delay);
    const std::optional<Ejection> again = detector_.put_probe_result(state_, false, delay);
    ASSERT_TRUE(again.has_value());
    EXPECT_EQ(again->delay, want);
    EXPECT_EQ(again->until, clock_.now() + want);
    EXPECT_TRUE(state_.ejected());
    delay = again->delay;
  }
  probe_back(delay);
}

TEST_F(OutlierDetectorTest, RepeatedEjectionsDoubleUpToTheCap) {
  const milliseconds expected[] = {milliseconds(1'000),  milliseconds(2'000),  milliseconds(4'000),
                                   milliseconds(8'000),  milliseconds(16'000), milliseconds(30'000),
                                   milliseconds(30'000), milliseconds(30'000)};
  for (milliseconds want : expected) {
    const milliseconds delay = eject();
    EXPECT_EQ(delay, want);
    probe_back(delay);  // a probe's answer is no success of a request: the count stays
  }
  // Many more: the shift is bounded, the delay stays at the cap.
  for (int i = 0; i < 40; ++i) {
    const milliseconds delay = eject();
    EXPECT_EQ(delay, kOptions.max_ejection_time);
    probe_back(delay);
  }
}

TEST_F(OutlierDetectorTest, SuccessResetsTheEjectionTime) {
  probe_back(eject());
  probe_back(eject());
  EXPECT_EQ(eject(), milliseconds(4'000));
  probe_back(milliseconds(4'000));
  EXPECT_FALSE(detector_.put_result(state_, AttemptResult::kSuccess).has_value());
  EXPECT_EQ(eject(), kOptions.ejection_time);
}

TEST_F(OutlierDetectorTest, ForgetEndsTheEjection) {
  ASSERT_TRUE(fail(3).has_value());
  detector_.forget(state_);
  EXPECT_FALSE(state_.ejected());
}

TEST(OutlierDetectorOptionsTest, OneFailureEjectsWhenConfigured) {
  FakeClock clock;
  const OutlierDetector detector({1, milliseconds(50), milliseconds(120)}, clock);
  OutlierState state;
  std::optional<Ejection> ejection = detector.put_result(state, AttemptResult::kFailure);
  ASSERT_TRUE(ejection.has_value());
  EXPECT_EQ(ejection->delay, milliseconds(50));
  EXPECT_FALSE(detector.put_probe_result(state, true, ejection->delay).has_value());
  ejection = detector.put_result(state, AttemptResult::kFailure);
  ASSERT_TRUE(ejection.has_value());
  EXPECT_EQ(ejection->delay, milliseconds(100));
  EXPECT_FALSE(detector.put_probe_result(state, true, ejection->delay).has_value());
  ejection = detector.put_result(state, AttemptResult::kFailure);
  ASSERT_TRUE(ejection.has_value());
  EXPECT_EQ(ejection->delay, milliseconds(120));
}

}  // namespace
}  // namespace flotilla::gateway

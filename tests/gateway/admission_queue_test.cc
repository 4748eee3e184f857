#include <memory>

#include <gtest/gtest.h>

#include "gateway/gateway_policy.h"

namespace flotilla::gateway {
namespace {

using TimePoint = AdmissionQueue<int>::TimePoint;

TimePoint at_ms(int64_t ms) {
  return TimePoint(std::chrono::milliseconds(ms));
}

TEST(AdmissionQueueTest, DispatchesInArrivalOrder) {
  AdmissionQueue<int> queue(8);
  for (int id = 1; id <= 3; ++id) {
    EXPECT_EQ(queue.push(int{id}, at_ms(100)), std::nullopt);
  }
  EXPECT_EQ(queue.size(), 3u);
  EXPECT_EQ(queue.pop(), 1);
  EXPECT_EQ(queue.pop(), 2);
  EXPECT_EQ(queue.pop(), 3);
  EXPECT_EQ(queue.pop(), std::nullopt);
}

TEST(AdmissionQueueTest, GivesTheItemBackWhenFull) {
  AdmissionQueue<std::unique_ptr<int>> queue(2);
  EXPECT_EQ(queue.push(std::make_unique<int>(1), at_ms(10)), std::nullopt);
  EXPECT_EQ(queue.push(std::make_unique<int>(2), at_ms(10)), std::nullopt);
  auto rejected = queue.push(std::make_unique<int>(3), at_ms(10));
  ASSERT_TRUE(rejected.has_value());
  ASSERT_NE(*rejected, nullptr);
  EXPECT_EQ(**rejected, 3);  // still the caller's, to answer 429
  EXPECT_EQ(queue.size(), 2u);
  queue.pop();
  EXPECT_EQ(queue.push(std::make_unique<int>(4), at_ms(20)), std::nullopt);  // room again
}

TEST(AdmissionQueueTest, ExpiresOnlyWhatIsDue) {
  AdmissionQueue<int> queue(8);
  queue.push(1, at_ms(10));
  queue.push(2, at_ms(20));
  queue.push(3, at_ms(20));
  queue.push(4, at_ms(30));
  EXPECT_EQ(queue.next_deadline(), at_ms(10));
  EXPECT_TRUE(queue.expire(at_ms(9)).empty());
  EXPECT_EQ(queue.expire(at_ms(20)), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(queue.next_deadline(), at_ms(30));
  EXPECT_EQ(queue.pop(), 4);
  EXPECT_EQ(queue.next_deadline(), std::nullopt);
}

TEST(AdmissionQueueTest, ZeroCapacityRejectsEverything) {
  AdmissionQueue<int> queue(0);
  EXPECT_EQ(queue.push(7, at_ms(1)), 7);
  EXPECT_EQ(queue.size(), 0u);
}

}  // namespace
}  // namespace flotilla::gateway

namespace flotilla::gateway {
namespace {

TEST(AdmissionQueueTest, RemovesAWaiterThatLeftAndFreesItsPlace) {
  AdmissionQueue<int> queue(2);
  const TimePoint deadline = at_ms(10);
  EXPECT_EQ(queue.push(1, deadline), std::nullopt);
  EXPECT_EQ(queue.push(2, deadline), std::nullopt);
  EXPECT_TRUE(queue.remove(1));
  EXPECT_FALSE(queue.remove(1));
  EXPECT_EQ(queue.push(3, deadline), std::nullopt);  // the freed place is usable
  EXPECT_EQ(queue.pop(), 2);
  EXPECT_EQ(queue.pop(), 3);
  EXPECT_EQ(queue.pop(), std::nullopt);
}

// A slot on a replica some waiters must not use (it failed them, or is of another version) goes
// to the oldest waiter that may use it; the others keep their places (issue 18 item 1).
TEST(AdmissionQueueTest, PopFirstSkipsWaitersThatCannotTakeTheSlot) {
  AdmissionQueue<int> queue(8);
  for (int id = 1; id <= 4; ++id) {
    EXPECT_EQ(queue.push(int{id}, at_ms(100)), std::nullopt);
  }
  EXPECT_EQ(*queue.front(), 1);
  EXPECT_EQ(queue.pop_first([](int id) { return id % 2 == 0; }), 2);
  EXPECT_EQ(queue.pop_first([](int id) { return id > 9; }), std::nullopt);
  EXPECT_EQ(queue.size(), 3u);
  EXPECT_EQ(queue.pop(), 1);
  EXPECT_EQ(queue.pop(), 3);
  EXPECT_EQ(queue.pop(), 4);
  EXPECT_EQ(queue.front(), nullptr);
}

// The simulator's use: time in seconds as a double, and a request lost with its replica put
// back ahead of the waiters, beyond the capacity (it held a place already).
TEST(AdmissionQueueTest, TakesAnyTimeTypeAndPutsARetryInFront) {
  AdmissionQueue<int, double> queue(2);
  EXPECT_EQ(queue.push(1, 5.5), std::nullopt);
  EXPECT_EQ(queue.push(2, 6.0), std::nullopt);
  queue.push_front(0, 5.0);
  EXPECT_EQ(queue.size(), 3u);
  EXPECT_EQ(queue.push(3, 7.0), 3);  // full
  EXPECT_EQ(queue.next_deadline(), 5.0);
  EXPECT_EQ(queue.expire(5.5), (std::vector<int>{0, 1}));
  EXPECT_EQ(queue.pop(), 2);
}

}  // namespace
}  // namespace flotilla::gateway

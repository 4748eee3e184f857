#include "gateway/admission.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fakes/common/fake_clock.h"

namespace flotilla::gateway {
namespace {

using flotilla::testing::FakeClock;
using std::chrono::milliseconds;

// Records what admission hands back instead of posting it to a worker loop.
class FakeCalls final : public CallHandler {
 public:
  void respond(ProxyCall&, http::Response&& response) override {
    answers.push_back(response.status);
  }
  void watch_client(const std::shared_ptr<ProxyCall>&) override { ++watched; }
  void post_forward(std::shared_ptr<ProxyCall> call,
                    std::shared_ptr<ReplicaRuntime> replica) override {
    forwarded.push_back(std::move(call));
    replicas.push_back(std::move(replica));
  }
  void post_respond(std::shared_ptr<ProxyCall>,
                    std::function<http::Response()> make_response) override {
    const http::Response response = make_response();
    answers.push_back(response.status);
    bodies.push_back(response.body);
  }
  void expire_after(const ProxyCall&, std::chrono::microseconds delay) override {
    timers.push_back(delay);
  }

  std::vector<int> answers;
  std::vector<std::string> bodies;
  std::vector<std::shared_ptr<ProxyCall>> forwarded;
  std::vector<std::shared_ptr<ReplicaRuntime>> replicas;  // the slots forwarded with them
  std::vector<std::chrono::microseconds> timers;
  int watched = 0;
};

class FakeRequester final : public CapacityRequester {
 public:
  void request_capacity(const std::string& endpoint) override { requests.push_back(endpoint); }
  std::vector<std::string> requests;
};

// One endpoint "fraud" with one replica whose cap is 1, and admission over a FakeClock.
class AdmissionTest : public ::testing::Test {
 protected:
  AdmissionTest(ReplicaState state = ReplicaState::kReady, size_t queue_capacity = 8) {
    options_.queue_timeout = milliseconds(5'000);
    options_.cold_start_timeout = milliseconds(60'000);
    endpoint_ = std::make_shared<EndpointRuntime>("fraud", queue_capacity, registry_, clock_);
    replica_ = std::make_shared<ReplicaRuntime>(
        "fraud", "v1", ReplicaEntry{"r1", "127.0.0.1", 9000, 1, state}, registry_);
    view_ = std::make_shared<EndpointView>();
    view_->runtime = endpoint_;
    view_->versions.push_back(VersionView{"v1", {replica_}});
    view_->weights = {100};
    {
      MutexLock lock(endpoint_->mutex);
      endpoint_->view = view_;
    }
    worker_.balancer = make_balancer(BalancerKind::kPowerOfTwo);
    worker_.random = std::make_unique<SeededRandom>(7);
  }

  // Waiters hold their endpoint: let them go.
  void TearDown() override {
    MutexLock lock(endpoint_->mutex);
    (void)endpoint_->queue.expire(TimePoint::max());
  }

  std::shared_ptr<ProxyCall> new_call() {
    auto call = std::make_shared<ProxyCall>(http::Responder(nullptr), http::Loop());
    call->view = view_.get();
    call->endpoint = endpoint_;
    return call;
  }

  FakeClock clock_;
  MetricsRegistry registry_;
  GatewayOptions options_;
  FakeCalls calls_;
  Admission admission_{options_, clock_, calls_};
  std::shared_ptr<EndpointRuntime> endpoint_;
  std::shared_ptr<ReplicaRuntime> replica_;
  std::shared_ptr<EndpointView> view_;
  WorkerState worker_;
};

TEST_F(AdmissionTest, AWaiterExpiresAtTheQueueTimeoutOnTheClock) {
  ASSERT_TRUE(replica_->try_acquire());  // the only slot is taken: the next call waits
  auto call = new_call();
  admission_.enqueue(call, worker_);
  EXPECT_FALSE(call->cold);
  EXPECT_EQ(call->state.load(), CallState::kQueued);
  EXPECT_EQ(endpoint_->queued.load(), 1);
  ASSERT_EQ(calls_.timers.size(), 1u);
  EXPECT_EQ(calls_.timers[0], milliseconds(5'000));
  EXPECT_EQ(calls_.watched, 1);

  clock_.advance(milliseconds(4'999));
  admission_.expire_waiting(endpoint_);  // a timer that fired early expires nothing
  EXPECT_TRUE(calls_.answers.empty());
  EXPECT_EQ(endpoint_->queued.load(), 1);

  clock_.advance(milliseconds(1));
  admission_.expire_waiting(endpoint_);
  ASSERT_EQ(calls_.answers, std::vector<int>{429});
  EXPECT_NE(calls_.bodies[0].find("no replica was free within 5000 ms"), std::string::npos);
  EXPECT_EQ(call->state.load(), CallState::kExpired);
  EXPECT_EQ(endpoint_->queued.load(), 0);
  EXPECT_EQ(endpoint_->rejected.load(), 1u);
}

TEST_F(AdmissionTest, AFreedSlotGoesToTheWaiterBeforeItsDeadline) {
  ASSERT_TRUE(replica_->try_acquire());
  auto call = new_call();
  admission_.enqueue(call, worker_);
  clock_.advance(milliseconds(1'000));
  replica_->release();
  admission_.dispatch_waiting(*endpoint_, *worker_.balancer, *worker_.random);
  ASSERT_EQ(calls_.forwarded.size(), 1u);
  EXPECT_EQ(calls_.forwarded[0], call);
  EXPECT_EQ(call->state.load(), CallState::kDispatched);
  EXPECT_EQ(endpoint_->queued.load(), 0);

  clock_.advance(milliseconds(10'000));
  admission_.expire_waiting(endpoint_);  // nothing left to expire
  EXPECT_TRUE(calls_.answers.empty());
}

TEST_F(AdmissionTest, ACancelledWaiterLeavesTheQueue) {
  ASSERT_TRUE(replica_->try_acquire());
  auto call = new_call();
  admission_.enqueue(call, worker_);
  EXPECT_TRUE(admission_.cancel(call));
  EXPECT_EQ(endpoint_->queued.load(), 0);
  EXPECT_FALSE(admission_.cancel(call));  // once
  clock_.advance(milliseconds(5'000));
  admission_.expire_waiting(endpoint_);
  EXPECT_TRUE(calls_.answers.empty());
}

TEST_F(AdmissionTest, AnAbandonedEndpointAnswersItsWaiters404) {
  ASSERT_TRUE(replica_->try_acquire());
  auto call = new_call();
  admission_.enqueue(call, worker_);
  admission_.abandon(*endpoint_);
  EXPECT_EQ(calls_.answers, std::vector<int>{404});
  EXPECT_EQ(endpoint_->queued.load(), 0);
}

class FullQueueTest : public AdmissionTest {
 protected:
  FullQueueTest() : AdmissionTest(ReplicaState::kReady, 1) {}
};

TEST_F(FullQueueTest, AFullQueueAnswers429AtOnce) {
  ASSERT_TRUE(replica_->try_acquire());
  auto first = new_call();
  auto second = new_call();
  admission_.enqueue(first, worker_);
  admission_.enqueue(second, worker_);
  EXPECT_EQ(calls_.answers, std::vector<int>{429});
  EXPECT_EQ(second->state.load(), CallState::kExpired);
  EXPECT_EQ(first->state.load(), CallState::kQueued);
  EXPECT_EQ(endpoint_->queued.load(), 1);
}

class ColdTest : public AdmissionTest {
 protected:
  ColdTest() : AdmissionTest(ReplicaState::kStarting) {}
};

TEST_F(ColdTest, AWaiterForAFirstReplicaWaitsTheColdStartTimeoutAndAsksForCapacity) {
  FakeRequester requester;
  admission_.set_capacity_requester(&requester);
  auto call = new_call();
  admission_.enqueue(call, worker_);
  EXPECT_TRUE(call->cold);
  EXPECT_EQ(requester.requests, std::vector<std::string>{"fraud"});
  ASSERT_EQ(calls_.timers.size(), 1u);
  EXPECT_EQ(calls_.timers[0], milliseconds(60'000));

  // A second cold waiter within the second asks again only once the second has passed.
  admission_.enqueue(new_call(), worker_);
  EXPECT_EQ(requester.requests.size(), 1u);
  clock_.advance(milliseconds(1'000));
  admission_.enqueue(new_call(), worker_);
  EXPECT_EQ(requester.requests.size(), 2u);

  clock_.advance(milliseconds(58'999));
  admission_.expire_waiting(endpoint_);
  EXPECT_TRUE(calls_.answers.empty());
  clock_.advance(milliseconds(1));  // the first two waiters' 60 s are up, not the third's
  admission_.expire_waiting(endpoint_);
  ASSERT_EQ(calls_.answers, (std::vector<int>{503, 503}));
  EXPECT_NE(calls_.bodies[0].find("none became ready within 60000 ms"), std::string::npos);
  EXPECT_EQ(endpoint_->queued.load(), 1);

  admission_.set_capacity_requester(nullptr);
  clock_.advance(milliseconds(5'000));
  admission_.enqueue(new_call(), worker_);
  EXPECT_EQ(requester.requests.size(), 2u);  // unsubscribed
}

}  // namespace
}  // namespace flotilla::gateway

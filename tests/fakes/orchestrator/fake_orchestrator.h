// An Orchestrator with no processes, for tests of what drives one (the control plane): ensure()
// makes a replica ready at once (an address of its own, nothing listening), drain() stops it,
// and watchers hear each change on the fake's own thread, as they do from a real driver. It
// stands in for a driver that cannot run in a unit test; the local driver has its own tests
// with real processes (tests/orchestrator).
#pragma once

#include <deque>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/common.h"
#include "orchestrator/orchestrator.h"

namespace flotilla::testing {

class FakeOrchestrator final : public orchestrator::Orchestrator {
 public:
  FakeOrchestrator() : thread_([this] { deliver(); }) {}
  ~FakeOrchestrator() override { shutdown(std::chrono::milliseconds(0)); }

  void ensure(const orchestrator::Deployment& deployment, int replicas) override {
    MutexLock lock(mu_);
    wanted_[deployment.key] = replicas;
    int live = 0;
    for (auto& [id, replica] : replicas_) {
      if (replica.deployment.key != deployment.key || replica.state == kStopped) {
        continue;
      }
      if (++live > replicas) {
        replica.state = kStopped;
        report(replica, "stopped");
      }
    }
    for (; live < replicas; ++live) {
      orchestrator::Replica replica;
      replica.id =
          deployment.endpoint + "-" + deployment.version + "-" + std::to_string(replicas_.size());
      replica.deployment = deployment;
      replica.host = "127.0.0.1";
      replica.port = static_cast<uint16_t>(20'000 + replicas_.size());
      replica.state = orchestrator::ReplicaState::kReady;
      report(replica, "ready");
      replicas_.emplace(replica.id, replica);
    }
  }

  Status drain(const std::string& replica_id) override {
    MutexLock lock(mu_);
    auto it = replicas_.find(replica_id);
    if (it == replicas_.end()) {
      return Status(StatusCode::kNotFound, "no replica '" + replica_id + "'");
    }
    it->second.state = kStopped;
    report(it->second, "stopped");
    return Status::ok();
  }

  std::vector<orchestrator::Replica> list() const override {
    MutexLock lock(mu_);
    std::vector<orchestrator::Replica> live;
    for (const auto& [id, replica] : replicas_) {
      if (replica.state != kStopped) {
        live.push_back(replica);
      }
    }
    return live;
  }

  std::vector<orchestrator::UsageReading> usage(const std::vector<std::string>& replica_ids,
                                                std::chrono::milliseconds) override {
    std::vector<orchestrator::UsageReading> readings;
    for (const std::string& id : replica_ids) {
      readings.push_back({id, 0.0, 0, 0.0, real_clock().now()});
    }
    return readings;
  }

  void watch(std::function<void(const orchestrator::ReplicaEvent&)> on_change) override {
    MutexLock lock(mu_);
    watchers_.push_back(std::move(on_change));
  }
  void adopt(std::vector<orchestrator::Replica> replicas) override {
    MutexLock lock(mu_);
    for (orchestrator::Replica& replica : replicas) {
      report(replica, "lost");
    }
  }
  // Stops reporting: when it returns no watcher runs, nor will (as a real driver after its
  // shutdown), so the watchers' owner may be destroyed.
  void shutdown(std::chrono::milliseconds) override {
    {
      MutexLock lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) {
      thread_.join();
    }
  }

  // The count the last ensure() of `key` asked for; -1 when it was never named.
  int wanted(const std::string& key) const {
    MutexLock lock(mu_);
    auto it = wanted_.find(key);
    return it == wanted_.end() ? -1 : it->second;
  }
  // Blocks until some deployment of `endpoint` is wanted with at least `count` replicas, or
  // `timeout` passes (false). A bound on a wait, not a timed expectation.
  bool wait_for_wanted(const std::string& endpoint, int count, std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    MutexLock lock(mu_);
    while (true) {
      for (const auto& [key, wanted] : wanted_) {
        if (key.starts_with(endpoint) && wanted >= count) {
          return true;
        }
      }
      if (!changed_.wait_until(mu_, deadline)) {
        return false;
      }
    }
  }

 private:
  static constexpr orchestrator::ReplicaState kStopped = orchestrator::ReplicaState::kStopped;

  void report(const orchestrator::Replica& replica, std::string kind) FLOTILLA_REQUIRES(mu_) {
    events_.push_back({replica, std::move(kind), ""});
    wake_.notify_all();
    changed_.notify_all();
  }

  // Watchers run here, without mu_: they may call back into the fake.
  void deliver() {
    while (true) {
      orchestrator::ReplicaEvent event;
      std::vector<std::function<void(const orchestrator::ReplicaEvent&)>> watchers;
      {
        MutexLock lock(mu_);
        while (!stopping_ && events_.empty()) {
          wake_.wait(mu_);
        }
        if (stopping_) {
          return;
        }
        event = std::move(events_.front());
        events_.pop_front();
        watchers = watchers_;
      }
      for (const auto& watcher : watchers) {
        watcher(event);
      }
    }
  }

  mutable Mutex mu_;
  CondVar wake_;
  CondVar changed_;
  bool stopping_ FLOTILLA_GUARDED_BY(mu_) = false;
  std::map<std::string, orchestrator::Replica> replicas_ FLOTILLA_GUARDED_BY(mu_);
  std::map<std::string, int> wanted_ FLOTILLA_GUARDED_BY(mu_);
  std::deque<orchestrator::ReplicaEvent> events_ FLOTILLA_GUARDED_BY(mu_);
  std::vector<std::function<void(const orchestrator::ReplicaEvent&)>> watchers_
      FLOTILLA_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace flotilla::testing

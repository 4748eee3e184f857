// A GatewaySink that records what the control plane publishes (tables, tokens, the capacity
// requester) and serves the load samples a test sets, so the control plane is tested without a
// gateway process. Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/common.h"
#include "gateway/gateway.h"

namespace flotilla::testing {

class RecordingGateway final : public gateway::GatewaySink {
 public:
  Status update_table(gateway::EndpointTable table) override {
    if (Status valid = gateway::validate_endpoint_table(table); !valid.is_ok()) {
      return valid;
    }
    MutexLock lock(mu_);
    table_ = std::move(table);
    ++table_updates_;
    changed_.notify_all();
    return Status::ok();
  }
  void update_auth(gateway::AuthConfig auth) override {
    MutexLock lock(mu_);
    auth_ = std::move(auth);
    ++auth_updates_;
    changed_.notify_all();
  }
  std::vector<LoadSample> samples(const std::string& endpoint, size_t seconds) const override {
    MutexLock lock(mu_);
    ++sample_reads_;
    changed_.notify_all();
    auto it = samples_.find(endpoint);
    if (it == samples_.end()) {
      return {};
    }
    const std::vector<LoadSample>& all = it->second;
    return {all.end() - static_cast<std::ptrdiff_t>(std::min(seconds, all.size())), all.end()};
  }
  void set_capacity_requester(gateway::CapacityRequester* requester) override {
    MutexLock lock(mu_);
    requester_ = requester;
  }

  gateway::EndpointTable table() const {
    MutexLock lock(mu_);
    return table_;
  }
  gateway::AuthConfig auth() const {
    MutexLock lock(mu_);
    return auth_;
  }
  int table_updates() const {
    MutexLock lock(mu_);
    return table_updates_;
  }
  gateway::CapacityRequester* requester() const {
    MutexLock lock(mu_);
    return requester_;
  }
  void set_samples(const std::string& endpoint, std::vector<LoadSample> samples) {
    MutexLock lock(mu_);
    samples_[endpoint] = std::move(samples);
  }
  // How many times samples() was called: each pass of the control plane's autoscaler reads
  // each endpoint's samples once.
  int sample_reads() const {
    MutexLock lock(mu_);
    return sample_reads_;
  }
  // Blocks until sample_reads() reaches `reads`, or `timeout` passes (false).
  bool wait_for_sample_reads(int reads, std::chrono::seconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    MutexLock lock(mu_);
    while (sample_reads_ < reads) {
      if (!changed_.wait_until(mu_, deadline)) {
        return sample_reads_ >= reads;
      }
    }
    return true;
  }
  // Blocks until `done(table)` holds for the last table published, or `timeout` passes (false).
  // A bound on a wait, not a timed expectation.
  bool wait_for_table(const std::function<bool(const gateway::EndpointTable&)>& done,
                      std::chrono::seconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    MutexLock lock(mu_);
    while (!done(table_)) {
      if (!changed_.wait_until(mu_, deadline)) {
        return done(table_);
      }
    }
    return true;
  }

 private:
  mutable Mutex mu_;
  mutable CondVar changed_;
  gateway::EndpointTable table_ FLOTILLA_GUARDED_BY(mu_);
  gateway::AuthConfig auth_ FLOTILLA_GUARDED_BY(mu_);
  int table_updates_ FLOTILLA_GUARDED_BY(mu_) = 0;
  int auth_updates_ FLOTILLA_GUARDED_BY(mu_) = 0;
  mutable int sample_reads_ FLOTILLA_GUARDED_BY(mu_) = 0;
  gateway::CapacityRequester* requester_ FLOTILLA_GUARDED_BY(mu_) = nullptr;
  std::map<std::string, std::vector<LoadSample>> samples_ FLOTILLA_GUARDED_BY(mu_);
};

}  // namespace flotilla::testing

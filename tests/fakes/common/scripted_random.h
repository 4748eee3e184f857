// A fake Random that returns scripted draws, for tests that must know which replicas a policy
// samples. Each uniform(n) returns the next scripted value (which must be < n).
#pragma once

#include <deque>

#include <gtest/gtest.h>

#include "common/common.h"

namespace flotilla::testing {

class ScriptedRandom final : public Random {
 public:
  explicit ScriptedRandom(std::initializer_list<uint64_t> draws) : draws_(draws) {}
  uint64_t next() override { return 0; }
  uint64_t uniform(uint64_t n) override {
    EXPECT_FALSE(draws_.empty()) << "the policy drew more values than scripted";
    if (draws_.empty()) {
      return 0;
    }
    const uint64_t value = draws_.front();
    draws_.pop_front();
    EXPECT_LT(value, n);
    return value;
  }
  size_t remaining() const { return draws_.size(); }

 private:
  std::deque<uint64_t> draws_;
};

}  // namespace flotilla::testing

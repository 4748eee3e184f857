// Sampling: greedy, top-k and top-p truncation, temperature, seeds and logprobs. Frequencies are
// measured with fixed seeds, so each check is deterministic.
#include "llm/sampler.h"

#include <cmath>

#include <gtest/gtest.h>

namespace flotilla::llm {
namespace {

const std::vector<float> kLogits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                    std::log(0.05f)};

std::vector<int> histogram(const SamplingParams& params, int draws, uint64_t seed = 1) {
  Sampler sampler;
  std::mt19937_64 rng(seed);
  std::vector<int> counts(kLogits.size());
  for (int i = 0; i < draws; ++i) {
    ++counts[sampler.sample(kLogits, params, rng, nullptr)];
  }
  return counts;
}

TEST(SamplerTest, GreedyTakesTheLargestLogit) {
  SamplingParams params;
  params.temperature = 0;
  EXPECT_EQ(histogram(params, 100), (std::vector<int>{100, 0, 0, 0}));
  params.temperature = 1;
  params.top_k = 1;
  EXPECT_EQ(histogram(params, 100), (std::vector<int>{100, 0, 0, 0}));
}

TEST(SamplerTest, TemperatureOneFollowsTheDistribution) {
  SamplingParams params;
  std::vector<int> counts = histogram(params, 20000);
  std::vector<double> expected = {0.5, 0.3, 0.15, 0.05};
  for (size_t i = 0; i < counts.size(); ++i) {
    EXPECT_NEAR(counts[i] / 20000.0, expected[i], 0.015) << i;
  }
}

TEST(SamplerTest, LowTemperatureSharpensAndHighFlattens) {
  SamplingParams cold, hot;
  cold.temperature = 0.2;
  hot.temperature = 5;
  EXPECT_GT(histogram(cold, 5000)[0], 4500);
  EXPECT_GT(histogram(hot, 5000)[3], 700);
}

TEST(SamplerTest, TopKAndTopPTruncate) {
  SamplingParams top_k;
  top_k.top_k = 2;
  std::vector<int> counts = histogram(top_k, 5000);
  EXPECT_EQ(counts[2] + counts[3], 0);
  EXPECT_NEAR(counts[0] / 5000.0, 0.5 / 0.8, 0.03);
  SamplingParams top_p;
  top_p.top_p = 0.75;  // 0.5 + 0.3 reaches it: the last two never come
  counts = histogram(top_p, 5000);
  EXPECT_EQ(counts[2] + counts[3], 0);
  top_p.top_p = 0.1;  // the first alone
  EXPECT_EQ(histogram(top_p, 100), (std::vector<int>{100, 0, 0, 0}));
}

TEST(SamplerTest, SeedsReproduce) {
  SamplingParams params;
  EXPECT_EQ(histogram(params, 50, 42), histogram(params, 50, 42));
  Sampler sampler;
  std::mt19937_64 a(5), b(5);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(sampler.sample(kLogits, params, a, nullptr),
              sampler.sample(kLogits, params, b, nullptr));
  }
}

TEST(SamplerTest, LogprobsComeFromTheUnmodifiedDistribution) {
  SamplingParams params;
  params.temperature = 0;
  params.logprobs = 2;
  Sampler sampler;
  std::mt19937_64 rng(1);
  TokenLogprob logprob;
  EXPECT_EQ(sampler.sample(kLogits, params, rng, &logprob), 0);
  EXPECT_NEAR(logprob.logprob, std::log(0.5), 1e-5);
  ASSERT_EQ(logprob.top.size(), 2u);
  EXPECT_EQ(logprob.top[1].first, 1);
  EXPECT_NEAR(logprob.top[1].second, std::log(0.3), 1e-5);
}

TEST(SamplerTest, ValidateNamesTheBadParameter) {
  auto message = [](auto edit) {
    SamplingParams params;
    edit(params);
    return validate(params).message();
  };
  EXPECT_NE(message([](auto& p) { p.temperature = -0.5; }).find("temperature"), std::string::npos);
  EXPECT_NE(message([](auto& p) { p.top_p = 0; }).find("top_p"), std::string::npos);
  EXPECT_NE(message([](auto& p) { p.top_k = -3; }).find("top_k"), std::string::npos);
  EXPECT_NE(message([](auto& p) { p.max_tokens = 0; }).find("max_tokens"), std::string::npos);
  EXPECT_NE(message([](auto& p) { p.logprobs = 50; }).find("logprobs"), std::string::npos);
  EXPECT_NE(message([](auto& p) { p.stop = {""}; }).find("stop"), std::string::npos);
  EXPECT_TRUE(validate(SamplingParams{}).is_ok());
}

}  // namespace
}  // namespace flotilla::llm

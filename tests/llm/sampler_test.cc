// Sampling: greedy, top-k and top-p truncation, temperature, seeds and logprobs. Frequencies are
// measured with fixed seeds, so each check is deterministic.
#include "llm/sampler.h"

#include <algorithm>
#include <cmath>
#include <random>

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

// Greedy is the first index of the largest logit wherever it lies: in the vectorized body, in
// the tail past the last 16, tied with a later equal value, or below 16 logits; and with a NaN
// among them it answers as std::max_element does.
TEST(SamplerTest, GreedyTakesTheFirstLargestLogitAtAnyPositionAndLength) {
  SamplingParams params;
  params.temperature = 0;
  Sampler sampler;
  std::mt19937_64 rng(1);
  for (int vocab : {1, 5, 15, 16, 17, 31, 32, 33, 1000, 32000}) {
    for (int at : {0, vocab / 3, vocab - 1}) {
      std::vector<float> logits(vocab);
      for (int i = 0; i < vocab; ++i) {
        logits[i] = -static_cast<float>((i * 7919) % 1009) / 100.0f;  // all <= 0
      }
      logits[at] = 3.0f;
      if (at + 5 < vocab) {
        logits[at + 5] = 3.0f;  // a tie: the first wins
      }
      EXPECT_EQ(sampler.sample(logits, params, rng, nullptr), at) << vocab << " " << at;
      logits[vocab / 2] = std::nanf("");
      const auto expected = std::max_element(logits.begin(), logits.end()) - logits.begin();
      EXPECT_EQ(sampler.sample(logits, params, rng, nullptr), expected) << vocab << " " << at;
    }
  }
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

// softmax(logits / temperature) over `kept` (token ids), zero elsewhere: what a distribution
// must equal exactly.
std::vector<double> softmax(const std::vector<double>& logits, std::vector<int> kept,
                            double temperature = 1) {
  std::vector<double> out(logits.size(), 0.0);
  double total = 0;
  for (int token : kept) {
    total += std::exp(logits[token] / temperature);
  }
  for (int token : kept) {
    out[token] = std::exp(logits[token] / temperature) / total;
  }
  return out;
}

// Sampler::distribution as a dense vector by token id.
std::vector<double> dense(Sampler& sampler, const std::vector<float>& logits,
                          const SamplingParams& params, const SamplingContext& context = {}) {
  Sampler::Distribution d = sampler.distribution(logits, params, context);
  std::vector<double> out(logits.size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    out[d.tokens[i]] = d.probabilities[i];
    total += d.probabilities[i];
  }
  EXPECT_NEAR(total, 1.0, 1e-9);
  return out;
}

void expect_distribution(const std::vector<double>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-6) << "token " << i;
  }
}

std::vector<double> as_double(const std::vector<float>& logits) {
  return std::vector<double>(logits.begin(), logits.end());
}

TEST(SamplerTest, MinPDropsTokensBelowItsShareOfTheLikeliest) {
  Sampler sampler;
  SamplingParams params;
  params.min_p = 0.35;  // 0.35 * 0.5 = 0.175: 0.15 and 0.05 go
  expect_distribution(dense(sampler, kLogits, params), softmax(as_double(kLogits), {0, 1}));
  params.min_p = 0.2;  // 0.1: only 0.05 goes
  expect_distribution(dense(sampler, kLogits, params), softmax(as_double(kLogits), {0, 1, 2}));
  params.min_p = 1;  // the likeliest alone
  expect_distribution(dense(sampler, kLogits, params), {1, 0, 0, 0});
  // It reads the distribution after temperature: at T = 2 the shares are sqrt(p / 0.5) (1,
  // 0.77, 0.55, 0.32), so 0.5 keeps three tokens where T = 1 (1, 0.6, 0.3, 0.1) keeps two.
  params.min_p = 0.5;
  params.temperature = 2;
  expect_distribution(dense(sampler, kLogits, params), softmax(as_double(kLogits), {0, 1, 2}, 2));
  params.temperature = 1;
  expect_distribution(dense(sampler, kLogits, params), softmax(as_double(kLogits), {0, 1}));
}

TEST(SamplerTest, MinPThenTopKThenTopPRenormalize) {
  Sampler sampler;
  SamplingParams params;
  params.min_p = 0.2;  // keeps 0.5, 0.3, 0.15 (mass 0.95)
  params.top_p = 0.8;  // of the kept: 0.526 + 0.316 = 0.842 reaches 0.8, so two stay
  expect_distribution(dense(sampler, kLogits, params), softmax(as_double(kLogits), {0, 1}));
  params.top_p = 1;
  params.top_k = 2;
  expect_distribution(dense(sampler, kLogits, params), softmax(as_double(kLogits), {0, 1}));
  // Sampled frequencies follow it.
  params = SamplingParams();
  params.min_p = 0.2;
  std::vector<int> counts = histogram(params, 20000);
  EXPECT_EQ(counts[3], 0);
  EXPECT_NEAR(counts[2] / 20000.0, 0.15 / 0.95, 0.015);
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOfSeenTokens) {
  const std::vector<float> logits = {2.0f, 1.0f, -1.0f, 0.5f, 0.0f};
  const std::vector<int32_t> tokens = {0, 2, 0, 4, 2};  // prompt {0, 2}, output {0, 4, 2}
  Sampler sampler;
  SamplingParams params;
  params.repetition_penalty = 2;
  // Seen (prompt or output), once however often: 0: 2 / 2; 2: -1 * 2; 4: 0 stays 0.
  expect_distribution(dense(sampler, logits, params, {tokens, 2}),
                      softmax({1.0, 1.0, -2.0, 0.5, 0.0}, {0, 1, 2, 3, 4}));
  // The prompt counts too: with no output yet, the same tokens 0 and 2 are penalized.
  expect_distribution(dense(sampler, logits, params, {std::span(tokens).first(2), 2}),
                      softmax({1.0, 1.0, -2.0, 0.5, 0.0}, {0, 1, 2, 3, 4}));
  // Below 1 it rewards repetition instead.
  params.repetition_penalty = 0.5;
  expect_distribution(dense(sampler, logits, params, {tokens, 2}),
                      softmax({4.0, 1.0, -0.5, 0.5, 0.0}, {0, 1, 2, 3, 4}));
  // Without a context, or at 1, nothing changes.
  expect_distribution(dense(sampler, logits, params), softmax(as_double(logits), {0, 1, 2, 3, 4}));
  params.repetition_penalty = 1;
  expect_distribution(dense(sampler, logits, params, {tokens, 2}),
                      softmax(as_double(logits), {0, 1, 2, 3, 4}));
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesCountTheOutputOnly) {
  const std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f};
  const std::vector<int32_t> tokens = {3, 3, 0, 0, 1};  // prompt {3, 3}, output {0, 0, 1}
  Sampler sampler;
  SamplingParams params;
  params.frequency_penalty = 0.5;
  params.presence_penalty = 0.25;
  // 0: 1 - 0.5 * 2 - 0.25; 1: 1 - 0.5 - 0.25; 2 unseen; 3 only in the prompt: unchanged.
  const std::vector<double> expected = softmax({-0.25, 0.25, 1.0, 1.0}, {0, 1, 2, 3});
  expect_distribution(dense(sampler, logits, params, {tokens, 2}), expected);
  // The same call again gives the same answer: no count survives a call.
  expect_distribution(dense(sampler, logits, params, {tokens, 2}), expected);
  // Negative values reward what was said.
  params.frequency_penalty = 0;
  params.presence_penalty = -1;
  expect_distribution(dense(sampler, logits, params, {tokens, 2}),
                      softmax({2.0, 2.0, 1.0, 1.0}, {0, 1, 2, 3}));
}

TEST(SamplerTest, LogitBiasIsAddedFirst) {
  const std::vector<float> logits = {0.0f, 0.0f, 0.0f};
  Sampler sampler;
  SamplingParams params;
  params.logit_bias = {{2, std::log(2.0f)}};
  expect_distribution(dense(sampler, logits, params), {0.25, 0.25, 0.5});
  params.logit_bias = {{1, -100.0f}};
  EXPECT_NEAR(dense(sampler, logits, params)[1], 0, 1e-40);
  params.temperature = 0;
  params.logit_bias = {{1, 0.5f}};
  expect_distribution(dense(sampler, logits, params), {0, 1, 0});
  // Then the repetition penalty divides the biased logit: (1 + 1) / 2 = 1 vs 0.
  const std::vector<float> two = {1.0f, 0.0f};
  const std::vector<int32_t> tokens = {0};
  params = SamplingParams();
  params.logit_bias = {{0, 1.0f}};
  params.repetition_penalty = 2;
  expect_distribution(dense(sampler, two, params, {tokens, 1}), softmax({1.0, 0.0}, {0, 1}));
}

TEST(SamplerTest, PenaltiesComeBeforeTemperatureAndTruncation) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -1.0f};
  const std::vector<int32_t> tokens = {0, 0};  // prompt {0}, output {0}
  Sampler sampler;
  SamplingParams params;
  params.temperature = 0.5;
  params.frequency_penalty = 1.5;  // 0: 2 - 1.5 = 0.5
  params.top_k = 2;                // then the top two of {0.5, 1, 0, -1}: 1 and 0
  expect_distribution(dense(sampler, logits, params, {tokens, 1}),
                      softmax({0.5, 1.0, 0.0, -1.0}, {0, 1}, 0.5));
}

TEST(SamplerTest, PenaltiesChangeTheGreedyChoiceButNotTheLogprobs) {
  const std::vector<float> logits = {3.0f, 2.9f, 0.0f, -1.0f};
  const std::vector<int32_t> tokens = {2, 0};  // prompt {2}, output {0}
  Sampler sampler;
  std::mt19937_64 rng(1);
  SamplingParams params;
  params.temperature = 0;
  params.logprobs = 1;
  TokenLogprob logprob;
  EXPECT_EQ(sampler.sample(logits, params, rng, &logprob, {tokens, 1}), 0);
  const float unpenalized = logprob.logprob;
  params.repetition_penalty = 1.5;  // 3 / 1.5 = 2 < 2.9
  EXPECT_EQ(sampler.sample(logits, params, rng, &logprob, {tokens, 1}), 1);
  params.repetition_penalty = 1;
  params.presence_penalty = 0.2;  // 2.8 < 2.9
  EXPECT_EQ(sampler.sample(logits, params, rng, &logprob, {tokens, 1}), 1);
  // Logprobs are those of the model's own distribution, as OpenAI and vLLM report them.
  ASSERT_EQ(logprob.top.size(), 1u);
  EXPECT_EQ(logprob.top[0].first, 0);
  EXPECT_NEAR(logprob.top[0].second, unpenalized, 1e-6);
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
  EXPECT_NE(message([](auto& p) { p.min_p = 1.5; }).find("min_p"), std::string::npos);
  EXPECT_NE(message([](auto& p) { p.repetition_penalty = 0; }).find("repetition_penalty"),
            std::string::npos);
  EXPECT_NE(message([](auto& p) { p.presence_penalty = -2.5; }).find("presence_penalty"),
            std::string::npos);
  EXPECT_NE(message([](auto& p) { p.frequency_penalty = 2.5; }).find("frequency_penalty"),
            std::string::npos);
  EXPECT_NE(message([](auto& p) {
              p.logit_bias = {{3, 200.0f}};
            }).find("logit_bias"),
            std::string::npos);
  EXPECT_TRUE(validate(SamplingParams{}).is_ok());
}

}  // namespace
}  // namespace flotilla::llm

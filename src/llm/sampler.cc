#include "llm/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace flotilla::llm {
namespace {

// A guard against overflow, far above what anyone uses (1.0-1.5).
constexpr double kMaxRepetitionPenalty = 100;

// The first index of the largest logit, as std::max_element gives it. Its one pass carries a
// compare-and-select chain through every element: on 32,000 logits that was 4% of a 16-client
// bf16 replica's time, all of it on the engine's thread between steps. Here the largest value
// comes from 16 lanes of SSE maxima (GCC 12 at -O2 leaves the plain loop scalar), then its
// first occurrence from a search.
int32_t argmax(std::span<const float> logits) {
  const auto largest_first = [&] {
    return std::max_element(logits.begin(), logits.end()) - logits.begin();
  };
#if defined(__SSE2__)
  const size_t n = logits.size();
  if (n < 16) {
    return static_cast<int32_t>(largest_first());
  }
  const float* p = logits.data();
  __m128 m0 = _mm_loadu_ps(p), m1 = _mm_loadu_ps(p + 4), m2 = _mm_loadu_ps(p + 8),
         m3 = _mm_loadu_ps(p + 12);
  size_t i = 16;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm_max_ps(m0, _mm_loadu_ps(p + i));
    m1 = _mm_max_ps(m1, _mm_loadu_ps(p + i + 4));
    m2 = _mm_max_ps(m2, _mm_loadu_ps(p + i + 8));
    m3 = _mm_max_ps(m3, _mm_loadu_ps(p + i + 12));
  }
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3)));
  float largest = std::max({lanes[0], lanes[1], lanes[2], lanes[3]});
  for (; i < n; ++i) {
    largest = std::max(largest, p[i]);
  }
  const auto first = std::find(logits.begin(), logits.end(), largest);
  if (first != logits.end()) {
    return static_cast<int32_t>(first - logits.begin());
  }
  // Not found only with a NaN among the logits (maxps passes its second operand on a NaN).
#endif
  return static_cast<int32_t>(largest_first());
}

void fill_logprobs(std::span<const float> logits, int32_t token, int top, TokenLogprob& out,
                   std::vector<int32_t>& order) {
  float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) {
    sum += std::exp(static_cast<double>(l - max_logit));
  }
  float log_sum = max_logit + static_cast<float>(std::log(sum));
  out.token = token;
  out.logprob = logits[token] - log_sum;
  order.resize(logits.size());
  std::iota(order.begin(), order.end(), 0);
  int k = std::min<int>(top, static_cast<int>(logits.size()));
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  out.top.clear();
  for (int i = 0; i < k; ++i) {
    out.top.emplace_back(order[i], logits[order[i]] - log_sum);
  }
}

}  // namespace

Status validate(const SamplingParams& params) {
  if (!(params.temperature >= 0) || params.temperature > 100) {
    return invalid_argument("temperature must be in [0, 100]");
  }
  if (params.top_k < 0) {
    return invalid_argument("top_k must be 0 (off) or positive");
  }
  if (!(params.top_p > 0) || params.top_p > 1) {
    return invalid_argument("top_p must be in (0, 1]");
  }
  if (!(params.min_p >= 0) || params.min_p > 1) {
    return invalid_argument("min_p must be in [0, 1]");
  }
  if (!(params.repetition_penalty > 0) || params.repetition_penalty > kMaxRepetitionPenalty) {
    return invalid_argument("repetition_penalty must be in (0, 100]");
  }
  if (!(params.presence_penalty >= -2) || params.presence_penalty > 2) {
    return invalid_argument("presence_penalty must be in [-2, 2]");
  }
  if (!(params.frequency_penalty >= -2) || params.frequency_penalty > 2) {
    return invalid_argument("frequency_penalty must be in [-2, 2]");
  }
  for (const auto& [token, bias] : params.logit_bias) {
    if (token < 0 || !(bias >= -100 && bias <= 100)) {
      return invalid_argument("logit_bias must map token ids to values in [-100, 100]");
    }
  }
  if (params.max_tokens < 1) {
    return invalid_argument("max_tokens must be at least 1");
  }
  if (params.logprobs < 0 || params.logprobs > 20) {
    return invalid_argument("logprobs must be in [0, 20]");
  }
  for (const std::string& stop : params.stop) {
    if (stop.empty()) {
      return invalid_argument("stop strings must not be empty");
    }
  }
  return Status::ok();
}

std::span<const float> Sampler::penalize(std::span<const float> logits,
                                         const SamplingParams& params,
                                         const SamplingContext& context) {
  const bool repetition = params.repetition_penalty != 1 && !context.tokens.empty();
  const bool output = (params.presence_penalty != 0 || params.frequency_penalty != 0) &&
                      static_cast<int>(context.tokens.size()) > context.prompt_length;
  if (!repetition && !output && params.logit_bias.empty()) {
    return logits;
  }
  const auto vocab = static_cast<int32_t>(logits.size());
  penalized_.assign(logits.begin(), logits.end());
  // vLLM's order: the bias first, then the penalties read the biased logits.
  for (const auto& [token, bias] : params.logit_bias) {
    if (token >= 0 && token < vocab) {  // the engine refuses ids outside the vocabulary
      penalized_[token] += bias;
    }
  }
  // Both stay all zero between calls: each pass below undoes what it marked.
  output_counts_.resize(logits.size());
  seen_.resize(logits.size());
  auto in_vocab = [vocab](int32_t token) {
    return token >= 0 && token < vocab;
  };
  const size_t prompt_length =
      std::min(static_cast<size_t>(std::max(context.prompt_length, 0)), context.tokens.size());
  if (repetition) {
    // HF and vLLM: a seen token's logit is divided by the penalty when positive, multiplied by
    // it otherwise, once however often it was seen.
    const auto penalty = static_cast<float>(params.repetition_penalty);
    for (int32_t token : context.tokens) {
      if (in_vocab(token) && !seen_[token]) {
        seen_[token] = 1;
        float& logit = penalized_[token];
        logit = logit > 0 ? logit / penalty : logit * penalty;
      }
    }
    for (int32_t token : context.tokens) {
      if (in_vocab(token)) {
        seen_[token] = 0;
      }
    }
  }
  if (output) {
    // OpenAI: logit -= frequency_penalty * count + presence_penalty * (count > 0), over the
    // generated tokens only.
    const std::span<const int32_t> generated = context.tokens.subspan(prompt_length);
    for (int32_t token : generated) {
      if (in_vocab(token)) {
        ++output_counts_[token];
      }
    }
    for (int32_t token : generated) {
      if (in_vocab(token) && output_counts_[token] > 0) {
        penalized_[token] -= static_cast<float>(params.frequency_penalty * output_counts_[token] +
                                                params.presence_penalty);
        output_counts_[token] = 0;  // applied once; and back to zero for the next call
      }
    }
  }
  return penalized_;
}

Sampler::Distribution Sampler::distribution(std::span<const float> raw_logits,
                                            const SamplingParams& params,
                                            const SamplingContext& context) {
  const std::span<const float> logits = penalize(raw_logits, params, context);
  if (params.temperature == 0 || params.top_k == 1) {
    order_.assign(1, argmax(logits));
    probabilities_.assign(1, 1.0);
    return {order_, probabilities_};
  }
  const int vocab = static_cast<int>(logits.size());
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  const double inverse_temperature = 1.0 / params.temperature;
  order_.resize(vocab);
  int candidates = vocab;
  if (params.min_p <= 0) {
    std::iota(order_.begin(), order_.end(), 0);
  } else {
    // p / p_max = exp((logit - max) / T) >= min_p, so logit >= max + T ln(min_p). The most
    // likely token always stays; the candidates keep id order.
    const double floor = max_logit + params.temperature * std::log(params.min_p);
    candidates = 0;
    for (int32_t token = 0; token < vocab; ++token) {
      if (logits[token] >= floor) {
        order_[candidates++] = token;
      }
    }
  }
  // Most likely first: the top k, or all candidates for top-p alone.
  const int sorted = params.top_k > 0 ? std::min(params.top_k, candidates) : candidates;
  if (params.top_p < 1 || sorted < candidates) {
    std::partial_sort(order_.begin(), order_.begin() + sorted, order_.begin() + candidates,
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  }
  candidates = sorted;
  probabilities_.resize(candidates);
  double total = 0;
  for (int i = 0; i < candidates; ++i) {
    probabilities_[i] = std::exp((logits[order_[i]] - max_logit) * inverse_temperature);
    total += probabilities_[i];
  }
  if (params.top_p < 1) {
    // Keep the smallest prefix whose mass reaches top_p (at least one token).
    double kept = 0;
    int keep = 0;
    while (keep < candidates && kept < params.top_p * total) {
      kept += probabilities_[keep++];
    }
    candidates = keep;
    total = kept;
  }
  for (int i = 0; i < candidates; ++i) {
    probabilities_[i] /= total;
  }
  return {std::span<const int32_t>(order_).first(candidates),
          std::span<const double>(probabilities_).first(candidates)};
}

int32_t Sampler::sample(std::span<const float> logits, const SamplingParams& params,
                        std::mt19937_64& rng, TokenLogprob* logprob,
                        const SamplingContext& context) {
  const Distribution d = distribution(logits, params, context);
  int32_t token = d.tokens.back();
  if (d.tokens.size() > 1) {
    double draw = std::uniform_real_distribution<double>(0, 1)(rng);
    for (size_t i = 0; i < d.tokens.size(); ++i) {
      draw -= d.probabilities[i];
      if (draw < 0) {
        token = d.tokens[i];
        break;
      }
    }
  }
  if (logprob != nullptr && params.logprobs > 0) {
    fill_logprobs(logits, token, params.logprobs, *logprob, order_);
  }
  return token;
}

}  // namespace flotilla::llm

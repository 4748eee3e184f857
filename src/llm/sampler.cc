#include "llm/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace flotilla::llm {
namespace {

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
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

int32_t Sampler::sample(std::span<const float> logits, const SamplingParams& params,
                        std::mt19937_64& rng, TokenLogprob* logprob) {
  int32_t token;
  if (params.temperature == 0 || params.top_k == 1) {
    token = argmax(logits);
  } else {
    const int vocab = static_cast<int>(logits.size());
    const float max_logit = *std::max_element(logits.begin(), logits.end());
    const float inverse_temperature = static_cast<float>(1.0 / params.temperature);
    // Candidates most likely first: the top k, or all of them for top-p alone.
    int candidates = params.top_k > 0 ? std::min(params.top_k, vocab) : vocab;
    order_.resize(vocab);
    std::iota(order_.begin(), order_.end(), 0);
    auto by_logit = [&](int32_t a, int32_t b) {
      return logits[a] > logits[b];
    };
    if (params.top_p < 1 || candidates < vocab) {
      std::partial_sort(order_.begin(), order_.begin() + candidates, order_.end(), by_logit);
    }
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
    double draw = std::uniform_real_distribution<double>(0, total)(rng);
    token = order_[candidates - 1];
    for (int i = 0; i < candidates; ++i) {
      draw -= probabilities_[i];
      if (draw < 0) {
        token = order_[i];
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

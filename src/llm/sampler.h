// Picks the next token from a row of logits: greedy, or temperature with min-p, top-k and top-p,
// from a per-sequence random generator (seeded: reproducible), after the repetition, presence
// and frequency penalties of the sequence so far.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "llm/llm.h"

namespace flotilla::llm {

// The sequence a token is sampled for, which the penalties read: its prompt, then what it has
// generated so far.
struct SamplingContext {
  std::span<const int32_t> tokens;
  int prompt_length = 0;  // tokens[0, prompt_length) is the prompt
};

// Confined to one thread (the engine's): it reuses buffers between calls.
class Sampler {
 public:
  // The distribution sample() draws from: candidate tokens and their probabilities (summing
  // to 1), after, in this order (vLLM's): the logit bias, the repetition penalty over prompt
  // and output, the frequency and presence penalties over the output, temperature, min-p,
  // top-k and top-p.
  // Greedy (temperature 0 or top_k 1): the one most likely token of the penalized logits.
  // Candidates come most likely first when top-k or top-p truncates, else in id order. The
  // spans stay valid until the next call.
  struct Distribution {
    std::span<const int32_t> tokens;
    std::span<const double> probabilities;
  };
  Distribution distribution(std::span<const float> logits, const SamplingParams& params,
                            const SamplingContext& context = {});

  // Draws a token from distribution(); with params.logprobs > 0 also fills `logprob` from the
  // unmodified distribution (no penalties, temperature 1, no truncation), as the OpenAI API
  // and vLLM report it.
  int32_t sample(std::span<const float> logits, const SamplingParams& params, std::mt19937_64& rng,
                 TokenLogprob* logprob, const SamplingContext& context = {});

 private:
  // `logits` with the bias and penalties applied, in penalized_; `logits` itself when none
  // applies.
  std::span<const float> penalize(std::span<const float> logits, const SamplingParams& params,
                                  const SamplingContext& context);

  std::vector<double> probabilities_;  // reused between calls
  std::vector<int32_t> order_;
  std::vector<float> penalized_;
  std::vector<int32_t> output_counts_;  // by token id; all zero between calls
  std::vector<uint8_t> seen_;           // by token id; all zero between calls
};

}  // namespace flotilla::llm

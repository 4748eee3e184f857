// Picks the next token from a row of logits: greedy, or temperature with top-k and top-p, from
// a per-sequence random generator (seeded: reproducible).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "llm/llm.h"

namespace flotilla::llm {

class Sampler {
 public:
  // Draws `token`; with params.logprobs > 0 also fills `logprob` from the unmodified
  // distribution (temperature 1, no truncation), as the OpenAI API reports it.
  int32_t sample(std::span<const float> logits, const SamplingParams& params, std::mt19937_64& rng,
                 TokenLogprob* logprob);

 private:
  std::vector<float> probabilities_;  // reused between calls: one sampler per engine thread
  std::vector<int32_t> order_;
};

}  // namespace flotilla::llm

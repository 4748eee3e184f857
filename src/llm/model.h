// The forward pass over a batch of sequences on a paged KV cache (owned by one engine thread),
// over a loaded model's weights (weights.h).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "llm/kernels.h"
#include "llm/kv_cache.h"
#include "llm/llm.h"
#include "llm/thread_pool.h"
#include "llm/weights.h"

namespace flotilla::llm {

// One sequence's part of a forward step: `tokens` at positions start, start+1, ... Its blocks
// must cover every position up to start + tokens.size(). Logits come back for the tokens from
// index `logits_from` on (tokens.size() - 1: the last only; tokens.size(): none).
struct StepSequence {
  const std::vector<int>* blocks = nullptr;
  int start = 0;
  std::span<const int32_t> tokens;
  int logits_from = 0;
};

// Scratch buffers and threads for forward steps of one model; one thread uses it at a time.
class ForwardPass {
 public:
  ForwardPass(std::shared_ptr<const Model> model, int threads);

  // Runs the model over the step's tokens, writes their keys and values into `cache`, and
  // returns the logits asked for, [row][vocab], rows in the order of `step` then tokens.
  std::span<const float> forward(std::span<const StepSequence> step, KvCache& cache);

  const Model& model() const { return *model_; }

 private:
  void attention(std::span<const StepSequence> step, int layer, KvCache& cache);

  std::shared_ptr<const Model> model_;
  const Kernels& kernels_;
  ThreadPool pool_;
  // Activations of the step, resized as steps grow.
  std::vector<float> x_, normed_, qkv_, attn_, mlp_, logits_in_, logits_;
};

}  // namespace flotilla::llm

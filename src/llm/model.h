// The loaded model (immutable, shared) and the forward pass over a batch of sequences on a
// paged KV cache (owned by one engine thread).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "llm/block_allocator.h"
#include "llm/kernels.h"
#include "llm/llm.h"
#include "llm/safetensors.h"
#include "llm/thread_pool.h"

namespace flotilla::llm {

struct LayerWeights {
  std::vector<float> input_norm;
  WeightMatrix qkv;  // q, k and v projections stacked: one matmul for the three
  WeightMatrix o;
  std::vector<float> post_norm;
  WeightMatrix gate_up;  // gate and up projections stacked
  WeightMatrix down;
};

class Model {
 public:
  ModelConfig config;
  LoadOptions options;
  SafetensorsSet files;  // keeps the mapped weights alive
  const TensorView* embedding = nullptr;
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;
  WeightMatrix lm_head;
  // cos and sin of every position's rotary angles: [max_position][head_dim / 2] each.
  std::vector<float> rope_cos;
  std::vector<float> rope_sin;
};

// Fixed-size blocks of KV cache memory and their free list. Layout per layer and per K or V:
// [block][kv_head][token in block][head_dim], so one head's keys of a block are contiguous.
class KvCache {
 public:
  KvCache(const ModelConfig& config, int blocks, int block_tokens);

  int block_tokens() const { return block_tokens_; }
  int total_blocks() const { return total_blocks_; }
  int free_blocks() const { return allocator_.free_blocks(); }

  // -1 when none is free.
  int allocate() { return allocator_.allocate(); }
  void release(int block) { allocator_.release(block); }

  // The free list, for the scheduler.
  BlockAllocator& allocator() { return allocator_; }

  float* key(int layer, int block, int kv_head);
  float* value(int layer, int block, int kv_head);

 private:
  int64_t offset(int layer, int block, int kv_head) const;

  int block_tokens_;
  int total_blocks_;
  int kv_heads_;
  int head_dim_;
  std::vector<float> keys_;
  std::vector<float> values_;
  BlockAllocator allocator_;
};

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

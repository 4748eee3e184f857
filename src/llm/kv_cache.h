// The paged KV cache (owned by one engine thread).
#pragma once

#include <cstdint>
#include <vector>

#include "llm/block_allocator.h"
#include "llm/llm.h"

namespace flotilla::llm {

// Fixed-size blocks of KV cache memory and their free list. Layout per layer and per K or V:
// [block][kv_head][token in block][head_dim], so one head's keys of a block are contiguous.
class KvCache {
 public:
  // With prefix caching, the free list keeps full blocks' contents for reuse (block_allocator.h).
  KvCache(const ModelConfig& config, int blocks, int block_tokens, bool prefix_caching = false);

  int block_tokens() const { return block_tokens_; }
  int total_blocks() const { return total_blocks_; }
  int free_blocks() const { return allocator_.free_blocks(); }

  // Which blocks are free and which sequences hold, for the scheduler.
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

}  // namespace flotilla::llm

// The paged KV cache's memory.
#include "llm/kv_cache.h"

namespace flotilla::llm {

KvCache::KvCache(const ModelConfig& config, int blocks, int block_tokens, bool prefix_caching)
    : block_tokens_(block_tokens),
      total_blocks_(blocks),
      kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim),
      allocator_(blocks, block_tokens, prefix_caching) {
  size_t floats =
      static_cast<size_t>(config.num_layers) * blocks * kv_heads_ * block_tokens_ * head_dim_;
  keys_.resize(floats);
  values_.resize(floats);
}

int64_t KvCache::offset(int layer, int block, int kv_head) const {
  return ((static_cast<int64_t>(layer) * total_blocks_ + block) * kv_heads_ + kv_head) *
         block_tokens_ * head_dim_;
}

float* KvCache::key(int layer, int block, int kv_head) {
  return keys_.data() + offset(layer, block, kv_head);
}

float* KvCache::value(int layer, int block, int kv_head) {
  return values_.data() + offset(layer, block, kv_head);
}

}  // namespace flotilla::llm

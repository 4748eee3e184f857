// The free list of a paged KV cache's fixed-size blocks: which block ids are in use. It holds no
// cache memory (KvCache does), so the scheduler and its tests use it without a model.
#pragma once

#include <vector>

#include "common/common.h"

namespace flotilla::llm {

class BlockAllocator {
 public:
  // Blocks 0 .. blocks - 1, all free; allocate() hands out the lowest ids first.
  explicit BlockAllocator(int blocks) : total_(blocks) {
    free_.reserve(blocks);
    for (int b = blocks - 1; b >= 0; --b) {
      free_.push_back(b);
    }
  }

  int total_blocks() const { return total_; }
  int free_blocks() const { return static_cast<int>(free_.size()); }
  int used_blocks() const { return total_ - free_blocks(); }

  // -1 when none is free.
  int allocate() {
    if (free_.empty()) {
      return -1;
    }
    int block = free_.back();
    free_.pop_back();
    return block;
  }

  void release(int block) {
    FLOTILLA_DCHECK(block >= 0 && block < total_);
    free_.push_back(block);
  }

 private:
  int total_;
  std::vector<int> free_;
};

}  // namespace flotilla::llm

#include "llm/block_allocator.h"

#include "common/common.h"

namespace flotilla::llm {

BlockAllocator::BlockAllocator(int blocks, int block_tokens, bool prefix_caching)
    : block_tokens_(block_tokens), prefix_caching_(prefix_caching), blocks_(blocks) {
  free_.reserve(blocks);
  for (int b = blocks - 1; b >= 0; --b) {
    free_.push_back(b);
  }
}

size_t BlockAllocator::KeyHash::operator()(const Key& key) const {
  // 64-bit FNV-1a over the parent's serial and the token ids; equality decides a hit.
  uint64_t hash = 14695981039346656037ull;
  auto mix = [&hash](uint64_t value) {
    hash = (hash ^ value) * 1099511628211ull;
  };
  mix(key.parent);
  for (int32_t token : key.tokens) {
    mix(static_cast<uint32_t>(token));
  }
  return static_cast<size_t>(hash);
}

int BlockAllocator::allocate() {
  int block;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else if (!evictable_.empty()) {
    block = evictable_.front();
    evictable_.pop_front();
    uncache(block);
  } else {
    return -1;
  }
  blocks_[block].references = 1;
  return block;
}

void BlockAllocator::release(int block) {
  FLOTILLA_DCHECK(block >= 0 && block < total_blocks() && blocks_[block].references > 0);
  Block& b = blocks_[block];
  if (--b.references > 0) {
    return;
  }
  if (b.serial != 0) {
    b.evictable = evictable_.insert(evictable_.end(), block);
  } else {
    free_.push_back(block);
  }
}

void BlockAllocator::uncache(int block) {
  Block& b = blocks_[block];
  cached_.erase(b.key);
  b.key.tokens.clear();
  b.serial = 0;
}

int BlockAllocator::acquire_prefix(std::span<const int32_t> tokens, int max_blocks,
                                   std::vector<int>& blocks, std::vector<uint64_t>& keys) {
  if (!prefix_caching_) {
    return 0;
  }
  Key key;
  key.parent = keys.empty() ? 0 : keys.back();
  int taken = 0;
  for (int start = static_cast<int>(keys.size()) * block_tokens_;
       taken < max_blocks && start + block_tokens_ <= static_cast<int>(tokens.size());
       start += block_tokens_, ++taken) {
    key.tokens.assign(tokens.begin() + start, tokens.begin() + start + block_tokens_);
    auto found = cached_.find(key);
    if (found == cached_.end()) {
      break;
    }
    Block& b = blocks_[found->second];
    if (b.references++ == 0) {
      evictable_.erase(b.evictable);
    }
    blocks.push_back(found->second);
    keys.push_back(b.serial);
    key.parent = b.serial;
  }
  return taken;
}

uint64_t BlockAllocator::cache(int block, uint64_t parent, std::span<const int32_t> tokens) {
  FLOTILLA_DCHECK(static_cast<int>(tokens.size()) == block_tokens_);
  if (!prefix_caching_) {
    return 0;
  }
  Key key{parent, std::vector<int32_t>(tokens.begin(), tokens.end())};
  auto [entry, inserted] = cached_.try_emplace(key, block);
  if (!inserted) {
    return blocks_[entry->second].serial;
  }
  Block& b = blocks_[block];
  FLOTILLA_DCHECK(b.serial == 0 && b.references > 0);
  b.serial = ++last_serial_;
  b.key = std::move(key);
  return b.serial;
}

}  // namespace flotilla::llm

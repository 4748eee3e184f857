// The blocks of a paged KV cache: which are free and which sequences hold them. It holds no
// cache memory (KvCache does), so the scheduler and its tests use it without a model.
//
// With prefix caching (vLLM's automatic prefix caching), a full block stays cached after the
// last sequence holding it lets go, keyed by its tokens and the key of the block before it, so
// a later sequence whose tokens start the same way takes those blocks instead of computing them
// again. A key names the parent by a serial number given when the parent was cached and never
// reused, so a hit means the whole prefix matches: exact, with no hash collision to fear. A
// cached block no sequence holds counts as free: allocate() takes an uncached free block first,
// then evicts the cached one released longest ago.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace flotilla::llm {

class BlockAllocator {
 public:
  // Blocks 0 .. blocks - 1, all free; allocate() hands out the lowest ids first.
  explicit BlockAllocator(int blocks, int block_tokens = 1, bool prefix_caching = false);

  int total_blocks() const { return static_cast<int>(blocks_.size()); }
  // Blocks allocate() can hand out: uncached free ones and cached ones no sequence holds.
  int free_blocks() const { return static_cast<int>(free_.size() + evictable_.size()); }
  int used_blocks() const { return total_blocks() - free_blocks(); }
  // Cached blocks no sequence holds (part of free_blocks()).
  int evictable_blocks() const { return static_cast<int>(evictable_.size()); }
  bool prefix_caching() const { return prefix_caching_; }

  // One reference to a block; -1 when none is free.
  int allocate();
  // Drops a reference; a block no sequence holds any more is free again (cached ones stay
  // cached until allocate() needs them).
  void release(int block);

  // Prefix caching (no-ops without it). A sequence's `keys` are those of its leading blocks
  // that are cached, in order; the next block's key builds on the last.
  //
  // Takes (one reference each) the cached blocks holding `tokens`' leading full blocks, at most
  // `max_blocks`, appending them to `blocks` and their keys to `keys`; returns how many.
  int acquire_prefix(std::span<const int32_t> tokens, int max_blocks, std::vector<int>& blocks,
                     std::vector<uint64_t>& keys);
  // Caches `block`, which holds `tokens` (a full block) after the block keyed `parent` (0: it is
  // a sequence's first), and returns its key. When another block already holds the same, that
  // one's key comes back and `block` stays uncached.
  uint64_t cache(int block, uint64_t parent, std::span<const int32_t> tokens);

 private:
  struct Key {
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& key) const;
  };
  struct Block {
    int references = 0;
    uint64_t serial = 0;  // its key's serial number while cached; 0: not cached
    Key key;
    std::list<int>::iterator evictable;  // its place in evictable_ while cached and unheld
  };

  // Forgets a cached block's contents (it is about to hold others).
  void uncache(int block);

  const int block_tokens_;
  const bool prefix_caching_;
  std::vector<Block> blocks_;
  std::vector<int> free_;     // uncached, unheld; lowest id last
  std::list<int> evictable_;  // cached, unheld; released longest ago first
  std::unordered_map<Key, int, KeyHash> cached_;
  uint64_t last_serial_ = 0;
};

}  // namespace flotilla::llm

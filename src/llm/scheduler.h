// The engine's scheduler: which sequences run this step and with how many tokens, over the KV
// cache's block free list. It is pure bookkeeping (no model, no threads): the engine hands it
// its running and waiting queues each step and gets back a step plan.
//
// Policy: every running sequence, oldest first, gets its next tokens (one when decoding, a chunk
// of the prompt when prefilling) within the step's token budget, prompt chunks also within the
// step's prefill budget (so that decoders' steps stay short while prompts join them); when the
// cache has no block for one of them, the youngest running sequence is preempted (its blocks freed,
// put first in the waiting queue, recomputed later from its tokens). Then waiting sequences are
// admitted in FIFO order while the budget, the batch size and the cache allow; a sequence is
// admitted only when its whole known length plus one token fits in the free blocks, so admission
// alone never forces a preemption, and the queue's head is never overtaken.
//
// With prefix caching (the allocator's), an admitted sequence first takes the cached blocks that
// hold the start of its tokens (all but its last token, which is computed for the logits), and
// starts computing after them; the engine has the blocks it fills cached (cache_full_blocks).
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "llm/block_allocator.h"
#include "llm/llm.h"

namespace flotilla::llm {

class RequestOutput;

struct Sequence {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // prompt, then generated
  int prompt_length = 0;
  int computed = 0;  // tokens whose keys and values are in the cache
  std::vector<int> blocks;
  std::vector<uint64_t> block_keys;  // prefix caching: the keys of its leading cached blocks
  SamplingParams sampling;
  std::mt19937_64 rng;
  std::shared_ptr<RequestOutput> output;

  int generated() const { return static_cast<int>(tokens.size()) - prompt_length; }
};

using SequenceQueue = std::deque<std::unique_ptr<Sequence>>;

struct SchedulerOptions {
  int max_tokens_per_step = 1;
  int max_sequences = 1;
  int block_tokens = 1;
  // Of max_tokens_per_step, tokens of sequences with more than one to compute (prompt chunks,
  // recomputation).
  int max_prefill_tokens_per_step = std::numeric_limits<int>::max();
};

// One sequence's work in a step: its next `tokens` tokens from position `computed`.
struct PlannedWork {
  Sequence* sequence = nullptr;
  int tokens = 0;
};

struct StepPlan {
  std::vector<PlannedWork> work;    // the running sequences, oldest first, then those admitted
  std::vector<uint64_t> preempted;  // ids, in the order they were preempted
  std::vector<uint64_t> admitted;   // ids, in the order they were admitted
  int blocks_reserved = 0;          // blocks allocated by this plan
  // Prefix caching, over the sequences admitted: their tokens, and those found cached.
  int64_t prefix_queried_tokens = 0;
  int64_t prefix_hit_tokens = 0;
};

class Scheduler {
 public:
  // `blocks` outlives the scheduler.
  Scheduler(BlockAllocator& blocks, const SchedulerOptions& options);

  // Plans one step: reserves the blocks the planned work needs, moves preempted sequences from
  // `running` to the front of `waiting` and admitted ones from the front of `waiting` to the
  // back of `running` (running stays oldest first). The plan's pointers stay valid until a
  // sequence leaves the queues.
  StepPlan plan(SequenceQueue& running, SequenceQueue& waiting);

  // Frees a sequence's blocks; it is recomputed from its first token (or its cached prefix) if
  // it runs again.
  void release(Sequence& sequence);

  // Has the allocator cache the sequence's blocks that its computed tokens fill (a no-op
  // without prefix caching); the engine calls it after each step.
  void cache_full_blocks(Sequence& sequence);

  int blocks_for(int tokens) const;

 private:
  // Gives `sequence` blocks for its first `tokens` positions; false when the cache is short.
  bool reserve(Sequence& sequence, int tokens, StepPlan& plan);
  void preempt_youngest(SequenceQueue& running, SequenceQueue& waiting, StepPlan& plan);
  // Takes the cached blocks of a waiting sequence's prefix; they count as computed.
  void take_cached_prefix(Sequence& sequence);

  BlockAllocator& blocks_;
  const SchedulerOptions options_;
};

}  // namespace flotilla::llm

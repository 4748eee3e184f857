// The engine's scheduler: which sequences run this step and with how many tokens, over the KV
// cache's block free list. It is pure bookkeeping (no model, no threads): the engine hands it
// its running and waiting queues each step and gets back a step plan.
//
// Policy: every running sequence, oldest first, gets its next tokens (one when decoding, a chunk
// of the prompt when prefilling) within the step's token budget; when the cache has no block for
// one of them, the youngest running sequence is preempted (its blocks freed, put first in the
// waiting queue, recomputed later from its tokens). Then waiting sequences are admitted in FIFO
// order while the budget, the batch size and the cache allow; a sequence is admitted only when
// its whole known length plus one token fits in the free blocks, so admission alone never forces
// a preemption, and the queue's head is never overtaken.
#pragma once

#include <cstdint>
#include <deque>
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

  // Frees a sequence's blocks; it is recomputed from its first token if it runs again.
  void release(Sequence& sequence);

  int blocks_for(int tokens) const;

 private:
  // Gives `sequence` blocks for its first `tokens` positions; false when the cache is short.
  bool reserve(Sequence& sequence, int tokens, StepPlan& plan);
  void preempt_youngest(SequenceQueue& running, SequenceQueue& waiting, StepPlan& plan);

  BlockAllocator& blocks_;
  const SchedulerOptions options_;
};

}  // namespace flotilla::llm

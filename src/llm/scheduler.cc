#include "llm/scheduler.h"

#include <algorithm>

namespace flotilla::llm {

Scheduler::Scheduler(BlockAllocator& blocks, const SchedulerOptions& options)
    : blocks_(blocks), options_(options) {}

int Scheduler::blocks_for(int tokens) const {
  return (tokens + options_.block_tokens - 1) / options_.block_tokens;
}

bool Scheduler::reserve(Sequence& sequence, int tokens, StepPlan& plan) {
  int needed = blocks_for(tokens) - static_cast<int>(sequence.blocks.size());
  if (needed > blocks_.free_blocks()) {
    return false;
  }
  for (int i = 0; i < needed; ++i) {
    sequence.blocks.push_back(blocks_.allocate());
  }
  plan.blocks_reserved += std::max(0, needed);
  return true;
}

void Scheduler::release(Sequence& sequence) {
  for (int block : sequence.blocks) {
    blocks_.release(block);
  }
  sequence.blocks.clear();
  sequence.computed = 0;
}

void Scheduler::preempt_youngest(SequenceQueue& running, SequenceQueue& waiting, StepPlan& plan) {
  std::unique_ptr<Sequence> victim = std::move(running.back());
  running.pop_back();
  release(*victim);
  plan.preempted.push_back(victim->id);
  waiting.push_front(std::move(victim));
}

StepPlan Scheduler::plan(SequenceQueue& running, SequenceQueue& waiting) {
  StepPlan plan;
  int budget = options_.max_tokens_per_step;
  for (size_t i = 0; i < running.size() && budget > 0;) {
    Sequence& sequence = *running[i];
    int tokens = std::min(budget, static_cast<int>(sequence.tokens.size()) - sequence.computed);
    if (!reserve(sequence, sequence.computed + tokens, plan)) {
      if (i + 1 == running.size()) {  // it is the youngest itself: it waits
        preempt_youngest(running, waiting, plan);
        break;
      }
      preempt_youngest(running, waiting, plan);
      continue;  // try again with the freed blocks
    }
    plan.work.push_back({&sequence, tokens});
    budget -= tokens;
    ++i;
  }
  while (!waiting.empty() && budget > 0 &&
         static_cast<int>(running.size()) < options_.max_sequences) {
    Sequence& sequence = *waiting.front();
    // Admitted only when the whole known sequence fits now, so that admission alone never
    // forces a preemption.
    if (blocks_for(static_cast<int>(sequence.tokens.size()) + 1) > blocks_.free_blocks()) {
      break;
    }
    int tokens = std::min(budget, static_cast<int>(sequence.tokens.size()));
    reserve(sequence, tokens, plan);
    plan.work.push_back({&sequence, tokens});
    plan.admitted.push_back(sequence.id);
    budget -= tokens;
    running.push_back(std::move(waiting.front()));
    waiting.pop_front();
  }
  return plan;
}

}  // namespace flotilla::llm

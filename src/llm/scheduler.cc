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
  // Last block first: a prefix's later blocks then go before its earlier ones when cached
  // blocks are evicted (an evicted block leaves those after it unreachable).
  for (auto block = sequence.blocks.rbegin(); block != sequence.blocks.rend(); ++block) {
    blocks_.release(*block);
  }
  sequence.blocks.clear();
  sequence.block_keys.clear();
  sequence.computed = 0;
}

void Scheduler::take_cached_prefix(Sequence& sequence) {
  FLOTILLA_DCHECK(sequence.blocks.empty() && sequence.computed == 0);
  const int reusable = (static_cast<int>(sequence.tokens.size()) - 1) / options_.block_tokens;
  const int taken =
      blocks_.acquire_prefix(sequence.tokens, reusable, sequence.blocks, sequence.block_keys);
  sequence.computed = taken * options_.block_tokens;
}

void Scheduler::cache_full_blocks(Sequence& sequence) {
  if (!blocks_.prefix_caching()) {
    return;
  }
  const size_t full = static_cast<size_t>(sequence.computed / options_.block_tokens);
  for (size_t i = sequence.block_keys.size(); i < full; ++i) {
    const uint64_t parent = i == 0 ? 0 : sequence.block_keys[i - 1];
    sequence.block_keys.push_back(
        blocks_.cache(sequence.blocks[i], parent,
                      std::span<const int32_t>(sequence.tokens)
                          .subspan(i * options_.block_tokens, options_.block_tokens)));
  }
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
  int prefill_budget = options_.max_prefill_tokens_per_step;
  // A decode's one token takes the step's budget only; a longer remainder is prefill, cut to
  // what is left of both budgets (0: it sits this step out).
  auto remaining = [](const Sequence& sequence) {
    return static_cast<int>(sequence.tokens.size()) - sequence.computed;
  };
  auto tokens_for = [&](const Sequence& sequence) {
    return remaining(sequence) == 1 ? std::min(budget, 1)
                                    : std::min({budget, prefill_budget, remaining(sequence)});
  };
  auto take = [&](const Sequence& sequence, int tokens) {
    budget -= tokens;
    if (remaining(sequence) > 1) {
      prefill_budget -= tokens;
    }
  };
  for (size_t i = 0; i < running.size() && budget > 0;) {
    Sequence& sequence = *running[i];
    int tokens = tokens_for(sequence);
    if (tokens == 0) {
      ++i;
      continue;
    }
    if (!reserve(sequence, sequence.computed + tokens, plan)) {
      if (i + 1 == running.size()) {  // it is the youngest itself: it waits
        preempt_youngest(running, waiting, plan);
        break;
      }
      preempt_youngest(running, waiting, plan);
      continue;  // try again with the freed blocks
    }
    plan.work.push_back({&sequence, tokens});
    take(sequence, tokens);
    ++i;
  }
  while (!waiting.empty() && budget > 0 &&
         static_cast<int>(running.size()) < options_.max_sequences) {
    Sequence& sequence = *waiting.front();
    const int length = static_cast<int>(sequence.tokens.size());
    take_cached_prefix(sequence);
    const int tokens = tokens_for(sequence);
    // Admitted only when the whole known sequence fits now, so that admission alone never
    // forces a preemption.
    if (tokens == 0 ||
        blocks_for(length + 1) - static_cast<int>(sequence.blocks.size()) > blocks_.free_blocks()) {
      release(sequence);
      break;
    }
    plan.prefix_queried_tokens += length;
    plan.prefix_hit_tokens += sequence.computed;
    reserve(sequence, sequence.computed + tokens, plan);
    plan.work.push_back({&sequence, tokens});
    plan.admitted.push_back(sequence.id);
    take(sequence, tokens);
    running.push_back(std::move(waiting.front()));
    waiting.pop_front();
  }
  return plan;
}

}  // namespace flotilla::llm

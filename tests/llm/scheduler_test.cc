// The scheduler on its own, over a bare block allocator (no model): admission only when the
// whole known sequence fits, chunked prefill within the token and prefill budgets, preemption of
// the youngest running sequence to the front of the waiting queue, and FIFO admission with no
// overtaking of the queue's head; prefix caching: exact reuse of cached blocks, eviction, admission
// with a cached prefix.
#include "llm/scheduler.h"

#include <algorithm>

#include <gtest/gtest.h>

namespace flotilla::llm {
namespace {

std::unique_ptr<Sequence> sequence(uint64_t id, int prompt_tokens) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->tokens.assign(prompt_tokens, 7);
  s->prompt_length = prompt_tokens;
  return s;
}

std::vector<uint64_t> ids(const SequenceQueue& queue) {
  std::vector<uint64_t> out;
  for (const auto& s : queue) {
    out.push_back(s->id);
  }
  return out;
}

std::vector<uint64_t> work_ids(const StepPlan& plan) {
  std::vector<uint64_t> out;
  for (const PlannedWork& w : plan.work) {
    out.push_back(w.sequence->id);
  }
  return out;
}

// What the engine does after the forward pass: the planned tokens are in the cache, and a
// sequence that reached its end gets one more (sampled) token.
void run_step(const StepPlan& plan) {
  for (const PlannedWork& w : plan.work) {
    w.sequence->computed += w.tokens;
    if (w.sequence->computed == static_cast<int>(w.sequence->tokens.size())) {
      w.sequence->tokens.push_back(1);
    }
  }
}

int blocks_held(const SequenceQueue& queue) {
  int n = 0;
  for (const auto& s : queue) {
    n += static_cast<int>(s->blocks.size());
  }
  return n;
}

TEST(SchedulerTest, AdmitsASequenceOnlyWhenItsBlocksFit) {
  BlockAllocator blocks(4);
  Scheduler scheduler(blocks, {/*max_tokens_per_step=*/64, /*max_sequences=*/8,
                               /*block_tokens=*/4});
  SequenceQueue running, waiting;
  waiting.push_back(sequence(1, 7));  // 7 tokens + 1: 2 blocks
  waiting.push_back(sequence(2, 8));  // 8 tokens + 1: 3 blocks, only 2 left
  StepPlan plan = scheduler.plan(running, waiting);
  EXPECT_EQ(plan.admitted, std::vector<uint64_t>({1}));
  EXPECT_EQ(ids(running), std::vector<uint64_t>({1}));
  EXPECT_EQ(ids(waiting), std::vector<uint64_t>({2}));
  ASSERT_EQ(plan.work.size(), 1u);
  EXPECT_EQ(plan.work[0].tokens, 7);
  EXPECT_EQ(plan.blocks_reserved, 2);
  EXPECT_EQ(running[0]->blocks.size(), 2u);
  EXPECT_EQ(blocks.free_blocks(), 2);
  EXPECT_TRUE(waiting[0]->blocks.empty());

  // Exactly fitting is enough: 7 tokens + 1 in the 2 free blocks.
  waiting.push_front(sequence(3, 7));
  plan = scheduler.plan(running, waiting);
  EXPECT_EQ(plan.admitted, std::vector<uint64_t>({3}));
  EXPECT_EQ(blocks.free_blocks(), 0);
  EXPECT_EQ(blocks_held(running), 4);
}

TEST(SchedulerTest, ChunkedPrefillStaysWithinTheTokenBudget) {
  BlockAllocator blocks(8);
  Scheduler scheduler(blocks, {/*max_tokens_per_step=*/5, /*max_sequences=*/8,
                               /*block_tokens=*/2});
  SequenceQueue running, waiting;
  waiting.push_back(sequence(1, 12));
  waiting.push_back(sequence(2, 3));
  StepPlan plan = scheduler.plan(running, waiting);
  // The first chunk of 1 uses the whole budget: 2 waits, and 1 holds blocks for 5 tokens only.
  EXPECT_EQ(work_ids(plan), std::vector<uint64_t>({1}));
  EXPECT_EQ(plan.work[0].tokens, 5);
  EXPECT_EQ(running[0]->blocks.size(), 3u);
  EXPECT_EQ(ids(waiting), std::vector<uint64_t>({2}));
  run_step(plan);
  plan = scheduler.plan(running, waiting);
  EXPECT_EQ(work_ids(plan), std::vector<uint64_t>({1}));
  EXPECT_EQ(plan.work[0].tokens, 5);
  run_step(plan);
  // 2 prompt tokens of 1 are left; 3 of the budget go to 2.
  plan = scheduler.plan(running, waiting);
  EXPECT_EQ(work_ids(plan), std::vector<uint64_t>({1, 2}));
  EXPECT_EQ(plan.work[0].tokens, 2);
  EXPECT_EQ(plan.work[1].tokens, 3);
  EXPECT_TRUE(plan.preempted.empty());
}

TEST(SchedulerTest, PromptChunksStayWithinThePrefillBudgetWhileDecodesGoOn) {
  BlockAllocator blocks(64);
  SchedulerOptions options{/*max_tokens_per_step=*/16, /*max_sequences=*/8, /*block_tokens=*/2};
  options.max_prefill_tokens_per_step = 4;
  Scheduler scheduler(blocks, options);
  SequenceQueue running, waiting;
  waiting.push_back(sequence(1, 1));  // decodes from its first step on
  waiting.push_back(sequence(2, 1));
  waiting.push_back(sequence(3, 10));
  waiting.push_back(sequence(4, 3));
  StepPlan plan = scheduler.plan(running, waiting);
  // 1 and 2 take one token each outside the prefill budget; 3 gets 4 of its 10; 4 has no
  // prefill budget left and waits although the step budget has 10 tokens left.
  EXPECT_EQ(work_ids(plan), std::vector<uint64_t>({1, 2, 3}));
  EXPECT_EQ(plan.work[2].tokens, 4);
  EXPECT_EQ(ids(waiting), std::vector<uint64_t>({4}));
  run_step(plan);
  plan = scheduler.plan(running, waiting);
  EXPECT_EQ(work_ids(plan), std::vector<uint64_t>({1, 2, 3}));
  EXPECT_EQ(plan.work[2].tokens, 4);
  run_step(plan);
  // 2 prompt tokens of 3 are left: 2 of the prefill budget go to 4.
  plan = scheduler.plan(running, waiting);
  EXPECT_EQ(work_ids(plan), std::vector<uint64_t>({1, 2, 3, 4}));
  EXPECT_EQ(plan.work[2].tokens, 2);
  EXPECT_EQ(plan.work[3].tokens, 2);
  run_step(plan);
  // 3 decodes now; 4's last prompt token is computed like a decode.
  plan = scheduler.plan(running, waiting);
  EXPECT_EQ(work_ids(plan), std::vector<uint64_t>({1, 2, 3, 4}));
  for (const PlannedWork& w : plan.work) {
    EXPECT_EQ(w.tokens, 1);
  }
}

TEST(SchedulerTest, DecodeWithoutAFreeBlockPreemptsTheYoungestToTheFrontOfTheQueue) {
  BlockAllocator blocks(4);
  Scheduler scheduler(blocks, {/*max_tokens_per_step=*/64, /*max_sequences=*/2,
                               /*block_tokens=*/2});
  SequenceQueue running, waiting;
  waiting.push_back(sequence(1, 3));
  waiting.push_back(sequence(2, 3));
  waiting.push_back(sequence(3, 1));  // newer than both: must not pass the preempted one
  StepPlan plan = scheduler.plan(running, waiting);
  EXPECT_EQ(plan.admitted, std::vector<uint64_t>({1, 2}));
  EXPECT_EQ(blocks.free_blocks(), 0);
  run_step(plan);  // both at 4 tokens, 3 computed: the next decode fits in their 2 blocks
  plan = scheduler.plan(running, waiting);
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_EQ(work_ids(plan), std::vector<uint64_t>({1, 2}));
  run_step(plan);  // 5 tokens: position 4 needs a third block each, and none is free

  plan = scheduler.plan(running, waiting);
  EXPECT_EQ(plan.preempted, std::vector<uint64_t>({2}));
  EXPECT_EQ(work_ids(plan), std::vector<uint64_t>({1}));
  EXPECT_EQ(plan.work[0].tokens, 1);
  EXPECT_EQ(ids(running), std::vector<uint64_t>({1}));
  EXPECT_EQ(ids(waiting), std::vector<uint64_t>({2, 3}));
  const Sequence& victim = *waiting.front();
  EXPECT_TRUE(victim.blocks.empty());
  EXPECT_EQ(victim.computed, 0);  // recomputed from its tokens
  EXPECT_EQ(victim.tokens.size(), 5u);
  EXPECT_EQ(running[0]->blocks.size(), 3u);
  EXPECT_EQ(blocks.free_blocks(), 1);
  // 3 would fit in the free block, but it does not overtake the preempted 2.
  EXPECT_TRUE(plan.admitted.empty());

  // When 1 ends, 2 comes back first and recomputes all of its 5 tokens.
  scheduler.release(*running.front());
  running.pop_front();
  plan = scheduler.plan(running, waiting);
  EXPECT_EQ(plan.admitted, std::vector<uint64_t>({2, 3}));
  ASSERT_EQ(plan.work.size(), 2u);
  EXPECT_EQ(plan.work[0].tokens, 5);
}

TEST(SchedulerTest, TheYoungestThatCannotGrowPreemptsItself) {
  BlockAllocator blocks(3);
  Scheduler scheduler(blocks, {/*max_tokens_per_step=*/64, /*max_sequences=*/2,
                               /*block_tokens=*/2});
  SequenceQueue running, waiting;
  waiting.push_back(sequence(1, 2));  // 2 + 1 tokens: 2 blocks, takes 1
  waiting.push_back(sequence(2, 2));  // takes 1
  StepPlan plan = scheduler.plan(running, waiting);
  EXPECT_EQ(plan.admitted, std::vector<uint64_t>({1, 2}));
  run_step(plan);  // 3 tokens each: 1 takes the last free block, 2 finds none
  plan = scheduler.plan(running, waiting);
  EXPECT_EQ(work_ids(plan), std::vector<uint64_t>({1}));
  EXPECT_EQ(plan.preempted, std::vector<uint64_t>({2}));
  EXPECT_EQ(ids(running), std::vector<uint64_t>({1}));
  EXPECT_EQ(ids(waiting), std::vector<uint64_t>({2}));
  EXPECT_EQ(blocks.free_blocks(), 1);
  EXPECT_EQ(blocks_held(running) + blocks.free_blocks(), blocks.total_blocks());
}

TEST(SchedulerTest, AdmitsInArrivalOrderWithinTheBatchSize) {
  BlockAllocator blocks(64);
  Scheduler scheduler(blocks, {/*max_tokens_per_step=*/64, /*max_sequences=*/2,
                               /*block_tokens=*/4});
  SequenceQueue running, waiting;
  for (uint64_t id = 1; id <= 4; ++id) {
    waiting.push_back(sequence(id, 3));
  }
  StepPlan plan = scheduler.plan(running, waiting);
  EXPECT_EQ(plan.admitted, std::vector<uint64_t>({1, 2}));
  EXPECT_EQ(ids(waiting), std::vector<uint64_t>({3, 4}));
  scheduler.release(*running.back());  // 2 ends first
  running.pop_back();
  plan = scheduler.plan(running, waiting);
  EXPECT_EQ(plan.admitted, std::vector<uint64_t>({3}));
  EXPECT_EQ(ids(running), std::vector<uint64_t>({1, 3}));  // oldest first
  EXPECT_EQ(ids(waiting), std::vector<uint64_t>({4}));
}

// A stream of small requests never starves a large one at the head of the queue: once it is
// first in line, nothing behind it is admitted until it is.
TEST(SchedulerTest, TheOldestWaitingSequenceIsNotStarved) {
  BlockAllocator blocks(8);
  Scheduler scheduler(blocks, {/*max_tokens_per_step=*/64, /*max_sequences=*/8,
                               /*block_tokens=*/4});
  SequenceQueue running, waiting;
  running.push_back(sequence(1, 11));
  running.push_back(sequence(2, 11));
  StepPlan plan = scheduler.plan(running, waiting);  // 3 blocks each: 2 left
  ASSERT_EQ(blocks.free_blocks(), 2);
  waiting.push_back(sequence(3, 20));  // needs 6 blocks
  uint64_t next_id = 4;
  bool admitted = false;
  for (int step = 0; step < 40 && !admitted; ++step) {
    waiting.push_back(sequence(next_id++, 1));  // a small one arrives every step
    run_step(plan);
    // The running ones end one at a time, each after a few steps.
    if (step % 5 == 4 && !running.empty()) {
      scheduler.release(*running.front());
      running.pop_front();
    }
    plan = scheduler.plan(running, waiting);
    for (uint64_t id : plan.admitted) {
      if (id == 3) {
        admitted = true;
        EXPECT_EQ(plan.admitted.front(), 3u) << "a younger sequence was admitted first";
      } else if (!admitted) {
        ADD_FAILURE() << "sequence " << id << " overtook the oldest waiting sequence";
      }
    }
  }
  EXPECT_TRUE(admitted) << "the oldest waiting sequence was never admitted";
}

// ---- Prefix caching ---------------------------------------------------------------------

std::vector<int32_t> counting(int from, int n) {
  std::vector<int32_t> out(n);
  for (int i = 0; i < n; ++i) {
    out[i] = from + i;
  }
  return out;
}

// Caches the full blocks of `tokens` in newly allocated blocks, as a sequence that computed them
// would; returns the blocks.
std::vector<int> cache_sequence(BlockAllocator& blocks, const std::vector<int32_t>& tokens,
                                int block_tokens) {
  std::vector<int> held;
  uint64_t parent = 0;
  for (size_t start = 0; start + block_tokens <= tokens.size(); start += block_tokens) {
    held.push_back(blocks.allocate());
    parent = blocks.cache(held.back(), parent,
                          std::span<const int32_t>(tokens).subspan(start, block_tokens));
  }
  return held;
}

TEST(PrefixCacheTest, AHitNeedsTheWholePrefixToMatch) {
  BlockAllocator blocks(8, /*block_tokens=*/4, /*prefix_caching=*/true);
  const std::vector<int32_t> tokens = counting(1, 12);
  std::vector<int> first = cache_sequence(blocks, tokens, 4);
  for (int b : first) {
    blocks.release(b);
  }
  EXPECT_EQ(blocks.free_blocks(), 8);
  EXPECT_EQ(blocks.evictable_blocks(), 3);

  // The same start, then other tokens: the first two blocks, the same ones, held again.
  std::vector<int32_t> same_start = counting(1, 8);
  same_start.push_back(99);
  std::vector<int> held;
  std::vector<uint64_t> keys;
  EXPECT_EQ(blocks.acquire_prefix(same_start, 8, held, keys), 2);
  EXPECT_EQ(held, std::vector<int>(first.begin(), first.begin() + 2));
  EXPECT_EQ(blocks.free_blocks(), 6);
  EXPECT_EQ(blocks.used_blocks(), 2);

  // A block's tokens alone are not enough: the second block after another first one misses.
  std::vector<int32_t> other_start = counting(1, 12);
  other_start[0] = 50;
  std::vector<int> none;
  std::vector<uint64_t> none_keys;
  EXPECT_EQ(blocks.acquire_prefix(other_start, 8, none, none_keys), 0);
  EXPECT_TRUE(none.empty());

  // max_blocks caps what is taken, and a second holder shares the block.
  std::vector<int> capped;
  std::vector<uint64_t> capped_keys;
  EXPECT_EQ(blocks.acquire_prefix(tokens, 1, capped, capped_keys), 1);
  EXPECT_EQ(capped.front(), first.front());
  blocks.release(capped.front());
  EXPECT_EQ(blocks.used_blocks(), 2);  // still held by the first holder
  for (int b : held) {
    blocks.release(b);
  }
  EXPECT_EQ(blocks.used_blocks(), 0);
}

TEST(PrefixCacheTest, FreeBlocksGoFirstThenTheCachedOneReleasedLongestAgo) {
  BlockAllocator blocks(4, /*block_tokens=*/2, /*prefix_caching=*/true);
  std::vector<int> a = cache_sequence(blocks, counting(10, 2), 2);
  std::vector<int> b = cache_sequence(blocks, counting(20, 2), 2);
  blocks.release(a[0]);
  blocks.release(b[0]);
  EXPECT_EQ(blocks.evictable_blocks(), 2);
  // The two never-cached blocks first, then a's (released before b's).
  int third = blocks.allocate(), fourth = blocks.allocate();
  EXPECT_NE(third, a[0]);
  EXPECT_NE(fourth, b[0]);
  EXPECT_EQ(blocks.allocate(), a[0]);
  EXPECT_EQ(blocks.free_blocks(), 1);
  std::vector<int> held;
  std::vector<uint64_t> keys;
  EXPECT_EQ(blocks.acquire_prefix(counting(10, 3), 4, held, keys), 0) << "a's block was evicted";
  EXPECT_EQ(blocks.acquire_prefix(counting(20, 3), 4, held, keys), 1);
  EXPECT_EQ(held, std::vector<int>({b[0]}));
  EXPECT_EQ(blocks.allocate(), -1);
}

TEST(PrefixCacheTest, TheSameContentTwiceKeepsOneCachedCopy) {
  BlockAllocator blocks(4, /*block_tokens=*/2, /*prefix_caching=*/true);
  const std::vector<int32_t> tokens = counting(1, 4);
  std::vector<int> first = cache_sequence(blocks, tokens, 2);
  std::vector<int> second = cache_sequence(blocks, tokens, 2);  // computed side by side
  EXPECT_EQ(blocks.free_blocks(), 0);
  for (int b : second) {
    blocks.release(b);
  }
  // The second copy was never cached: its blocks are plain free ones.
  EXPECT_EQ(blocks.evictable_blocks(), 0);
  EXPECT_EQ(blocks.free_blocks(), 2);
  std::vector<int> held;
  std::vector<uint64_t> keys;
  EXPECT_EQ(blocks.acquire_prefix(counting(1, 5), 4, held, keys), 2);
  EXPECT_EQ(held, first);
}

TEST(PrefixCacheTest, WithoutPrefixCachingNothingIsReused) {
  BlockAllocator blocks(4, /*block_tokens=*/2, /*prefix_caching=*/false);
  std::vector<int> a = cache_sequence(blocks, counting(1, 4), 2);
  for (int b : a) {
    blocks.release(b);
  }
  EXPECT_EQ(blocks.evictable_blocks(), 0);
  std::vector<int> held;
  std::vector<uint64_t> keys;
  EXPECT_EQ(blocks.acquire_prefix(counting(1, 5), 4, held, keys), 0);
}

// The scheduler admits a sequence past its cached blocks, computes at least its last token (for
// the logits) and has the blocks it fills cached; a sequence it cannot admit gives its cached
// blocks back.
TEST(PrefixCacheTest, AdmissionStartsAfterTheCachedPrefix) {
  BlockAllocator blocks(8, /*block_tokens=*/4, /*prefix_caching=*/true);
  Scheduler scheduler(blocks, {/*max_tokens_per_step=*/64, /*max_sequences=*/8,
                               /*block_tokens=*/4});
  SequenceQueue running, waiting;
  auto with_tokens = [](uint64_t id, std::vector<int32_t> tokens) {
    auto s = sequence(id, 0);
    s->prompt_length = static_cast<int>(tokens.size());
    s->tokens = std::move(tokens);
    return s;
  };
  waiting.push_back(with_tokens(1, counting(1, 10)));
  StepPlan plan = scheduler.plan(running, waiting);
  EXPECT_EQ(plan.prefix_queried_tokens, 10);
  EXPECT_EQ(plan.prefix_hit_tokens, 0);
  run_step(plan);
  scheduler.cache_full_blocks(*running[0]);
  EXPECT_EQ(running[0]->block_keys.size(), 2u);

  // 8 shared tokens: 2 cached blocks; 4 tokens to compute.
  std::vector<int32_t> shared = counting(1, 8);
  shared.insert(shared.end(), {70, 71, 72, 73});
  waiting.push_back(with_tokens(2, shared));
  // All 8 tokens cached: the second block is left to compute, for the last token's logits.
  waiting.push_back(with_tokens(3, counting(1, 8)));
  plan = scheduler.plan(running, waiting);
  ASSERT_EQ(work_ids(plan), std::vector<uint64_t>({1, 2, 3}));
  EXPECT_EQ(plan.work[1].tokens, 4);
  EXPECT_EQ(running[1]->computed, 8);
  EXPECT_EQ(running[1]->blocks[0], running[0]->blocks[0]);
  EXPECT_EQ(running[1]->blocks[1], running[0]->blocks[1]);
  EXPECT_EQ(plan.work[2].tokens, 4);
  EXPECT_EQ(running[2]->computed, 4);
  EXPECT_EQ(plan.prefix_queried_tokens, 20);
  EXPECT_EQ(plan.prefix_hit_tokens, 12);
  // 1 holds 3 blocks, 2 one more of its own (and 1's two), 3 one of its own: 5 in use.
  EXPECT_EQ(blocks.used_blocks(), 5);

  // No room for the rest of a long one: it is not admitted and holds nothing.
  std::vector<int32_t> long_one = counting(1, 8);
  long_one.resize(30, 5);
  waiting.push_back(with_tokens(4, long_one));
  run_step(plan);
  plan = scheduler.plan(running, waiting);
  EXPECT_TRUE(plan.admitted.empty());
  EXPECT_TRUE(waiting.front()->blocks.empty());
  EXPECT_EQ(waiting.front()->computed, 0);
  EXPECT_EQ(plan.prefix_queried_tokens, 0);
  for (auto& s : running) {
    scheduler.release(*s);
  }
  EXPECT_EQ(blocks.used_blocks(), 0);
}

}  // namespace
}  // namespace flotilla::llm

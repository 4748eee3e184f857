// The scheduler on its own, over a bare block allocator (no model): admission only when the
// whole known sequence fits, chunked prefill within the token budget, preemption of the youngest
// running sequence to the front of the waiting queue, and FIFO admission with no overtaking of
// the queue's head.
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

}  // namespace
}  // namespace flotilla::llm

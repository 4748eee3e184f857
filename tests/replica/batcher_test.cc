#include "replica/batcher.h"

#include <chrono>
#include <map>

#include <gtest/gtest.h>

namespace flotilla::replica {
namespace {

// An in-memory runtime (a fake): output row i = 2 * the first feature of row i, and an error
// when a batch starts with a negative value. Records the rows of every call.
class DoublingRuntime final : public runtime::Runtime {
 public:
  const ModelMetadata& metadata() const override { return metadata_; }
  bool can_batch() const override { return true; }
  Result<runtime::ModelInput> prepare(const InferRequest&) const override {
    return internal_error("unused");
  }
  void run(runtime::ModelInput&& input, runtime::RunCallback done) override {
    call_rows.push_back(input.rows);
    if (!input.values.empty() && input.values[0] < 0) {
      done(internal_error("negative input"));
      return;
    }
    Tensor output{"out", DataType::kFp32, {input.rows}, {}};
    for (int64_t row = 0; row < input.rows; ++row) {
      output.append(2 * input.values[row * input.columns]);
    }
    done(std::vector<Tensor>{std::move(output)});
  }

  std::vector<int64_t> call_rows;

 private:
  ModelMetadata metadata_;
};

runtime::ModelInput rows_of(std::initializer_list<float> first_features) {
  runtime::ModelInput input;
  input.columns = 2;
  for (float value : first_features) {
    input.values.push_back(value);
    input.values.push_back(0);
    ++input.rows;
  }
  return input;
}

// Collects the answers per request id.
struct Answers {
  std::map<int, std::vector<float>> values;
  int errors = 0;
  runtime::RunCallback for_request(int id) {
    return [this, id](Result<std::vector<Tensor>> result) {
      if (!result.is_ok()) {
        ++errors;
        return;
      }
      auto out = result->at(0).values<float>();
      values[id].assign(out.begin(), out.end());
    };
  }
};

// A scheduler that keeps flushes until the test runs them, like an event loop would.
struct DeferredScheduler {
  std::vector<std::function<void()>> tasks;
  std::vector<std::chrono::microseconds> delays;
  Batcher::Scheduler scheduler() {
    return [this](std::function<void()> task, std::chrono::microseconds delay) {
      tasks.push_back(std::move(task));
      delays.push_back(delay);
    };
  }
  void run_all() {
    auto pending = std::move(tasks);
    tasks.clear();
    for (auto& task : pending) {
      task();
    }
  }
};

TEST(BatcherTest, RunsAloneAtLowLoad) {
  DoublingRuntime runtime;
  Histogram rows({1, 2, 4, 8});
  Batcher batcher(runtime, 64, std::chrono::microseconds(0), rows,
                  [](std::function<void()> flush, std::chrono::microseconds) { flush(); });
  Answers answers;
  batcher.submit(rows_of({3, 4}), answers.for_request(0));
  EXPECT_EQ(answers.values[0], (std::vector<float>{6, 8}));
  EXPECT_EQ(runtime.call_rows, std::vector<int64_t>{2});
  EXPECT_EQ(rows.count(), 1u);
}

TEST(BatcherTest, DeferredFlushTakesEverythingQueuedBeforeIt) {
  DoublingRuntime runtime;
  Histogram rows({1, 2, 4, 8});
  DeferredScheduler loop;
  Batcher batcher(runtime, 64, std::chrono::microseconds(0), rows, loop.scheduler());
  Answers answers;
  for (int id = 0; id < 3; ++id) {
    batcher.submit(rows_of({static_cast<float>(id)}), answers.for_request(id));
  }
  ASSERT_EQ(loop.tasks.size(), 1u);  // one flush scheduled for the three requests
  EXPECT_TRUE(answers.values.empty());
  loop.run_all();
  EXPECT_EQ(runtime.call_rows, std::vector<int64_t>{3});
  for (int id = 0; id < 3; ++id) {
    EXPECT_EQ(answers.values[id], std::vector<float>{2.0f * id}) << id;
  }
}

TEST(BatcherTest, WritesWhenATracedRequestsBatchBeganToRun) {
  DoublingRuntime runtime;
  Histogram rows({1, 2, 4, 8});
  DeferredScheduler loop;
  Batcher batcher(runtime, 64, std::chrono::microseconds(0), rows, loop.scheduler());
  Answers answers;
  const std::chrono::steady_clock::time_point unset{};
  std::chrono::steady_clock::time_point first = unset;
  std::chrono::steady_clock::time_point second = unset;
  batcher.submit(rows_of({1}), answers.for_request(0), &first);
  batcher.submit(rows_of({2}), answers.for_request(1));  // not traced
  batcher.submit(rows_of({3}), answers.for_request(2), &second);
  EXPECT_EQ(first, unset) << "written when the batch runs, not when queued";
  const auto before = std::chrono::steady_clock::now();
  loop.run_all();
  EXPECT_GE(first, before);
  EXPECT_EQ(first, second) << "one batch, one start";
  EXPECT_EQ(answers.values.size(), 3u);
}

TEST(BatcherTest, SplitsTheQueueIntoWholeRequestsOfAtMostMaxRows) {
  DoublingRuntime runtime;
  Histogram rows({1, 2, 4, 8, 16});
  DeferredScheduler loop;
  Batcher batcher(runtime, 8, std::chrono::microseconds(0), rows, loop.scheduler());
  Answers answers;
  batcher.submit(rows_of({1}), answers.for_request(0));
  for (int id = 1; id <= 5; ++id) {
    const float base = static_cast<float>(id * 10);
    batcher.submit(rows_of({base, base + 1}), answers.for_request(id));
  }
  // The 5th request brought the queue to 9 rows: it flushed at once, 7 rows (1+2+2+2, the next
  // request would pass 8), then 2; the 6th request waits for the scheduled flush.
  EXPECT_EQ(runtime.call_rows, (std::vector<int64_t>{7, 2}));
  loop.run_all();
  EXPECT_EQ(runtime.call_rows, (std::vector<int64_t>{7, 2, 2}));
  EXPECT_EQ(answers.values[0], std::vector<float>{2});
  for (int id = 1; id <= 5; ++id) {
    EXPECT_EQ(answers.values[id], (std::vector<float>{id * 20.0f, id * 20.0f + 2})) << id;
  }
  EXPECT_EQ(rows.count(), 3u);
}

TEST(BatcherTest, FullBatchFlushesWithoutWaitingForTheDelay) {
  DoublingRuntime runtime;
  Histogram rows({1, 2, 4, 8});
  DeferredScheduler loop;
  Batcher batcher(runtime, 4, std::chrono::microseconds(500), rows, loop.scheduler());
  Answers answers;
  batcher.submit(rows_of({1}), answers.for_request(0));
  batcher.submit(rows_of({2, 3}), answers.for_request(1));
  EXPECT_TRUE(answers.values.empty());
  batcher.submit(rows_of({4}), answers.for_request(2));  // 4 rows: the batch is full
  EXPECT_EQ(answers.values.size(), 3u);
  EXPECT_EQ(runtime.call_rows, std::vector<int64_t>{4});
  ASSERT_EQ(loop.delays, std::vector<std::chrono::microseconds>{std::chrono::microseconds(500)});
  loop.run_all();  // the scheduled flush finds nothing left
  EXPECT_EQ(runtime.call_rows, std::vector<int64_t>{4});
}

TEST(BatcherTest, ReportsModelErrorsToEveryRequestOfTheBatch) {
  DoublingRuntime runtime;
  Histogram rows({1, 2, 4});
  DeferredScheduler loop;
  Batcher batcher(runtime, 8, std::chrono::microseconds(0), rows, loop.scheduler());
  Answers answers;
  batcher.submit(rows_of({-1}), answers.for_request(0));  // the merged batch starts with -1
  batcher.submit(rows_of({5}), answers.for_request(1));
  loop.run_all();
  EXPECT_EQ(answers.errors, 2);
  EXPECT_TRUE(answers.values.empty());
}

TEST(BatcherTest, ManyRoundsKeepEveryRequestsRows) {
  DoublingRuntime runtime;
  Histogram rows(exponential_buckets(1, 2, 8));
  DeferredScheduler loop;
  Batcher batcher(runtime, 16, std::chrono::microseconds(0), rows, loop.scheduler());
  Answers answers;
  for (int id = 0; id < 1000; ++id) {
    batcher.submit(rows_of({static_cast<float>(id)}), answers.for_request(id));
    if (id % 7 == 0) {
      loop.run_all();
    }
  }
  loop.run_all();
  ASSERT_EQ(answers.values.size(), 1000u);
  for (int id = 0; id < 1000; ++id) {
    ASSERT_EQ(answers.values[id], std::vector<float>{2.0f * id}) << id;
  }
}

}  // namespace
}  // namespace flotilla::replica

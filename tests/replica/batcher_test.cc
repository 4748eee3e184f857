#include "replica/batcher.h"

#include <atomic>
#include <condition_variable>
#include <thread>

#include <gtest/gtest.h>

namespace flotilla::replica {
namespace {

// An in-memory runtime (a fake): output row i = 2 * the first feature of row i; records the
// size of every call. `block` makes the first call wait, so others queue up behind it.
class DoublingRuntime final : public runtime::Runtime {
 public:
  const ModelMetadata& metadata() const override { return metadata_; }
  bool can_batch() const override { return true; }
  Result<runtime::ModelInput> prepare(const InferRequest&) const override {
    return internal_error("unused");
  }
  void run(runtime::ModelInput&& input, runtime::RunCallback done) override {
    {
      std::unique_lock lock(mutex_);
      call_rows_.push_back(input.rows);
      running_ = true;
      started_.notify_all();
      release_.wait(lock, [this] { return !block_; });
    }
    if (input.values.size() > 0 && input.values[0] < 0) {
      done(internal_error("negative input"));
      return;
    }
    Tensor output{"out", DataType::kFp32, {input.rows}, {}};
    for (int64_t row = 0; row < input.rows; ++row) {
      output.append(2 * input.values[row * input.columns]);
    }
    done(std::vector<Tensor>{std::move(output)});
  }

  void set_block(bool block) {
    std::lock_guard lock(mutex_);
    block_ = block;
    release_.notify_all();
  }
  void wait_running() {
    std::unique_lock lock(mutex_);
    started_.wait(lock, [this] { return running_; });
  }
  std::vector<int64_t> call_rows() {
    std::lock_guard lock(mutex_);
    return call_rows_;
  }

 private:
  ModelMetadata metadata_;
  std::mutex mutex_;
  std::condition_variable started_;
  std::condition_variable release_;
  bool block_ = false;
  bool running_ = false;
  std::vector<int64_t> call_rows_;
};

void run_inline(std::function<void()> flush, std::chrono::microseconds) {
  flush();
}

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

TEST(BatcherTest, RunsAloneAtLowLoadOnTheCallingThread) {
  DoublingRuntime runtime;
  Histogram rows({1, 2, 4, 8});
  Batcher batcher(runtime, 64, std::chrono::microseconds(0), rows, run_inline);
  std::vector<float> got;
  batcher.submit(rows_of({3, 4}), [&](Result<std::vector<Tensor>> result) {
    ASSERT_TRUE(result.is_ok());
    auto values = result->at(0).values<float>();
    got.assign(values.begin(), values.end());
  });
  EXPECT_EQ(got, (std::vector<float>{6, 8}));  // answered before submit returned
  EXPECT_EQ(runtime.call_rows(), std::vector<int64_t>{2});
}

TEST(BatcherTest, MergesRequestsQueuedWhileTheModelRuns) {
  DoublingRuntime runtime;
  Histogram rows({1, 2, 4, 8, 16});
  Batcher batcher(runtime, 8, std::chrono::microseconds(0), rows, run_inline);
  runtime.set_block(true);

  std::mutex mutex;
  std::map<int, std::vector<float>> answers;
  auto submit = [&](int id, runtime::ModelInput input) {
    batcher.submit(std::move(input), [&, id](Result<std::vector<Tensor>> result) {
      ASSERT_TRUE(result.is_ok());
      auto values = result->at(0).values<float>();
      std::lock_guard lock(mutex);
      answers[id].assign(values.begin(), values.end());
    });
  };
  // The leader blocks inside the model; the others queue behind it.
  std::thread leader([&] { submit(0, rows_of({1})); });
  runtime.wait_running();
  for (int id = 1; id <= 5; ++id) {
    submit(id, rows_of({static_cast<float>(id * 10), static_cast<float>(id * 10 + 1)}));
  }
  runtime.set_block(false);
  leader.join();

  // 1 row alone, then 10 queued rows in batches of at most 8 rows (whole requests only).
  EXPECT_EQ(runtime.call_rows(), (std::vector<int64_t>{1, 8, 2}));
  ASSERT_EQ(answers.size(), 6u);
  EXPECT_EQ(answers[0], std::vector<float>{2});
  for (int id = 1; id <= 5; ++id) {
    EXPECT_EQ(answers[id], (std::vector<float>{id * 20.0f, id * 20.0f + 2})) << id;
  }
  EXPECT_EQ(rows.count(), 3u);
}

TEST(BatcherTest, ReportsModelErrorsToEveryRequestOfTheBatch) {
  DoublingRuntime runtime;
  Histogram rows({1, 2, 4});
  Batcher batcher(runtime, 8, std::chrono::microseconds(0), rows, run_inline);
  runtime.set_block(true);
  std::atomic<int> errors{0};
  std::thread leader([&] {
    batcher.submit(rows_of({1}), [](Result<std::vector<Tensor>> r) { EXPECT_TRUE(r.is_ok()); });
  });
  runtime.wait_running();
  for (float value : {-1.0f, 5.0f}) {  // merged: the batch starts with -1, so it fails
    batcher.submit(rows_of({value}), [&](Result<std::vector<Tensor>> result) {
      EXPECT_FALSE(result.is_ok());
      ++errors;
    });
  }
  runtime.set_block(false);
  leader.join();
  EXPECT_EQ(errors.load(), 2);
}

TEST(BatcherTest, DeferredFlushTakesEverythingQueuedBeforeIt) {
  DoublingRuntime runtime;
  Histogram rows({1, 2, 4, 8});
  std::vector<std::function<void()>> deferred;
  Batcher batcher(runtime, 64, std::chrono::microseconds(0), rows,
                  [&deferred](std::function<void()> flush, std::chrono::microseconds) {
                    deferred.push_back(std::move(flush));
                  });
  int answered = 0;
  for (float value : {1.0f, 2.0f, 3.0f}) {
    batcher.submit(rows_of({value}), [&](Result<std::vector<Tensor>> result) {
      EXPECT_TRUE(result.is_ok());
      ++answered;
    });
  }
  ASSERT_EQ(deferred.size(), 1u);  // one flush scheduled for the three requests
  EXPECT_EQ(answered, 0);
  deferred[0]();
  EXPECT_EQ(answered, 3);
  EXPECT_EQ(runtime.call_rows(), std::vector<int64_t>{3});
}

TEST(BatcherTest, FullBatchFlushesWithoutWaitingForTheSchedule) {
  DoublingRuntime runtime;
  Histogram rows({1, 2, 4, 8});
  std::vector<std::function<void()>> deferred;
  std::vector<std::chrono::microseconds> delays;
  Batcher batcher(runtime, 4, std::chrono::microseconds(500), rows,
                  [&](std::function<void()> flush, std::chrono::microseconds delay) {
                    deferred.push_back(std::move(flush));
                    delays.push_back(delay);
                  });
  int answered = 0;
  auto count = [&](Result<std::vector<Tensor>> result) {
    EXPECT_TRUE(result.is_ok());
    ++answered;
  };
  batcher.submit(rows_of({1}), count);
  batcher.submit(rows_of({2, 3}), count);
  EXPECT_EQ(answered, 0);
  batcher.submit(rows_of({4}), count);  // 4 rows: the batch is full
  EXPECT_EQ(answered, 3);
  EXPECT_EQ(runtime.call_rows(), std::vector<int64_t>{4});
  ASSERT_EQ(delays, std::vector<std::chrono::microseconds>{std::chrono::microseconds(500)});
  deferred[0]();  // the scheduled flush finds nothing left
  EXPECT_EQ(runtime.call_rows(), std::vector<int64_t>{4});
}

TEST(BatcherTest, ManyThreadsEachGetTheirOwnRows) {
  DoublingRuntime runtime;
  Histogram rows(exponential_buckets(1, 2, 8));
  Batcher batcher(runtime, 16, std::chrono::microseconds(0), rows, run_inline);
  std::atomic<int> wrong{0};
  std::atomic<int> answered{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        const float value = static_cast<float>(t * 1000 + i);
        batcher.submit(rows_of({value}), [&, value](Result<std::vector<Tensor>> result) {
          if (!result.is_ok() || result->at(0).values<float>()[0] != 2 * value) {
            ++wrong;
          }
          ++answered;
        });
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  EXPECT_EQ(answered.load(), 2000);
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace flotilla::replica

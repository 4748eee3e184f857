// Dynamic batching: merges the rows of concurrent requests into one model call.
//
// Leader/follower, after leveldb's DBImpl::Write: the thread that submits while no batch is
// running becomes the leader and runs batches, its own first, until the queue is empty; a
// thread that submits while a batch runs only enqueues and returns to its event loop. At low
// load a request therefore runs inline with no thread hand-off; under load, requests that
// arrive during one model call form the next batch.
//
// Thread-safe. Callbacks run on the leader's thread, without the lock held.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "common/common.h"
#include "runtime/runtime.h"

namespace flotilla::replica {

class Batcher {
 public:
  // `runtime` and `batch_rows` must outlive the batcher.
  Batcher(runtime::Runtime& runtime, int64_t max_batch_rows,
          std::chrono::microseconds max_queue_delay, Histogram& batch_rows);
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Runs `input` in some batch and calls `done` with this request's rows of every output.
  // May run batches on the calling thread before it returns.
  void submit(runtime::ModelInput&& input, runtime::RunCallback done);

 private:
  struct Item {
    runtime::ModelInput input;
    runtime::RunCallback done;
  };
  using Clock = std::chrono::steady_clock;

  // Takes up to max_batch_rows_ rows of queued items (always at least one); waits up to
  // max_queue_delay_ for more when the batch is not full. Requires mutex_ held via `lock`.
  std::vector<Item> take_batch(std::unique_lock<std::mutex>& lock);
  void run_batch(std::vector<Item>&& batch);

  runtime::Runtime& runtime_;
  const int64_t max_batch_rows_;
  const std::chrono::microseconds max_queue_delay_;
  Histogram& batch_rows_;

  std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<Item> queue_;     // guarded by mutex_
  int64_t queued_rows_ = 0;    // guarded by mutex_
  bool leader_active_ = false; // guarded by mutex_
};

}  // namespace flotilla::replica

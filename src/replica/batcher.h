// Dynamic batching: merges the rows of concurrent requests into one model call.
//
// No batcher thread. A request is queued; the first request queued while no flush is
// scheduled schedules one, max_queue_delay later (the replica defers it on the submitting
// event loop, behind the requests that loop has already read, without blocking the loop). A
// request that fills the queue to max_batch_rows flushes at once. A flush runs batches,
// leader/follower style after leveldb's DBImpl::Write, until the queue is empty; requests
// submitted meanwhile from any thread only queue. At low load a request runs on its own
// thread with no hand-off; under load, requests read in one event-loop pass, or during one
// model call, form one batch.
//
// Thread-safe. Callbacks run on the flushing thread, without the lock held.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <mutex>

#include "common/common.h"
#include "runtime/runtime.h"

namespace flotilla::replica {

class Batcher {
 public:
  using Scheduler = std::function<void(std::function<void()>, std::chrono::microseconds)>;

  // `runtime` and `batch_rows` must outlive the batcher. `schedule(task, delay)` runs a flush
  // after about `delay`, on the calling thread (inline, or later on its event loop).
  Batcher(runtime::Runtime& runtime, int64_t max_batch_rows,
          std::chrono::microseconds max_queue_delay, Histogram& batch_rows, Scheduler schedule);
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Runs `input` in some batch and calls `done` with this request's rows of every output.
  void submit(runtime::ModelInput&& input, runtime::RunCallback done);

 private:
  struct Item {
    runtime::ModelInput input;
    runtime::RunCallback done;
  };
  using Clock = std::chrono::steady_clock;

  // Takes up to max_batch_rows_ rows of queued items (always at least one). Requires mutex_.
  std::vector<Item> take_batch();
  void run_batch(std::vector<Item>&& batch);
  // Runs batches until the queue is empty, unless another thread is already doing so.
  void flush();
  void scheduled_flush();

  runtime::Runtime& runtime_;
  const int64_t max_batch_rows_;
  const std::chrono::microseconds max_queue_delay_;
  Histogram& batch_rows_;
  Scheduler schedule_;

  std::mutex mutex_;
  std::deque<Item> queue_;        // guarded by mutex_
  int64_t queued_rows_ = 0;       // guarded by mutex_
  bool flush_scheduled_ = false;  // guarded by mutex_
  bool flushing_ = false;         // guarded by mutex_
};

}  // namespace flotilla::replica

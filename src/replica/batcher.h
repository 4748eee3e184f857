// Dynamic batching: merges the rows of concurrent requests into one model call.
//
// One batcher per event-loop worker, confined to that worker's thread: no lock, and each
// worker runs its own model calls, so several cores predict at once. A request is queued; the
// first request queued while no flush is scheduled schedules one, max_queue_delay later (the
// replica defers it on the worker's event loop, behind the requests that loop has already
// read, without blocking the loop). A request that fills the queue to max_batch_rows flushes
// at once. At low load a request therefore runs alone after one cheap post; under load, the
// requests read in one event-loop pass form one batch.
//
// Not thread-safe: every call, and every scheduled flush, on the owning thread.
#pragma once

#include <chrono>
#include <deque>
#include <functional>

#include "common/common.h"
#include "runtime/runtime.h"

namespace flotilla::replica {

class Batcher {
 public:
  using Scheduler = std::function<void(std::function<void()>, std::chrono::microseconds)>;

  // `runtime` and `batch_rows` must outlive the batcher. `schedule(task, delay)` runs a flush
  // after about `delay` on the owning thread (inline, or later on its event loop).
  Batcher(runtime::Runtime& runtime, int64_t max_batch_rows,
          std::chrono::microseconds max_queue_delay, Histogram& batch_rows, Scheduler schedule);
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Runs `input` in some batch and calls `done` with this request's rows of every output.
  // `run_start`, when given, gets the time its batch began to run (a traced request's batch
  // wait ends there); it must stay valid until `done` runs.
  void submit(runtime::ModelInput&& input, runtime::RunCallback done,
              std::chrono::steady_clock::time_point* run_start = nullptr);

 private:
  struct Item {
    runtime::ModelInput input;
    runtime::RunCallback done;
    std::chrono::steady_clock::time_point* run_start;
  };

  // Runs batches until the queue is empty.
  void flush();
  // Takes up to max_batch_rows_ rows of queued items (always at least one).
  std::vector<Item> take_batch();
  void run_batch(std::vector<Item>&& batch);

  runtime::Runtime& runtime_;
  const int64_t max_batch_rows_;
  const std::chrono::microseconds max_queue_delay_;
  Histogram& batch_rows_;
  Scheduler schedule_;

  std::deque<Item> queue_;
  int64_t queued_rows_ = 0;
  bool flush_scheduled_ = false;
  bool flushing_ = false;  // guards against a callback submitting from inside flush()
};

}  // namespace flotilla::replica

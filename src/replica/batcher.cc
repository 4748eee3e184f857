#include "replica/batcher.h"

namespace flotilla::replica {

Batcher::Batcher(runtime::Runtime& runtime, int64_t max_batch_rows,
                 std::chrono::microseconds max_queue_delay, Histogram& batch_rows)
    : runtime_(runtime),
      max_batch_rows_(std::max<int64_t>(1, max_batch_rows)),
      max_queue_delay_(max_queue_delay),
      batch_rows_(batch_rows) {}

void Batcher::submit(runtime::ModelInput&& input, runtime::RunCallback done) {
  std::unique_lock lock(mutex_);
  queued_rows_ += input.rows;
  queue_.push_back(Item{std::move(input), std::move(done)});
  if (leader_active_) {
    arrived_.notify_one();  // a leader waiting out max_queue_delay may now be full
    return;
  }
  leader_active_ = true;
  while (!queue_.empty()) {
    std::vector<Item> batch = take_batch(lock);
    lock.unlock();
    run_batch(std::move(batch));
    lock.lock();
  }
  leader_active_ = false;
}

std::vector<Batcher::Item> Batcher::take_batch(std::unique_lock<std::mutex>& lock) {
  if (max_queue_delay_.count() > 0 && queued_rows_ < max_batch_rows_) {
    const auto deadline = Clock::now() + max_queue_delay_;
    arrived_.wait_until(lock, deadline, [this] { return queued_rows_ >= max_batch_rows_; });
  }
  std::vector<Item> batch;
  int64_t rows = 0;
  while (!queue_.empty() &&
         (batch.empty() || rows + queue_.front().input.rows <= max_batch_rows_)) {
    rows += queue_.front().input.rows;
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  queued_rows_ -= rows;
  return batch;
}

void Batcher::run_batch(std::vector<Item>&& batch) {
  if (batch.size() == 1) {
    batch_rows_.observe(static_cast<double>(batch[0].input.rows));
    runtime_.run(std::move(batch[0].input), std::move(batch[0].done));
    return;
  }
  runtime::ModelInput merged;
  merged.columns = batch[0].input.columns;
  for (const Item& item : batch) {
    merged.rows += item.input.rows;
  }
  merged.values.reserve(static_cast<size_t>(merged.rows * merged.columns));
  for (const Item& item : batch) {
    merged.values.insert(merged.values.end(), item.input.values.begin(), item.input.values.end());
  }
  batch_rows_.observe(static_cast<double>(merged.rows));
  // Each item's rows are a contiguous range of the merged input, in batch order.
  auto items = std::make_shared<std::vector<Item>>(std::move(batch));
  runtime_.run(std::move(merged), [items](Result<std::vector<Tensor>> result) {
    int64_t offset = 0;
    for (Item& item : *items) {
      const int64_t rows = item.input.rows;
      if (!result.is_ok()) {
        item.done(result.status());
        continue;
      }
      std::vector<Tensor> slices;
      for (const Tensor& output : result.value()) {
        slices.push_back(output.slice_rows(offset, offset + rows));
      }
      offset += rows;
      item.done(std::move(slices));
    }
  });
}

}  // namespace flotilla::replica

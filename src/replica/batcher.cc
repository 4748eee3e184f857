#include "replica/batcher.h"

namespace flotilla::replica {

Batcher::Batcher(runtime::Runtime& runtime, int64_t max_batch_rows,
                 std::chrono::microseconds max_queue_delay, Histogram& batch_rows,
                 Scheduler schedule)
    : runtime_(runtime),
      max_batch_rows_(std::max<int64_t>(1, max_batch_rows)),
      max_queue_delay_(max_queue_delay),
      batch_rows_(batch_rows),
      schedule_(std::move(schedule)) {}

void Batcher::submit(runtime::ModelInput&& input, runtime::RunCallback done,
                     std::chrono::steady_clock::time_point* run_start) {
  queued_rows_ += input.rows;
  queue_.push_back(Item{std::move(input), std::move(done), run_start});
  if (flushing_) {
    return;  // the running flush takes it
  }
  if (queued_rows_ >= max_batch_rows_) {
    flush();  // a full batch need not wait
  } else if (!flush_scheduled_) {
    flush_scheduled_ = true;
    schedule_(
        [this] {
          flush_scheduled_ = false;
          flush();
        },
        max_queue_delay_);
  }
}

void Batcher::flush() {
  if (flushing_) {
    return;
  }
  flushing_ = true;
  while (!queue_.empty()) {
    run_batch(take_batch());
  }
  flushing_ = false;
}

std::vector<Batcher::Item> Batcher::take_batch() {
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
  std::chrono::steady_clock::time_point now{};
  for (const Item& item : batch) {
    if (item.run_start != nullptr) {
      if (now == std::chrono::steady_clock::time_point{}) {
        now = std::chrono::steady_clock::now();  // once a batch, and only when traced
      }
      *item.run_start = now;
    }
  }
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

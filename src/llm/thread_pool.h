// A fixed set of compute threads for the forward pass. A step runs ~40 parallel regions (a
// few per layer), each tens of microseconds long, so waking threads through the kernel for each
// one would cost as much as the work: workers spin for a while after a region before they
// sleep, and the caller runs a share of every region itself.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace flotilla::llm {

class ThreadPool {
 public:
  // `threads` in all, the caller included; at least 1.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls task(index, size()) once for each index in [0, size()) — index 0 on the calling
  // thread — and returns when all have returned. Not reentrant; one caller at a time.
  void run(const std::function<void(int index, int count)>& task);

  // Splits [0, n) into size() contiguous parts, each a multiple of `align` but the last, and
  // calls body(begin, end) for each non-empty part in parallel.
  void parallel_for(int n, int align, const std::function<void(int begin, int end)>& body);

 private:
  void work(int index);

  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* task_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace flotilla::llm

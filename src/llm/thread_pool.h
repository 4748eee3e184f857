// A fixed set of compute threads for the forward pass. A step runs ~40 parallel regions (a
// few per layer), each tens of microseconds long, so waking threads through the kernel for each
// one would cost as much as the work: workers spin briefly after a region before they sleep.
//
// Work is handed out in chunks claimed one at a time, and the calling thread claims chunks too.
// When the machine has more runnable threads than cores, a worker that is not scheduled claims
// nothing and the caller does its share, instead of waiting a scheduler slice for it.
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

  // Calls body(begin, end) over [0, n) in chunks whose starts are multiples of `align`, on the
  // pool's threads and the caller's, and returns when all have returned. One caller at a time.
  void parallel_for(int n, int align, const std::function<void(int begin, int end)>& body);

 private:
  // Claims and runs chunks of the region `word` describes until none is left; false when the
  // region is over (or a newer one began).
  void work_on(uint64_t region);
  void worker_loop();

  std::vector<std::thread> workers_;
  // The current region: generation (24 bits) | chunk count (20) | next unclaimed chunk (20).
  // Claims are compare-and-swaps on the whole word, so a late worker never claims a chunk of a
  // newer region with an older region's parameters.
  std::atomic<uint64_t> claim_{0};
  // Written before claim_ announces the region, stable until all its chunks are done.
  const std::function<void(int, int)>* body_ = nullptr;
  int n_ = 0;
  int chunk_ = 0;
  std::atomic<int> done_{0};
  std::atomic<uint32_t> sleep_generation_{0};  // futex word workers sleep on
  std::atomic<int> sleeping_{0};
  std::atomic<bool> stopping_{false};
  uint64_t generation_ = 0;
};

}  // namespace flotilla::llm

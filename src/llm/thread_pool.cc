#include "llm/thread_pool.h"

#include <algorithm>

#include "common/common.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace flotilla::llm {
namespace {

// About 100 µs of spinning: longer than the gap between two regions of a step, far shorter
// than the gap between steps when the engine is idle.
constexpr int kSpinIterations = 20000;

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  FLOTILLA_CHECK(threads >= 1);
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this, i] { work(i); });
  }
}

ThreadPool::~ThreadPool() {
  stopping_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (std::thread& worker : workers_) {
    worker.join();
  }
}

void ThreadPool::run(const std::function<void(int, int)>& task) {
  if (workers_.empty()) {
    task(0, 1);
    return;
  }
  task_ = &task;
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  task(0, size());
  while (pending_.load(std::memory_order_acquire) != 0) {
    cpu_relax();
  }
}

void ThreadPool::parallel_for(int n, int align, const std::function<void(int, int)>& body) {
  int parts = size();
  // Each part a multiple of `align`: kernels work on tiles of rows.
  int per_part = (n + parts - 1) / parts;
  per_part = (per_part + align - 1) / align * align;
  run([&](int index, int) {
    int begin = std::min(n, index * per_part);
    int end = std::min(n, begin + per_part);
    if (begin < end) {
      body(begin, end);
    }
  });
}

void ThreadPool::work(int index) {
  uint64_t seen = 0;
  while (true) {
    uint64_t current = generation_.load(std::memory_order_acquire);
    for (int spin = 0; current == seen && spin < kSpinIterations; ++spin) {
      cpu_relax();
      current = generation_.load(std::memory_order_acquire);
    }
    if (current == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = current;
    if (stopping_.load()) {
      return;
    }
    (*task_)(index, size());
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace flotilla::llm

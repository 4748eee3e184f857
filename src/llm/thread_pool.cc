#include "llm/thread_pool.h"

#include <algorithm>

#include "common/common.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace flotilla::llm {
namespace {

// Spinning (with pause) covers the gap between two regions of a step, a few microseconds.
// Past it a waiting thread yields its core at every check, then sleeps: a thread that kept
// spinning would hold a core that a thread it waits for may need.
constexpr int kSpinIterations = 2000;
constexpr int kYieldIterations = 2000;

constexpr int kFieldBits = 20;
constexpr uint64_t kFieldMask = (uint64_t{1} << kFieldBits) - 1;

uint64_t region_word(uint64_t generation, uint64_t chunks, uint64_t next) {
  return (generation << (2 * kFieldBits)) | (chunks << kFieldBits) | next;
}
uint64_t generation_of(uint64_t word) {
  return word >> (2 * kFieldBits);
}
uint64_t chunks_of(uint64_t word) {
  return (word >> kFieldBits) & kFieldMask;
}
uint64_t next_of(uint64_t word) {
  return word & kFieldMask;
}

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// Waits with the spin-then-yield policy until `done()`; false if it gave up (caller sleeps).
template <typename Done>
bool spin_until(Done done, bool may_give_up) {
  for (int spin = 0; !done(); ++spin) {
    if (spin < kSpinIterations) {
      cpu_relax();
    } else if (!may_give_up || spin < kSpinIterations + kYieldIterations) {
      std::this_thread::yield();
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  FLOTILLA_CHECK(threads >= 1);
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this] { worker_loop(); });
  }
}

ThreadPool::~ThreadPool() {
  stopping_.store(true);
  sleep_generation_.fetch_add(1);
  sleep_generation_.notify_all();
  for (std::thread& worker : workers_) {
    worker.join();
  }
}

void ThreadPool::parallel_for(int n, int align, const std::function<void(int, int)>& body) {
  if (n <= 0) {
    return;
  }
  // About four chunks per thread: enough to balance, few enough to claim cheaply.
  int chunk = (n + size() * 4 - 1) / (size() * 4);
  chunk = std::max(align, (chunk + align - 1) / align * align);
  int chunks = (n + chunk - 1) / chunk;
  if (workers_.empty() || chunks == 1) {
    body(0, n);
    return;
  }
  FLOTILLA_CHECK(static_cast<uint64_t>(chunks) <= kFieldMask);
  body_ = &body;
  n_ = n;
  chunk_ = chunk;
  done_.store(0, std::memory_order_relaxed);
  generation_ = (generation_ + 1) & ((uint64_t{1} << 24) - 1);
  const uint64_t region = region_word(generation_, chunks, 0);
  // Sequentially consistent with the worker's sleeping_ increment and re-check: either the
  // worker sees this region, or this sees the worker asleep and wakes it.
  claim_.store(region);
  if (sleeping_.load() > 0) {
    sleep_generation_.fetch_add(1, std::memory_order_release);
    sleep_generation_.notify_all();
  }
  work_on(region);
  spin_until([&] { return done_.load(std::memory_order_acquire) == chunks; }, false);
}

void ThreadPool::work_on(uint64_t region) {
  uint64_t word = claim_.load(std::memory_order_acquire);
  while (generation_of(word) == generation_of(region) && next_of(word) < chunks_of(word)) {
    if (!claim_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel)) {
      continue;  // `word` now holds the current value
    }
    // The claimed chunk keeps the region open, so body_, n_ and chunk_ are stable here.
    int begin = static_cast<int>(next_of(word)) * chunk_;
    (*body_)(begin, std::min(n_, begin + chunk_));
    done_.fetch_add(1, std::memory_order_acq_rel);
    word = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;  // the last region this worker took part in
  while (!stopping_.load(std::memory_order_acquire)) {
    uint64_t word = claim_.load(std::memory_order_acquire);
    auto fresh = [&] {
      word = claim_.load();
      return generation_of(word) != generation_of(seen) || stopping_.load();
    };
    if (!spin_until(fresh, true)) {
      uint32_t sleep_word = sleep_generation_.load(std::memory_order_acquire);
      sleeping_.fetch_add(1);
      if (!fresh()) {
        sleep_generation_.wait(sleep_word, std::memory_order_acquire);
      }
      sleeping_.fetch_sub(1, std::memory_order_acq_rel);
      continue;
    }
    seen = word;
    work_on(word);
  }
}

}  // namespace flotilla::llm

// Recycled memory for parsing. A parser per request allocates every header field, the target
// and the reason phrase on the heap, about ten blocks a proxied request; a cache per connection
// keeps the blocks one parse freed and hands them to the next, so a warm keep-alive connection
// parses without the heap. Bodies are recycled per thread instead (see BodyRecycler). Private
// to the http module.
#pragma once

#include <array>
#include <cstddef>
#include <new>
#include <string>
#include <vector>

namespace flotilla::http {

// Small blocks kept by size class (32-byte steps up to 512 bytes, a few per class); larger ones
// go straight to the heap. Not thread-safe: one per connection, used on its loop's thread.
class BlockCache {
 public:
  BlockCache() = default;
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  ~BlockCache() {
    for (auto& blocks : free_) {
      for (void* block : blocks) {
        ::operator delete(block);
      }
    }
  }

  void* allocate(size_t bytes) {
    const size_t size_class = class_of(bytes);
    if (size_class >= kClasses) {
      return ::operator new(bytes);
    }
    auto& blocks = free_[size_class];
    if (blocks.empty()) {
      return ::operator new((size_class + 1) * kGranule);
    }
    void* block = blocks.back();
    blocks.pop_back();
    return block;
  }

  void deallocate(void* block, size_t bytes) {
    const size_t size_class = class_of(bytes);
    if (size_class < kClasses && free_[size_class].size() < kKeep) {
      free_[size_class].push_back(block);
      return;
    }
    ::operator delete(block);
  }

 private:
  static constexpr size_t kGranule = 32;
  static constexpr size_t kClasses = 16;  // up to 512 bytes
  static constexpr size_t kKeep = 16;     // blocks kept per class
  static size_t class_of(size_t bytes) { return bytes == 0 ? 0 : (bytes - 1) / kGranule; }

  std::array<std::vector<void*>, kClasses> free_;
};

// A standard allocator over a BlockCache; a default-constructed one uses the heap directly.
template <class T>
class CachedAllocator {
 public:
  using value_type = T;
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);

  CachedAllocator() noexcept = default;
  explicit CachedAllocator(BlockCache* cache) noexcept : cache_(cache) {}
  template <class U>
  CachedAllocator(const CachedAllocator<U>& other) noexcept : cache_(other.cache()) {}

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    return static_cast<T*>(cache_ != nullptr ? cache_->allocate(bytes) : ::operator new(bytes));
  }
  void deallocate(T* block, size_t n) noexcept {
    if (cache_ != nullptr) {
      cache_->deallocate(block, n * sizeof(T));
    } else {
      ::operator delete(block);
    }
  }

  BlockCache* cache() const noexcept { return cache_; }
  template <class U>
  bool operator==(const CachedAllocator<U>& other) const noexcept {
    return cache_ == other.cache();
  }

 private:
  BlockCache* cache_ = nullptr;
};

// Body strings kept with their capacity on each thread. A body read by a parser is handed on
// (to the handler, or in a proxy to the other side) and written out; the writer gives its
// string back here and the next parse on that thread takes it, so a proxied body costs no heap
// allocation once warm. A string that never comes back (a handler kept it) costs what it always
// did: a fresh one.
class BodyRecycler {
 public:
  // An empty string, with capacity when one was given back on this thread.
  static std::string take() {
    auto& kept = strings();
    if (kept.empty()) {
      return {};
    }
    std::string body = std::move(kept.back());
    kept.pop_back();
    return body;
  }

  // Keeps `body`'s buffer for a later take() on this thread; small and huge ones are dropped.
  static void give(std::string&& body) {
    auto& kept = strings();
    if (body.capacity() <= kSmallString || body.capacity() > kMaxBytes || kept.size() >= kKeep) {
      return;
    }
    body.clear();
    kept.push_back(std::move(body));
  }

 private:
  static constexpr size_t kSmallString = 15;  // held in the string itself: nothing to recycle
  static constexpr size_t kMaxBytes = 64 * 1024;
  static constexpr size_t kKeep = 64;

  static std::vector<std::string>& strings() {
    thread_local std::vector<std::string> kept = [] {
      std::vector<std::string> empty;
      empty.reserve(kKeep);
      return empty;
    }();
    return kept;
  }
};

}  // namespace flotilla::http

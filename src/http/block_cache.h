// Recycled memory for Beast's header fields. A parser per request allocates every header field,
// the target and the reason phrase on the heap, about ten blocks a proxied request; a cache per
// connection keeps the blocks one parse freed and hands them to the next, so a warm keep-alive
// connection parses without the heap. Private to the http module.
#pragma once

#include <array>
#include <cstddef>
#include <new>
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

}  // namespace flotilla::http

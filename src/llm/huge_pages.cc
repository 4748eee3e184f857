#include "llm/huge_pages.h"

#include <cstdlib>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace flotilla::llm {
namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

void* allocate_on_huge_pages(size_t bytes) {
  if (bytes < kHugePage) {
    return ::operator new(bytes);
  }
  // Address space to the next 2 MiB (aligned_alloc wants a multiple of the alignment); only the
  // whole 2 MiB pieces are advised.
  void* p = std::aligned_alloc(kHugePage, (bytes + kHugePage - 1) / kHugePage * kHugePage);
  if (p == nullptr) {
    throw std::bad_alloc();
  }
#if defined(MADV_HUGEPAGE)
  ::madvise(p, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // advice: without THP, no worse
#endif
  return p;
}

void free_on_huge_pages(void* p, size_t bytes) noexcept {
  if (bytes < kHugePage) {
    ::operator delete(p);
  } else {
    std::free(p);
  }
}

}  // namespace flotilla::llm

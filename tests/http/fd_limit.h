// Runs a test's own process short of descriptors (RLIMIT_NOFILE), to see what the server and
// the client do when none is left. Not thread-safe: the limit is the whole process's.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

namespace flotilla::http {

// The number the next descriptor opened would get.
inline int lowest_free_descriptor() {
  const int probe = ::dup(0);
  ::close(probe);
  return probe;
}

// Sets the soft limit for its lifetime, then restores the limit it found.
class ScopedFdLimit {
 public:
  explicit ScopedFdLimit(rlim_t soft) {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit lowered = saved_;
    lowered.rlim_cur = soft;
    ok_ = ::setrlimit(RLIMIT_NOFILE, &lowered) == 0;
  }
  ~ScopedFdLimit() { ::setrlimit(RLIMIT_NOFILE, &saved_); }
  ScopedFdLimit(const ScopedFdLimit&) = delete;
  ScopedFdLimit& operator=(const ScopedFdLimit&) = delete;
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  bool ok_ = false;
};

}  // namespace flotilla::http

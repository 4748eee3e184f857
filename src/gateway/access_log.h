// The JSON access log, written by a background thread so a request never waits on a disk.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "common/common.h"

namespace flotilla::gateway {

// Thread-safe: append() from any thread takes a short lock to move a line into a buffer; the
// writer thread swaps the buffer out and writes it every 100 ms or sooner when it grows. Lines
// are dropped (and counted) when the writer falls more than 8 MiB behind.
class AccessLog {
 public:
  // `path`: a file (appended to), or "-" for stderr.
  static Result<std::unique_ptr<AccessLog>> open(const std::string& path);
  ~AccessLog();  // flushes what is buffered

  void append(std::string&& line);  // `line` ends without a newline
  uint64_t dropped() const;

 private:
  explicit AccessLog(std::FILE* file, bool owned);
  void run();

  std::FILE* file_;
  bool owned_;
  mutable Mutex mutex_;
  CondVar wake_;
  std::string buffer_ FLOTILLA_GUARDED_BY(mutex_);
  bool stop_ FLOTILLA_GUARDED_BY(mutex_) = false;
  uint64_t dropped_ FLOTILLA_GUARDED_BY(mutex_) = 0;
  std::thread writer_;
};

}  // namespace flotilla::gateway

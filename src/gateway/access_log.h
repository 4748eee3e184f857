// The JSON access log, written by a background thread so a request never waits on a disk.
#pragma once

#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
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
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::string buffer_;    // guarded by mutex_
  bool stop_ = false;     // guarded by mutex_
  uint64_t dropped_ = 0;  // guarded by mutex_
  std::thread writer_;
};

}  // namespace flotilla::gateway

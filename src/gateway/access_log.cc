#include "gateway/access_log.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace flotilla::gateway {
namespace {
constexpr size_t kMaxBufferedBytes = 8 << 20;
constexpr size_t kFlushBytes = 64 << 10;
}  // namespace

Result<std::unique_ptr<AccessLog>> AccessLog::open(const std::string& path) {
  if (path == "-") {
    return std::unique_ptr<AccessLog>(new AccessLog(stderr, false));
  }
  std::FILE* file = std::fopen(path.c_str(), "ae");
  if (file == nullptr) {
    return invalid_argument("cannot open access log '" + path + "': " + std::strerror(errno));
  }
  return std::unique_ptr<AccessLog>(new AccessLog(file, true));
}

AccessLog::AccessLog(std::FILE* file, bool owned) : file_(file), owned_(owned) {
  writer_ = std::thread([this] { run(); });
}

AccessLog::~AccessLog() {
  {
    MutexLock lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  writer_.join();
  if (owned_) {
    std::fclose(file_);
  }
}

void AccessLog::append(std::string&& line) {
  bool wake = false;
  {
    MutexLock lock(mutex_);
    if (buffer_.size() + line.size() > kMaxBufferedBytes) {
      ++dropped_;
      return;
    }
    buffer_.append(line);
    buffer_.push_back('\n');
    wake = buffer_.size() >= kFlushBytes;
  }
  if (wake) {
    wake_.notify_one();
  }
}

uint64_t AccessLog::dropped() const {
  MutexLock lock(mutex_);
  return dropped_;
}

void AccessLog::run() {
  std::string out;
  mutex_.lock();
  while (true) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    while (!stop_ && buffer_.size() < kFlushBytes) {
      if (!wake_.wait_until(mutex_, deadline)) {
        break;
      }
    }
    out.swap(buffer_);
    const bool stop = stop_;
    mutex_.unlock();
    if (!out.empty()) {
      std::fwrite(out.data(), 1, out.size(), file_);
      std::fflush(file_);
      out.clear();
    }
    if (stop) {
      return;
    }
    mutex_.lock();
  }
}

}  // namespace flotilla::gateway

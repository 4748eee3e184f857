#include "gateway/access_log.h"

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
    std::lock_guard lock(mutex_);
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
    std::lock_guard lock(mutex_);
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
  std::lock_guard lock(mutex_);
  return dropped_;
}

void AccessLog::run() {
  std::string out;
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait_for(lock, std::chrono::milliseconds(100),
                   [this] { return stop_ || buffer_.size() >= kFlushBytes; });
    out.swap(buffer_);
    const bool stop = stop_;
    lock.unlock();
    if (!out.empty()) {
      std::fwrite(out.data(), 1, out.size(), file_);
      std::fflush(file_);
      out.clear();
    }
    if (stop) {
      return;
    }
    lock.lock();
  }
}

}  // namespace flotilla::gateway

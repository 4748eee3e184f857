#include "gateway/access_log.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace flotilla::gateway {
namespace {
constexpr size_t kMaxBufferedBytes = 8 << 20;
constexpr size_t kFlushBytes = 64 << 10;
}  // namespace

std::string_view traceparent_trace_id(std::string_view header) {
  // 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
  constexpr size_t kLength = 55;
  if (header.size() != kLength || header[2] != '-' || header[35] != '-' || header[52] != '-') {
    return {};
  }
  auto lower_hex = [](std::string_view digits) {
    return std::all_of(digits.begin(), digits.end(),
                       [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
  };
  const std::string_view trace_id = header.substr(3, 32);
  if (header.substr(0, 2) != "00" || !lower_hex(trace_id) || !lower_hex(header.substr(36, 16)) ||
      !lower_hex(header.substr(53, 2)) ||
      trace_id.find_first_not_of('0') == std::string_view::npos) {
    return {};
  }
  return trace_id;
}

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

#include "store/download.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <deque>
#include <fstream>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "common/common_sha256.h"

namespace flotilla::store {
namespace {

using Clock = std::chrono::steady_clock;

// Bytes done, reported to the caller at most every 200 ms and to the log every 5 s.
class Meter {
 public:
  Meter(std::string url, const PullOptions& options) : url_(std::move(url)), options_(options) {}

  void set_total(uint64_t total) {
    MutexLock lock(mu_);
    total_ = total;
  }
  void add(uint64_t bytes, bool final = false) {
    const uint64_t done = done_ += bytes;
    MutexLock lock(mu_);
    const auto now = Clock::now();
    if (!final && now - last_report_ < std::chrono::milliseconds(200)) {
      return;
    }
    last_report_ = now;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const Progress progress{done, total_, seconds > 0 ? (done - resumed_) / seconds : 0};
    if (options_.on_progress) {
      options_.on_progress(progress);
    }
    if (final || now - last_log_ >= std::chrono::seconds(5)) {
      last_log_ = now;
      const double mib = 1 << 20;
      const double eta = progress.bytes_per_second > 0 && total_ > done
                             ? static_cast<double>(total_ - done) / progress.bytes_per_second
                             : 0;
      spdlog::info("pull {}: {:.1f} of {:.1f} MiB, {:.1f} MiB/s, ETA {:.0f} s", url_,
                   static_cast<double>(done) / mib, static_cast<double>(total_) / mib,
                   progress.bytes_per_second / mib, eta);
    }
  }
  // Bytes an earlier attempt left: counted as done, not in the rate.
  void resumed(uint64_t bytes) {
    {
      MutexLock lock(mu_);
      resumed_ = bytes;
    }
    done_ += bytes;
  }

 private:
  std::string url_;
  const PullOptions& options_;
  std::atomic<uint64_t> done_{0};
  const Clock::time_point start_ = Clock::now();
  Mutex mu_;
  uint64_t resumed_ FLOTILLA_GUARDED_BY(mu_) = 0;
  uint64_t total_ FLOTILLA_GUARDED_BY(mu_) = 0;
  Clock::time_point last_report_ FLOTILLA_GUARDED_BY(mu_){};
  Clock::time_point last_log_ FLOTILLA_GUARDED_BY(mu_) = Clock::now();
};

// A response's Content-Range header; "" when absent.
std::string content_range(const http::ResponseHead& head) {
  return std::string(http::find_header(head.headers, "Content-Range"));
}

// "bytes FIRST-LAST/TOTAL" → {first, last, total}.
std::optional<std::array<uint64_t, 3>> parse_content_range(const std::string& text) {
  uint64_t first = 0, last = 0, total = 0;
  int consumed = 0;
  if (std::sscanf(text.c_str(), "bytes %" SCNu64 "-%" SCNu64 "/%" SCNu64 "%n", &first, &last,
                  &total, &consumed) == 3 &&
      static_cast<size_t>(consumed) == text.size() && first <= last && last < total) {
    return std::array<uint64_t, 3>{first, last, total};
  }
  return std::nullopt;
}

Status write_at(int fd, const std::string& path, const char* data, size_t size, uint64_t offset) {
  while (size > 0) {
    const ssize_t wrote = ::pwrite(fd, data, size, static_cast<off_t>(offset));
    if (wrote < 0 && errno == EINTR) {
      continue;
    }
    if (wrote < 0) {
      // A local failure (ENOSPC, EIO): kFailedPrecondition, so no retry.
      return Status(StatusCode::kFailedPrecondition,
                    "writing '" + path + "': " + std::strerror(errno));
    }
    data += wrote;
    size -= static_cast<size_t>(wrote);
    offset += static_cast<uint64_t>(wrote);
  }
  return Status::ok();
}

// The record of finished ranges: "size N" then one range index per line, appended as they
// finish (a line is written only after its bytes are).
class RangeState {
 public:
  explicit RangeState(std::string path) : path_(std::move(path)) {}

  // The indices recorded for a file of `size` bytes (none if it was another size).
  std::vector<bool> load(uint64_t size, size_t ranges) {
    std::vector<bool> done(ranges, false);
    std::ifstream in(path_);
    std::string word;
    uint64_t recorded = 0;
    if (in >> word >> recorded && word == "size" && recorded == size) {
      size_t index = 0;
      while (in >> index) {
        if (index < ranges) {
          done[index] = true;
        }
      }
    }
    return done;
  }
  Status start(uint64_t size, const std::vector<bool>& done) {
    MutexLock lock(mu_);
    out_.open(path_, std::ios::trunc);
    out_ << "size " << size << "\n";
    for (size_t i = 0; i < done.size(); ++i) {
      if (done[i]) {
        out_ << i << "\n";
      }
    }
    out_.flush();
    return out_ ? Status::ok() : unavailable("cannot write '" + path_ + "'");
  }
  void finished(size_t index) {
    MutexLock lock(mu_);
    out_ << index << "\n";
    out_.flush();
  }
  void remove() {
    MutexLock lock(mu_);
    out_.close();
    ::unlink(path_.c_str());
  }

 private:
  const std::string path_;
  Mutex mu_;
  std::ofstream out_ FLOTILLA_GUARDED_BY(mu_);
};

// Hashes the file's contiguous prefix of finished ranges while later ranges still arrive, so
// the digest is ready about when the last range is (a pass over the whole file afterwards cost
// 0.65 s per GiB, half of a pull on a fast link).
class PrefixHasher {
 public:
  PrefixHasher(int fd, uint64_t size, uint64_t range_bytes, std::vector<bool> done)
      : fd_(fd), size_(size), range_bytes_(range_bytes), done_(std::move(done)) {
    thread_ = std::thread([this] { run(); });
  }
  ~PrefixHasher() { stop(); }
  PrefixHasher(const PrefixHasher&) = delete;
  PrefixHasher& operator=(const PrefixHasher&) = delete;

  void finished(size_t index) {
    {
      MutexLock lock(mu_);
      done_[index] = true;
    }
    wake_.notify_one();
  }
  // Once every range has finished: the file's digest.
  Result<std::string> digest() {
    stop();
    FLOTILLA_RETURN_IF_ERROR(status_);
    {
      MutexLock lock(mu_);
      FLOTILLA_CHECK(next_ == done_.size());
    }
    return sha_.hex_digest();
  }

 private:
  // Hashes what is ready; after stop(), what is already finished, then returns.
  void stop() {
    {
      MutexLock lock(mu_);
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) {
      thread_.join();
    }
  }

  void run() {
    std::vector<char> buffer(1 << 20);
    for (;;) {
      size_t index = 0;
      {
        MutexLock lock(mu_);
        while (!stopping_ && next_ < done_.size() && !done_[next_]) {
          wake_.wait(mu_);
        }
        if (next_ >= done_.size() || !done_[next_]) {
          return;
        }
        index = next_;  // only this thread moves it
      }
      uint64_t offset = index * range_bytes_;
      const uint64_t end = std::min(size_, offset + range_bytes_);
      while (offset < end) {
        const ssize_t got =
            ::pread(fd_, buffer.data(),
                    static_cast<size_t>(std::min<uint64_t>(buffer.size(), end - offset)),
                    static_cast<off_t>(offset));
        if (got < 0 && errno == EINTR) {
          continue;
        }
        if (got <= 0) {
          status_ = unavailable(std::string("cannot read back a downloaded range: ") +
                                (got < 0 ? std::strerror(errno) : "end of file"));
          return;
        }
        sha_.update(buffer.data(), static_cast<size_t>(got));
        offset += static_cast<uint64_t>(got);
      }
      MutexLock lock(mu_);
      ++next_;
    }
  }

  const int fd_;
  const uint64_t size_;
  const uint64_t range_bytes_;
  Mutex mu_;
  CondVar wake_;
  std::vector<bool> done_ FLOTILLA_GUARDED_BY(mu_);
  size_t next_ FLOTILLA_GUARDED_BY(mu_) = 0;  // the first range not hashed yet
  bool stopping_ FLOTILLA_GUARDED_BY(mu_) = false;
  Sha256 sha_;  // the hashing thread only, until it is joined
  Status status_ = Status::ok();
  std::thread thread_;
};

// The first failure of the range workers.
class FirstError {
 public:
  void set(const Status& status) {
    MutexLock lock(mu_);
    if (status_.is_ok()) {
      status_ = status;
    }
  }
  Status get() {
    MutexLock lock(mu_);
    return status_;
  }

 private:
  Mutex mu_;
  Status status_ FLOTILLA_GUARDED_BY(mu_) = Status::ok();
};

// Fetches [first, last] into the file; kFailedPrecondition for what a retry cannot fix.
Status fetch_range(http::BlockingConnection& connection, const Url& url, int fd,
                   const std::string& path, uint64_t first, uint64_t last, uint64_t total,
                   const std::atomic<bool>& stop) {
  uint64_t got = 0;
  const uint64_t wanted = last - first + 1;
  Status status = connection.get(
      url.target, http::ByteRange{first, last},
      [&](const http::ResponseHead& head) -> Status {
        if (head.status == 200) {
          return Status(StatusCode::kFailedPrecondition,
                        url.text() + ": the server stopped honouring Range requests");
        }
        if (head.status != 206) {
          return unavailable(url.text() + ": HTTP " + std::to_string(head.status) + " for bytes " +
                             std::to_string(first) + "-" + std::to_string(last));
        }
        const auto range = parse_content_range(content_range(head));
        if (!range || (*range)[0] != first || (*range)[1] != last || (*range)[2] != total) {
          return Status(StatusCode::kFailedPrecondition,
                        url.text() + ": asked for bytes " + std::to_string(first) + "-" +
                            std::to_string(last) + "/" + std::to_string(total) +
                            ", the server sent Content-Range '" + content_range(head) + "'");
        }
        return Status::ok();
      },
      [&](const char* data, size_t size) -> Status {
        if (stop) {
          return unavailable(url.text() + ": download cancelled");
        }
        if (got + size > wanted) {
          return Status(StatusCode::kFailedPrecondition,
                        url.text() + ": more bytes than the range asked for");
        }
        FLOTILLA_RETURN_IF_ERROR(write_at(fd, path, data, size, first + got));
        got += size;
        return Status::ok();
      });
  FLOTILLA_RETURN_IF_ERROR(status);
  if (got != wanted) {
    return unavailable(url.text() + ": bytes " + std::to_string(first) + "-" +
                       std::to_string(last) + ": got " + std::to_string(got) + " of " +
                       std::to_string(wanted));
  }
  return Status::ok();
}

}  // namespace

struct Download::Impl {
  enum RangeProgress : uint8_t { kMissing, kFetching, kDone };

  Impl(const Url& url_in, std::string partial_in, const PullOptions& options_in,
       std::counting_semaphore<>* slots_in)
      : url(url_in), partial(std::move(partial_in)), options(options_in), slots(slots_in) {}

  Result<Downloaded> fetch_all();
  // The next range to fetch: an awaited one first, else the next missing one in file order.
  std::optional<size_t> claim();
  void range_done(size_t index);
  void end(const Status& status);
  // Whether ranges first..last are all here.
  bool present(size_t first, size_t last) const FLOTILLA_REQUIRES(mu);

  const Url url;
  const std::string partial;
  const PullOptions options;
  std::counting_semaphore<>* const slots;  // may be null

  Mutex mu;
  CondVar changed;
  // The size is known, the file sized, the ranges laid out.
  bool ranges_ready FLOTILLA_GUARDED_BY(mu) = false;
  bool ended FLOTILLA_GUARDED_BY(mu) = false;
  Status failure FLOTILLA_GUARDED_BY(mu) = Status::ok();
  uint64_t size FLOTILLA_GUARDED_BY(mu) = 0;
  uint64_t range_bytes FLOTILLA_GUARDED_BY(mu) = 1;
  std::vector<RangeProgress> ranges FLOTILLA_GUARDED_BY(mu);
  // Ranges someone awaits, in the order to fetch them.
  std::deque<size_t> urgent FLOTILLA_GUARDED_BY(mu);
  size_t next_in_order FLOTILLA_GUARDED_BY(mu) = 0;

  std::atomic<bool> stop{false};  // a range failed for good, or cancel()
};

std::optional<size_t> Download::Impl::claim() {
  MutexLock lock(mu);
  while (!urgent.empty()) {
    const size_t index = urgent.front();
    urgent.pop_front();
    if (ranges[index] == kMissing) {
      ranges[index] = kFetching;
      return index;
    }
  }
  for (; next_in_order < ranges.size(); ++next_in_order) {
    if (ranges[next_in_order] == kMissing) {
      ranges[next_in_order] = kFetching;
      return next_in_order++;
    }
  }
  return std::nullopt;
}

bool Download::Impl::present(size_t first, size_t last) const {
  for (size_t i = first; i <= last; ++i) {
    if (ranges[i] != kDone) {
      return false;
    }
  }
  return true;
}

void Download::Impl::range_done(size_t index) {
  {
    MutexLock lock(mu);
    ranges[index] = kDone;
  }
  changed.notify_all();
}

void Download::Impl::end(const Status& status) {
  {
    MutexLock lock(mu);
    ended = true;
    failure = status;
  }
  changed.notify_all();
}

Download::Download(const Url& url, std::string partial, const PullOptions& options,
                   std::counting_semaphore<>* slots)
    : impl_(std::make_unique<Impl>(url, std::move(partial), options, slots)) {}

Download::~Download() = default;

Result<Downloaded> Download::run() {
  Result<Downloaded> result = impl_->fetch_all();
  impl_->end(result.status());
  return result;
}

void Download::cancel() {
  impl_->stop = true;
}

Status Download::await(uint64_t offset, uint64_t length) {
  Impl& d = *impl_;
  MutexLock lock(d.mu);
  while (!d.ranges_ready && !d.ended) {
    d.changed.wait(d.mu);
  }
  if (d.ended || length == 0 || offset >= d.size) {
    return d.failure;  // ok once every byte is here
  }
  const uint64_t end = length > d.size - offset ? d.size : offset + length;
  const size_t first = static_cast<size_t>(offset / d.range_bytes);
  const size_t last = static_cast<size_t>((end - 1) / d.range_bytes);
  // Ahead of every range awaited before, in file order.
  for (size_t i = last + 1; i-- > first;) {
    if (d.ranges[i] == Impl::kMissing) {
      d.urgent.push_front(i);
    }
  }
  while (!d.ended && !d.present(first, last)) {
    d.changed.wait(d.mu);
  }
  return d.present(first, last) ? Status::ok() : d.failure;
}

Result<Downloaded> download(const Url& url, const std::string& partial,
                            const PullOptions& options) {
  return Download(url, partial, options).run();
}

Result<Downloaded> Download::Impl::fetch_all() {
  // range_bytes (the member, for await()) is set with the ranges, under mu.
  const uint64_t bytes_per_range = std::max<uint64_t>(options.range_bytes, 1);
  const int attempts = std::max(options.attempts_per_range, 1);
  const int fd = ::open(partial.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return unavailable("cannot create '" + partial + "': " + std::strerror(errno));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  RangeState state(partial + ".state");
  Meter meter(url.text(), options);
  auto discard = [&](Status status) {
    ::unlink(partial.c_str());
    state.remove();
    return status;
  };

  // A one-byte range tells whether the server honours Range, and the size, in one round trip.
  // A server that ignores it answers 200 with the whole body: that response is the
  // single-stream download.
  http::BlockingConnection first_connection(origin_of(url), options.io_timeout);
  std::optional<uint64_t> total;
  bool ranged = false;
  uint64_t streamed = 0;
  std::optional<Sha256> stream_sha;  // one stream: hashed as it arrives
  Status probe = Status::ok();
  for (int attempt = 1; attempt <= attempts; ++attempt) {
    streamed = 0;
    stream_sha.emplace();
    probe = first_connection.get(
        url.target, http::ByteRange{0, 0},
        [&](const http::ResponseHead& head) -> Status {
          if (head.status == 206) {
            const auto range = parse_content_range(content_range(head));
            if (!range || (*range)[0] != 0) {
              return Status(StatusCode::kFailedPrecondition,
                            url.text() + ": bad Content-Range '" + content_range(head) + "'");
            }
            ranged = true;
            total = (*range)[2];
            return Status::ok();
          }
          if (head.status == 416) {  // an empty file has no byte 0
            ranged = true;
            total = 0;
            return Status::ok();
          }
          if (head.status == 200) {
            spdlog::warn("pull {}: the server ignores Range requests: downloading in one stream",
                         url.text());
            ranged = false;
            total = head.content_length;
            meter.set_total(total.value_or(0));
            return Status::ok();
          }
          const std::string message =
              url.text() + ": HTTP " + std::to_string(head.status) + " from the server";
          return head.status == 404 || head.status == 410 ? not_found(message)
                 : head.status >= 500                     ? unavailable(message)
                                      : Status(StatusCode::kFailedPrecondition, message);
        },
        [&](const char* data, size_t size) -> Status {
          if (stop) {
            return unavailable(url.text() + ": download cancelled");
          }
          if (ranged) {
            return Status::ok();  // the probe's byte: fetched again with its range
          }
          FLOTILLA_RETURN_IF_ERROR(write_at(fd, partial, data, size, streamed));
          stream_sha->update(data, size);
          streamed += size;
          meter.add(size);
          return Status::ok();
        });
    // Retry what the network broke (and 5xx); not a 4xx, nor what the disk refused.
    if (probe.is_ok() || probe.code() != StatusCode::kUnavailable || stop) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100 * attempt));
  }
  if (!probe.is_ok()) {
    return probe.code() == StatusCode::kUnavailable ? probe : discard(probe);
  }

  if (!ranged) {
    if (total && streamed != *total) {
      return discard(unavailable(url.text() + ": the response ended after " +
                                 std::to_string(streamed) + " of " + std::to_string(*total) +
                                 " bytes"));
    }
    if (::ftruncate(fd, static_cast<off_t>(streamed)) != 0) {
      return discard(unavailable("cannot truncate '" + partial + "'"));
    }
    meter.add(0, /*final=*/true);
    state.remove();
    return Downloaded{streamed, stream_sha->hex_digest()};
  }

  const uint64_t file_size = *total;
  meter.set_total(file_size);
  const size_t range_count =
      static_cast<size_t>((file_size + bytes_per_range - 1) / bytes_per_range);
  std::vector<bool> done = state.load(file_size, range_count);
  uint64_t resumed = 0;
  for (size_t i = 0; i < range_count; ++i) {
    if (done[i]) {
      resumed += std::min(bytes_per_range, file_size - i * bytes_per_range);
    }
  }
  if (resumed > 0) {
    spdlog::info("pull {}: resuming, {} of {} bytes already here", url.text(), resumed, file_size);
  }
  meter.resumed(resumed);
  FLOTILLA_RETURN_IF_ERROR(state.start(file_size, done));
  if (::ftruncate(fd, static_cast<off_t>(file_size)) != 0) {
    return discard(unavailable("cannot size '" + partial + "': " + std::strerror(errno)));
  }

  PrefixHasher hasher(fd, file_size, bytes_per_range, done);
  size_t missing = 0;
  {
    MutexLock lock(mu);
    size = file_size;
    range_bytes = bytes_per_range;
    ranges.resize(range_count);
    for (size_t i = 0; i < range_count; ++i) {
      ranges[i] = done[i] ? kDone : kMissing;
      missing += done[i] ? 0 : 1;
    }
    ranges_ready = true;
  }
  changed.notify_all();
  FirstError error;
  auto worker = [&] {
    http::BlockingConnection connection(origin_of(url), options.io_timeout);
    for (;;) {
      if (slots) {
        slots->acquire();
      }
      const std::optional<size_t> claimed = stop ? std::nullopt : claim();
      struct SlotGuard {
        std::counting_semaphore<>* slots;
        ~SlotGuard() {
          if (slots) {
            slots->release();
          }
        }
      } slot{slots};
      if (!claimed) {
        return;
      }
      const size_t index = *claimed;
      const uint64_t first = index * bytes_per_range;
      const uint64_t last = std::min(file_size, first + bytes_per_range) - 1;
      Status status = unavailable(url.text() + ": download cancelled");
      for (int attempt = 1; attempt <= attempts && !stop; ++attempt) {
        status = fetch_range(connection, url, fd, partial, first, last, file_size, stop);
        if (status.is_ok() || status.code() != StatusCode::kUnavailable) {
          break;
        }
        spdlog::debug("pull {}: bytes {}-{}, attempt {}: {}", url.text(), first, last, attempt,
                      status.message());
        std::this_thread::sleep_for(std::chrono::milliseconds(100 * attempt));
      }
      if (!status.is_ok()) {
        error.set(status);
        stop = true;
        return;
      }
      state.finished(index);
      hasher.finished(index);
      meter.add(last - first + 1);
      range_done(index);
    }
  };
  const size_t workers =
      std::min<size_t>(static_cast<size_t>(std::max(options.connections, 1)), missing);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < workers; ++i) {
    threads.emplace_back(worker);
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  if (Status failed = error.get(); !failed.is_ok()) {
    // Network trouble: keep what arrived for a resume. Anything else: start over next time.
    return failed.code() == StatusCode::kUnavailable ? failed : discard(failed);
  }
  if (stop) {
    // Cancelled while every worker was between ranges: none saw a failed fetch, and ranges
    // are missing. What arrived stays for a resume.
    return unavailable(url.text() + ": download cancelled");
  }
  FLOTILLA_ASSIGN_OR_RETURN(std::string digest, hasher.digest());
  meter.add(0, /*final=*/true);
  state.remove();
  return Downloaded{file_size, std::move(digest)};
}

}  // namespace flotilla::store

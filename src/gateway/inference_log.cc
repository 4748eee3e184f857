#include "gateway/inference_log.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <system_error>

#include <fcntl.h>
#include <isa-l/igzip_lib.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <zlib.h>

#include "gateway/gateway.h"
#include "protocol/protocol.h"

namespace flotilla::gateway {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kClosedSuffix = ".jsonl.gz";
constexpr std::string_view kPartialSuffix = ".jsonl.gz.partial";
// A file being written is flushed this often, so that a reader sees its records.
constexpr auto kFlushInterval = std::chrono::seconds(1);
// How often the writer takes what waits (unless a filling buffer wakes it sooner).
constexpr auto kDrainInterval = std::chrono::milliseconds(100);
constexpr auto kPruneInterval = std::chrono::seconds(60);
constexpr size_t kMaxUsageBytes = 512;

// Endpoint names become directory names: only what cannot climb out of the table's directory.
bool safe_directory_name(std::string_view name) {
  return !name.empty() && name.front() != '.' && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

std::string utc_stamp(int64_t unix_s) {
  const auto seconds = static_cast<std::time_t>(unix_s);
  std::tm parts{};
  gmtime_r(&seconds, &parts);
  char text[32];
  std::strftime(text, sizeof(text), "%Y%m%dT%H%M%SZ", &parts);
  return text;
}

// The text of the JSON object after `"usage":` at `at` in `text`, "" when it is not an object
// (`null`) or does not end in `text`. A usage object holds only numbers: its first '}' ends it.
std::string_view usage_object(std::string_view text, size_t at) {
  size_t open = text.find_first_not_of(" \t\r\n", at + std::string_view("\"usage\":").size());
  if (open == std::string_view::npos || text[open] != '{') {
    return {};
  }
  const size_t close = text.find('}', open);
  if (close == std::string_view::npos || close - open >= kMaxUsageBytes) {
    return {};
  }
  return text.substr(open, close - open + 1);
}

// Keeps the last usage object in `text` as `usage`: it is at the end of a response and in a
// stream's last event.
void keep_usage(std::string_view text, std::string& usage) {
  if (const size_t at = text.rfind("\"usage\":"); at != std::string_view::npos) {
    if (const std::string_view found = usage_object(text, at); !found.empty()) {
      usage.assign(found);
    }
  }
}

}  // namespace

// ---- Gathering, on the request path -------------------------------------------------------------

void InferenceCapture::add_request(std::string_view body) {
  request_bytes = body.size();
  request.assign(body.substr(0, std::min(body.size(), max_body_bytes)));
}

void InferenceCapture::add_response(std::string_view piece) {
  response_bytes += piece.size();
  if (response.size() < max_body_bytes) {
    response.append(piece.substr(0, max_body_bytes - response.size()));
  }
  if (stream && !piece.empty()) {
    // Events are counted per piece: a "data:" split across two pieces is not seen (a replica
    // writes each event whole).
    size_t at = 0;
    if (!at_line_start) {
      at = piece.find('\n');
      at = at == std::string_view::npos ? piece.size() : at + 1;
    }
    while (at < piece.size()) {
      const std::string_view line = piece.substr(at);
      if (line.starts_with("data:") && !line.starts_with("data: [DONE]")) {
        ++stream_events;
      }
      const size_t end = piece.find('\n', at);
      at = end == std::string_view::npos ? piece.size() : end + 1;
    }
    at_line_start = piece.back() == '\n';
  }
  keep_usage(piece, usage);
}

void InferenceCapture::view_response(std::string_view body) {
  response_bytes = body.size();
  viewed = body.substr(0, std::min(body.size(), max_body_bytes));
  response_viewed = true;
  keep_usage(body, usage);
}

// ---- The record's line, on the request path ---------------------------------------------------

namespace {

// Room for everything in a line but its strings: the keys and punctuation (about 300 bytes),
// the numbers (at most 20 characters each), the tokens.
constexpr size_t kFixedLineBytes = 1024;

using protocol::JsonCursor;

// Milliseconds with 3 decimals, from whole microseconds (std::to_chars of a double in fixed
// form cost a fifth of the line); anything not a sane duration (negative, NaN) as 0. At most
// kIntegerBound + 4 bytes.
void write_millis(double value, JsonCursor& line) {
  value = value >= 0 ? std::min(value, 1e12) : 0;
  const auto micros = static_cast<int64_t>(value * 1e3 + 0.5);
  line.integer(micros / 1000);
  const auto fraction = static_cast<int>(micros % 1000);
  const char digits[] = {'.', static_cast<char>('0' + fraction / 100),
                         static_cast<char>('0' + fraction / 10 % 10),
                         static_cast<char>('0' + fraction % 10)};
  line.raw(std::string_view(digits, sizeof(digits)));
}

size_t inference_record_bound(const InferenceRecord& record) {
  size_t strings = record.request_id.size() + record.trace_id.size() + record.endpoint.size() +
                   record.version.size() + record.replica.size() + record.method.size() +
                   record.path.size();
  if (const InferenceCapture* capture = record.capture) {
    strings += capture->protocol.size() + capture->request.size() + capture->kept_response().size();
  }
  // Each string at most 6 bytes a byte and its quotes (10 strings), and the newline.
  return kFixedLineBytes + protocol::json_string_bound(strings) + 2 * 10 + 1;
}

// The tokens of the response's usage ({"prompt_tokens": 5, ...}) as {"prompt":5,...}; nothing
// when it has none. Only LLM responses carry a usage.
void write_tokens(std::string_view usage_text, JsonCursor& line) {
  if (usage_text.empty()) {
    return;
  }
  const json usage = json::parse(usage_text, nullptr, /*allow_exceptions=*/false);
  if (!usage.is_object()) {
    return;
  }
  line.literal(",\"tokens\":{");
  bool first = true;
  for (const auto& [from, to] :
       {std::pair{"prompt_tokens", "prompt"}, std::pair{"completion_tokens", "completion"},
        std::pair{"total_tokens", "total"}}) {
    if (usage.contains(from) && usage[from].is_number_integer()) {
      if (!first) {
        line.literal(",");
      }
      first = false;
      line.string(to);
      line.literal(":");
      line.integer(usage[from].get<int64_t>());
    }
  }
  line.literal("}");
}

void write_body(std::string_view kept, size_t bytes, JsonCursor& line) {
  line.literal("{\"body\":");
  line.string(kept);
  line.literal(",\"bytes\":");
  line.integer(static_cast<int64_t>(bytes));
  line.literal(",\"truncated\":");
  line.boolean(kept.size() < bytes);
}

// The line, at `out` with room for inference_record_bound(record) bytes; returns its end.
char* write_inference_record_json(const InferenceRecord& record, char* out) {
  JsonCursor line(out);
  line.literal("{\"timestamp_ms\":");
  line.integer(record.unix_ms);
  line.literal(",\"request_id\":");
  line.string(record.request_id);
  line.literal(",\"trace_id\":");
  if (record.trace_id.empty()) {
    line.literal("null");
  } else {
    line.string(record.trace_id);
  }
  line.literal(",\"endpoint\":");
  line.string(record.endpoint);
  line.literal(",\"version\":");
  line.string(record.version);
  line.literal(",\"replica\":");
  line.string(record.replica);
  line.literal(",\"method\":");
  line.string(record.method);
  line.literal(",\"path\":");
  line.string(record.path);
  line.literal(",\"protocol\":");
  line.string(record.capture ? record.capture->protocol : "http");
  line.literal(",\"status\":");
  line.integer(record.status);
  line.literal(",\"latency_ms\":");
  write_millis(record.latency_ms, line);
  line.literal(",\"queue_wait_ms\":");
  write_millis(record.queue_wait_ms, line);
  line.literal(",\"attempts\":");
  line.integer(record.attempts);
  if (const InferenceCapture* capture = record.capture) {
    line.literal(",\"request\":");
    write_body(capture->request, capture->request_bytes, line);
    line.literal("},\"response\":");
    write_body(capture->kept_response(), capture->response_bytes, line);
    line.literal(",\"stream\":");
    line.boolean(capture->stream);
    if (capture->stream) {
      line.literal(",\"stream_events\":");
      line.integer(capture->stream_events);
    }
    line.literal("}");
    write_tokens(capture->usage, line);
  }
  line.literal("}");
  return line.end();
}

}  // namespace

std::string inference_record_json(const InferenceRecord& record) {
  protocol::ByteBuffer buffer;
  buffer.commit(write_inference_record_json(record, buffer.room(inference_record_bound(record))));
  return std::string(buffer.view());
}

// ---- Writing, on the writer thread ------------------------------------------------------------

// One gzip member appended to a file, compressed by ISA-L's igzip at its level 1: standard
// gzip (zlib, zcat and `flotilla logs` read it) at about 12x zlib level 1's speed and a
// smaller output on these records (bench/RESULTS.md, "What an inference table costs"), which
// matters because the writer compresses every request the gateway serves.
class GzipFile {
 public:
  // Opens `path` for appending; null (errno set) when it cannot be opened.
  static std::unique_ptr<GzipFile> open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      return nullptr;
    }
    return std::unique_ptr<GzipFile>(new GzipFile(fd));
  }
  ~GzipFile() { ::close(fd_); }
  GzipFile(const GzipFile&) = delete;
  GzipFile& operator=(const GzipFile&) = delete;

  // Compresses `data`; it may stay in the compressor until the next sync() or finish().
  bool write(std::string_view data) {
    constexpr size_t kMaxPiece = size_t{1} << 30;  // igzip counts its input in 32 bits
    for (size_t at = 0; at < data.size(); at += kMaxPiece) {
      if (!deflate(data.substr(at, kMaxPiece), NO_FLUSH, false)) {
        return false;
      }
    }
    return true;
  }
  // Ends the deflate block: a reader sees every byte written so far.
  bool sync() { return deflate({}, SYNC_FLUSH, false); }
  // Ends the member with gzip's trailer. Nothing is written after.
  bool finish() { return deflate({}, NO_FLUSH, true); }

 private:
  explicit GzipFile(int fd) : fd_(fd), level_buffer_(ISAL_DEF_LVL1_DEFAULT), out_(256 * 1024) {
    isal_deflate_init(&stream_);
    stream_.gzip_flag = IGZIP_GZIP;
    stream_.level = 1;
    stream_.level_buf = level_buffer_.data();
    stream_.level_buf_size = static_cast<uint32_t>(level_buffer_.size());
  }

  bool deflate(std::string_view data, uint16_t flush, bool end) {
    stream_.next_in = reinterpret_cast<uint8_t*>(const_cast<char*>(data.data()));
    stream_.avail_in = static_cast<uint32_t>(data.size());
    stream_.flush = flush;
    stream_.end_of_stream = end ? 1 : 0;
    // Done when the input is taken and the output did not fill (igzip's rule for a flush),
    // and, at the end, when the trailer is out.
    do {
      stream_.next_out = out_.data();
      stream_.avail_out = static_cast<uint32_t>(out_.size());
      if (isal_deflate(&stream_) != COMP_OK) {
        return false;
      }
      if (!write_all(out_.size() - stream_.avail_out)) {
        return false;
      }
    } while (stream_.avail_in > 0 || stream_.avail_out == 0 ||
             (end && stream_.internal_state.state != ZSTATE_END));
    return true;
  }

  bool write_all(size_t size) {
    const uint8_t* at = out_.data();
    while (size > 0) {
      const ssize_t written = ::write(fd_, at, size);
      if (written < 0 && errno == EINTR) {
        continue;
      }
      if (written <= 0) {
        return false;
      }
      at += written;
      size -= static_cast<size_t>(written);
    }
    return true;
  }

  const int fd_;
  isal_zstream stream_{};
  std::vector<uint8_t> level_buffer_;
  std::vector<uint8_t> out_;
};

// One endpoint's lines in one lane.
struct InferenceLog::LaneLines {
  explicit LaneLines(std::string_view name) : endpoint(name) {}

  const std::string endpoint;
  // Under the lane's mutex.
  int64_t retention_s = 0;  // as the last record said
  protocol::ByteBuffer lines;
  // The writer's: the lines it took last, written to the file after the lock. Swapped with
  // `lines`, so that neither side copies and both keep their memory for the next batch.
  protocol::ByteBuffer taken;
  int64_t taken_retention_s = 0;
};

// One thread's lines, by endpoint, until the writer takes them.
struct InferenceLog::Lane {
  // The lines of `endpoint`: a lane sees a handful of endpoints, so a scan. Never removed, and
  // where they are does not move (the writer uses `taken` after the lock).
  LaneLines& lines_for(std::string_view endpoint) FLOTILLA_REQUIRES(mutex) {
    for (const std::unique_ptr<LaneLines>& lines : by_endpoint) {
      if (lines->endpoint == endpoint) {
        return *lines;
      }
    }
    return *by_endpoint.emplace_back(std::make_unique<LaneLines>(endpoint));
  }

  Mutex mutex;
  std::vector<std::unique_ptr<LaneLines>> by_endpoint FLOTILLA_GUARDED_BY(mutex);
};

struct InferenceLog::OpenFile {
  std::unique_ptr<GzipFile> gz;
  std::string partial_path;
  std::string closed_path;
  int64_t period_start_s = 0;
  Clock::TimePoint last_flush{};
  bool dirty = false;

  ~OpenFile() {
    if (gz == nullptr) {
      return;
    }
    if (!gz->finish()) {
      spdlog::error("inference table: cannot close {}", partial_path);
    }
    gz.reset();
    std::error_code error;
    fs::rename(partial_path, closed_path, error);
    if (error) {
      spdlog::error("inference table: cannot close {}: {}", partial_path, error.message());
    }
  }
};

namespace {
std::atomic<uint64_t> next_log_id{1};
}  // namespace

InferenceLog::InferenceLog(Options options, const Clock& clock)
    : options_(std::move(options)), clock_(clock), id_(next_log_id.fetch_add(1)) {
  writer_ = std::thread([this] { run(); });
}

InferenceLog::~InferenceLog() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  writer_.join();
}

InferenceLog::Lane& InferenceLog::lane() {
  // One log in a process is the rule (tests make more, one after another): the thread keeps
  // the lane of the last log it wrote to.
  thread_local struct {
    uint64_t log_id = 0;
    Lane* lane = nullptr;
  } cached;
  if (cached.log_id != id_) {
    MutexLock lock(mutex_);
    lanes_.push_back(std::make_unique<Lane>());
    cached.log_id = id_;
    cached.lane = lanes_.back().get();
  }
  return *cached.lane;
}

bool InferenceLog::offer(const InferenceRecord& record) {
  const size_t bound = inference_record_bound(record);
  const size_t limit = options_.max_buffer_bytes;
  if (queued_bytes_.load(std::memory_order_relaxed) + bound > limit) {
    return false;
  }
  Lane& lane = this->lane();
  size_t before = 0;
  size_t written = 0;
  {
    MutexLock lock(lane.mutex);
    LaneLines& lines = lane.lines_for(record.endpoint);
    lines.retention_s = record.retention_s;
    char* start = lines.lines.room(bound);
    char* end = write_inference_record_json(record, start);
    *end++ = '\n';
    lines.lines.commit(end);
    written = static_cast<size_t>(end - start);
    // Counted under the lane's lock: the writer takes the lines and subtracts them only after.
    before = queued_bytes_.fetch_add(written, std::memory_order_relaxed);
  }
  // The writer drains every kDrainInterval on its own: waking it for each record would cost
  // a context switch per request. Only a buffer filling up wakes it early.
  if (before < limit / 4 && before + written >= limit / 4) {
    wake_.notify_one();
  }
  return true;
}

void InferenceLog::flush() {
  MutexLock lock(mutex_);
  const uint64_t asked = ++flush_asked_;
  wake_.notify_all();
  while (flush_done_ < asked && !stopping_) {
    flushed_.wait(mutex_);
  }
}

void InferenceLog::run() {
  while (true) {
    uint64_t flush_target = 0;
    bool flush_asked = false;
    bool stopping = false;
    {
      MutexLock lock(mutex_);
      if (!stopping_ && flush_asked_ == flush_done_) {
        wake_.wait_for(mutex_, kDrainInterval);
      }
      flush_target = flush_asked_;
      flush_asked = flush_asked_ != flush_done_;
      stopping = stopping_;
    }
    close_due_files(/*all=*/false);  // a record of a new period starts a new file
    write(take());
    close_due_files(stopping);
    flush_files(/*all=*/flush_asked);
    if (clock_.now() - last_prune_ >= kPruneInterval) {
      prune();
      last_prune_ = clock_.now();
    }
    {
      MutexLock lock(mutex_);
      flush_done_ = flush_target;
      if (stopping) {
        // Whatever was offered after the last take goes now: nothing is offered once the
        // log is being destroyed.
        flush_done_ = flush_asked_;
        flushed_.notify_all();
        return;
      }
    }
    flushed_.notify_all();
  }
}

std::vector<InferenceLog::LaneLines*> InferenceLog::take() {
  std::vector<LaneLines*> taken;
  size_t bytes = 0;
  MutexLock lock(mutex_);  // the list of lanes; only a thread's first record waits for it
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    MutexLock lane_lock(lane->mutex);
    for (const std::unique_ptr<LaneLines>& lines : lane->by_endpoint) {
      if (!lines->lines.empty()) {
        lines->taken.swap(lines->lines);  // `taken` was written and cleared: no copy
        lines->taken_retention_s = lines->retention_s;
        bytes += lines->taken.size();
        taken.push_back(lines.get());
      }
    }
  }
  queued_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  return taken;
}

InferenceLog::OpenFile* InferenceLog::file_for(const std::string& endpoint) {
  std::unique_ptr<OpenFile>& file = files_[endpoint];
  if (file != nullptr) {
    return file.get();
  }
  files_.erase(endpoint);
  if (!safe_directory_name(endpoint)) {
    return nullptr;
  }
  const int64_t now_s = clock_.unix_ms() / 1000;
  const int64_t period_s = std::max<int64_t>(1, options_.period.count());
  const fs::path directory = fs::path(options_.dir) / endpoint;
  std::error_code error;
  fs::create_directories(directory, error);
  auto opened = std::make_unique<OpenFile>();
  opened->period_start_s = now_s / period_s * period_s;
  const std::string stem =
      (directory / (utc_stamp(opened->period_start_s) + "-" + std::to_string(::getpid()))).string();
  opened->partial_path = stem + std::string(kPartialSuffix);
  opened->closed_path = stem + std::string(kClosedSuffix);
  if (!error) {
    opened->gz = GzipFile::open(opened->partial_path);
  }
  if (opened->gz == nullptr) {
    if (!warned_) {
      spdlog::error("inference table: cannot write {}: {}", opened->partial_path,
                    error ? error.message() : std::strerror(errno));
      warned_ = true;
    }
    return nullptr;  // tried again with the next batch
  }
  opened->last_flush = clock_.now();
  return (files_[endpoint] = std::move(opened)).get();
}

void InferenceLog::write(const std::vector<LaneLines*>& batch) {
  // One compressed write per lane, endpoint and batch. The lines of an endpoint that has no
  // file (a name that cannot be a directory, a directory that cannot be made) go.
  for (LaneLines* lines : batch) {
    retention_s_[lines->endpoint] = lines->taken_retention_s;
    if (OpenFile* file = file_for(lines->endpoint)) {
      if (!file->gz->write(lines->taken.view()) && !warned_) {
        spdlog::error("inference table: cannot write {}", file->partial_path);
        warned_ = true;
      }
      file->dirty = true;
    }
    lines->taken.clear();
  }
}

void InferenceLog::close_due_files(bool all) {
  const int64_t now_s = clock_.unix_ms() / 1000;
  const int64_t period_s = std::max<int64_t>(1, options_.period.count());
  std::erase_if(files_, [&](const auto& entry) {
    return all || now_s >= entry.second->period_start_s + period_s;
  });
}

void InferenceLog::flush_files(bool all) {
  const Clock::TimePoint now = clock_.now();
  for (auto& [endpoint, file] : files_) {
    // Every second, and at once when a flush() was asked.
    if (file->dirty && (all || now - file->last_flush >= kFlushInterval)) {
      if (!file->gz->sync() && !warned_) {
        spdlog::error("inference table: cannot write {}", file->partial_path);
        warned_ = true;
      }
      file->dirty = false;
      file->last_flush = now;
    }
  }
}

void InferenceLog::prune() {
  const auto now = fs::file_time_type::clock::now();
  for (const auto& [endpoint, retention_s] : retention_s_) {
    if (!safe_directory_name(endpoint)) {
      continue;
    }
    std::error_code error;
    for (const fs::directory_entry& entry :
         fs::directory_iterator(fs::path(options_.dir) / endpoint, error)) {
      const std::string name = entry.path().filename().string();
      if (!name.ends_with(kClosedSuffix)) {
        continue;  // a file being written is never deleted
      }
      std::error_code time_error;
      const auto written = entry.last_write_time(time_error);
      if (!time_error && now - written > std::chrono::seconds(retention_s)) {
        fs::remove(entry.path(), time_error);
      }
    }
  }
}

// ---- Reading (flotilla logs) --------------------------------------------------------------------

std::vector<std::string> inference_table_files(const std::string& dir,
                                               const std::string& endpoint) {
  std::vector<std::string> files;
  if (!safe_directory_name(endpoint)) {
    return files;
  }
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(fs::path(dir) / endpoint, error)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(kClosedSuffix) || name.ends_with(kPartialSuffix)) {
      files.push_back(entry.path().string());
    }
  }
  // Names start with the period's UTC start: in name order, oldest first.
  std::sort(files.begin(), files.end(), [](const std::string& a, const std::string& b) {
    return fs::path(a).filename() < fs::path(b).filename();
  });
  return files;
}

Status read_inference_file(const std::string& path,
                           const std::function<bool(std::string_view line)>& each) {
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) {
    return not_found("cannot open " + path + ": " + std::strerror(errno));
  }
  std::string pending;
  char buffer[64 * 1024];
  bool first = true;
  while (true) {
    const int got = gzread(gz, buffer, sizeof(buffer));
    if (first && gzdirect(gz) == 1) {
      gzclose(gz);
      return invalid_argument(path + " is not gzip data");
    }
    first = false;
    if (got <= 0) {
      break;  // the end, or a file being written cut mid-block: what came whole counts
    }
    pending.append(buffer, static_cast<size_t>(got));
    size_t start = 0;
    for (size_t end = pending.find('\n'); end != std::string::npos;
         end = pending.find('\n', start)) {
      if (!each(std::string_view(pending).substr(start, end - start))) {
        gzclose(gz);
        return Status::ok();
      }
      start = end + 1;
    }
    pending.erase(0, start);
  }
  gzclose(gz);
  return Status::ok();
}

}  // namespace flotilla::gateway

#include "gateway/inference_log.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <system_error>

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
  // The usage object is at the end of a response and in a stream's last event.
  if (const size_t at = piece.rfind("\"usage\":"); at != std::string_view::npos) {
    if (const std::string_view found = usage_object(piece, at); !found.empty()) {
      usage.assign(found);
    }
  }
}

size_t InferenceRecord::weight() const {
  size_t bytes = sizeof(*this) + endpoint.size() + version.size() + replica.size() +
                 request_id.size() + trace_id.size() + path.size();
  if (capture) {
    bytes += sizeof(*capture) + capture->request.size() + capture->response.size() +
             capture->usage.size();
  }
  return bytes;
}

template <typename Number>
void append_number(Number value, std::string& out) {
  char text[32];
  std::to_chars_result written;
  if constexpr (std::is_floating_point_v<Number>) {
    written = std::to_chars(text, text + sizeof(text), value, std::chars_format::fixed, 3);
  } else {
    written = std::to_chars(text, text + sizeof(text), value);
  }
  out.append(text, written.ec == std::errc() ? written.ptr : text);
}

// Hand-written rather than through nlohmann::json: the writer formats every request the
// gateway serves, and a json object cost 5.8 µs a record here, several times the gateway's own
// work for the request.
void append_inference_record_json(const InferenceRecord& record, std::string& out) {
  bool first = true;
  const auto key = [&out, &first](std::string_view name) {
    out += first ? "{\"" : ",\"";
    first = false;
    out += name;
    out += "\":";
  };
  const auto text = [&](std::string_view name, std::string_view value) {
    key(name);
    protocol::append_json_string(value, out);
  };
  const auto number = [&](std::string_view name, auto value) {
    key(name);
    append_number(value, out);
  };
  const auto body = [&](std::string_view name, const std::string& kept, size_t bytes) {
    key(name);
    out += "{\"body\":";
    protocol::append_json_string(kept, out);
    out += ",\"bytes\":";
    append_number(bytes, out);
    out += kept.size() < bytes ? ",\"truncated\":true" : ",\"truncated\":false";
  };
  number("timestamp_ms", record.unix_ms);
  text("request_id", record.request_id);
  if (record.trace_id.empty()) {
    key("trace_id");
    out += "null";
  } else {
    text("trace_id", record.trace_id);
  }
  text("endpoint", record.endpoint);
  text("version", record.version);
  text("replica", record.replica);
  text("method", record.method);
  text("path", record.path);
  text("protocol", record.capture ? record.capture->protocol : "http");
  number("status", record.status);
  number("latency_ms", record.latency_ms);
  number("queue_wait_ms", record.queue_wait_ms);
  number("attempts", record.attempts);
  if (const InferenceCapture* capture = record.capture.get()) {
    body("request", capture->request, capture->request_bytes);
    out += '}';
    body("response", capture->response, capture->response_bytes);
    out += capture->stream ? ",\"stream\":true" : ",\"stream\":false";
    if (capture->stream) {
      out += ",\"stream_events\":";
      append_number(capture->stream_events, out);
    }
    out += '}';
    const json usage = capture->usage.empty()
                           ? json()
                           : json::parse(capture->usage, nullptr, /*allow_exceptions=*/false);
    if (usage.is_object()) {
      key("tokens");
      const char* separator = "{";
      for (const auto& [from, to] :
           {std::pair{"prompt_tokens", "prompt"}, std::pair{"completion_tokens", "completion"},
            std::pair{"total_tokens", "total"}}) {
        if (usage.contains(from) && usage[from].is_number_integer()) {
          out += separator;
          out += '"';
          out += to;
          out += "\":";
          append_number(usage[from].get<int64_t>(), out);
          separator = ",";
        }
      }
      out += *separator == '{' ? "{}" : "}";
    }
  }
  out += '}';
}

// ---- Writing, on the writer thread ------------------------------------------------------------

struct InferenceLog::OpenFile {
  gzFile gz = nullptr;
  std::string partial_path;
  std::string closed_path;
  int64_t period_start_s = 0;
  Clock::TimePoint last_flush{};
  bool dirty = false;
  std::string pending;  // this batch's lines, written at once

  ~OpenFile() {
    if (gz == nullptr) {
      return;
    }
    if (gzclose(gz) != Z_OK) {
      spdlog::error("inference table: cannot close {}", partial_path);
    }
    std::error_code error;
    fs::rename(partial_path, closed_path, error);
    if (error) {
      spdlog::error("inference table: cannot close {}: {}", partial_path, error.message());
    }
  }
};

InferenceLog::InferenceLog(Options options, const Clock& clock)
    : options_(std::move(options)), clock_(clock) {
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

bool InferenceLog::offer(InferenceRecord&& record) {
  const size_t weight = record.weight();
  bool wake = false;
  {
    MutexLock lock(mutex_);
    if (queued_bytes_ + weight > options_.max_buffer_bytes) {
      return false;
    }
    // The writer drains every kDrainInterval on its own: waking it for each record would cost
    // a context switch per request. Only a buffer filling up wakes it early.
    wake = queued_bytes_ < options_.max_buffer_bytes / 4 &&
           queued_bytes_ + weight >= options_.max_buffer_bytes / 4;
    queued_bytes_ += weight;
    queue_.push_back(std::move(record));
  }
  if (wake) {
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
  std::vector<InferenceRecord> batch;
  while (true) {
    uint64_t flush_target = 0;
    bool flush_asked = false;
    bool stopping = false;
    {
      MutexLock lock(mutex_);
      if (!stopping_ && flush_asked_ == flush_done_) {
        wake_.wait_for(mutex_, kDrainInterval);
      }
      batch.swap(queue_);
      queued_bytes_ = 0;
      flush_target = flush_asked_;
      flush_asked = flush_asked_ != flush_done_;
      stopping = stopping_;
    }
    close_due_files(/*all=*/false);  // a record of a new period starts a new file
    write(batch);
    batch.clear();
    close_due_files(stopping);
    flush_files(/*all=*/flush_asked);
    if (clock_.now() - last_prune_ >= kPruneInterval) {
      prune();
      last_prune_ = clock_.now();
    }
    {
      MutexLock lock(mutex_);
      flush_done_ = flush_target;
      if (stopping && queue_.empty()) {
        flush_done_ = flush_asked_;
        flushed_.notify_all();
        return;
      }
    }
    flushed_.notify_all();
  }
}

void InferenceLog::write(std::vector<InferenceRecord>& batch) {
  const int64_t now_s = clock_.unix_ms() / 1000;
  const int64_t period_s = std::max<int64_t>(1, options_.period.count());
  for (InferenceRecord& record : batch) {
    retention_s_[record.endpoint] = record.retention_s;
    std::unique_ptr<OpenFile>& file = files_[record.endpoint];
    if (file == nullptr) {
      if (!safe_directory_name(record.endpoint)) {
        continue;
      }
      const fs::path directory = fs::path(options_.dir) / record.endpoint;
      std::error_code error;
      fs::create_directories(directory, error);
      auto opened = std::make_unique<OpenFile>();
      opened->period_start_s = now_s / period_s * period_s;
      const std::string stem =
          (directory / (utc_stamp(opened->period_start_s) + "-" + std::to_string(::getpid())))
              .string();
      opened->partial_path = stem + std::string(kPartialSuffix);
      opened->closed_path = stem + std::string(kClosedSuffix);
      opened->gz = error ? nullptr
                         : gzopen(opened->partial_path.c_str(),
                                  getenv("FLOTILLA_GZ_MODE") ? getenv("FLOTILLA_GZ_MODE") : "ab1");
      if (opened->gz == nullptr) {
        if (!warned_) {
          spdlog::error("inference table: cannot write {}: {}", opened->partial_path,
                        error ? error.message() : std::strerror(errno));
          warned_ = true;
        }
        files_.erase(record.endpoint);
        continue;
      }
      opened->last_flush = clock_.now();
      file = std::move(opened);
    }
    append_inference_record_json(record, file->pending);
    file->pending += '\n';
  }
  // One compressed write per file and batch.
  for (auto& [endpoint, file] : files_) {
    if (file->pending.empty()) {
      continue;
    }
    if (gzwrite(file->gz, file->pending.data(), static_cast<unsigned>(file->pending.size())) <= 0 &&
        !warned_) {
      spdlog::error("inference table: cannot write {}", file->partial_path);
      warned_ = true;
    }
    file->pending.clear();
    file->dirty = true;
  }
}

void InferenceLog::close_due_files(bool all) {
  const int64_t now_s = clock_.unix_ms() / 1000;
  const int64_t period_s = std::max<int64_t>(1, options_.period.count());
  std::erase_if(files_, [&](const auto& entry) {
    return all || entry.second == nullptr || now_s >= entry.second->period_start_s + period_s;
  });
}

void InferenceLog::flush_files(bool all) {
  const Clock::TimePoint now = clock_.now();
  for (auto& [endpoint, file] : files_) {
    // Every second, and at once when a flush() was asked.
    if (file->dirty && (all || now - file->last_flush >= kFlushInterval)) {
      gzflush(file->gz, Z_SYNC_FLUSH);
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

// The endpoints' inference tables (docs/inference-tables.md): one record per sampled request,
// gathered on the request path (InferenceCapture) and written off it by one writer thread to
// gzip'd JSON Lines files under `dir`/<endpoint>/. The file of the current period is
// "<start>-<pid>.jsonl.gz.partial" (flushed every second, so readers see it), renamed to
// "<start>-<pid>.jsonl.gz" when the period ends: a closed file is never written again. Closed
// files older than their endpoint's retention are deleted. offer() never waits for the disk:
// past `max_buffer_bytes` of records waiting, a record is dropped, and the caller counts it.
//
// Private to the gateway module.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/common.h"

namespace flotilla::gateway {

// What a table keeps of one call, gathered as it goes: bodies up to the cap (with their whole
// sizes), and for a response the text of its "usage" object and its count of stream events.
struct InferenceCapture {
  explicit InferenceCapture(size_t max_body_bytes) : max_body_bytes(max_body_bytes) {}

  void add_request(std::string_view body);
  // One whole response, or one piece of a stream (pieces add up to one record).
  void add_response(std::string_view piece);

  size_t max_body_bytes;
  std::string_view protocol = "http";  // mlflow, oip, openai, http (a literal)
  std::string request;
  size_t request_bytes = 0;
  std::string response;
  size_t response_bytes = 0;
  bool stream = false;
  int64_t stream_events = 0;  // "data:" lines but the closing [DONE]
  bool at_line_start = true;  // the stream's next piece starts a line
  std::string usage;          // {"prompt_tokens": ..., ...} when the response carried one
  Clock::TimePoint first_dispatch{};
};

struct InferenceRecord {
  int64_t unix_ms = 0;
  std::string endpoint;
  std::string version;
  std::string replica;
  std::string request_id;
  std::string trace_id;
  std::string method;
  std::string path;
  int status = 0;
  double latency_ms = 0;
  double queue_wait_ms = 0;  // arrival to the first send to a replica (all of it when none)
  int attempts = 0;
  int64_t retention_s = 0;  // the endpoint's, for the writer's pruning
  std::unique_ptr<InferenceCapture> capture;

  // Roughly the memory the record holds while it waits.
  size_t weight() const;
};

// Appends the record as its JSON line (no newline): bodies as strings (invalid UTF-8
// replaced), marked truncated when cut; token counts from the response's usage when it had one.
void append_inference_record_json(const InferenceRecord& record, std::string& out);

class InferenceLog {
 public:
  struct Options {
    std::string dir;
    std::chrono::seconds period{3'600};
    size_t max_buffer_bytes = 64 * 1024 * 1024;
  };

  // Starts the writer. `clock` stamps the files' periods and is kept alive by the caller.
  InferenceLog(Options options, const Clock& clock);
  // Writes what waits and closes every file (renamed closed).
  ~InferenceLog();
  InferenceLog(const InferenceLog&) = delete;
  InferenceLog& operator=(const InferenceLog&) = delete;

  // Queues a record; false when the buffer is full (the record is dropped). Any thread.
  bool offer(InferenceRecord&& record);
  // Returns once every record offered before the call is written and flushed to its file.
  void flush();

 private:
  struct OpenFile;
  void run();
  void write(std::vector<InferenceRecord>& batch);
  void close_due_files(bool all);
  void prune();
  // Flushes the files written to: those not flushed for a second, or all of them.
  void flush_files(bool all);

  const Options options_;
  const Clock& clock_;

  Mutex mutex_;
  CondVar wake_;
  CondVar flushed_;
  std::vector<InferenceRecord> queue_ FLOTILLA_GUARDED_BY(mutex_);
  size_t queued_bytes_ FLOTILLA_GUARDED_BY(mutex_) = 0;
  uint64_t flush_asked_ FLOTILLA_GUARDED_BY(mutex_) = 0;
  uint64_t flush_done_ FLOTILLA_GUARDED_BY(mutex_) = 0;
  bool stopping_ FLOTILLA_GUARDED_BY(mutex_) = false;

  // The writer thread's.
  std::map<std::string, std::unique_ptr<OpenFile>> files_;  // by endpoint
  std::map<std::string, int64_t> retention_s_;              // by endpoint, as last seen
  Clock::TimePoint last_prune_{};
  bool warned_ = false;

  std::thread writer_;
};

}  // namespace flotilla::gateway

// The endpoints' inference tables (docs/inference-tables.md): one record per sampled request,
// gathered on the request path (InferenceCapture), its JSON line written there into the
// thread's own buffer, and compressed and written off the request path by one writer thread
// to gzip'd JSON Lines files under `dir`/<endpoint>/. The file of the current period is
// "<start>-<pid>.jsonl.gz.partial" (flushed every second, so readers see it), renamed to
// "<start>-<pid>.jsonl.gz" when the period ends: a closed file is never written again. Closed
// files older than their endpoint's retention are deleted. offer() never waits for the disk:
// past `max_buffer_bytes` of records waiting, a record is dropped, and the caller counts it.
//
// Private to the gateway module.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/common.h"
#include "protocol/protocol_json_cursor.h"

namespace flotilla::gateway {

// What a table keeps of one call, gathered as it goes: bodies up to the cap (with their whole
// sizes), and for a response the text of its "usage" object and its count of stream events.
struct InferenceCapture {
  explicit InferenceCapture(size_t max_body_bytes) : max_body_bytes(max_body_bytes) {}

  void add_request(std::string_view body);
  // One whole response, or one piece of a stream (pieces add up to one record).
  void add_response(std::string_view piece);
  // A whole response that the record is offered before it is sent (Proxy::respond): its body
  // is viewed, not copied, and must outlive the offer.
  void view_response(std::string_view body);
  // The response's body as the record keeps it (up to the cap).
  std::string_view kept_response() const { return response_viewed ? viewed : response; }

  size_t max_body_bytes;
  std::string_view protocol = "http";  // mlflow, oip, openai, http (a literal)
  std::string request;
  size_t request_bytes = 0;
  std::string response;
  std::string_view viewed;  // view_response's, up to the cap
  bool response_viewed = false;
  size_t response_bytes = 0;
  bool stream = false;
  int64_t stream_events = 0;  // "data:" lines but the closing [DONE]
  bool at_line_start = true;  // the stream's next piece starts a line
  std::string usage;          // {"prompt_tokens": ..., ...} when the response carried one
  Clock::TimePoint first_dispatch{};
};

// One call's record, viewed from the call: nothing is copied until offer() writes its line.
struct InferenceRecord {
  int64_t unix_ms = 0;
  std::string_view endpoint;
  std::string_view version;
  std::string_view replica;
  std::string_view request_id;
  std::string_view trace_id;
  std::string_view method;
  std::string_view path;
  int status = 0;
  double latency_ms = 0;
  double queue_wait_ms = 0;  // arrival to the first send to a replica (all of it when none)
  int attempts = 0;
  int64_t retention_s = 0;  // the endpoint's, for the writer's pruning
  const InferenceCapture* capture = nullptr;
};

// The record's JSON line (no newline): bodies as strings (invalid UTF-8 replaced), marked
// truncated when cut; token counts from the response's usage when it had one.
std::string inference_record_json(const InferenceRecord& record);

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

  // Writes the record's line into the calling thread's own buffer (a lock no other thread
  // takes but the writer, every 100 ms); false when the lines waiting would pass
  // max_buffer_bytes (the record is dropped). Any thread. Lines reach a file in order per
  // thread, not across threads.
  bool offer(const InferenceRecord& record);
  // Returns once every record offered before the call is written and flushed to its file.
  void flush();

 private:
  struct LaneLines;
  struct Lane;
  struct OpenFile;
  // The calling thread's lane, made on its first record.
  Lane& lane();
  void run();
  // Takes every lane's lines (each swapped into its `taken`); the lines that had some.
  std::vector<LaneLines*> take();
  // The open file of `endpoint`, opened for the current period if needed; null when it cannot be.
  OpenFile* file_for(const std::string& endpoint);
  // Compresses and writes what take() took.
  void write(const std::vector<LaneLines*>& batch);
  void close_due_files(bool all);
  void prune();
  // Flushes the files written to: those not flushed for a second, or all of them.
  void flush_files(bool all);

  const Options options_;
  const Clock& clock_;
  const uint64_t id_;  // this log among the process's, for the threads' cached lanes

  // Lines waiting in the lanes: updated under each lane's lock, read without one.
  std::atomic<size_t> queued_bytes_{0};

  Mutex mutex_;
  CondVar wake_;
  CondVar flushed_;
  std::vector<std::unique_ptr<Lane>> lanes_ FLOTILLA_GUARDED_BY(mutex_);
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

// Distributed traces: W3C Trace Context in and out, spans, and their export as OTLP over HTTP
// (the protobuf-JSON encoding) to a collector.
//
// A process that serves requests (the gateway, a replica) owns one Tracer when an OTLP endpoint
// is configured, and none otherwise: code on the request path holds a Tracer* and does nothing
// when it is null. A request's spans are built by the thread that handles it and handed to
// record(), which only moves them into a bounded queue (full: the span is dropped and counted);
// one exporter thread batches the queue, encodes it and posts it, so the request path never
// waits on the collector.
//
// Sampling is parent-based: a request that carries a valid `traceparent` keeps its caller's
// decision (the sampled flag); one that does not starts a trace, sampled at the configured ratio
// (deterministically from the trace id, so every process that sees the trace agrees).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/common.h"

namespace flotilla::http {
class BlockingConnection;
struct Url;
}  // namespace flotilla::http

namespace flotilla::trace {

using SteadyClock = std::chrono::steady_clock;

// What a `traceparent` header carries (version 00): a 128-bit trace id, the 64-bit id of the
// span that sent it, and the flags (bit 0: sampled).
struct SpanContext {
  uint64_t trace_hi = 0;
  uint64_t trace_lo = 0;
  uint64_t span_id = 0;
  uint8_t flags = 0;

  bool sampled() const { return (flags & 1) != 0; }
  // 32 lower-case hex digits.
  std::string trace_id_hex() const;
};

// A W3C `traceparent` header ("00-<32 hex>-<16 hex>-<2 hex>", lower case); nullopt when it is
// absent, malformed, of version ff, or has an all-zero trace or parent id (invalid by the spec).
// Later versions are read as 00 when their first 55 characters are (the spec's rule).
std::optional<SpanContext> parse_traceparent(std::string_view header);
std::string format_traceparent(const SpanContext& context);

// A random non-zero 64-bit id (thread-safe: a generator per thread).
uint64_t random_id();

enum class SpanKind { kInternal = 1, kServer = 2, kClient = 3 };

// A span attribute: one of four OTLP value types. (Not a std::variant: GCC 12 warns about
// moving one, wrongly.)
struct Attribute {
  enum class Type : uint8_t { kString, kInt, kDouble, kBool };
  const char* key;  // a string literal: attributes are named in code
  Type type = Type::kString;
  std::string text;
  int64_t integer = 0;  // kInt, and kBool as 0 or 1
  double number = 0;
};

// One finished (or finishing) operation. Times are the process's steady clock; the exporter
// converts them to Unix time.
struct Span {
  SpanContext context;
  uint64_t parent_span_id = 0;  // 0: a root span
  std::string name;
  SpanKind kind = SpanKind::kInternal;
  SteadyClock::time_point start;
  SteadyClock::time_point end;
  std::vector<Attribute> attributes;
  bool error = false;  // OTLP status ERROR (else UNSET)
  std::string status_message;

  void set(const char* key, std::string value) {
    room();
    attributes.push_back({key, Attribute::Type::kString, std::move(value)});
  }
  void set(const char* key, const char* value) { set(key, std::string(value)); }
  void set(const char* key, int64_t value) {
    room();
    attributes.push_back({key, Attribute::Type::kInt, {}, value});
  }
  void set(const char* key, int value) { set(key, int64_t{value}); }
  void set(const char* key, double value) {
    room();
    attributes.push_back({key, Attribute::Type::kDouble, {}, 0, value});
  }
  void set(const char* key, bool value) {
    room();
    attributes.push_back({key, Attribute::Type::kBool, {}, value ? 1 : 0});
  }

 private:
  // One allocation for a span's attributes, not one per doubling.
  void room() {
    if (attributes.capacity() == 0) {
      attributes.reserve(10);
    }
  }
};

// A child of `parent`: same trace and flags, a new span id, started at `start`.
Span child_span(const SpanContext& parent, std::string name, SpanKind kind,
                SteadyClock::time_point start);

struct TracerOptions {
  // The collector's traces URL (http:// or https://, the full path: ".../v1/traces").
  std::string endpoint;
  std::vector<std::pair<std::string, std::string>> headers;  // sent with every export
  double sample_ratio = 1.0;  // for traces this process starts; [0, 1]
  std::string service_name;
  std::vector<std::pair<std::string, std::string>> resource_attributes;
  size_t max_queue_spans = 2048;  // OpenTelemetry's batch span processor defaults
  size_t max_batch_spans = 512;
  std::chrono::milliseconds schedule_delay{5000};
  std::chrono::milliseconds export_timeout{10000};
};

// TracerOptions from OpenTelemetry's standard environment variables, or nullopt when no traces
// endpoint is set (tracing off): OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (used as is), else
// OTEL_EXPORTER_OTLP_ENDPOINT + "/v1/traces"; OTEL_EXPORTER_OTLP_[TRACES_]HEADERS
// ("k=v,k2=v2", values percent-decoded); OTEL_TRACES_SAMPLER_ARG (the ratio);
// OTEL_SERVICE_NAME (else `default_service`); OTEL_RESOURCE_ATTRIBUTES; OTEL_BSP_SCHEDULE_DELAY,
// OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE, OTEL_BSP_EXPORT_TIMEOUT (ms). A flag
// given (`endpoint_flag` non-empty, `ratio_flag` at or above 0: --otlp-endpoint and
// --trace-sample-ratio, whose unset values these are) wins over its variable. kInvalidArgument
// naming the variable or flag for a value that cannot be used.
Result<std::optional<TracerOptions>> tracer_options_from_env(const std::string& default_service,
                                                             const std::string& endpoint_flag,
                                                             double ratio_flag);

// The OTLP protobuf-JSON body (an ExportTraceServiceRequest) for `spans`, with Unix times at
// `unix_offset` from the steady clock. Ids are hex, 64-bit integers strings, enums numbers, as
// the OTLP/JSON specification asks.
std::string encode_otlp_json(const std::vector<Span>& spans, const TracerOptions& options,
                             std::chrono::nanoseconds unix_offset);

class Tracer {
 public:
  // Starts the exporter thread; the metrics go into `registry`, which outlives the tracer.
  static Result<std::unique_ptr<Tracer>> start(TracerOptions options, MetricsRegistry& registry);
  // Exports what is queued (within the export timeout), then stops.
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // The server span of a request that arrived with `traceparent` (empty or invalid: none),
  // started at `start`: a child of the caller's span, or the root of a new trace, sampled as
  // the class comment says.
  Span server_span(std::string_view traceparent, std::string name,
                   SteadyClock::time_point start) const;
  // Queues a finished span when its trace is sampled; never blocks on the export.
  void record(Span&& span);
  // Exports everything queued by now and returns when that is done (tests, shutdown).
  void flush();

 private:
  Tracer(TracerOptions options, MetricsRegistry& registry);
  // The exporter thread; `url` is options_.endpoint, parsed.
  void run(const http::Url& url);
  void export_batch(http::BlockingConnection& connection, const http::Url& url,
                    std::vector<Span>&& batch);

  const TracerOptions options_;
  const std::chrono::nanoseconds unix_offset_;
  Counter& exported_;
  Counter& dropped_;
  Counter& failed_exports_;

  Mutex mutex_;
  CondVar wake_;
  CondVar flushed_;
  std::vector<Span> queue_ FLOTILLA_GUARDED_BY(mutex_);
  uint64_t flush_requested_ FLOTILLA_GUARDED_BY(mutex_) = 0;
  uint64_t flush_done_ FLOTILLA_GUARDED_BY(mutex_) = 0;
  bool stopping_ FLOTILLA_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace flotilla::trace

// The tracer: sampling, the bounded span queue and the exporter thread (trace.h).
#include <cmath>

#include <spdlog/spdlog.h>

#include "http/http.h"
#include "trace/trace.h"

namespace flotilla::trace {
namespace {

// System time minus steady time, now: added to a steady time point, it gives Unix time.
std::chrono::nanoseconds steady_to_unix_offset() {
  const auto system = std::chrono::system_clock::now().time_since_epoch();
  const auto steady = SteadyClock::now().time_since_epoch();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(system) -
         std::chrono::duration_cast<std::chrono::nanoseconds>(steady);
}

// A new trace is sampled when its trace id's low 56 bits fall under ratio * 2^56: the same
// decision wherever the id is seen (OpenTelemetry's TraceIdRatioBased samples on the id too).
bool ratio_samples(uint64_t trace_lo, double ratio) {
  if (ratio >= 1) {
    return true;
  }
  constexpr double kSpace = 72057594037927936.0;  // 2^56
  return static_cast<double>(trace_lo & ((uint64_t{1} << 56) - 1)) < ratio * kSpace;
}

// Status codes OTLP/HTTP says to retry (with backoff); anything else is final.
bool retryable(int status) {
  return status == 429 || status == 502 || status == 503 || status == 504;
}

}  // namespace

Result<std::unique_ptr<Tracer>> Tracer::start(TracerOptions options, MetricsRegistry& registry) {
  FLOTILLA_ASSIGN_OR_RETURN(http::Url url, http::parse_url(options.endpoint));
  if (options.max_queue_spans == 0 || options.max_batch_spans == 0) {
    return invalid_argument("the span queue and batch must hold at least one span");
  }
  std::unique_ptr<Tracer> tracer(new Tracer(std::move(options), registry));
  tracer->thread_ = std::thread([raw = tracer.get(), url = std::move(url)] { raw->run(url); });
  spdlog::info("exporting traces to {} (service {}, sampling {} of new traces)",
               tracer->options_.endpoint, tracer->options_.service_name,
               tracer->options_.sample_ratio);
  return tracer;
}

Tracer::Tracer(TracerOptions options, MetricsRegistry& registry)
    : options_(std::move(options)),
      unix_offset_(steady_to_unix_offset()),
      exported_(
          registry.counter("flotilla_trace_spans_exported_total", "Spans the collector accepted.")),
      dropped_(registry.counter("flotilla_trace_spans_dropped_total",
                                "Spans dropped: the export queue was full, or the collector "
                                "refused or could not be reached.")),
      failed_exports_(registry.counter("flotilla_trace_export_failures_total",
                                       "Batches of spans the collector did not take.")) {}

Tracer::~Tracer() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

Span Tracer::server_span(std::string_view traceparent, std::string name,
                         SteadyClock::time_point start) const {
  SpanContext parent;
  if (std::optional<SpanContext> caller = parse_traceparent(traceparent)) {
    parent = *caller;
  } else {
    parent.trace_hi = random_id();
    parent.trace_lo = random_id();
    parent.span_id = 0;  // a root
    parent.flags = ratio_samples(parent.trace_lo, options_.sample_ratio) ? 1 : 0;
  }
  return child_span(parent, std::move(name), SpanKind::kServer, start);
}

void Tracer::record(Span&& span) {
  if (!span.context.sampled()) {
    return;
  }
  bool full_batch = false;
  {
    MutexLock lock(mutex_);
    if (queue_.size() >= options_.max_queue_spans) {
      dropped_.inc();
      return;
    }
    queue_.push_back(std::move(span));
    full_batch = queue_.size() == options_.max_batch_spans;
  }
  if (full_batch) {
    wake_.notify_one();
  }
}

void Tracer::flush() {
  MutexLock lock(mutex_);
  const uint64_t ticket = ++flush_requested_;
  wake_.notify_one();
  while (flush_done_ < ticket && !stopping_) {
    flushed_.wait(mutex_);
  }
}

void Tracer::run(const http::Url& url) {
  // One connection, kept alive between batches.
  http::BlockingConnection connection(url.origin(), options_.export_timeout);
  auto next_export = SteadyClock::now() + options_.schedule_delay;
  std::optional<SteadyClock::time_point> shutdown_deadline;
  for (;;) {
    std::vector<Span> batch;
    uint64_t flushing = 0;
    bool last = false;
    {
      MutexLock lock(mutex_);
      while (!stopping_ && flush_requested_ == flush_done_ &&
             queue_.size() < options_.max_batch_spans && SteadyClock::now() < next_export) {
        wake_.wait_until(mutex_, next_export);
      }
      last = stopping_;
      flushing = flush_requested_;
      const size_t take = std::min(queue_.size(), options_.max_batch_spans);
      batch.assign(std::make_move_iterator(queue_.begin()),
                   std::make_move_iterator(queue_.begin() + static_cast<ptrdiff_t>(take)));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<ptrdiff_t>(take));
      if (queue_.empty() || batch.empty()) {
        next_export = SteadyClock::now() + options_.schedule_delay;
      }
    }
    if (!batch.empty()) {
      export_batch(connection, url, std::move(batch));
    }
    MutexLock lock(mutex_);
    if (last) {
      // Shutdown takes at most one export timeout more: what is left then is dropped.
      if (!shutdown_deadline) {
        shutdown_deadline = SteadyClock::now() + options_.export_timeout;
      } else if (SteadyClock::now() >= *shutdown_deadline) {
        dropped_.inc(queue_.size());
        queue_.clear();
      }
    }
    if (!queue_.empty() && (last || flushing > flush_done_)) {
      continue;  // a flush or the shutdown exports everything queued before it
    }
    flush_done_ = flushing;
    flushed_.notify_all();
    if (last) {
      return;
    }
  }
}

void Tracer::export_batch(http::BlockingConnection& connection, const http::Url& url,
                          std::vector<Span>&& batch) {
  const auto deadline = SteadyClock::now() + options_.export_timeout;
  const std::string body = encode_otlp_json(batch, options_, unix_offset_);
  std::string failure;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) {
      const auto backoff = std::chrono::milliseconds(100) * (1 << (2 * (attempt - 1)));
      if (SteadyClock::now() + backoff >= deadline) {
        break;
      }
      std::this_thread::sleep_for(backoff);
    }
    http::ClientRequest request;
    request.method = http::Method::kPost;
    request.target = url.target;
    request.body = body;
    request.headers.emplace_back("Content-Type", "application/json");
    for (const auto& [name, value] : options_.headers) {
      request.headers.emplace_back(name, value);
    }
    int status = 0;
    std::string answer;
    const Status sent = connection.send(
        std::move(request),
        [&](const http::ResponseHead& head) {
          status = head.status;
          return Status::ok();
        },
        [&](const char* data, size_t size) {
          if (answer.size() < 4096) {
            answer.append(data, std::min(size, 4096 - answer.size()));
          }
          return Status::ok();
        },
        deadline);
    if (sent.is_ok() && status >= 200 && status < 300) {
      exported_.inc(batch.size());
      return;
    }
    failure = sent.is_ok() ? "HTTP " + std::to_string(status) + ": " + answer : sent.message();
    if (sent.is_ok() && !retryable(status)) {
      break;
    }
  }
  failed_exports_.inc();
  dropped_.inc(batch.size());
  spdlog::warn("could not export {} spans to {}: {}", batch.size(), options_.endpoint, failure);
}

}  // namespace flotilla::trace

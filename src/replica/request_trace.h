// A sampled request's spans in a replica (docs/tracing.md): the server span, ended when the
// answer is handed to the socket, and its children (decode, batch wait, inference, encode; for
// a language model the engine's queue, prefill and decode). Shared by the request's callbacks;
// each piece is touched by one thread at a time, in the request's order.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "trace/trace.h"

namespace flotilla::replica {

struct RequestTrace {
  using TimePoint = std::chrono::steady_clock::time_point;

  RequestTrace(trace::Tracer& tracer_in, trace::Span server_in)
      : tracer(tracer_in), server(std::move(server_in)) {}

  // A child of the server span over [start, end], for the caller to record.
  trace::Span child(std::string name, TimePoint start, TimePoint end) const {
    trace::Span span =
        trace::child_span(server.context, std::move(name), trace::SpanKind::kInternal, start);
    span.end = end;
    return span;
  }
  void record(std::string name, TimePoint start, TimePoint end) {
    tracer.record(child(std::move(name), start, end));
  }

  trace::Tracer& tracer;
  trace::Span server;
  TimePoint submitted{};  // handed to the batcher or the runtime
  int64_t rows = 0;       // of the model call
  TimePoint run_start{};  // its batch began to run (the batcher writes it)
};

}  // namespace flotilla::replica

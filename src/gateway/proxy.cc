// The proxied call: forward, retry, streaming, accounting and outlier ejection (proxy.h).
// Moved out of gateway_server.cc (issue #19).
#include "gateway/proxy.h"

#include <algorithm>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/common_logging.h"
#include "gateway/snapshots.h"

namespace flotilla::gateway {
namespace {

// At debug level: an attempt that failed, on a line carrying the request's fields.
void log_failed_attempt(const ProxyCall& call, const ReplicaRuntime& replica,
                        const http::ClientResponse& response, std::string_view how) {
  if (!spdlog::should_log(spdlog::level::debug)) {
    return;
  }
  LogScope scope(
      {.endpoint = replica.endpoint, .replica = replica.id, .request_id = call.request_id});
  spdlog::debug("request {}: replica {} of '{}' failed{} ({}): {}", call.request_id, replica.id,
                replica.endpoint, how, http::failure_name(response.failure), response.error);
}

}  // namespace

Proxy::Proxy(const GatewayOptions& options, const Clock& clock, Workers& workers,
             Admission& admission, const Snapshots& snapshots, AccessLog* access_log,
             InferenceLog* inference_log, trace::Tracer* tracer)
    : options_(options),
      workers_(workers),
      admission_(admission),
      snapshots_(snapshots),
      access_log_(access_log),
      inference_log_(inference_log),
      tracer_(tracer),
      outlier_({options.eject_after_failures, options.ejection_time, options.max_ejection_time},
               clock) {}

void Proxy::admit(const std::shared_ptr<ProxyCall>& call) {
  WorkerState& state = workers_.current();
  auto replica =
      acquire(*call->view, *state.balancer, *state.random, call->excluded, call->version);
  if (replica) {
    forward(call, std::move(replica));
    return;
  }
  if (call->trace) {
    call->trace->queued_at = SteadyClock::now();
  }
  admission_.enqueue(call, state);
}

// ---- CallHandler: admission's hand-offs, each on the call's worker --------------------------

void Proxy::watch_client(const std::shared_ptr<ProxyCall>& call) {
  if (!call->watching) {
    call->watching = true;
    call->responder.on_client_gone([this, call] { on_client_gone(call); });
  }
}

void Proxy::post_forward(std::shared_ptr<ProxyCall> call, std::shared_ptr<ReplicaRuntime> replica) {
  http::Loop loop = call->loop;
  loop.post([this, call = std::move(call), replica = std::move(replica)]() mutable {
    forward(call, std::move(replica));
  });
}

void Proxy::post_respond(std::shared_ptr<ProxyCall> call,
                         std::function<http::Response()> make_response) {
  http::Loop loop = call->loop;
  loop.post([this, call = std::move(call), make_response = std::move(make_response)] {
    respond(*call, make_response());
  });
}

void Proxy::expire_after(const ProxyCall& call, std::chrono::microseconds delay) {
  call.loop.post_after(delay,
                       [this, endpoint = call.endpoint] { admission_.expire_waiting(endpoint); });
}

// ---- Forwarding, retries and streams ----------------------------------------------------------

void Proxy::forward(const std::shared_ptr<ProxyCall>& call,
                    std::shared_ptr<ReplicaRuntime> replica) {
  if (call->client_gone) {
    replica->release();
    admission_.dispatch_waiting(*call->endpoint, *workers_.current().balancer,
                                *workers_.current().random);
    respond(*call, error_response(call->shape, 499, "client closed the connection"));
    return;
  }
  call->state.store(CallState::kDispatched);
  call->replica = std::move(replica);
  ++call->attempts;
  call->endpoint->in_flight.fetch_add(1);
  call->endpoint->in_flight_gauge.add(1);
  call->upstream_start = SteadyClock::now();
  if (call->capture && call->attempts == 1) {
    call->capture->first_dispatch = call->upstream_start;
  }
  if (call->trace) {
    end_queue_span(*call->trace, call->upstream_start);
    start_attempt_span(*call, call->upstream_start);
  }
  ReplicaRuntime& target = *call->replica;
  WorkerState& state = workers_.current();
  call->handle =
      state.pool->send(target.host, target.port, std::move(call->request),
                       options_.upstream_timeout, [call](http::ClientResponse&& response) {
                         call->proxy->on_upstream(call, std::move(response));
                       });
  if (!call->watching && call->owner == nullptr) {
    call->owner = &state;
    call->active_index = state.active.size();
    state.active.push_back(call.get());
    if (!state.sweeping) {
      state.sweeping = true;
      watch_slow_calls(state);
    }
  }
}

// Watching a client for a disconnect costs an epoll_ctl, more than a fast request is worth
// saving: calls still at their replica after one sweep period (25 to 50 ms) are watched.
void Proxy::watch_slow_calls(WorkerState& state) {
  http::Loop::current().post_after(std::chrono::milliseconds(25), [this, &state] {
    const TimePoint old = SteadyClock::now() - std::chrono::milliseconds(25);
    for (size_t i = 0; i < state.active.size(); ++i) {
      ProxyCall* call = state.active[i];
      if (!call->watching && !call->answered && call->start <= old) {
        call->watching = true;
        call->responder.on_client_gone(
            [this, self = call->shared_from_this()] { on_client_gone(self); });
      }
    }
    if (state.active.empty()) {
      state.sweeping = false;
      return;
    }
    watch_slow_calls(state);
  });
}

void Proxy::release(ProxyCall& call) {
  ReplicaRuntime& replica = *call.replica;
  replica.release();
  call.endpoint->in_flight.fetch_sub(1);
  call.endpoint->in_flight_gauge.add(-1);
  if (call.endpoint->queued.load() > 0) {
    WorkerState& state = workers_.current();
    admission_.dispatch_waiting(*call.endpoint, *state.balancer, *state.random);
  }
}

void Proxy::on_upstream(const std::shared_ptr<ProxyCall>& call, http::ClientResponse&& response) {
  const TimePoint now = SteadyClock::now();
  call->upstream_time += now - call->upstream_start;
  if (call->trace) {
    end_attempt_span(*call, response, now);
  }
  ReplicaRuntime& replica = *call->replica;
  const double seconds = seconds_between(call->upstream_start, now);
  replica.latency.observe(seconds);
  // Failures do not count: a replica that fails fast must not look fast (outlier detection
  // ejects it instead).
  if (response.failure == http::UpstreamFailure::kNone) {
    replica.observe_latency(seconds, now);
  }
  release(*call);
  if (call->streaming) {
    on_upstream_stream(call, std::move(response));
    return;
  }

  if (response.failure == http::UpstreamFailure::kNone) {
    record_answer(call, response.status);
    // Every field given: a default Content-Type would be built only to be replaced.
    respond(*call, http::Response{response.status, std::move(response.content_type),
                                  std::move(response.body), std::move(response.headers)});
    return;
  }
  if (response.failure == http::UpstreamFailure::kCancelled) {
    respond(*call, error_response(call->shape, 499, "client closed the connection"));
    return;
  }
  // Out of descriptors here says nothing about the replica: counted, it never ejects it.
  record_failure(call->replica,
                 response.local_failure ? AttemptResult::kLocalFailure : AttemptResult::kFailure);
  log_failed_attempt(*call, replica, response, "");
  if (should_retry(FailedAttempt{response.failure, response.unsent.has_value(), call->client_gone,
                                 call->attempts})) {
    // Nothing reached the client: send it again, to another replica or, when none is
    // eligible, after waiting in the queue for one (a replacement, a probe back, a drain's
    // successor). Only the queue's deadline then ends it (503 or 429).
    call->endpoint->retries.inc();
    call->excluded = call->replica.get();
    call->request = std::move(*response.unsent);
    admit(call);
    return;
  }
  if (response.failure == http::UpstreamFailure::kTimeout) {
    respond(*call, error_response(call->shape, 504,
                                  "replica '" + replica.id + "' of endpoint '" + replica.endpoint +
                                      "' did not respond within " +
                                      std::to_string(options_.upstream_timeout.count()) + " ms"));
    return;
  }
  respond(*call, error_response(call->shape, 502,
                                "replica '" + replica.id + "' of endpoint '" + replica.endpoint +
                                    "' failed: " + response.error));
}

void Proxy::on_stream_head(ProxyCall& call, int status, std::string content_type,
                           http::Headers headers) {
  call.streaming = true;
  if (call.capture) {
    call.capture->stream = true;
  }
  if (!call.watching) {
    // A stream is long: its client is watched now, so leaving stops the generation at once.
    call.watching = true;
    call.responder.on_client_gone([this, self = call.shared_from_this()] { on_client_gone(self); });
  }
  headers.emplace_back("X-Request-Id", call.request_id);
  call.responder.start_stream(status, std::move(content_type), std::move(headers));
}

void Proxy::record_answer(const std::shared_ptr<ProxyCall>& call, int status) {
  call->replica->codes.inc(status);
  // A replica that answers it is overloaded or broken counts as failing, like a dead one.
  if (status == 502 || status == 503 || status == 504) {
    record_failure(call->replica);
  } else {
    record_success(*call->replica);
  }
}

void Proxy::on_upstream_stream(const std::shared_ptr<ProxyCall>& call,
                               http::ClientResponse&& response) {
  ReplicaRuntime& replica = *call->replica;
  if (response.failure == http::UpstreamFailure::kNone) {
    record_answer(call, response.status);
    end_stream(*call, response.status, true);
    return;
  }
  if (response.failure == http::UpstreamFailure::kCancelled) {
    end_stream(*call, 499, false);  // the client left mid-stream
    return;
  }
  // Cut mid-stream (kStreamInterrupted): bytes went to the client, so no retry; the client's
  // stream is cut too, so it cannot take the partial stream for a whole one.
  record_failure(call->replica);
  log_failed_attempt(*call, replica, response, " mid-stream");
  end_stream(*call, 502, false);
}

void Proxy::end_stream(ProxyCall& call, int code, bool complete) {
  if (!account(call, code)) {
    return;
  }
  if (complete) {
    call.responder.finish();
  } else {
    // A Responder destroyed mid-stream closes the connection.
    http::Responder cut(std::move(call.responder));
  }
}

void Proxy::on_client_gone(const std::shared_ptr<ProxyCall>& call) {
  call->client_gone = true;
  if (admission_.cancel(call)) {
    respond(*call, error_response(call->shape, 499, "client closed the connection"));
    return;
  }
  workers_.current().pool->cancel(call->handle);
}

void Proxy::respond(ProxyCall& call, http::Response&& response) {
  if (call.capture && !call.answered) {
    call.capture->view_response(response.body);  // account() offers the record: still here
  }
  if (!account(call, response.status)) {
    return;
  }
  response.headers.emplace_back("X-Request-Id", call.request_id);
  call.responder.send(std::move(response));
}

bool Proxy::account(ProxyCall& call, int code) {
  if (call.answered) {
    return false;
  }
  call.answered = true;
  if (call.owner != nullptr) {
    auto& active = call.owner->active;
    active[call.active_index] = active.back();
    active[call.active_index]->active_index = call.active_index;
    active.pop_back();
    call.owner = nullptr;
  }
  const TimePoint now = SteadyClock::now();
  const double total = seconds_between(call.start, now);
  const double added = total - std::chrono::duration<double>(call.upstream_time).count();
  EndpointRuntime& endpoint = *call.endpoint;
  endpoint.codes.inc(code);
  endpoint.latency.observe(total);
  endpoint.response_latency.observe(total);
  endpoint.added_latency.observe(std::max(0.0, added));
  endpoint.completions.fetch_add(1, std::memory_order_relaxed);
  if (call.upstream_time.count() > 0) {
    endpoint.upstream_answers.fetch_add(1, std::memory_order_relaxed);
    endpoint.upstream_us.fetch_add(
        std::chrono::duration_cast<std::chrono::microseconds>(call.upstream_time).count(),
        std::memory_order_relaxed);
  }
  if (access_log_) {
    nlohmann::json line{{"ts", unix_time_ms()},
                        {"request_id", call.request_id},
                        {"trace_id", call.trace_id.empty() ? nlohmann::json(nullptr)
                                                           : nlohmann::json(call.trace_id)},
                        {"method", http::method_name(call.method)},
                        {"path", call.path},
                        {"endpoint", endpoint.name},
                        {"version", call.replica ? call.replica->version : ""},
                        {"replica", call.replica ? call.replica->id : ""},
                        {"code", code},
                        {"latency_ms", total * 1e3},
                        {"added_ms", added * 1e3},
                        {"attempts", call.attempts}};
    access_log_->append(line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  if (call.capture) {
    record_inference(call, code, total);
  }
  if (call.trace) {
    end_server_span(call, code, now);
  }
  return true;
}

void Proxy::record_inference(ProxyCall& call, int code, double total_seconds) {
  EndpointRuntime& endpoint = *call.endpoint;
  InferenceRecord record;
  record.unix_ms = unix_time_ms() - static_cast<int64_t>(total_seconds * 1e3);  // its arrival
  record.endpoint = endpoint.name;
  if (call.replica) {
    record.version = call.replica->version;
    record.replica = call.replica->id;
  }
  record.request_id = call.request_id;
  record.trace_id = call.trace_id;
  record.method = http::method_name(call.method);
  record.path = call.path;
  record.status = code;
  record.latency_ms = total_seconds * 1e3;
  const TimePoint dispatched = call.capture->first_dispatch;
  record.queue_wait_ms =
      dispatched == TimePoint{} ? record.latency_ms : seconds_between(call.start, dispatched) * 1e3;
  record.attempts = call.attempts;
  record.retention_s = call.view->inference_table.retention_s;
  record.capture = &*call.capture;
  if (inference_log_->offer(record)) {
    endpoint.inference_records.inc();
  } else {
    endpoint.inference_dropped.inc();
  }
}

// ---- Spans ----------------------------------------------------------------------------------

void Proxy::end_queue_span(CallTrace& trace, TimePoint now) {
  if (trace.queued_at == TimePoint{}) {
    return;
  }
  trace::Span wait = trace::child_span(trace.server.context, "admission wait",
                                       trace::SpanKind::kInternal, trace.queued_at);
  wait.end = now;
  trace.queued_at = TimePoint{};
  tracer_->record(std::move(wait));
}

void Proxy::start_attempt_span(ProxyCall& call, TimePoint now) {
  call.trace->attempt =
      trace::child_span(call.trace->server.context, "upstream", trace::SpanKind::kClient, now);
  http::set_header(call.request.headers, "traceparent",
                   trace::format_traceparent(call.trace->attempt.context));
}

void Proxy::end_attempt_span(ProxyCall& call, const http::ClientResponse& response, TimePoint now) {
  trace::Span& span = call.trace->attempt;
  const ReplicaRuntime& replica = *call.replica;
  span.end = now;
  span.set("flotilla.replica", replica.id);
  span.set("flotilla.version", replica.version);
  span.set("server.address", replica.host);
  span.set("server.port", static_cast<int64_t>(replica.port));
  span.set("flotilla.attempt", call.attempts);
  if (response.failure == http::UpstreamFailure::kNone) {
    span.set("http.response.status_code", response.status);
    span.error = response.status >= 500;
  } else {
    span.error = true;
    span.set("error.type", std::string(http::failure_name(response.failure)));
    span.status_message = response.error;
  }
  tracer_->record(std::move(span));
}

void Proxy::end_server_span(ProxyCall& call, int code, TimePoint now) {
  end_queue_span(*call.trace, now);  // answered from the queue (expired, cancelled)
  trace::Span& span = call.trace->server;
  span.end = now;
  span.set("http.request.method", std::string(http::method_name(call.method)));
  span.set("url.path", call.path.substr(0, call.path.find('?')));
  span.set("http.response.status_code", code);
  span.set("flotilla.endpoint", call.endpoint->name);
  if (call.replica) {
    span.set("flotilla.version", call.replica->version);
    span.set("flotilla.replica", call.replica->id);
  }
  span.set("flotilla.request_id", call.request_id);
  span.set("flotilla.attempts", call.attempts);
  span.error = code >= 500;
  tracer_->record(std::move(span));
  call.trace.reset();
}

// ---- Outlier detection -----------------------------------------------------------------------

void Proxy::record_success(ReplicaRuntime& replica) {
  (void)outlier_.put_result(replica.outlier, AttemptResult::kSuccess);
}

void Proxy::record_failure(const std::shared_ptr<ReplicaRuntime>& replica, AttemptResult result) {
  const std::optional<Ejection> ejection = outlier_.put_result(replica->outlier, result);
  if (!ejection) {
    return;
  }
  replica->ejections.inc();
  spdlog::warn("replica '{}' of '{}' at {} ejected for {} ms after {} consecutive failures",
               replica->id, replica->endpoint, replica->address, ejection->delay.count(),
               ejection->consecutive_failures);
  probe_later(replica, ejection->delay);
}

// While ejected, a replica is probed (GET /v2/health/ready) instead of being sent requests;
// any answer below 500 brings it back.
void Proxy::probe_later(std::shared_ptr<ReplicaRuntime> replica, std::chrono::milliseconds delay) {
  http::Loop::current().post_after(
      std::chrono::duration_cast<std::chrono::microseconds>(delay),
      [this, replica = std::move(replica), delay] {
        if (replica->removed.load()) {
          outlier_.forget(replica->outlier);
          return;
        }
        http::ClientRequest probe;
        probe.method = http::Method::kGet;
        probe.target = "/v2/health/ready";
        workers_.current().pool->send(
            replica->host, replica->port, std::move(probe), options_.client.connect_timeout,
            [this, replica, delay](http::ClientResponse&& response) {
              const bool healthy =
                  response.failure == http::UpstreamFailure::kNone && response.status < 500;
              const std::optional<Ejection> again =
                  outlier_.put_probe_result(replica->outlier, healthy, delay);
              if (!again) {
                spdlog::info("replica '{}' of '{}' answered its probe; back in", replica->id,
                             replica->endpoint);
                // Requests waiting for lack of an eligible replica may take it now.
                WorkerState& state = workers_.current();
                const EndpointView* view = snapshots_.current(state)->find(replica->endpoint);
                if (view != nullptr && view->runtime->queued.load() > 0) {
                  admission_.dispatch_waiting(*view->runtime, *state.balancer, *state.random);
                }
                return;
              }
              probe_later(replica, again->delay);
            });
      });
}

}  // namespace flotilla::gateway

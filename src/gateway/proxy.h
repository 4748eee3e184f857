// The proxied call: one request's way from admission to its answer. It takes a slot (or waits
// in admission), forwards the request through its worker's ClientPool, retries a failed attempt
// elsewhere, passes an event stream through, counts the answer (metrics, access log) against
// the endpoint and the replica, and feeds outlier detection, probing ejected replicas back in.
//
// Threads: a call runs on the worker that read its request; a slot freed on another thread
// reaches it through its loop (CallHandler::post_forward). Probes run on the worker whose
// request ejected the replica.
//
// Private to the gateway module.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "gateway/access_log.h"
#include "gateway/admission.h"
#include "gateway/gateway.h"
#include "gateway/inference_log.h"
#include "gateway/outlier_detector.h"
#include "gateway/runtime_state.h"
#include "http/http.h"

namespace flotilla::gateway {

class Snapshots;

class Proxy final : public CallHandler {
 public:
  // Everything passed is kept alive by the caller (the gateway) for the proxy's life;
  // `access_log`, `inference_log` and `tracer` may be null. `clock` times ejections.
  Proxy(const GatewayOptions& options, const Clock& clock, Workers& workers, Admission& admission,
        const Snapshots& snapshots, AccessLog* access_log, InferenceLog* inference_log,
        trace::Tracer* tracer);
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // Sends a new call (or a retry) to a replica with room, else queues it. On its worker.
  void admit(const std::shared_ptr<ProxyCall>& call);

  // The upstream call's callbacks (ProxyCall::proxy reaches them), on the call's worker.
  void on_upstream(const std::shared_ptr<ProxyCall>& call, http::ClientResponse&& response);
  void on_stream_head(ProxyCall& call, int status, std::string content_type, http::Headers headers);

  // CallHandler, for admission.
  void respond(ProxyCall& call, http::Response&& response) override;
  void watch_client(const std::shared_ptr<ProxyCall>& call) override;
  void post_forward(std::shared_ptr<ProxyCall> call,
                    std::shared_ptr<ReplicaRuntime> replica) override;
  void post_respond(std::shared_ptr<ProxyCall> call,
                    std::function<http::Response()> make_response) override;
  void expire_after(const ProxyCall& call, std::chrono::microseconds delay) override;

 private:
  void forward(const std::shared_ptr<ProxyCall>& call, std::shared_ptr<ReplicaRuntime> replica);
  void on_client_gone(const std::shared_ptr<ProxyCall>& call);
  void watch_slow_calls(WorkerState& state);
  void release(ProxyCall& call);
  void on_upstream_stream(const std::shared_ptr<ProxyCall>& call, http::ClientResponse&& response);
  // Ends a stream: finish() when `complete`, else the client's connection is cut.
  void end_stream(ProxyCall& call, int code, bool complete);
  // The bookkeeping of an answer (metrics, access log), once per call; false when done before.
  bool account(ProxyCall& call, int code);
  // Hands a sampled call's record to the inference log (account's, once per call).
  void record_inference(ProxyCall& call, int code, double total_seconds);
  // A traced call's spans: the wait in the admission queue that ends `now` (if it waited), the
  // attempt that starts (its traceparent goes to the replica) and ends, and the call's own.
  void end_queue_span(CallTrace& trace, TimePoint now);
  void start_attempt_span(ProxyCall& call, TimePoint now);
  void end_attempt_span(ProxyCall& call, const http::ClientResponse& response, TimePoint now);
  void end_server_span(ProxyCall& call, int code, TimePoint now);

  // Counts an upstream's answer with `status` against its replica.
  void record_answer(const std::shared_ptr<ProxyCall>& call, int status);
  void record_success(ReplicaRuntime& replica);
  // `result` is kFailure or kLocalFailure.
  void record_failure(const std::shared_ptr<ReplicaRuntime>& replica,
                      AttemptResult result = AttemptResult::kFailure);
  void probe_later(std::shared_ptr<ReplicaRuntime> replica, std::chrono::milliseconds delay);

  const GatewayOptions& options_;
  Workers& workers_;
  Admission& admission_;
  const Snapshots& snapshots_;
  AccessLog* const access_log_;
  InferenceLog* const inference_log_;
  trace::Tracer* const tracer_;
  // Immutable after construction; each replica's state is its runtime's `outlier`.
  const OutlierDetector outlier_;
};

}  // namespace flotilla::gateway

// Admission: the path of a request that finds no replica with room. It waits in its endpoint's
// AdmissionQueue until a slot frees (dispatch), its deadline passes (expire: 429, or 503 when it
// waited for a first ready replica), its client leaves (cancel) or its endpoint leaves the
// table (abandon: 404). Deadlines come from an injected Clock, so tests drive them.
//
// Admission never touches a call's worker loop itself: answers, forwards and expiry timers go
// through the CallHandler (the proxy), which posts them to the worker that owns the call.
//
// Private to the gateway module.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string_view>

#include "common/common.h"
#include "gateway/gateway.h"
#include "gateway/runtime_state.h"
#include "http/http.h"

namespace flotilla::gateway {

// What admission hands its calls back to. Implemented by the proxy; a test fakes it.
class CallHandler {
 public:
  // On the call's worker thread: answers the call now (a queue that is full).
  virtual void respond(ProxyCall& call, http::Response&& response) = 0;
  // On the call's worker thread: watches the call's client for a disconnect, once (a queued
  // call must leave its queue when its client goes).
  virtual void watch_client(const std::shared_ptr<ProxyCall>& call) = 0;
  // From any thread: forwards the call to `replica` (a slot already taken) on its worker.
  virtual void post_forward(std::shared_ptr<ProxyCall> call,
                            std::shared_ptr<ReplicaRuntime> replica) = 0;
  // From any thread: answers the call with `make_response()`'s response on its worker.
  virtual void post_respond(std::shared_ptr<ProxyCall> call,
                            std::function<http::Response()> make_response) = 0;
  // On the call's worker thread: runs Admission::expire_waiting for the call's endpoint on
  // that worker after `delay`.
  virtual void expire_after(const ProxyCall& call, std::chrono::microseconds delay) = 0;

 protected:
  ~CallHandler() = default;
};

// A slot on an eligible replica of `view` other than `excluded`, of the version named `version`
// (ignoring weights) when not empty, else of a version drawn by weight; null when none has
// room. Any thread; `balancer` and `random` are the caller's.
std::shared_ptr<ReplicaRuntime> acquire(const EndpointView& view, Balancer& balancer,
                                        Random& random, const ReplicaRuntime* excluded,
                                        std::string_view version);

// Thread-safety: every method may be called from any worker thread and the control thread;
// each endpoint's queue is guarded by the endpoint's mutex.
class Admission {
 public:
  // `options` (queue capacity and timeouts), `clock` and `calls` are kept alive by the caller.
  Admission(const GatewayOptions& options, const Clock& clock, CallHandler& calls)
      : options_(options), clock_(clock), calls_(calls) {}
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Queues `call` (its acquire found no slot) until its deadline: the queue timeout, or the
  // cold-start timeout when no replica that could serve it is eligible (then capacity is
  // requested, at most once a second per endpoint). A full queue answers 429 at once. On the
  // call's worker thread; `worker` is that worker's state.
  void enqueue(const std::shared_ptr<ProxyCall>& call, WorkerState& worker);

  // Hands free slots of `endpoint` to its oldest waiters (after a release, a table swap or a
  // probe that brought a replica back). Any thread.
  void dispatch_waiting(EndpointRuntime& endpoint, Balancer& balancer, Random& random);

  // Answers the waiters of `endpoint` whose deadline passed (429; 503 when cold). Any thread.
  void expire_waiting(const std::shared_ptr<EndpointRuntime>& endpoint);

  // The call's client left: true when the call was still queued and now is not (the caller
  // answers it 499), false when it was dispatched or answered already.
  bool cancel(const std::shared_ptr<ProxyCall>& call);

  // The endpoint left the table: its waiters are answered 404.
  void abandon(EndpointRuntime& endpoint);

  // Scale from zero: where capacity requests go from now on; null (the default) for nowhere.
  // When it returns, no call to the previous requester is running. Thread-safe; must not be
  // called while holding a lock that the requester takes.
  void set_capacity_requester(CapacityRequester* requester);

 private:
  void request_capacity(EndpointRuntime& endpoint);

  const GatewayOptions& options_;
  const Clock& clock_;
  CallHandler& calls_;
  // The requester is called under this lock, so that unsubscribing waits for a call in
  // progress; calls are rare (at most one a second per endpoint) and must not block.
  Mutex capacity_mutex_;
  CapacityRequester* capacity_ FLOTILLA_GUARDED_BY(capacity_mutex_) = nullptr;
};

}  // namespace flotilla::gateway

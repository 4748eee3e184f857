// Admission: enqueue, dispatch, expire (admission.h). Moved out of gateway_server.cc (issue #19).
#include "gateway/admission.h"

#include <algorithm>
#include <string>
#include <vector>

namespace flotilla::gateway {

std::shared_ptr<ReplicaRuntime> acquire(const EndpointView& view, Balancer& balancer,
                                        Random& random, const ReplicaRuntime* excluded,
                                        std::string_view version) {
  thread_local std::vector<Candidate> candidates;
  std::optional<size_t> first;
  if (version.empty()) {
    first = pick_by_weight(view.weights, random);
  } else {
    for (size_t v = 0; v < view.versions.size() && !first; ++v) {
      if (view.versions[v].name == version) {
        first = v;
      }
    }
  }
  if (!first) {
    return nullptr;
  }
  // The version drawn by weight first; when it has no room, the others in order, so a full
  // version does not make requests wait while another has capacity. A version path stays on
  // its version.
  const size_t versions = version.empty() ? view.versions.size() : 1;
  for (size_t n = 0; n < versions; ++n) {
    const size_t v = (*first + n) % view.versions.size();
    if (n > 0 && view.weights[v] <= 0) {
      continue;
    }
    const auto& replicas = view.versions[v].replicas;
    for (int attempt = 0; attempt < 3; ++attempt) {
      candidates.clear();
      for (const auto& replica : replicas) {
        candidates.push_back(Candidate{replica->eligible() && replica.get() != excluded,
                                       replica->in_flight.load(std::memory_order_relaxed),
                                       replica->cap.load(std::memory_order_relaxed),
                                       replica->latency_estimate.load(std::memory_order_relaxed)});
      }
      const auto index = balancer.pick(candidates, random, to_millis(SteadyClock::now()));
      if (!index) {
        break;
      }
      // Another worker may have taken the last slot since the counts were read.
      if (replicas[*index]->try_acquire()) {
        return replicas[*index];
      }
    }
  }
  return nullptr;
}

void Admission::enqueue(const std::shared_ptr<ProxyCall>& call, WorkerState& worker) {
  EndpointRuntime& endpoint = *call->endpoint;
  // Cold: no replica that could serve the call is eligible (scale from zero, every replica
  // ejected or starting, or the only one just failed it): wait as long as a cold start takes.
  bool any_eligible = false;
  for (const auto& version : call->view->versions) {
    for (const auto& replica : version.replicas) {
      any_eligible = any_eligible || (replica->eligible() && call->accepts(*replica));
    }
  }
  call->cold = !any_eligible;
  const TimePoint now = clock_.now();
  TimePoint deadline = now + (call->cold ? options_.cold_start_timeout : options_.queue_timeout);
  call->state.store(CallState::kQueued);
  bool full = false;
  {
    MutexLock lock(endpoint.mutex);
    // Deadlines in one queue never decrease (AdmissionQueue's contract); a request behind a
    // cold-start waiter waits as long as it.
    deadline = std::max(deadline, endpoint.queue.last_deadline().value_or(deadline));
    if (endpoint.queue.push(std::shared_ptr<ProxyCall>(call), deadline)) {
      full = true;
    } else {
      endpoint.queued.fetch_add(1);
      endpoint.queue_gauge.add(1);
    }
  }
  if (full) {
    call->state.store(CallState::kExpired);
    endpoint.rejected.fetch_add(1, std::memory_order_relaxed);
    http::Response response = error_response(
        call->shape, 429, "endpoint '" + endpoint.name + "' is at capacity and its queue is full");
    response.headers.emplace_back("Retry-After", "1");
    calls_.respond(*call, std::move(response));
    return;
  }
  if (call->cold) {
    request_capacity(endpoint);
  }
  calls_.watch_client(call);
  calls_.expire_after(*call, std::chrono::duration_cast<std::chrono::microseconds>(deadline - now));
  // A slot freed between the failed acquire and the push saw an empty queue and dispatched
  // nothing; look once more now that the queue counter shows this request.
  dispatch_waiting(endpoint, *worker.balancer, *worker.random);
}

void Admission::request_capacity(EndpointRuntime& endpoint) {
  MutexLock lock(capacity_mutex_);
  if (capacity_ == nullptr) {
    return;
  }
  const int64_t now_ms = clock_.unix_ms();
  int64_t last = endpoint.last_capacity_request_ms.load();
  if (now_ms - last >= 1000 &&
      endpoint.last_capacity_request_ms.compare_exchange_strong(last, now_ms)) {
    capacity_->request_capacity(endpoint.name);
  }
}

void Admission::set_capacity_requester(CapacityRequester* requester) {
  MutexLock lock(capacity_mutex_);
  capacity_ = requester;
}

// Hands free slots to the oldest waiters: take a slot first, then a waiter, so a slot is never
// promised to a waiter that then finds none (and a waiter never sees a slot vanish). The slot is
// sought for what the oldest waiter needs (its version; not the replica that failed it); a
// waiter that cannot use the slot keeps its place and the next one that can takes it.
void Admission::dispatch_waiting(EndpointRuntime& endpoint, Balancer& balancer, Random& random) {
  int misses = 0;
  while (endpoint.queued.load() > 0) {
    std::shared_ptr<const EndpointView> view;
    const ReplicaRuntime* excluded = nullptr;
    std::string version;
    {
      MutexLock lock(endpoint.mutex);
      view = endpoint.view.lock();
      if (const auto* front = endpoint.queue.front(); front != nullptr) {
        excluded = (*front)->excluded;
        version = (*front)->version;
      }
    }
    if (!view || endpoint.removed.load()) {
      return;
    }
    auto replica = acquire(*view, balancer, random, excluded, version);
    if (!replica && (excluded != nullptr || !version.empty())) {
      replica = acquire(*view, balancer, random, nullptr, {});  // for a waiter further back
    }
    if (!replica) {
      return;
    }
    std::shared_ptr<ProxyCall> call;
    {
      MutexLock lock(endpoint.mutex);
      const auto takes = [&replica](const std::shared_ptr<ProxyCall>& waiting) {
        // Calls no longer queued (their client left) are dropped on the way.
        return waiting->state.load() != CallState::kQueued || waiting->accepts(*replica);
      };
      while (auto next = endpoint.queue.pop_first(takes)) {
        endpoint.queued.fetch_sub(1);
        endpoint.queue_gauge.add(-1);
        CallState expected = CallState::kQueued;
        if ((*next)->state.compare_exchange_strong(expected, CallState::kDispatched)) {
          call = std::move(*next);
          break;
        }
      }
    }
    if (!call) {
      // A push may have raced with this pop (its own dispatch found this slot taken): look
      // again. When no waiter may use the replicas with room, a later release, table swap or
      // probe dispatches them; stop after a few misses.
      replica->release();
      if (++misses > 2) {
        return;
      }
      continue;
    }
    calls_.post_forward(std::move(call), std::move(replica));
  }
}

void Admission::expire_waiting(const std::shared_ptr<EndpointRuntime>& endpoint) {
  std::vector<std::shared_ptr<ProxyCall>> expired;
  {
    MutexLock lock(endpoint->mutex);
    expired = endpoint->queue.expire(clock_.now());
    endpoint->queued.fetch_sub(static_cast<int64_t>(expired.size()));
    endpoint->queue_gauge.add(-static_cast<double>(expired.size()));
  }
  for (auto& call : expired) {
    CallState expected = CallState::kQueued;
    if (!call->state.compare_exchange_strong(expected, CallState::kExpired)) {
      continue;  // its client left; already answered
    }
    endpoint->rejected.fetch_add(1, std::memory_order_relaxed);
    ProxyCall& waiter = *call;
    calls_.post_respond(std::move(call), [this, &waiter] {
      const auto waited = options_.queue_timeout.count();
      http::Response response =
          waiter.cold
              ? error_response(waiter.shape, 503,
                               "endpoint '" + waiter.endpoint->name +
                                   "' has no ready replica; none became ready within " +
                                   std::to_string(options_.cold_start_timeout.count()) + " ms")
              : error_response(waiter.shape, 429,
                               "endpoint '" + waiter.endpoint->name +
                                   "' is at capacity; no replica was free within " +
                                   std::to_string(waited) + " ms");
      response.headers.emplace_back("Retry-After", "1");
      return response;
    });
  }
}

bool Admission::cancel(const std::shared_ptr<ProxyCall>& call) {
  CallState expected = CallState::kQueued;
  if (!call->state.compare_exchange_strong(expected, CallState::kCancelled)) {
    return false;
  }
  // Still queued, unless a dispatcher popped it a moment ago (it then skips it, as its state is
  // no longer kQueued, and has already uncounted it).
  EndpointRuntime& endpoint = *call->endpoint;
  MutexLock lock(endpoint.mutex);
  if (endpoint.queue.remove(call)) {
    endpoint.queued.fetch_sub(1);
    endpoint.queue_gauge.add(-1);
  }
  return true;
}

void Admission::abandon(EndpointRuntime& endpoint) {
  std::vector<std::shared_ptr<ProxyCall>> waiting;
  {
    MutexLock lock(endpoint.mutex);
    waiting = endpoint.queue.expire(TimePoint::max());
    endpoint.queued.fetch_sub(static_cast<int64_t>(waiting.size()));
    endpoint.queue_gauge.set(0);
  }
  for (auto& call : waiting) {
    CallState expected = CallState::kQueued;
    if (call->state.compare_exchange_strong(expected, CallState::kExpired)) {
      ProxyCall& waiter = *call;
      calls_.post_respond(std::move(call), [&waiter] {
        return error_response(waiter.shape, 404,
                              "endpoint '" + waiter.endpoint->name + "' was removed", "model");
      });
    }
  }
}

}  // namespace flotilla::gateway

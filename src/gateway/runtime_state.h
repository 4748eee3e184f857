// The gateway's live state, shared by its parts (private to the gateway module): per-replica
// and per-endpoint runtime kept across table swaps, the immutable views of one table snapshot,
// one proxied request (ProxyCall) and each worker thread's own state.
//
// Threads: ReplicaRuntime's and EndpointRuntime's counters are atomics shared by all workers (a
// replica's cap must hold across workers); an endpoint's admission queue is guarded by its
// mutex (why a mutex: "Locking" at Gateway in gateway.h). Views and snapshots are immutable once
// published. A ProxyCall is touched by its own worker, except for the atomic `state` that a
// dispatcher on another thread moves. A WorkerState belongs to its worker thread.
//
// The request path's small functions (try_acquire, eligible, accepts, CodeCounters::inc,
// Workers::current) stay inline here: each request runs them several times.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/common.h"
#include "gateway/gateway.h"
#include "gateway/inference_log.h"
#include "gateway/load_sampler.h"
#include "gateway/outlier_detector.h"
#include "http/http.h"

namespace flotilla::gateway {

// The clock of latencies and of the call's own timestamps. (Admission deadlines come from an
// injected flotilla::Clock instead: they decide behaviour.)
using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;

// The balancer's clock (gateway_policy.h's Millis): the steady clock in milliseconds, wrapping.
inline Millis to_millis(TimePoint time) {
  return static_cast<Millis>(
      std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count());
}

inline double seconds_between(TimePoint from, TimePoint to) {
  return std::chrono::duration<double>(to - from).count();
}

inline http::Response error_response(ErrorShape shape, int status, std::string_view message,
                                     std::string_view param = {}) {
  http::Response response;
  response.status = status;
  response.body = error_body(shape, status, message, param);
  return response;
}

// Counters by HTTP status code, registered on first use of each code so the output lists only
// codes that occurred. inc() is lock-free once a code has been seen.
class CodeCounters {
 public:
  CodeCounters(MetricsRegistry& registry, std::string name, std::string help, Labels labels)
      : registry_(registry),
        name_(std::move(name)),
        help_(std::move(help)),
        labels_(std::move(labels)) {}

  void inc(int code) {
    if (code < 100 || code > 599) {
      code = 0;
    }
    Counter* counter = counters_[code].load(std::memory_order_acquire);
    if (counter == nullptr) {
      Labels labels = labels_;
      labels.emplace_back("code", std::to_string(code));
      counter = &registry_.counter(name_, help_, labels);
      counters_[code].store(counter, std::memory_order_release);
    }
    counter->inc();
  }

  // Every code seen so far and its count.
  std::map<int, uint64_t> totals() const {
    std::map<int, uint64_t> totals;
    for (size_t code = 0; code < counters_.size(); ++code) {
      if (const Counter* counter = counters_[code].load(std::memory_order_acquire)) {
        totals[static_cast<int>(code)] = counter->value();
      }
    }
    return totals;
  }

 private:
  MetricsRegistry& registry_;
  std::string name_;
  std::string help_;
  Labels labels_;
  std::array<std::atomic<Counter*>, 600> counters_{};
};

inline std::vector<double> latency_buckets() {
  return exponential_buckets(0.0001, 2, 18);  // 100 µs .. 13 s
}

inline std::vector<double> added_latency_buckets() {
  return exponential_buckets(0.000005, 2, 16);  // 5 µs .. 164 ms
}

// ---- Live state, kept across table swaps ------------------------------------------------------

struct ReplicaRuntime {
  ReplicaRuntime(const std::string& endpoint_name, const std::string& version_name,
                 const ReplicaEntry& entry, MetricsRegistry& registry)
      : registry(registry),
        endpoint(endpoint_name),
        version(version_name),
        id(entry.id),
        host(entry.host),
        port(entry.port),
        address(entry.host + ":" + std::to_string(entry.port)),
        codes(registry, "flotilla_gateway_replica_requests_total",
              "Requests answered by a replica, by status code.",
              {{"endpoint", endpoint_name}, {"replica", entry.id}}),
        latency(registry.histogram("flotilla_gateway_replica_request_duration_seconds",
                                   "Time from sending to a replica to its full response.",
                                   latency_buckets(),
                                   {{"endpoint", endpoint_name}, {"replica", entry.id}})),
        in_flight_gauge(registry.gauge("flotilla_gateway_replica_in_flight_requests",
                                       "Requests sent to a replica and not yet answered.",
                                       {{"endpoint", endpoint_name}, {"replica", entry.id}})),
        ejections(registry.counter("flotilla_gateway_replica_ejections_total",
                                   "Times a replica was ejected by outlier detection.",
                                   {{"endpoint", endpoint_name}, {"replica", entry.id}})) {
    apply(entry);
  }
  // Gone from the table and from every request and probe: its series leave /metrics, so the
  // output does not grow with replica churn.
  ~ReplicaRuntime() { registry.retire({{"endpoint", endpoint}, {"replica", id}}); }
  ReplicaRuntime(const ReplicaRuntime&) = delete;
  ReplicaRuntime& operator=(const ReplicaRuntime&) = delete;

  void apply(const ReplicaEntry& entry) {
    cap.store(entry.max_in_flight);
    state.store(entry.state);
  }

  // Ready, not ejected and still in the table; the cap is checked separately.
  bool eligible() const {
    return state.load(std::memory_order_relaxed) == ReplicaState::kReady && !outlier.ejected() &&
           !removed.load(std::memory_order_relaxed);
  }

  // Takes one slot below the cap. Sequentially consistent with the queue counter, so a slot
  // freed while a request is being queued is never missed (see enqueue()).
  bool try_acquire() {
    const int64_t limit = cap.load();
    int64_t current = in_flight.load();
    while (limit <= 0 || current < limit) {
      if (in_flight.compare_exchange_weak(current, current + 1)) {
        in_flight_gauge.add(1);
        return true;
      }
    }
    return false;
  }

  void release() {
    in_flight.fetch_sub(1);
    in_flight_gauge.add(-1);
  }

  // A response (or an error status) that took `seconds`, into the balancer's estimate. Any
  // worker; lock-free: a lost race retries with the other worker's estimate.
  void observe_latency(double seconds, TimePoint now) {
    PeakEwma current = latency_estimate.load(std::memory_order_relaxed);
    while (!latency_estimate.compare_exchange_weak(
        current, current.observe(seconds, to_millis(now)), std::memory_order_relaxed)) {
    }
  }

  MetricsRegistry& registry;
  const std::string endpoint;
  const std::string version;
  const std::string id;
  const std::string host;
  const uint16_t port;
  const std::string address;
  std::atomic<int64_t> cap{0};
  std::atomic<ReplicaState> state{ReplicaState::kReady};
  std::atomic<bool> removed{false};
  std::atomic<int64_t> in_flight{0};
  std::atomic<PeakEwma> latency_estimate{};
  static_assert(std::atomic<PeakEwma>::is_always_lock_free);
  OutlierState outlier;
  CodeCounters codes;
  Histogram& latency;
  Gauge& in_flight_gauge;
  Counter& ejections;
};

struct ProxyCall;
struct EndpointView;

struct EndpointRuntime {
  // `clock` (the samples' timestamps) is kept alive by the gateway.
  EndpointRuntime(const std::string& endpoint_name, size_t queue_capacity,
                  MetricsRegistry& registry, const Clock& clock)
      : name(endpoint_name),
        queue(queue_capacity),
        codes(registry, "flotilla_gateway_requests_total",
              "Requests answered by the gateway for an endpoint, by status code.",
              {{"endpoint", endpoint_name}}),
        latency(registry.histogram("flotilla_gateway_request_duration_seconds",
                                   "Time from a request's arrival to its response.",
                                   latency_buckets(), {{"endpoint", endpoint_name}})),
        added_latency(registry.histogram(
            "flotilla_gateway_added_latency_seconds",
            "Time a request spent in the gateway itself: total minus time at replicas, "
            "including time in the admission queue.",
            added_latency_buckets(), {{"endpoint", endpoint_name}})),
        in_flight_gauge(registry.gauge("flotilla_gateway_in_flight_requests",
                                       "Requests of an endpoint at its replicas.",
                                       {{"endpoint", endpoint_name}})),
        queue_gauge(registry.gauge("flotilla_gateway_queue_depth",
                                   "Requests waiting in an endpoint's admission queue.",
                                   {{"endpoint", endpoint_name}})),
        retries(registry.counter("flotilla_gateway_retries_total",
                                 "Requests retried on another replica after a failure.",
                                 {{"endpoint", endpoint_name}})),
        inference_records(registry.counter(
            "flotilla_gateway_inference_records_total",
            "Requests recorded for the endpoint's inference table (queued for its files).",
            {{"endpoint", endpoint_name}})),
        inference_dropped(registry.counter(
            "flotilla_gateway_inference_records_dropped_total",
            "Requests sampled for the inference table but dropped: its write buffer was full.",
            {{"endpoint", endpoint_name}})),
        sampler(clock) {}

  const std::string name;
  Mutex mutex;
  AdmissionQueue<std::shared_ptr<ProxyCall>> queue FLOTILLA_GUARDED_BY(mutex);
  // The latest table's view of this endpoint, for dispatching waiters. Weak: views own their
  // runtime, and the snapshot that owns the view keeps it alive.
  std::weak_ptr<const EndpointView> view FLOTILLA_GUARDED_BY(mutex);
  std::atomic<bool> removed{false};
  std::atomic<int64_t> queued{0};  // entries in `queue`, read without the lock
  std::atomic<int64_t> in_flight{0};
  std::atomic<uint64_t> arrivals{0};
  std::atomic<uint64_t> completions{0};
  std::atomic<uint64_t> rejected{0};
  // Replica answers and their summed upstream time: the replicas' latency in each sample.
  std::atomic<uint64_t> upstream_answers{0};
  std::atomic<uint64_t> upstream_us{0};
  std::atomic<int64_t> last_capacity_request_ms{0};
  CodeCounters codes;
  Histogram& latency;
  Histogram& added_latency;
  Gauge& in_flight_gauge;
  Gauge& queue_gauge;
  Counter& retries;
  Counter& inference_records;
  Counter& inference_dropped;
  LatencyTotals response_latency;  // for the samples' quantiles (finer than `latency`)

  // Registry of replica state by "version/id@host:port"; touched only under the gateway's
  // swap mutex.
  std::map<std::string, std::shared_ptr<ReplicaRuntime>> replicas;

  // Ticked by the control thread; samples() reads it from any thread.
  LoadSampler sampler;
};

struct VersionView {
  std::string name;
  std::vector<std::shared_ptr<ReplicaRuntime>> replicas;
};

// One endpoint as one table snapshot describes it.
struct EndpointView {
  std::shared_ptr<EndpointRuntime> runtime;
  std::vector<VersionView> versions;
  std::vector<int64_t> weights;
  // An endpoint with an "llm" version is a generative model (`GET /v1/models`); its
  // max_model_len is the smallest known one of those versions (a request may reach any).
  bool generative = false;
  int64_t max_model_len = 0;
  InferenceTableConfig inference_table;
};

struct Snapshot {
  std::unordered_map<std::string, std::shared_ptr<const EndpointView>> endpoints;
  std::vector<std::string> names;  // sorted
  bool auth_enabled = false;
  std::shared_ptr<const auth::Authenticator> auth;
  std::vector<std::string> open_routes;

  const EndpointView* find(const std::string& name) const {
    auto it = endpoints.find(name);
    return it == endpoints.end() ? nullptr : it->second.get();
  }
  bool is_open(std::string_view route) const {
    return !auth_enabled ||
           std::find(open_routes.begin(), open_routes.end(), route) != open_routes.end();
  }
};

// ---- One proxied request ------------------------------------------------------------------------

enum class CallState { kNew, kQueued, kDispatched, kExpired, kCancelled };

struct WorkerState;
class Proxy;

// A sampled call's spans while it runs (docs/tracing.md): the gateway's server span, ended
// when the call is answered, and the pieces under it.
struct CallTrace {
  trace::Span server;
  TimePoint queued_at{};  // when the call last entered the admission queue; unset: not there
  trace::Span attempt;    // the upstream attempt in flight
};

struct ProxyCall : std::enable_shared_from_this<ProxyCall> {
  ProxyCall(http::Responder&& responder_in, http::Loop loop_in)
      : responder(std::move(responder_in)), loop(loop_in) {}

  http::Responder responder;
  http::Loop loop;  // the worker that owns the client connection
  // Callbacks capture only the call and reach the proxy through it. (A std::function still
  // allocates for a shared_ptr capture: libstdc++ keeps only trivially copyable ones inline.)
  Proxy* proxy = nullptr;
  http::Method method = http::Method::kPost;
  std::string path;  // as the client sent it, for the log
  http::ClientRequest request;
  std::string request_id;
  // For the access log and inference table: the trace the call belongs to (the client's, or
  // the one the gateway started when it traces); empty: none.
  std::string trace_id;
  std::shared_ptr<const Snapshot> snapshot;  // keeps `view` alive
  const EndpointView* view = nullptr;
  std::shared_ptr<EndpointRuntime> endpoint;
  std::shared_ptr<ReplicaRuntime> replica;
  // The replica that failed the last attempt: a retry goes elsewhere, and a queued retry is
  // not handed a slot there (the call's `replica` keeps it alive, so the address is unique).
  const ReplicaRuntime* excluded = nullptr;
  std::string version;  // for an OIP version path: only this version's replicas serve it
  ErrorShape shape = ErrorShape::kPlain;
  http::ClientPool::CallHandle handle;
  std::atomic<CallState> state{CallState::kNew};

  // Whether a slot on `candidate` may serve this call (the queue's dispatch asks).
  bool accepts(const ReplicaRuntime& candidate) const {
    return &candidate != excluded && (version.empty() || candidate.version == version);
  }
  bool cold = false;  // queued for lack of any ready replica
  bool watching = false;
  bool client_gone = false;
  bool answered = false;
  // The upstream answered with an event stream whose head went on to the client: from then on
  // a byte was sent, so the call is never retried, and it ends with finish() or a cut.
  bool streaming = false;
  WorkerState* owner = nullptr;  // set while the call is in owner->active
  size_t active_index = 0;
  int attempts = 0;
  TimePoint start;
  TimePoint upstream_start;
  SteadyClock::duration upstream_time{0};
  // Set when the call is sampled for its endpoint's inference table.
  std::optional<InferenceCapture> capture;
  // Set when the call's trace is sampled.
  std::unique_ptr<CallTrace> trace;
};

struct WorkerState {
  std::unique_ptr<http::ClientPool> pool;  // created on first use, on the worker's thread
  // Calls at the replicas, for the disconnect sweep (see watch_slow_calls).
  std::vector<ProxyCall*> active;
  bool sweeping = false;
  std::unique_ptr<Balancer> balancer;
  std::unique_ptr<SeededRandom> random;
  std::shared_ptr<const Snapshot> snapshot;
  uint64_t snapshot_version = 0;
  uint64_t request_counter = 0;
};

// Every worker's WorkerState, indexed by the server's worker index.
class Workers {
 public:
  // `client` is kept alive by the caller (the gateway's options).
  explicit Workers(const http::ClientOptions& client) : client_(client) {}
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  // Before the server runs: one state per worker, each with its balancer and random source.
  void add(std::unique_ptr<WorkerState> state) { states_.push_back(std::move(state)); }
  // After the loops stopped: the pools go while the event loops they belong to still exist.
  void clear() { states_.clear(); }

  // The calling worker's state; its client pool is created on first use, on its thread.
  // Worker threads only.
  WorkerState& current() {
    const int index = http::current_worker_index();
    FLOTILLA_CHECK(index >= 0 && static_cast<size_t>(index) < states_.size());
    WorkerState& state = *states_[index];
    if (!state.pool) {
      state.pool = http::ClientPool::create(http::Loop::current(), client_);
    }
    return state;
  }

 private:
  const http::ClientOptions& client_;
  std::vector<std::unique_ptr<WorkerState>> states_;
};

}  // namespace flotilla::gateway

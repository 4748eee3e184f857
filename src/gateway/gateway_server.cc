// The gateway server: routing, auth, admission, balancing, retries and outlier ejection around
// the http module's server and client pools. docs/gateway.md describes the behaviour.
//
// Threads and ownership:
// - Worker threads (one event loop each) run the handler. A request stays on the worker that
//   read it; its upstream call goes through that worker's ClientPool.
// - Per-replica and per-endpoint counters are atomics shared by all workers: a replica's cap
//   must hold across workers. The fast path (a replica has room) takes no lock.
// - The admission queue of an endpoint is the slow path: a mutex guards it (why a mutex and not
//   an owning worker: "Locking" at Gateway in gateway.h). A slot freed on any thread hands
//   itself to the oldest waiter, whose continuation is posted to its worker.
// - The control thread samples load every 100 ms (1 s samples for the autoscaler) and reloads
//   the config file. Table swaps publish a new immutable Snapshot; workers pick it up with one
//   atomic load per request.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "gateway/access_log.h"
#include "gateway/gateway.h"
#include "gateway/load_sampler.h"
#include "gateway/local_routes.h"
#include "gateway/outlier_detector.h"
#include "gateway/runtime_state.h"

namespace flotilla::gateway {
namespace {

constexpr auto kSampleTick = std::chrono::milliseconds(100);  // LoadSampler's tick

bool valid_request_id(std::string_view id) {
  if (id.empty() || id.size() > 128) {
    return false;
  }
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.' || c == ':';
    if (!ok) {
      return false;
    }
  }
  return true;
}

bool forwardable(std::string_view name) {
  static constexpr std::string_view kDropped[] = {
      "connection", "keep-alive",    "proxy-connection", "transfer-encoding",
      "te",         "trailer",       "upgrade",          "content-length",
      "host",       "authorization", "expect",           "x-request-id"};
  for (std::string_view dropped : kDropped) {
    if (equals_ignore_case(name, dropped)) {
      return false;
    }
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

class GatewayImpl final : public Gateway {
 public:
  GatewayImpl(const GatewayOptions& options, CapacityRequester* capacity, MetricsRegistry& registry)
      : options_(options),
        capacity_(capacity),
        registry_(registry),
        control_random_(options.seed != 0
                            ? options.seed
                            : static_cast<uint64_t>(SteadyClock::now().time_since_epoch().count())),
        control_balancer_(make_balancer(options.balancer)),
        outlier_({options.eject_after_failures, options.ejection_time, options.max_ejection_time},
                 real_clock()),
        unrouted_(registry, "flotilla_gateway_unrouted_requests_total",
                  "Requests answered without reaching an endpoint (auth, unknown routes), by "
                  "status code.",
                  {}) {}

  ~GatewayImpl() override {
    {
      MutexLock lock(control_mutex_);
      stop_control_ = true;
    }
    control_wake_.notify_all();
    if (control_thread_.joinable()) {
      control_thread_.join();
    }
    // The loops have stopped (or never ran). The pools go first: their timers and sockets
    // must be destroyed while the event loops they belong to still exist.
    workers_.clear();
    server_.reset();
    // Requests still queued (a drain that timed out) hold their endpoint: let them go.
    for (auto& [name, endpoint] : endpoints_) {
      MutexLock lock(endpoint->mutex);
      endpoint->queue.expire(TimePoint::max());
    }
  }

  Status init(EndpointTable table, AuthConfig auth) {
    if (!options_.access_log.empty()) {
      FLOTILLA_ASSIGN_OR_RETURN(access_log_, AccessLog::open(options_.access_log));
    }
    http::ServerOptions server_options = options_.server;
    server_options.capture_headers = true;
    server_options.error_request_ids = true;  // every answer has an X-Request-Id
    FLOTILLA_ASSIGN_OR_RETURN(
        server_, http::Server::create(server_options,
                                      [this](http::Request&& request, http::Responder&& responder) {
                                        handle(std::move(request), std::move(responder));
                                      }));
    uint64_t seed = 0;
    {
      MutexLock lock(swap_mutex_);  // no other thread yet; the checker asks for it
      seed = control_random_.next();
      auth_ = std::move(auth);
    }
    for (int i = 0; i < server_->worker_count(); ++i) {
      auto worker = std::make_unique<WorkerState>();
      worker->balancer = make_balancer(options_.balancer);
      worker->random = std::make_unique<SeededRandom>(seed + 0x9E3779B97F4A7C15ULL * (i + 1));
      workers_.add(std::move(worker));
    }
    FLOTILLA_RETURN_IF_ERROR(update_table(std::move(table)));
    control_thread_ = std::thread([this] { control_loop(); });
    return Status::ok();
  }

  uint16_t port() const override { return server_->port(); }
  bool run() override { return server_->run(); }
  void drain(std::chrono::milliseconds timeout) override { server_->drain(timeout); }
  void drain_on_signals(std::chrono::milliseconds timeout) override {
    server_->drain_on_signals(timeout);
  }

  Status update_table(EndpointTable table) override;
  void update_auth(AuthConfig auth) override {
    MutexLock lock(swap_mutex_);
    auth_ = std::move(auth);
    publish_locked();
  }
  void watch_config(const std::string& path, std::chrono::milliseconds interval) override {
    MutexLock lock(control_mutex_);
    config_path_ = path;
    config_interval_ = interval;
    config_stamp_.clear();
  }
  std::vector<LoadSample> samples(const std::string& endpoint, size_t seconds) const override;

  // The request path; public for the callbacks that reach it through ProxyCall::gateway.
  void handle(http::Request&& request, http::Responder&& responder);
  WorkerState& worker();
  const std::shared_ptr<const Snapshot>& current_snapshot(WorkerState& worker);

  void admit(const std::shared_ptr<ProxyCall>& call);
  // A slot on an eligible replica of `view` other than `excluded`, of the version named
  // `version` (ignoring weights) when not empty, else of a version drawn by weight; null when
  // none has room.
  std::shared_ptr<ReplicaRuntime> acquire(const EndpointView& view, Balancer& balancer,
                                          Random& random, const ReplicaRuntime* excluded,
                                          std::string_view version);
  void enqueue(const std::shared_ptr<ProxyCall>& call);
  void dispatch_waiting(EndpointRuntime& endpoint, Balancer& balancer, Random& random);
  void expire_waiting(const std::shared_ptr<EndpointRuntime>& endpoint);
  void forward(const std::shared_ptr<ProxyCall>& call, std::shared_ptr<ReplicaRuntime> replica);
  void on_upstream(const std::shared_ptr<ProxyCall>& call, http::ClientResponse&& response);
  void on_client_gone(const std::shared_ptr<ProxyCall>& call);
  void watch_slow_calls(WorkerState& state);
  void release(ProxyCall& call);
  void respond(ProxyCall& call, http::Response&& response);
  void on_stream_head(ProxyCall& call, int status, std::string content_type, http::Headers headers);
  void on_upstream_stream(const std::shared_ptr<ProxyCall>& call, http::ClientResponse&& response);
  // Ends a stream: finish() when `complete`, else the client's connection is cut.
  void end_stream(ProxyCall& call, int code, bool complete);
  // The bookkeeping of an answer (metrics, access log), once per call; false when done before.
  bool account(ProxyCall& call, int code);

  // Counts an upstream's answer with `status` against its replica.
  void record_answer(const std::shared_ptr<ProxyCall>& call, int status);
  void record_success(ReplicaRuntime& replica);
  // `result` is kFailure or kLocalFailure.
  void record_failure(const std::shared_ptr<ReplicaRuntime>& replica,
                      AttemptResult result = AttemptResult::kFailure);
  void probe_later(std::shared_ptr<ReplicaRuntime> replica, std::chrono::milliseconds delay);

  void publish_locked() FLOTILLA_REQUIRES(swap_mutex_);
  void control_loop();
  void sample_all();
  void check_config();

 private:
  GatewayOptions options_;
  CapacityRequester* capacity_;
  MetricsRegistry& registry_;
  std::unique_ptr<http::Server> server_;
  Workers workers_{options_.client};
  std::unique_ptr<AccessLog> access_log_;

  // Table swaps: serialized by swap_mutex_, which also guards the runtime registries, auth_
  // and the control thread's balancer and random source.
  Mutex swap_mutex_;
  std::map<std::string, std::shared_ptr<EndpointRuntime>> endpoints_
      FLOTILLA_GUARDED_BY(swap_mutex_);
  EndpointTable table_ FLOTILLA_GUARDED_BY(swap_mutex_);
  AuthConfig auth_ FLOTILLA_GUARDED_BY(swap_mutex_);
  SeededRandom control_random_ FLOTILLA_GUARDED_BY(swap_mutex_);
  std::unique_ptr<Balancer> control_balancer_ FLOTILLA_GUARDED_BY(swap_mutex_);
  // Immutable after construction; each replica's state is its runtime's `outlier`.
  const OutlierDetector outlier_;

  // The published snapshot; workers re-read it when the version moves.
  mutable Mutex snapshot_mutex_;
  std::shared_ptr<const Snapshot> snapshot_ FLOTILLA_GUARDED_BY(snapshot_mutex_);
  std::atomic<uint64_t> snapshot_version_{0};

  // Control thread.
  Mutex control_mutex_;
  CondVar control_wake_;
  bool stop_control_ FLOTILLA_GUARDED_BY(control_mutex_) = false;
  std::string config_path_ FLOTILLA_GUARDED_BY(control_mutex_);
  std::chrono::milliseconds config_interval_ FLOTILLA_GUARDED_BY(control_mutex_){0};
  std::string config_stamp_;  // control thread only
  std::thread control_thread_;

  CodeCounters unrouted_;
};

WorkerState& GatewayImpl::worker() {
  return workers_.current();
}

const std::shared_ptr<const Snapshot>& GatewayImpl::current_snapshot(WorkerState& worker) {
  const uint64_t version = snapshot_version_.load(std::memory_order_acquire);
  if (version != worker.snapshot_version) {
    MutexLock lock(snapshot_mutex_);
    worker.snapshot = snapshot_;
    worker.snapshot_version = snapshot_version_.load(std::memory_order_acquire);
  }
  return worker.snapshot;
}

// ---- Table swaps
// ---------------------------------------------------------------------------------

Status GatewayImpl::update_table(EndpointTable table) {
  FLOTILLA_RETURN_IF_ERROR(validate_endpoint_table(table));
  MutexLock lock(swap_mutex_);
  table_ = std::move(table);
  publish_locked();
  return Status::ok();
}

void GatewayImpl::publish_locked() {
  auto snapshot = std::make_shared<Snapshot>();
  std::map<std::string, std::shared_ptr<EndpointRuntime>> endpoints;
  for (const EndpointEntry& entry : table_.endpoints) {
    auto found = endpoints_.find(entry.name);
    std::shared_ptr<EndpointRuntime> runtime =
        found != endpoints_.end()
            ? found->second
            : std::make_shared<EndpointRuntime>(entry.name, options_.queue_capacity, registry_,
                                                real_clock());
    auto view = std::make_shared<EndpointView>();
    view->runtime = runtime;
    std::map<std::string, std::shared_ptr<ReplicaRuntime>> replicas;
    for (const VersionEntry& version : entry.versions) {
      VersionView& version_view = view->versions.emplace_back();
      version_view.name = version.name;
      view->weights.push_back(version.traffic);
      if (version.runtime == "llm") {
        view->generative = true;
        if (version.max_model_len > 0 &&
            (view->max_model_len == 0 || version.max_model_len < view->max_model_len)) {
          view->max_model_len = version.max_model_len;
        }
      }
      for (const ReplicaEntry& replica : version.replicas) {
        const std::string key = version.name + "/" + replica.id + "@" + replica.host + ":" +
                                std::to_string(replica.port);
        auto existing = runtime->replicas.find(key);
        std::shared_ptr<ReplicaRuntime> replica_runtime;
        if (existing != runtime->replicas.end()) {
          replica_runtime = existing->second;
          replica_runtime->apply(replica);
        } else {
          replica_runtime =
              std::make_shared<ReplicaRuntime>(entry.name, version.name, replica, registry_);
        }
        replicas[key] = replica_runtime;
        version_view.replicas.push_back(std::move(replica_runtime));
      }
    }
    // Replicas that left the table take no new requests; those in flight finish (the calls
    // hold them), which is the drain.
    for (auto& [key, old] : runtime->replicas) {
      if (!replicas.contains(key)) {
        old->removed.store(true);
      }
    }
    runtime->replicas = std::move(replicas);
    {
      MutexLock endpoint_lock(runtime->mutex);
      runtime->view = view;
    }
    snapshot->endpoints.emplace(entry.name, std::move(view));
    snapshot->names.push_back(entry.name);
    endpoints.emplace(entry.name, std::move(runtime));
  }
  std::sort(snapshot->names.begin(), snapshot->names.end());
  snapshot->auth_enabled = auth_.enabled;
  snapshot->auth = std::make_shared<const Authenticator>(auth_.tokens);
  snapshot->open_routes = auth_.open_routes;

  // Endpoints that left the table: their waiting requests are answered now.
  for (auto& [name, old] : endpoints_) {
    if (endpoints.contains(name)) {
      continue;
    }
    old->removed.store(true);
    for (auto& [key, replica] : old->replicas) {
      replica->removed.store(true);
    }
    std::vector<std::shared_ptr<ProxyCall>> waiting;
    {
      MutexLock endpoint_lock(old->mutex);
      waiting = old->queue.expire(TimePoint::max());
      old->queued.fetch_sub(static_cast<int64_t>(waiting.size()));
      old->queue_gauge.set(0);
    }
    for (auto& call : waiting) {
      CallState expected = CallState::kQueued;
      if (call->state.compare_exchange_strong(expected, CallState::kExpired)) {
        call->loop.post([this, call] {
          respond(*call,
                  error_response(call->shape, 404,
                                 "endpoint '" + call->endpoint->name + "' was removed", "model"));
        });
      }
    }
  }
  endpoints_ = std::move(endpoints);
  {
    MutexLock snapshot_lock(snapshot_mutex_);
    snapshot_ = std::move(snapshot);
    snapshot_version_.fetch_add(1, std::memory_order_release);
  }
  // New or freed capacity goes to requests that were waiting for it.
  for (auto& [name, runtime] : endpoints_) {
    if (runtime->queued.load() > 0) {
      dispatch_waiting(*runtime, *control_balancer_, control_random_);
    }
  }
}

// ---- The request path
// ----------------------------------------------------------------------------

namespace {

// The client's X-Request-Id when it is a valid one, else a fresh one.
void assign_request_id(const http::Request& request, Random& random, std::string& out) {
  const std::string_view client_id = http::find_header(request.headers, "x-request-id");
  if (valid_request_id(client_id)) {
    out = std::string(client_id);
    return;
  }
  // 15 base-32 digits (75 random bits), by hand: snprintf cost 0.4% of the gateway's CPU.
  // 15 characters fit in std::string's own buffer, so the three copies (the call's, the
  // replica's header, the client's header) cost no allocation.
  static constexpr char kDigits[] = "0123456789abcdefghijklmnopqrstuv";
  out.resize(15);
  uint64_t bits = 0;
  for (size_t i = 0; i < 15; ++i, bits >>= 5) {
    if (i % 12 == 0) {
      bits = random.next();  // 12 digits of 5 bits a draw
    }
    out[i] = kDigits[bits & 0x1f];
  }
}

}  // namespace

void GatewayImpl::handle(http::Request&& request, http::Responder&& responder) {
  WorkerState& state = worker();
  const std::shared_ptr<const Snapshot>& snapshot = current_snapshot(state);
  Route route =
      route_request(request.method, request.target, request.body, options_.default_endpoint);
  const std::string_view authorization = http::find_header(request.headers, "authorization");
  std::string request_id;
  assign_request_id(request, *state.random, request_id);
  const ErrorShape shape = error_shape_for(request.target);
  // The gateway's own refusals: counted as unrouted, in the route's protocol shape.
  const auto refuse = [&](int status, std::string_view message, std::string_view param = {},
                          std::string_view allow = {}) {
    unrouted_.inc(status);
    http::Response response = error_response(shape, status, message, param);
    response.headers.emplace_back("X-Request-Id", request_id);
    if (!allow.empty()) {
      response.headers.emplace_back("Allow", std::string(allow));
    }
    responder.send(std::move(response));
  };

  switch (route.kind) {
    case RouteKind::kHealth:
    case RouteKind::kMetrics:
    case RouteKind::kStats:
    case RouteKind::kListModels:
    case RouteKind::kModel:
    case RouteKind::kServerMetadata: {
      // The endpoints whose series and stats the caller sees (empty: all). A token scoped to
      // some sees only theirs: the names, replicas and counts of others are not its to read.
      std::vector<std::string> scope;
      if (!snapshot->is_open(open_route_name(route.kind))) {
        const AuthResult result = snapshot->auth->check_scope(authorization, &scope);
        if (result != AuthResult::kAllowed) {
          refuse(401,
                 result == AuthResult::kMissing ? "missing bearer token" : "invalid bearer token");
          return;
        }
      }
      http::Response response =
          answer_local(route, request, *snapshot, shape, scope, server_->draining(), registry_);
      unrouted_.inc(response.status);
      response.headers.emplace_back("X-Request-Id", request_id);
      responder.send(std::move(response));
      return;
    }
    case RouteKind::kNotFound:
      refuse(404, "no route for " + request.target);
      return;
    case RouteKind::kBadRequest:
      refuse(400, route.error, "model");
      return;
    case RouteKind::kMethodNotAllowed:
      refuse(405,
             std::string("method ") + std::string(http::method_name(request.method)) +
                 " is not allowed on " + request.target + " (allowed: " + std::string(route.allow) +
                 ")",
             {}, route.allow);
      return;
    default:
      break;
  }

  if (snapshot->auth_enabled) {
    const AuthResult result = snapshot->auth->check(authorization, route.endpoint);
    if (result != AuthResult::kAllowed) {
      refuse(
          result == AuthResult::kForbidden ? 403 : 401,
          result == AuthResult::kForbidden
              ? "the token may not call endpoint '" + route.endpoint + "'"
              : (result == AuthResult::kMissing ? "missing bearer token" : "invalid bearer token"));
      return;
    }
  }
  const EndpointView* view = snapshot->find(route.endpoint);
  if (view == nullptr) {
    refuse(404, "endpoint '" + route.endpoint + "' not found", "model");
    return;
  }
  if (!route.version.empty() && std::none_of(view->versions.begin(), view->versions.end(),
                                             [&route](const VersionView& version) {
                                               return version.name == route.version;
                                             })) {
    refuse(404, "model '" + route.endpoint + "' has no version '" + route.version + "'");
    return;
  }
  if (request.method == http::Method::kOther) {
    refuse(405, "method not allowed", {}, "GET, HEAD, POST, PUT, DELETE");
    return;
  }

  auto call = std::make_shared<ProxyCall>(std::move(responder), http::Loop::current());
  call->gateway = this;
  call->start = SteadyClock::now();
  call->method = request.method;
  call->path = std::move(request.target);
  call->snapshot = snapshot;
  call->view = view;
  call->endpoint = view->runtime;
  call->request_id = std::move(request_id);
  call->version = std::move(route.version);
  call->shape = shape;
  http::ClientRequest& upstream = call->request;
  upstream.method = request.method;
  upstream.target = std::move(route.upstream_target);
  upstream.body = std::move(request.body);
  upstream.headers.reserve(request.headers.size() + 1);
  for (auto& header : request.headers) {
    if (forwardable(header.first)) {
      upstream.headers.push_back(std::move(header));
    }
  }
  upstream.headers.emplace_back("X-Request-Id", call->request_id);
  // Raw pointer: the request (handed back by the pool for a retry) lives in the call, and the
  // pool calls these only while the call is pending, its callback holding the call.
  upstream.stream.on_head = [call = call.get()](int status, std::string content_type,
                                                http::Headers headers) {
    call->gateway->on_stream_head(*call, status, std::move(content_type), std::move(headers));
  };
  upstream.stream.on_body = [call = call.get()](std::string piece) {
    call->responder.write(std::move(piece));
  };
  call->endpoint->arrivals.fetch_add(1, std::memory_order_relaxed);
  admit(call);
}

void GatewayImpl::admit(const std::shared_ptr<ProxyCall>& call) {
  WorkerState& state = worker();
  auto replica =
      acquire(*call->view, *state.balancer, *state.random, call->excluded, call->version);
  if (replica) {
    forward(call, std::move(replica));
    return;
  }
  enqueue(call);
}

std::shared_ptr<ReplicaRuntime> GatewayImpl::acquire(const EndpointView& view, Balancer& balancer,
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
                                       replica->cap.load(std::memory_order_relaxed)});
      }
      const auto index = balancer.pick(candidates, random);
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

void GatewayImpl::enqueue(const std::shared_ptr<ProxyCall>& call) {
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
  const TimePoint now = SteadyClock::now();
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
    respond(*call, std::move(response));
    return;
  }
  if (call->cold && capacity_ != nullptr) {
    const int64_t now_ms = unix_time_ms();
    int64_t last = endpoint.last_capacity_request_ms.load();
    if (now_ms - last >= 1000 &&
        endpoint.last_capacity_request_ms.compare_exchange_strong(last, now_ms)) {
      capacity_->request_capacity(endpoint.name);
    }
  }
  if (!call->watching) {
    call->watching = true;
    call->responder.on_client_gone([this, call] { on_client_gone(call); });
  }
  call->loop.post_after(std::chrono::duration_cast<std::chrono::microseconds>(deadline - now),
                        [this, endpoint = call->endpoint] { expire_waiting(endpoint); });
  // A slot freed between the failed acquire and the push saw an empty queue and dispatched
  // nothing; look once more now that the queue counter shows this request.
  WorkerState& state = worker();
  dispatch_waiting(endpoint, *state.balancer, *state.random);
}

// Hands free slots to the oldest waiters: take a slot first, then a waiter, so a slot is never
// promised to a waiter that then finds none (and a waiter never sees a slot vanish). The slot is
// sought for what the oldest waiter needs (its version; not the replica that failed it); a
// waiter that cannot use the slot keeps its place and the next one that can takes it.
void GatewayImpl::dispatch_waiting(EndpointRuntime& endpoint, Balancer& balancer, Random& random) {
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
    call->loop.post([this, call, replica = std::move(replica)]() mutable {
      forward(call, std::move(replica));
    });
  }
}

void GatewayImpl::expire_waiting(const std::shared_ptr<EndpointRuntime>& endpoint) {
  std::vector<std::shared_ptr<ProxyCall>> expired;
  {
    MutexLock lock(endpoint->mutex);
    expired = endpoint->queue.expire(SteadyClock::now());
    endpoint->queued.fetch_sub(static_cast<int64_t>(expired.size()));
    endpoint->queue_gauge.add(-static_cast<double>(expired.size()));
  }
  for (auto& call : expired) {
    CallState expected = CallState::kQueued;
    if (!call->state.compare_exchange_strong(expected, CallState::kExpired)) {
      continue;  // its client left; already answered
    }
    endpoint->rejected.fetch_add(1, std::memory_order_relaxed);
    call->loop.post([this, call] {
      const auto waited = options_.queue_timeout.count();
      http::Response response =
          call->cold
              ? error_response(call->shape, 503,
                               "endpoint '" + call->endpoint->name +
                                   "' has no ready replica; none became ready within " +
                                   std::to_string(options_.cold_start_timeout.count()) + " ms")
              : error_response(call->shape, 429,
                               "endpoint '" + call->endpoint->name +
                                   "' is at capacity; no replica was free within " +
                                   std::to_string(waited) + " ms");
      response.headers.emplace_back("Retry-After", "1");
      respond(*call, std::move(response));
    });
  }
}

void GatewayImpl::forward(const std::shared_ptr<ProxyCall>& call,
                          std::shared_ptr<ReplicaRuntime> replica) {
  if (call->client_gone) {
    replica->release();
    dispatch_waiting(*call->endpoint, *worker().balancer, *worker().random);
    respond(*call, error_response(call->shape, 499, "client closed the connection"));
    return;
  }
  call->state.store(CallState::kDispatched);
  call->replica = std::move(replica);
  ++call->attempts;
  call->endpoint->in_flight.fetch_add(1);
  call->endpoint->in_flight_gauge.add(1);
  call->upstream_start = SteadyClock::now();
  ReplicaRuntime& target = *call->replica;
  WorkerState& state = worker();
  call->handle =
      state.pool->send(target.host, target.port, std::move(call->request),
                       options_.upstream_timeout, [call](http::ClientResponse&& response) {
                         call->gateway->on_upstream(call, std::move(response));
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
void GatewayImpl::watch_slow_calls(WorkerState& state) {
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

void GatewayImpl::release(ProxyCall& call) {
  ReplicaRuntime& replica = *call.replica;
  replica.release();
  call.endpoint->in_flight.fetch_sub(1);
  call.endpoint->in_flight_gauge.add(-1);
  if (call.endpoint->queued.load() > 0) {
    WorkerState& state = worker();
    dispatch_waiting(*call.endpoint, *state.balancer, *state.random);
  }
}

void GatewayImpl::on_upstream(const std::shared_ptr<ProxyCall>& call,
                              http::ClientResponse&& response) {
  const TimePoint now = SteadyClock::now();
  call->upstream_time += now - call->upstream_start;
  ReplicaRuntime& replica = *call->replica;
  replica.latency.observe(seconds_between(call->upstream_start, now));
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
  spdlog::debug("request {}: replica {} of '{}' failed ({}): {}", call->request_id, replica.id,
                replica.endpoint, http::failure_name(response.failure), response.error);
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

void GatewayImpl::on_stream_head(ProxyCall& call, int status, std::string content_type,
                                 http::Headers headers) {
  call.streaming = true;
  if (!call.watching) {
    // A stream is long: its client is watched now, so leaving stops the generation at once.
    call.watching = true;
    call.responder.on_client_gone([this, self = call.shared_from_this()] { on_client_gone(self); });
  }
  headers.emplace_back("X-Request-Id", call.request_id);
  call.responder.start_stream(status, std::move(content_type), std::move(headers));
}

void GatewayImpl::record_answer(const std::shared_ptr<ProxyCall>& call, int status) {
  call->replica->codes.inc(status);
  // A replica that answers it is overloaded or broken counts as failing, like a dead one.
  if (status == 502 || status == 503 || status == 504) {
    record_failure(call->replica);
  } else {
    record_success(*call->replica);
  }
}

void GatewayImpl::on_upstream_stream(const std::shared_ptr<ProxyCall>& call,
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
  spdlog::debug("request {}: replica {} of '{}' failed mid-stream ({}): {}", call->request_id,
                replica.id, replica.endpoint, http::failure_name(response.failure), response.error);
  end_stream(*call, 502, false);
}

void GatewayImpl::end_stream(ProxyCall& call, int code, bool complete) {
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

void GatewayImpl::on_client_gone(const std::shared_ptr<ProxyCall>& call) {
  call->client_gone = true;
  CallState expected = CallState::kQueued;
  if (call->state.compare_exchange_strong(expected, CallState::kCancelled)) {
    // Still queued, unless a dispatcher popped it a moment ago (it then skips it, as its state
    // is no longer kQueued, and has already uncounted it).
    EndpointRuntime& endpoint = *call->endpoint;
    {
      MutexLock lock(endpoint.mutex);
      if (endpoint.queue.remove(call)) {
        endpoint.queued.fetch_sub(1);
        endpoint.queue_gauge.add(-1);
      }
    }
    respond(*call, error_response(call->shape, 499, "client closed the connection"));
    return;
  }
  worker().pool->cancel(call->handle);
}

void GatewayImpl::respond(ProxyCall& call, http::Response&& response) {
  if (!account(call, response.status)) {
    return;
  }
  response.headers.emplace_back("X-Request-Id", call.request_id);
  call.responder.send(std::move(response));
}

bool GatewayImpl::account(ProxyCall& call, int code) {
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
  return true;
}

// ---- Outlier detection -----------------------------------------------------------------------

void GatewayImpl::record_success(ReplicaRuntime& replica) {
  (void)outlier_.put_result(replica.outlier, AttemptResult::kSuccess);
}

void GatewayImpl::record_failure(const std::shared_ptr<ReplicaRuntime>& replica,
                                 AttemptResult result) {
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
void GatewayImpl::probe_later(std::shared_ptr<ReplicaRuntime> replica,
                              std::chrono::milliseconds delay) {
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
        worker().pool->send(
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
                WorkerState& state = worker();
                const EndpointView* view = current_snapshot(state)->find(replica->endpoint);
                if (view != nullptr && view->runtime->queued.load() > 0) {
                  dispatch_waiting(*view->runtime, *state.balancer, *state.random);
                }
                return;
              }
              probe_later(replica, again->delay);
            });
      });
}

// ---- Local routes ------------------------------------------------------------------------------

// ---- Control thread: samples and config reloads ---------------------------------------------

std::vector<LoadSample> GatewayImpl::samples(const std::string& endpoint, size_t seconds) const {
  std::shared_ptr<const Snapshot> snapshot;
  {
    MutexLock lock(snapshot_mutex_);
    snapshot = snapshot_;
  }
  const EndpointView* view = snapshot ? snapshot->find(endpoint) : nullptr;
  if (view == nullptr) {
    return {};
  }
  return view->runtime->sampler.latest(seconds);
}

void GatewayImpl::sample_all() {
  std::vector<std::shared_ptr<EndpointRuntime>> endpoints;
  {
    MutexLock lock(swap_mutex_);
    for (auto& [name, runtime] : endpoints_) {
      endpoints.push_back(runtime);
    }
  }
  for (auto& runtime : endpoints) {
    const EndpointRuntime& endpoint = *runtime;
    runtime->sampler.tick(LoadReading{endpoint.in_flight.load(), endpoint.queued.load(),
                                      endpoint.arrivals.load(), endpoint.completions.load(),
                                      endpoint.rejected.load(), endpoint.upstream_answers.load(),
                                      endpoint.upstream_us.load()});
  }
}

void GatewayImpl::check_config() {
  std::string path;
  {
    MutexLock lock(control_mutex_);
    path = config_path_;
  }
  if (path.empty()) {
    return;
  }
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  const auto mtime = std::filesystem::last_write_time(path, ec);
  if (ec) {
    if (config_stamp_ != "missing") {
      spdlog::error("config '{}' cannot be read: {}; keeping the current table", path,
                    ec.message());
      config_stamp_ = "missing";
    }
    return;
  }
  const std::string stamp =
      std::to_string(size) + "/" + std::to_string(mtime.time_since_epoch().count());
  if (stamp == config_stamp_) {
    return;
  }
  config_stamp_ = stamp;
  auto config = load_gateway_config(path);
  if (!config.is_ok()) {
    spdlog::error("config not applied: {}", config.status().message());
    return;
  }
  {
    MutexLock lock(swap_mutex_);
    table_ = std::move(config->table);
    auth_ = std::move(config->auth);
    publish_locked();
  }
  spdlog::info("config '{}' applied", path);
}

void GatewayImpl::control_loop() {
  auto next_config_check = SteadyClock::now();
  while (true) {
    std::chrono::milliseconds interval{0};
    {
      MutexLock lock(control_mutex_);
      if (stop_control_) {
        return;
      }
      control_wake_.wait_for(control_mutex_, kSampleTick);
      if (stop_control_) {
        return;
      }
      interval = config_interval_;
    }
    sample_all();
    if (interval.count() > 0 && SteadyClock::now() >= next_config_check) {
      check_config();
      next_config_check = SteadyClock::now() + interval;
    }
  }
}

Result<std::unique_ptr<Gateway>> Gateway::create(const GatewayOptions& options, EndpointTable table,
                                                 AuthConfig auth, CapacityRequester* capacity,
                                                 MetricsRegistry& registry) {
  auto gateway = std::make_unique<GatewayImpl>(options, capacity, registry);
  FLOTILLA_RETURN_IF_ERROR(gateway->init(std::move(table), std::move(auth)));
  return std::unique_ptr<Gateway>(std::move(gateway));
}

}  // namespace flotilla::gateway

// The gateway server: GatewayImpl composes the gateway's parts around the http module's server
// and client pools. docs/gateway.md describes the behaviour.
//
// The parts, one concern each (issue #19):
// - runtime_state.h: replica and endpoint runtime state, table views, one proxied call
//   (ProxyCall) and each worker's state.
// - snapshots.{h,cc}: snapshot publication (table and auth swaps).
// - admission.{h,cc}: the slow path: enqueue, dispatch, expire.
// - proxy.{h,cc}: the proxied call: forward, retry, streaming, accounting, outlier ejection
//   (outlier_detector.h) and probes.
// - local_routes.{h,cc}: health, metrics, stats and the model listing.
// - load_sampler.h: the 1 s samples.
// This file keeps the request's entry (routing, auth, the call's creation) and the control
// thread.
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
#include <thread>

#include <spdlog/spdlog.h>

#include "gateway/access_log.h"
#include "gateway/admission.h"
#include "gateway/gateway.h"
#include "gateway/load_sampler.h"
#include "gateway/local_routes.h"
#include "gateway/proxy.h"
#include "gateway/runtime_state.h"
#include "gateway/snapshots.h"
#include "oip_grpc/oip_grpc.h"

namespace flotilla::gateway {
namespace {

constexpr auto kSampleTick = std::chrono::milliseconds(100);  // LoadSampler's tick
// How long gRPC calls in flight at a drain may take: unbounded in effect, as the HTTP server's
// drain bounds them (it answers every call it was handed, by serving it or abandoning it).
constexpr auto kGrpcShutdownGrace = std::chrono::hours(1);

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

// ---------------------------------------------------------------------------------------------

class GatewayImpl final : public Gateway {
 public:
  GatewayImpl(const GatewayOptions& options, const Clock& clock,
              std::unique_ptr<AccessLog> access_log, std::unique_ptr<trace::Tracer> tracer,
              MetricsRegistry& registry, AuthConfig auth)
      : options_(options),
        registry_(registry),
        access_log_(std::move(access_log)),
        tracer_(std::move(tracer)),
        inference_log_(
            options_.inference_dir.empty()
                ? nullptr
                : std::make_unique<InferenceLog>(
                      InferenceLog::Options{options_.inference_dir, options_.inference_period,
                                            options_.inference_buffer_bytes},
                      clock)),
        workers_(options_.client),
        proxy_(options_, clock, workers_, admission_, snapshots_, access_log_.get(),
               inference_log_.get(), tracer_.get()),
        admission_(options_, clock, proxy_),
        snapshots_(options_, clock, registry, admission_, std::move(auth)),
        unrouted_(registry, "flotilla_gateway_unrouted_requests_total",
                  "Requests answered without reaching an endpoint (auth, unknown routes), by "
                  "status code.",
                  {}) {}

  ~GatewayImpl() override {
    // gRPC first stops handing calls to the server (the order oip_grpc/oip_grpc.h asks).
    if (grpc_) {
      grpc_->shutdown(std::chrono::milliseconds(0));
    }
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
    grpc_.reset();
    snapshots_.drop_queued();
  }

  Status init(EndpointTable table) {
    http::ServerOptions server_options = options_.server;
    server_options.capture_headers = true;
    server_options.error_request_ids = true;  // every answer has an X-Request-Id
    server_options.on_drain = [this] {
      if (grpc_) {
        grpc_->shutdown(kGrpcShutdownGrace);
      }
    };
    FLOTILLA_ASSIGN_OR_RETURN(
        server_, http::Server::create(server_options,
                                      [this](http::Request&& request, http::Responder&& responder) {
                                        handle(std::move(request), std::move(responder));
                                      }));
    const uint64_t seed = snapshots_.next_random();
    for (int i = 0; i < server_->worker_count(); ++i) {
      auto worker = std::make_unique<WorkerState>();
      worker->balancer = make_balancer(options_.balancer);
      worker->random = std::make_unique<SeededRandom>(seed + 0x9E3779B97F4A7C15ULL * (i + 1));
      workers_.add(std::move(worker));
    }
    FLOTILLA_RETURN_IF_ERROR(update_table(std::move(table)));
    if (!options_.grpc_listen.empty()) {
      FLOTILLA_ASSIGN_OR_RETURN(
          grpc_, oip_grpc::GrpcServer::start({options_.grpc_listen, options_.server.max_body_bytes},
                                             *server_));
    }
    control_thread_ = std::thread([this] { control_loop(); });
    return Status::ok();
  }

  uint16_t port() const override { return server_->port(); }
  uint16_t grpc_port() const override { return grpc_ ? grpc_->port() : 0; }
  bool run() override { return server_->run(); }
  void drain(std::chrono::milliseconds timeout) override { server_->drain(timeout); }
  void drain_on_signals(std::chrono::milliseconds timeout) override {
    server_->drain_on_signals(timeout);
  }

  Status update_table(EndpointTable table) override {
    return snapshots_.update_table(std::move(table));
  }
  void update_auth(AuthConfig auth) override { snapshots_.update_auth(std::move(auth)); }
  void watch_config(const std::string& path, std::chrono::milliseconds interval) override {
    MutexLock lock(control_mutex_);
    config_path_ = path;
    config_interval_ = interval;
    config_stamp_.clear();
  }
  std::vector<LoadSample> samples(const std::string& endpoint, size_t seconds) const override;
  void set_capacity_requester(CapacityRequester* requester) override {
    admission_.set_capacity_requester(requester);
  }

 private:
  // The request path: routing, auth, local routes; a proxied request becomes a ProxyCall.
  void handle(http::Request&& request, http::Responder&& responder);

  // Starts `call`'s trace: the server span (kept when sampled), the auth span under it, and
  // the trace id and traceparent the replica gets.
  void start_trace(ProxyCall& call, const http::Headers& headers, TimePoint received,
                   TimePoint auth_start, TimePoint auth_end);
  // The one span of a request the gateway refused itself (auth, unknown endpoint or route).
  void trace_refusal(const http::Request& request, const Route& route,
                     const std::string& request_id, int status, TimePoint received);
  // Samples `call` for its endpoint's inference table and keeps its request body if taken.
  void start_capture(ProxyCall& call, const EndpointView& view, RouteKind kind, Random& random);

  void control_loop();
  void sample_all();
  void check_config();

  // The parts hold references to each other: `proxy_` is built first, keeping references to
  // `admission_` and `snapshots_` that it uses only once requests flow.
  const GatewayOptions options_;
  MetricsRegistry& registry_;
  const std::unique_ptr<AccessLog> access_log_;
  const std::unique_ptr<trace::Tracer> tracer_;        // null when spans are not exported
  const std::unique_ptr<InferenceLog> inference_log_;  // null without an inference_dir
  std::atomic<bool> warned_no_inference_dir_{false};
  // The OIP gRPC front end (null without options_.grpc_listen): its calls go to server_'s
  // handler. Declared before server_, so destroyed after it (the order oip_grpc/oip_grpc.h asks).
  std::unique_ptr<oip_grpc::GrpcServer> grpc_;
  std::unique_ptr<http::Server> server_;
  Workers workers_;
  Proxy proxy_;
  Admission admission_;
  Snapshots snapshots_;
  CodeCounters unrouted_;

  // Control thread.
  Mutex control_mutex_;
  CondVar control_wake_;
  bool stop_control_ FLOTILLA_GUARDED_BY(control_mutex_) = false;
  std::string config_path_ FLOTILLA_GUARDED_BY(control_mutex_);
  std::chrono::milliseconds config_interval_ FLOTILLA_GUARDED_BY(control_mutex_){0};
  std::string config_stamp_;  // control thread only
  std::thread control_thread_;
};

// ---- The request path
// ----------------------------------------------------------------------------

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

void GatewayImpl::handle(http::Request&& request, http::Responder&& responder) {
  const TimePoint received = tracer_ ? SteadyClock::now() : TimePoint{};
  WorkerState& state = workers_.current();
  const std::shared_ptr<const Snapshot>& snapshot = snapshots_.current(state);
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
    if (tracer_) {
      trace_refusal(request, route, request_id, status, received);
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
        const auth::AuthResult result = snapshot->auth->check_scope(authorization, &scope);
        if (result != auth::AuthResult::kAllowed) {
          refuse(401, result == auth::AuthResult::kMissing ? "missing bearer token"
                                                           : "invalid bearer token");
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

  const TimePoint auth_start = tracer_ ? SteadyClock::now() : TimePoint{};
  if (snapshot->auth_enabled) {
    const auth::AuthResult result = snapshot->auth->check(authorization, route.endpoint);
    if (result != auth::AuthResult::kAllowed) {
      refuse(result == auth::AuthResult::kForbidden ? 403 : 401,
             result == auth::AuthResult::kForbidden
                 ? "the token may not call endpoint '" + route.endpoint + "'"
                 : (result == auth::AuthResult::kMissing ? "missing bearer token"
                                                         : "invalid bearer token"));
      return;
    }
  }
  const TimePoint auth_end = tracer_ && snapshot->auth_enabled ? SteadyClock::now() : TimePoint{};
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
  call->proxy = &proxy_;
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
  if (tracer_) {
    start_trace(*call, upstream.headers, received, auth_start, auth_end);
  } else if (access_log_ || view->inference_table.enabled) {
    if (auto parent =
            trace::parse_traceparent(http::find_header(upstream.headers, "traceparent"))) {
      call->trace_id = parent->trace_id_hex();
    }
  }
  // Raw pointer: the request (handed back by the pool for a retry) lives in the call, and the
  // pool calls these only while the call is pending, its callback holding the call.
  upstream.stream.on_head = [call = call.get()](int status, std::string content_type,
                                                http::Headers headers) {
    call->proxy->on_stream_head(*call, status, std::move(content_type), std::move(headers));
  };
  upstream.stream.on_body = [call = call.get()](std::string piece) {
    if (call->capture) {
      call->capture->add_response(piece);
    }
    call->responder.write(std::move(piece));
  };
  if (view->inference_table.enabled) {
    start_capture(*call, *view, route.kind, *state.random);
  }
  call->endpoint->arrivals.fetch_add(1, std::memory_order_relaxed);
  proxy_.admit(call);
}

void GatewayImpl::start_trace(ProxyCall& call, const http::Headers& headers, TimePoint received,
                              TimePoint auth_start, TimePoint auth_end) {
  const std::string_view traceparent = http::find_header(headers, "traceparent");
  trace::Span server = tracer_->server_span(traceparent, {}, received);
  call.trace_id = server.context.trace_id_hex();
  if (!server.context.sampled()) {
    // Not recorded here, but the replica must make the same decision: a trace the gateway
    // started (or a malformed header it replaced) goes on as this unsampled one.
    if (!trace::parse_traceparent(traceparent)) {
      http::set_header(call.request.headers, "traceparent",
                       trace::format_traceparent(server.context));
    }
    return;
  }
  if (auth_end != TimePoint{}) {
    trace::Span auth =
        trace::child_span(server.context, "auth", trace::SpanKind::kInternal, auth_start);
    auth.end = auth_end;
    tracer_->record(std::move(auth));
  }
  server.name = std::string(http::method_name(call.method)) + " " + call.endpoint->name;
  call.trace = std::make_unique<CallTrace>();
  call.trace->server = std::move(server);
  // Each attempt's traceparent is set as it is sent (Proxy::forward).
}

void GatewayImpl::trace_refusal(const http::Request& request, const Route& route,
                                const std::string& request_id, int status, TimePoint received) {
  trace::Span span =
      tracer_->server_span(http::find_header(request.headers, "traceparent"), {}, received);
  if (!span.context.sampled()) {
    return;
  }
  span.name = std::string(http::method_name(request.method)) + " " +
              (route.endpoint.empty() ? std::string("(unrouted)") : route.endpoint);
  span.end = SteadyClock::now();
  span.set("http.request.method", std::string(http::method_name(request.method)));
  span.set("url.path", request.target.substr(0, request.target.find('?')));
  span.set("http.response.status_code", status);
  if (!route.endpoint.empty()) {
    span.set("flotilla.endpoint", route.endpoint);
  }
  span.set("flotilla.request_id", request_id);
  span.error = status >= 500;
  tracer_->record(std::move(span));
}

void GatewayImpl::start_capture(ProxyCall& call, const EndpointView& view, RouteKind kind,
                                Random& random) {
  if (!inference_log_) {
    if (!warned_no_inference_dir_.exchange(true)) {
      spdlog::warn(
          "endpoint '{}' enables its inference table, but this gateway has no "
          "directory for tables (--inference-dir): nothing is recorded",
          view.runtime->name);
    }
    return;
  }
  const InferenceTableConfig& table = view.inference_table;
  // A uniform draw in [0, 1) from the top 53 bits.
  if (table.sample_rate < 1 &&
      static_cast<double>(random.next() >> 11) * 0x1.0p-53 >= table.sample_rate) {
    return;
  }
  call.capture.emplace(static_cast<size_t>(std::max<int64_t>(0, table.max_body_bytes)));
  call.capture->protocol = kind == RouteKind::kInvocations ? "mlflow"
                           : kind == RouteKind::kOip       ? "oip"
                           : kind == RouteKind::kOpenAi    ? "openai"
                                                           : "http";
  call.capture->add_request(call.request.body);
}

// ---- Control thread: samples and config reloads ---------------------------------------------

std::vector<LoadSample> GatewayImpl::samples(const std::string& endpoint, size_t seconds) const {
  const std::shared_ptr<const Snapshot> snapshot = snapshots_.latest();
  const EndpointView* view = snapshot ? snapshot->find(endpoint) : nullptr;
  if (view == nullptr) {
    return {};
  }
  return view->runtime->sampler.latest(seconds);
}

void GatewayImpl::sample_all() {
  for (auto& runtime : snapshots_.endpoints()) {
    const EndpointRuntime& endpoint = *runtime;
    LoadReading reading;
    reading.in_flight = endpoint.in_flight.load();
    reading.queued = endpoint.queued.load();
    reading.arrivals = endpoint.arrivals.load();
    reading.completions = endpoint.completions.load();
    reading.rejected = endpoint.rejected.load();
    reading.upstream_answers = endpoint.upstream_answers.load();
    reading.upstream_us = endpoint.upstream_us.load();
    if (runtime->sampler.closes_on_next_tick()) {
      reading.codes = endpoint.codes.totals();
      reading.latency = endpoint.response_latency.read();
    }
    runtime->sampler.tick(reading);
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
  snapshots_.apply_config(std::move(config->table), std::move(config->auth));
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

}  // namespace

Result<std::unique_ptr<Gateway>> Gateway::create(const GatewayOptions& options, EndpointTable table,
                                                 AuthConfig auth, MetricsRegistry& registry) {
  std::unique_ptr<AccessLog> access_log;
  if (!options.access_log.empty()) {
    FLOTILLA_ASSIGN_OR_RETURN(access_log, AccessLog::open(options.access_log));
  }
  std::unique_ptr<trace::Tracer> tracer;
  if (options.tracing) {
    FLOTILLA_ASSIGN_OR_RETURN(tracer, trace::Tracer::start(*options.tracing, registry));
  }
  auto gateway = std::make_unique<GatewayImpl>(options, real_clock(), std::move(access_log),
                                               std::move(tracer), registry, std::move(auth));
  FLOTILLA_RETURN_IF_ERROR(gateway->init(std::move(table)));
  return std::unique_ptr<Gateway>(std::move(gateway));
}

}  // namespace flotilla::gateway

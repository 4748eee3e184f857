// The replica server: routing, protocol handling and metrics around one runtime.
#include "replica/replica.h"

#include <array>
#include <atomic>
#include <charconv>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "oip_grpc/oip_grpc.h"
#include "protocol/protocol.h"
#include "replica/batcher.h"
#include "replica/openai_handler.h"
#include "replica/request_trace.h"

namespace flotilla::replica {
namespace {

using Clock = std::chrono::steady_clock;
using http::Method;

enum class Route {
  kLive,
  kReady,
  kServerMetadata,
  kModelMetadata,
  kModelReady,
  kInfer,
  kInvocations,
  kPing,
  kHealth,
  kVersion,
  kMetrics,
  kCompletions,
  kChatCompletions,
  kModels,
  kModel,
  kUnknown,
  kCount,
};

constexpr std::array<const char*, static_cast<size_t>(Route::kCount)> kRouteNames = {
    "live",
    "ready",
    "server_metadata",
    "model_metadata",
    "model_ready",
    "infer",
    "invocations",
    "ping",
    "health",
    "version",
    "metrics",
    "completions",
    "chat_completions",
    "models",
    "model",
    "unknown"};

bool is_post_route(Route route) {
  return route == Route::kInfer || route == Route::kInvocations || route == Route::kCompletions ||
         route == Route::kChatCompletions;
}

bool is_openai_route(Route route) {
  return route == Route::kCompletions || route == Route::kChatCompletions ||
         route == Route::kModels || route == Route::kModel;
}

// Routes that need the model: before serve() they answer 503 "loading". Liveness, readiness
// (503 with its own body), /v2, /version and /metrics answer without it.
bool needs_model(Route route) {
  switch (route) {
    case Route::kModelMetadata:
    case Route::kModelReady:
    case Route::kInfer:
    case Route::kInvocations:
    case Route::kPing:
    case Route::kHealth:
    case Route::kCompletions:
    case Route::kChatCompletions:
    case Route::kModels:
    case Route::kModel:
      return true;
    default:
      return false;
  }
}

constexpr std::string_view kLoadingMessage = "model is loading";
constexpr std::string_view kReadyLoadingJson = "{\"ready\":false,\"state\":\"loading\"}";

// The status codes this server answers with; others are counted through the registry's map.
constexpr std::array<int, 10> kCommonCodes = {200, 400, 404, 405, 413, 415, 431, 500, 503, 501};

struct RouteMatch {
  Route route = Route::kUnknown;
  std::string_view model;    // for /v2/models/{name}/... and /v1/models/{id}
  std::string_view version;  // for /v2/models/{name}/versions/{version}/...; empty otherwise
};

// The route grammar is protocol's (shared with the gateway); which paths this server answers
// is decided here.
RouteMatch match_route(std::string_view path) {
  const protocol::ParsedPath parsed = protocol::parse_path(path);
  if (parsed.malformed) {
    return {};
  }
  switch (parsed.kind) {
    case protocol::PathKind::kOipModel: {  // /v2/models/{name}[/versions/{version}][/ready|/infer]
      RouteMatch match{Route::kUnknown, parsed.name, parsed.version};
      if (parsed.rest.empty()) {
        match.route = Route::kModelMetadata;
      } else if (parsed.rest == "/ready") {
        match.route = Route::kModelReady;
      } else if (parsed.rest == "/infer") {
        match.route = Route::kInfer;
      } else {
        return {};
      }
      return match;
    }
    case protocol::PathKind::kOpenAi:
      if (parsed.rest == "/completions")
        return {Route::kCompletions, {}, {}};
      if (parsed.rest == "/chat/completions")
        return {Route::kChatCompletions, {}, {}};
      if (parsed.rest == "/models")
        return {Route::kModels, {}, {}};
      if (!parsed.name.empty())  // /v1/models/{id}, slashes and all
        return {Route::kModel, parsed.name, {}};
      return {};
    case protocol::PathKind::kServingEndpoint:
      return {};  // the gateway's form; a replica serves /invocations
    case protocol::PathKind::kOther:
      break;
  }
  if (path == "/v2/health/live")
    return {Route::kLive, {}, {}};
  if (path == "/v2/health/ready")
    return {Route::kReady, {}, {}};
  if (path == "/v2" || path == "/v2/")
    return {Route::kServerMetadata, {}, {}};
  if (path == "/invocations")
    return {Route::kInvocations, {}, {}};
  if (path == "/ping")
    return {Route::kPing, {}, {}};
  if (path == "/health")
    return {Route::kHealth, {}, {}};
  if (path == "/version")
    return {Route::kVersion, {}, {}};
  if (path == "/metrics")
    return {Route::kMetrics, {}, {}};
  return {};
}

// What serve() installs: built on the owner's thread, then published to the workers once
// (ReplicaImpl::model_) and read-only from then on, except each batcher, which its worker's
// thread alone uses. Members are destroyed bottom-up: the batchers and the OpenAI handler
// (which hold references into the runtime) before the runtime.
struct LoadedModel {
  std::unique_ptr<runtime::Runtime> runtime;
  std::string metadata_json;
  std::string ready_json;
  std::string not_ready_json;
  std::unique_ptr<OpenAiHandler> openai;           // for a language model
  std::vector<std::unique_ptr<Batcher>> batchers;  // [worker index]
};

// Threads: the owner's (listen, serve, run, destructor), the server's workers (handle and
// everything under it), and serving_thread_, which runs the server's event loop 0 and returns
// when a drain completes.
class ReplicaImpl final : public Replica {
 public:
  ReplicaImpl(const ReplicaOptions& options, MetricsRegistry& registry);
  ~ReplicaImpl() override;

  Status start();
  uint16_t port() const override { return server_->port(); }
  uint16_t grpc_port() const override { return grpc_ ? grpc_->port() : 0; }
  Status serve(std::unique_ptr<runtime::Runtime>&& runtime,
               std::chrono::duration<double> model_load_time) override;
  bool run() override;
  void drain() override { server_->drain(options_.drain_timeout); }

 private:
  struct RouteMetrics {
    Histogram* latency = nullptr;
    std::array<Counter*, kCommonCodes.size()> by_code{};
  };

  void handle(http::Request&& request, http::Responder&& responder);
  void answer_loading(Route route, Clock::time_point start, http::Responder& responder);
  // `traced` is null unless the request's trace is sampled.
  void handle_infer(const LoadedModel& model, http::Request&& request,
                    std::shared_ptr<http::Responder> responder, Clock::time_point start,
                    std::shared_ptr<RequestTrace> traced);
  void handle_invocations(const LoadedModel& model, http::Request&& request,
                          std::shared_ptr<http::Responder> responder, Clock::time_point start,
                          std::shared_ptr<RequestTrace> traced);
  void execute(const LoadedModel& model, runtime::ModelInput&& input, runtime::RunCallback done,
               RequestTrace* traced);
  // A traced model call's spans once it returned (the wait for its batch, the run), and the
  // time it returned; nothing, and no time, when `traced` is null.
  static Clock::time_point record_run(RequestTrace* traced);
  void finish(Route route, Clock::time_point start, http::Responder& responder,
              http::Response&& response, RequestTrace* traced = nullptr);
  // The server span of a model request, when this replica traces and the trace is sampled.
  std::shared_ptr<RequestTrace> start_trace(Route route, const http::Request& request,
                                            std::string_view path, Clock::time_point start);
  static void end_trace(RequestTrace& traced, int status);
  void count(Route route, int status, Clock::time_point start);

  ReplicaOptions options_;
  MetricsRegistry& registry_;
  std::unique_ptr<trace::Tracer> tracer_;  // null when spans are not exported
  // The OIP gRPC front end (null without options_.grpc_listen): its calls go to server_'s
  // handler. Declared before server_, so destroyed after it (the order oip_grpc/oip_grpc.h asks).
  std::unique_ptr<oip_grpc::GrpcServer> grpc_;
  std::unique_ptr<http::Server> server_;
  std::array<RouteMetrics, static_cast<size_t>(Route::kCount)> route_metrics_;
  Gauge& in_flight_;
  Histogram& batch_rows_;
  Gauge& model_load_seconds_;

  // Null until serve() publishes the model (release); handlers read it once per request
  // (acquire), so whatever they see through it was fully built before.
  std::atomic<const LoadedModel*> model_{nullptr};
  Mutex mutex_;
  // The owner of *model_. Set once by serve(); read by the serving thread when the server
  // stops. Declared after server_ so that it is destroyed first: a runtime still holding
  // requests (a drain that timed out) answers them while the server's event loops still exist.
  std::unique_ptr<LoadedModel> loaded_ FLOTILLA_GUARDED_BY(mutex_);
  bool closing_ FLOTILLA_GUARDED_BY(mutex_) = false;  // the destructor stopped the server
  bool drained_cleanly_ = true;  // written by serving_thread_, read after joining it
  std::thread serving_thread_;
};

ReplicaImpl::ReplicaImpl(const ReplicaOptions& options, MetricsRegistry& registry)
    : options_(options),
      registry_(registry),
      in_flight_(registry.gauge("flotilla_replica_in_flight_requests",
                                "Requests received and not yet answered.")),
      batch_rows_(registry.histogram("flotilla_replica_batch_rows",
                                     "Rows per model call (dynamic batching merges requests).",
                                     exponential_buckets(1, 2, 11))),
      model_load_seconds_(registry.gauge("flotilla_replica_model_load_seconds",
                                         "Seconds the model took to load.")) {
  const auto latency_buckets = exponential_buckets(50e-6, 2, 18);  // 50 µs .. ~6.5 s
  for (size_t i = 0; i < kRouteNames.size(); ++i) {
    const std::string route = kRouteNames[i];
    route_metrics_[i].latency = &registry.histogram(
        "flotilla_replica_request_duration_seconds",
        "Time from a request's last byte read to its response handed to the socket.",
        latency_buckets, {{"route", route}});
    for (size_t c = 0; c < kCommonCodes.size(); ++c) {
      route_metrics_[i].by_code[c] = &registry.counter(
          "flotilla_replica_requests_total", "Requests answered, by route and status code.",
          {{"route", route}, {"code", std::to_string(kCommonCodes[c])}});
    }
  }
}

ReplicaImpl::~ReplicaImpl() {
  if (grpc_) {
    grpc_->shutdown(std::chrono::milliseconds(0));  // first, as oip_grpc/oip_grpc.h asks
  }
  if (serving_thread_.joinable()) {
    // Never served, or never run(): stop at once. An earlier drain, if any, goes on to its end.
    {
      MutexLock lock(mutex_);
      closing_ = true;
    }
    server_->drain(std::chrono::milliseconds(0));
    serving_thread_.join();
  }
  // Queued batches hold responders: loaded_ goes before server_ (declaration order).
}

Status ReplicaImpl::start() {
  if (options_.tracing) {
    FLOTILLA_ASSIGN_OR_RETURN(tracer_, trace::Tracer::start(*options_.tracing, registry_));
    options_.server.capture_headers = true;  // for traceparent
  }
  // A drain stops the gRPC intake too; calls in flight finish with the REST ones.
  options_.server.on_drain = [this] {
    if (grpc_) {
      grpc_->shutdown(options_.drain_timeout);
    }
  };
  FLOTILLA_ASSIGN_OR_RETURN(
      server_, http::Server::create(options_.server,
                                    [this](http::Request&& request, http::Responder&& responder) {
                                      handle(std::move(request), std::move(responder));
                                    }));
  if (!options_.grpc_listen.empty()) {
    FLOTILLA_ASSIGN_OR_RETURN(
        grpc_, oip_grpc::GrpcServer::start({options_.grpc_listen, options_.server.max_body_bytes},
                                           *server_));
  }
  // Before the loops run: signal_set is confined to worker 0's loop from then on.
  server_->drain_on_signals(options_.drain_timeout);
  serving_thread_ = std::thread([this] {
    const bool clean = server_->run();
    bool unserved = false;
    {
      MutexLock lock(mutex_);
      drained_cleanly_ = clean;
      unserved = loaded_ == nullptr && !closing_;
    }
    // serve() checks draining() under mutex_ before it publishes, so a model it installs
    // later is impossible here: this is the final word on "drained while loading".
    if (unserved && options_.on_drained_while_loading) {
      options_.on_drained_while_loading();
    }
  });
  return Status::ok();
}

Status ReplicaImpl::serve(std::unique_ptr<runtime::Runtime>&& runtime,
                          std::chrono::duration<double> model_load_time) {
  FLOTILLA_CHECK(runtime != nullptr);
  FLOTILLA_CHECK(model_.load(std::memory_order_relaxed) == nullptr);  // serve() runs once
  const ModelMetadata& metadata = runtime->metadata();
  auto not_served = [&] {
    return unavailable("the replica is draining; model '" + metadata.name + "' not served");
  };
  if (server_->draining()) {
    return not_served();
  }
  auto model = std::make_unique<LoadedModel>();
  // The served version is the one --model-version names, whatever the runtime says.
  ModelMetadata served = metadata;
  served.versions = {options_.model_version};
  model->metadata_json = protocol::encode_oip_model_metadata(served);
  model->ready_json = "{\"name\":";
  protocol::append_json_string(metadata.name, model->ready_json);
  model->not_ready_json = model->ready_json + ",\"ready\":false}";
  model->ready_json += ",\"ready\":true}";
  if (runtime::Generator* generator = runtime->generator()) {
    model->openai = std::make_unique<OpenAiHandler>(*generator, metadata.name, registry_);
  }
  if (options_.batching.enabled && runtime->can_batch()) {
    // One batcher per worker, used only on that worker's thread.
    for (int i = 0; i < server_->worker_count(); ++i) {
      model->batchers.push_back(std::make_unique<Batcher>(
          *runtime, options_.batching.max_batch_rows, options_.batching.max_queue_delay,
          batch_rows_, [](std::function<void()> flush, std::chrono::microseconds delay) {
            http::defer_on_current_loop(std::move(flush), delay);
          }));
    }
  }
  model_load_seconds_.set(model_load_time.count());
  MutexLock lock(mutex_);
  // Checked again under the lock the serving thread takes when the server stops: either the
  // model is published before any drain began, or it is never published.
  if (server_->draining()) {
    return not_served();  // `model` is destroyed here, `runtime` stays with the caller
  }
  model->runtime = std::move(runtime);
  loaded_ = std::move(model);
  model_.store(loaded_.get(), std::memory_order_release);
  // Read by the control plane's vertical autoscaler (in-replica queueing). Like the llm
  // gauges, it reads the runtime at scrape time: the registry must not render after the
  // replica is gone (the CLI's registry lives as long as the process, the replica too).
  registry_.callback("flotilla_replica_queue_wait_seconds_total",
                     "Seconds requests waited inside the runtime for room in the engine "
                     "(its rate is the mean number waiting).",
                     "counter",
                     [runtime = loaded_->runtime.get()] { return runtime->queue_wait_seconds(); });
  return Status::ok();
}

bool ReplicaImpl::run() {
  if (serving_thread_.joinable()) {
    serving_thread_.join();
  }
  return drained_cleanly_;
}

void ReplicaImpl::count(Route route, int status, Clock::time_point start) {
  RouteMetrics& metrics = route_metrics_[static_cast<size_t>(route)];
  metrics.latency->observe(std::chrono::duration<double>(Clock::now() - start).count());
  for (size_t c = 0; c < kCommonCodes.size(); ++c) {
    if (kCommonCodes[c] == status) {
      metrics.by_code[c]->inc();
      return;
    }
  }
  registry_
      .counter(
          "flotilla_replica_requests_total", "Requests answered, by route and status code.",
          {{"route", kRouteNames[static_cast<size_t>(route)]}, {"code", std::to_string(status)}})
      .inc();
}

void ReplicaImpl::finish(Route route, Clock::time_point start, http::Responder& responder,
                         http::Response&& response, RequestTrace* traced) {
  count(route, response.status, start);
  in_flight_.add(-1);
  if (traced != nullptr) {
    end_trace(*traced, response.status);
  }
  responder.send(std::move(response));
}

std::shared_ptr<RequestTrace> ReplicaImpl::start_trace(Route route, const http::Request& request,
                                                       std::string_view path,
                                                       Clock::time_point start) {
  if (!tracer_) {
    return nullptr;
  }
  trace::Span server =
      tracer_->server_span(http::find_header(request.headers, "traceparent"), {}, start);
  if (!server.context.sampled()) {
    return nullptr;
  }
  server.name = std::string("POST ") + kRouteNames[static_cast<size_t>(route)];
  server.set("http.request.method", "POST");
  server.set("url.path", std::string(path));
  if (std::string_view id = http::find_header(request.headers, "x-request-id"); !id.empty()) {
    server.set("flotilla.request_id", std::string(id));
  }
  return std::make_shared<RequestTrace>(*tracer_, std::move(server));
}

void ReplicaImpl::end_trace(RequestTrace& traced, int status) {
  traced.server.end = Clock::now();
  traced.server.set("http.response.status_code", status);
  traced.server.error = status >= 500;
  traced.tracer.record(std::move(traced.server));
}

Clock::time_point ReplicaImpl::record_run(RequestTrace* traced) {
  if (traced == nullptr) {
    return {};
  }
  const Clock::time_point ran = Clock::now();
  Clock::time_point run_start = traced->submitted;
  if (traced->run_start != Clock::time_point{}) {
    run_start = traced->run_start;
    traced->record("batch wait", traced->submitted, run_start);
  }
  trace::Span inference = traced->child("inference", run_start, ran);
  inference.set("flotilla.rows", traced->rows);
  traced->tracer.record(std::move(inference));
  return ran;
}

void ReplicaImpl::answer_loading(Route route, Clock::time_point start, http::Responder& responder) {
  http::Response response;
  response.status = 503;
  switch (route) {
    case Route::kInvocations:
    case Route::kPing:
    case Route::kHealth:
      response.body = protocol::encode_mlflow_error(StatusCode::kUnavailable, kLoadingMessage);
      break;
    case Route::kCompletions:
    case Route::kChatCompletions:
    case Route::kModels:
      response.body = protocol::encode_openai_error(503, kLoadingMessage);
      break;
    default:
      response.body = protocol::encode_oip_error(kLoadingMessage);
      break;
  }
  response.headers.emplace_back("Retry-After", "1");
  finish(route, start, responder, std::move(response));
}

void ReplicaImpl::handle(http::Request&& request, http::Responder&& responder) {
  const auto start = Clock::now();
  in_flight_.add(1);
  std::string_view path = request.target;
  path = path.substr(0, path.find('?'));
  const RouteMatch match = match_route(path);
  const Route route = match.route;

  if (route == Route::kUnknown) {
    finish(route, start, responder,
           json_response(404,
                         protocol::encode_oip_error("unknown route '" + std::string(path) + "'")));
    return;
  }
  // Null until serve(); below, every route that needs_model() has a model.
  const LoadedModel* model = model_.load(std::memory_order_acquire);
  if (model == nullptr && needs_model(route)) {
    answer_loading(route, start, responder);
    return;
  }
  if (is_openai_route(route) && model->openai == nullptr) {
    finish(route, start, responder,
           json_response(404, protocol::encode_openai_error(
                                  404, "model '" + model->runtime->metadata().name +
                                           "' is not a language model; it serves /v2 and "
                                           "/invocations")));
    return;
  }
  const bool wants_post = is_post_route(route);
  if ((wants_post && request.method != Method::kPost) ||
      (!wants_post && request.method != Method::kGet)) {
    http::Response response = json_response(
        405, protocol::encode_oip_error("method not allowed on '" + std::string(path) + "'; use " +
                                        (wants_post ? "POST" : "GET")));
    response.headers.emplace_back("Allow", wants_post ? "POST" : "GET");
    finish(route, start, responder, std::move(response));
    return;
  }
  if (!match.model.empty()) {  // a route that needs_model(): `model` is set
    const std::string& name = model->runtime->metadata().name;
    if (match.model != name) {
      const std::string message =
          "unknown model '" + std::string(match.model) + "'; this server serves '" + name + "'";
      finish(route, start, responder,
             json_response(404, route == Route::kModel ? protocol::encode_openai_error(404, message)
                                                       : protocol::encode_oip_error(message)));
      return;
    }
    if (!match.version.empty() && match.version != options_.model_version) {
      finish(route, start, responder,
             json_response(
                 404, protocol::encode_oip_error(
                          "unknown version '" + std::string(match.version) + "' of model '" + name +
                          "'; this server serves version '" + options_.model_version + "'")));
      return;
    }
  }
  switch (route) {
    case Route::kInfer:
      handle_infer(*model, std::move(request),
                   std::make_shared<http::Responder>(std::move(responder)), start,
                   start_trace(route, request, path, start));
      return;
    case Route::kInvocations:
      handle_invocations(*model, std::move(request),
                         std::make_shared<http::Responder>(std::move(responder)), start,
                         start_trace(route, request, path, start));
      return;
    case Route::kCompletions:
    case Route::kChatCompletions: {
      std::shared_ptr<RequestTrace> traced = start_trace(route, request, path, start);
      model->openai->completions(
          std::move(request), std::make_shared<http::Responder>(std::move(responder)),
          route == Route::kChatCompletions, traced, [this, route, start, traced](int status) {
            count(route, status, start);
            in_flight_.add(-1);
            if (traced) {
              end_trace(*traced, status);
            }
          });
      return;
    }
    case Route::kModels:
      finish(route, start, responder, json_response(200, model->openai->models_json()));
      return;
    case Route::kModel:
      finish(route, start, responder, json_response(200, model->openai->model_json()));
      return;
    case Route::kLive:
      finish(route, start, responder, json_response(200, "{\"live\":true}"));
      return;
    case Route::kReady:
      if (model == nullptr) {
        finish(route, start, responder, json_response(503, std::string(kReadyLoadingJson)));
      } else {
        finish(route, start, responder,
               server_->draining() ? json_response(503, "{\"ready\":false}")
                                   : json_response(200, "{\"ready\":true}"));
      }
      return;
    case Route::kModelReady:
      finish(route, start, responder,
             server_->draining() ? json_response(503, model->not_ready_json)
                                 : json_response(200, model->ready_json));
      return;
    case Route::kServerMetadata:
      finish(route, start, responder,
             json_response(200, std::string("{\"name\":\"flotilla\",\"version\":\"") +
                                    FLOTILLA_VERSION + "\",\"extensions\":[]}"));
      return;
    case Route::kModelMetadata:
      finish(route, start, responder, json_response(200, model->metadata_json));
      return;
    case Route::kPing:
    case Route::kHealth:
      // MLflow answers "\n" as JSON once its model is loaded (before: loading, above).
      finish(route, start, responder, json_response(200, "\n"));
      return;
    case Route::kVersion: {
      http::Response response = json_response(200, FLOTILLA_VERSION);
      response.content_type = "text/plain";
      finish(route, start, responder, std::move(response));
      return;
    }
    case Route::kMetrics: {
      http::Response response = json_response(200, registry_.render());
      response.content_type = "text/plain; version=0.0.4; charset=utf-8";
      finish(route, start, responder, std::move(response));
      return;
    }
    case Route::kUnknown:
    case Route::kCount:
      break;
  }
}

void ReplicaImpl::execute(const LoadedModel& model, runtime::ModelInput&& input,
                          runtime::RunCallback done, RequestTrace* traced) {
  if (traced != nullptr) {  // the request was decoded and checked: it runs now
    traced->submitted = Clock::now();
    traced->record("decode", traced->server.start, traced->submitted);
    traced->rows = input.rows;
  }
  const int worker = http::current_worker_index();
  if (worker >= 0 && worker < static_cast<int>(model.batchers.size())) {
    model.batchers[worker]->submit(std::move(input), std::move(done),
                                   traced != nullptr ? &traced->run_start : nullptr);
    return;
  }
  batch_rows_.observe(static_cast<double>(input.rows));
  model.runtime->run(std::move(input), std::move(done));
}

void ReplicaImpl::handle_infer(const LoadedModel& model, http::Request&& request,
                               std::shared_ptr<http::Responder> responder, Clock::time_point start,
                               std::shared_ptr<RequestTrace> traced) {
  auto fail = [&](const Status& status) {
    finish(
        Route::kInfer, start, *responder,
        json_response(http_status_for(status.code()), protocol::encode_oip_error(status.message())),
        traced.get());
  };
  if (model.openai != nullptr) {
    // A language model runs no tensors, whatever the body: 501.
    fail(Status(StatusCode::kUnimplemented,
                "model '" + model.runtime->metadata().name +
                    "' is a language model: use /v1/completions or /v1/chat/completions"));
    return;
  }
  std::optional<size_t> json_length;
  if (!request.inference_header_length.empty()) {
    size_t length = 0;
    const std::string& text = request.inference_header_length;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), length);
    if (error != std::errc() || end != text.data() + text.size()) {
      fail(invalid_argument("Inference-Header-Content-Length: '" + text + "' is not a byte count"));
      return;
    }
    json_length = length;
  }
  Result<InferRequest> decoded = protocol::decode_oip_infer_request(request.body, json_length);
  if (!decoded.is_ok()) {
    fail(decoded.status());
    return;
  }
  const ModelMetadata& metadata = model.runtime->metadata();
  // Requested outputs, as indices into the runtime's outputs, in the order asked for.
  std::vector<size_t> selected;
  for (const std::string& name : decoded->requested_outputs) {
    size_t index = 0;
    while (index < metadata.outputs.size() && metadata.outputs[index].name != name) {
      ++index;
    }
    if (index == metadata.outputs.size()) {
      fail(invalid_argument("unknown output '" + name + "'; the model's outputs are '" +
                            metadata.outputs[0].name + "'" +
                            (metadata.outputs.size() > 1 ? " and others" : "")));
      return;
    }
    selected.push_back(index);
  }
  Result<runtime::ModelInput> input = model.runtime->prepare(*decoded);
  if (!input.is_ok()) {
    fail(input.status());
    return;
  }
  RequestTrace* const trace_pointer = traced.get();
  execute(
      model, std::move(input).value(),
      [this, &metadata, responder, start, traced = std::move(traced),
       selected = std::move(selected),
       id = std::move(decoded->id)](Result<std::vector<Tensor>> outputs) mutable {
        const Clock::time_point ran = record_run(traced.get());
        if (!outputs.is_ok()) {
          finish(Route::kInfer, start, *responder,
                 json_response(http_status_for(outputs.status().code()),
                               protocol::encode_oip_error(outputs.status().message())),
                 traced.get());
          return;
        }
        InferResponse response;
        response.model_name = metadata.name;
        response.model_version = options_.model_version;
        response.id = std::move(id);
        if (selected.empty()) {
          response.outputs = std::move(outputs).value();
        } else {
          for (size_t index : selected) {
            response.outputs.push_back(outputs.value()[index]);
          }
        }
        http::Response reply;
        protocol::encode_oip_infer_response(response, reply.body);
        if (traced) {
          traced->record("encode", ran, Clock::now());
        }
        finish(Route::kInfer, start, *responder, std::move(reply), traced.get());
      },
      trace_pointer);
}

void ReplicaImpl::handle_invocations(const LoadedModel& model, http::Request&& request,
                                     std::shared_ptr<http::Responder> responder,
                                     Clock::time_point start,
                                     std::shared_ptr<RequestTrace> traced) {
  auto fail = [&](const Status& status, int http_status) {
    finish(
        Route::kInvocations, start, *responder,
        json_response(http_status, protocol::encode_mlflow_error(status.code(), status.message())),
        traced.get());
  };
  if (model.openai != nullptr) {
    // No pyfunc behind a language model, whatever the body: 501 in MLflow's shape.
    fail(Status(StatusCode::kUnimplemented,
                "model '" + model.runtime->metadata().name +
                    "' is a language model: /invocations is not implemented for it; use "
                    "/v1/completions or /v1/chat/completions"),
         501);
    return;
  }
  Result<protocol::MlflowFormat> format = protocol::parse_mlflow_content_type(request.content_type);
  if (!format.is_ok()) {
    // MLflow answers a content type it cannot read with 415 and BAD_REQUEST.
    fail(invalid_argument(format.status().message()), 415);
    return;
  }
  Result<InferRequest> decoded = *format == protocol::MlflowFormat::kJson
                                     ? protocol::decode_mlflow_json(request.body)
                                     : protocol::decode_mlflow_csv(request.body);
  if (!decoded.is_ok()) {
    fail(decoded.status(), 400);
    return;
  }
  Result<runtime::ModelInput> input = model.runtime->prepare(*decoded);
  if (!input.is_ok()) {
    fail(input.status(), http_status_for(input.status().code()));
    return;
  }
  RequestTrace* const trace_pointer = traced.get();
  execute(
      model, std::move(input).value(),
      [this, responder, start, traced = std::move(traced)](Result<std::vector<Tensor>> outputs) {
        const Clock::time_point ran = record_run(traced.get());
        if (!outputs.is_ok()) {
          finish(Route::kInvocations, start, *responder,
                 json_response(500, protocol::encode_mlflow_error(outputs.status().code(),
                                                                  outputs.status().message())),
                 traced.get());
          return;
        }
        http::Response reply;
        protocol::encode_mlflow_predictions(outputs.value().front(), reply.body);
        if (traced) {
          traced->record("encode", ran, Clock::now());
        }
        finish(Route::kInvocations, start, *responder, std::move(reply), traced.get());
      },
      trace_pointer);
}

}  // namespace

Result<std::unique_ptr<Replica>> Replica::listen(const ReplicaOptions& options,
                                                 MetricsRegistry& registry) {
  auto replica = std::make_unique<ReplicaImpl>(options, registry);
  FLOTILLA_RETURN_IF_ERROR(replica->start());
  return std::unique_ptr<Replica>(std::move(replica));
}

}  // namespace flotilla::replica

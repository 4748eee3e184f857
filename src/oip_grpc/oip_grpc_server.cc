// GrpcServer: gRPC's completion-queue API in front of http::Server::submit, polled by a thread
// of our own (gRPC's performance guide: its callback API is slower at high call rates). A
// call's REST request is built and its response written on that thread; the REST handler runs
// on an HTTP worker.
#include <algorithm>
#include <atomic>
#include <climits>
#include <thread>

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "common/common.h"
#include "grpc_predict_v2.grpc.pb.h"
#include "oip_grpc/oip_grpc.h"
#include "oip_grpc/oip_translate.h"

namespace flotilla::oip_grpc {
namespace {

using AsyncService = inference::GRPCInferenceService::AsyncService;

// Metadata a call's REST request carries as headers: the token, the request id and the
// trace context.
constexpr std::string_view kForwardedMetadata[] = {"authorization", "x-request-id", "traceparent",
                                                   "tracestate"};

// ModelInfer calls asked for ahead: enough that a burst of new streams does not wait for the
// polling thread to ask for the next one.
constexpr int kInferCallsWaiting = 16;

// Live or ready: 200 is yes, 503 (not ready, draining) no; any other answer (401, 404, ...)
// is the call's error.
template <typename Set>
grpc::Status health(const http::Response& answer, Set set) {
  if (answer.status == 200 || answer.status == 503) {
    set(answer.status == 200);
    return grpc::Status::OK;
  }
  return status_of_answer(answer);
}

// A 2xx answer decoded by `decode`; any other is the call's error.
template <typename Response>
grpc::Status decoded(http::Response& answer, Response& response,
                     Status (*decode)(std::string&, Response&)) {
  if (answer.status < 200 || answer.status >= 300) {
    return status_of_answer(answer);
  }
  const Status status = decode(answer.body, response);
  if (!status.is_ok()) {
    spdlog::warn("gRPC: cannot translate the REST answer: {}", status.message());
  }
  return to_grpc_status(status);
}

// One RPC of the service: how a call of it is asked for, the REST request it stands for, and
// how the REST answer becomes its response.
template <typename Request, typename Response>
struct Rpc {
  using RequestCall = void (AsyncService::*)(grpc::ServerContext*, Request*,
                                             grpc::ServerAsyncResponseWriter<Response>*,
                                             grpc::CompletionQueue*, grpc::ServerCompletionQueue*,
                                             void*);
  RequestCall request_call;
  Result<http::Request> (*to_rest)(const Request&);
  grpc::Status (*from_rest)(http::Response&, Response&);
};

const Rpc<inference::ServerLiveRequest, inference::ServerLiveResponse> kServerLive{
    &AsyncService::RequestServerLive,
    [](const inference::ServerLiveRequest&) -> Result<http::Request> {
      return rest_get("/v2/health/live");
    },
    [](http::Response& answer, inference::ServerLiveResponse& response) {
      return health(answer, [&](bool up) { response.set_live(up); });
    }};

const Rpc<inference::ServerReadyRequest, inference::ServerReadyResponse> kServerReady{
    &AsyncService::RequestServerReady,
    [](const inference::ServerReadyRequest&) -> Result<http::Request> {
      return rest_get("/v2/health/ready");
    },
    [](http::Response& answer, inference::ServerReadyResponse& response) {
      return health(answer, [&](bool up) { response.set_ready(up); });
    }};

const Rpc<inference::ModelReadyRequest, inference::ModelReadyResponse> kModelReady{
    &AsyncService::RequestModelReady,
    [](const inference::ModelReadyRequest& request) {
      return rest_model_request(request.name(), request.version(), "/ready");
    },
    [](http::Response& answer, inference::ModelReadyResponse& response) {
      return health(answer, [&](bool up) { response.set_ready(up); });
    }};

const Rpc<inference::ServerMetadataRequest, inference::ServerMetadataResponse> kServerMetadata{
    &AsyncService::RequestServerMetadata,
    [](const inference::ServerMetadataRequest&) -> Result<http::Request> {
      return rest_get("/v2");
    },
    [](http::Response& answer, inference::ServerMetadataResponse& response) {
      return decoded(answer, response, &decode_server_metadata_answer);
    }};

const Rpc<inference::ModelMetadataRequest, inference::ModelMetadataResponse> kModelMetadata{
    &AsyncService::RequestModelMetadata,
    [](const inference::ModelMetadataRequest& request) {
      return rest_model_request(request.name(), request.version(), "");
    },
    [](http::Response& answer, inference::ModelMetadataResponse& response) {
      return decoded(answer, response, &decode_model_metadata_answer);
    }};

const Rpc<inference::ModelInferRequest, inference::ModelInferResponse> kModelInfer{
    &AsyncService::RequestModelInfer, &rest_infer_request,
    [](http::Response& answer, inference::ModelInferResponse& response) {
      return decoded(answer, response, &decode_infer_answer);
    }};

// What a queue's polling thread is handed back: a call's next step (it arrived, its REST
// answer came, its response was sent).
class Tag {
 public:
  virtual ~Tag() = default;
  virtual void proceed(bool ok) = 0;
};

class GrpcServerImpl final : public GrpcServer {
 public:
  explicit GrpcServerImpl(http::Server& rest) : rest_(rest) {}

  ~GrpcServerImpl() override {
    shutdown(std::chrono::milliseconds(0));
    if (shutdown_thread_.joinable()) {
      shutdown_thread_.join();
    }
  }

  Status start(const GrpcServerOptions& options);

  uint16_t port() const override { return port_; }

  void shutdown(std::chrono::milliseconds grace) override {
    if (shutting_down_.exchange(true) || !server_) {
      return;
    }
    {
      MutexLock lock(mutex_);
      closed_ = true;
    }
    shutdown_thread_ = std::thread([this, grace] {
      server_->Shutdown(std::chrono::system_clock::now() + grace);
      // A call handed to `rest_` comes back through the queue: it closes only once every such
      // call is answered.
      {
        MutexLock lock(mutex_);
        while (in_rest_ > 0) {
          answered_.wait(mutex_);
        }
        queue_closed_ = true;
      }
      close_queue();
    });
  }

  AsyncService& service() { return service_; }

  // Asks for the next call of a kind, unless the queue is closing.
  template <typename Request, typename Response>
  void await(const Rpc<Request, Response>& rpc);

  grpc::ServerCompletionQueue* queue() { return queue_.get(); }

  // Hands a call's REST request to `rest_`; false (nothing sent) once shutdown() began. Once
  // its response is handed to gRPC, the call says answered().
  bool submit(http::Request&& request, std::function<void(http::Response&&)> on_answer) {
    MutexLock lock(mutex_);
    if (closed_) {
      return false;
    }
    ++in_rest_;
    rest_.submit(std::move(request), std::move(on_answer));
    return true;
  }

  void answered() {
    MutexLock lock(mutex_);
    if (--in_rest_ == 0) {
      answered_.notify_all();
    }
  }

 private:
  // Stops the queue; its thread takes what is left on it and ends.
  void close_queue() {
    queue_->Shutdown();
    if (poller_.joinable()) {
      poller_.join();
    }
  }

  http::Server& rest_;
  AsyncService service_;
  // Declared before server_: gRPC destroys a server before its queue.
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  std::unique_ptr<grpc::Server> server_;
  // Polls queue_: reads calls off the network, builds their REST requests, writes their
  // responses. One is enough: the REST handler runs on the HTTP server's workers.
  std::thread poller_;
  uint16_t port_ = 0;
  std::atomic<bool> shutting_down_{false};
  std::thread shutdown_thread_;
  // Held while a call is handed to `rest_` or the next call asked for: each then sees whether
  // shutdown() closed the way.
  Mutex mutex_;
  CondVar answered_;
  bool closed_ FLOTILLA_GUARDED_BY(mutex_) = false;        // no call reaches rest_ any more
  bool queue_closed_ FLOTILLA_GUARDED_BY(mutex_) = false;  // no call is asked for any more
  int64_t in_rest_ FLOTILLA_GUARDED_BY(mutex_) = 0;        // handed to rest_, not answered yet
};

// One call of an RPC, from being asked for to its answer sent; deletes itself then. Its steps
// run on its queue's polling thread: the worker that answers its REST request hands the answer
// back through an alarm that fires at once, so gRPC writes the response on the polling thread
// (finished on a worker, gRPC 1.51 passed the write to its executor thread: one more thread
// hop a call).
template <typename Request, typename Response>
class Call final : public Tag {
 public:
  Call(GrpcServerImpl& owner, const Rpc<Request, Response>& rpc)
      : owner_(owner), rpc_(rpc), queue_(owner.queue()), responder_(&context_) {
    (owner_.service().*rpc_.request_call)(&context_, &request_, &responder_, queue_, queue_, this);
  }

  void proceed(bool ok) override {
    switch (step_) {
      case Step::kAsked:
        if (!ok) {  // no call came: the server shut down
          delete this;
          return;
        }
        owner_.await(rpc_);
        start();
        return;
      case Step::kInRest:
        if (const std::string_view id = http::find_header(answer_.headers, "x-request-id");
            !id.empty()) {
          context_.AddInitialMetadata("x-request-id", std::string(id));
        }
        finish(rpc_.from_rest(answer_, response_));
        owner_.answered();
        return;
      case Step::kFinishing:  // the answer was sent, or the client went away
        delete this;
        return;
    }
  }

 private:
  enum class Step { kAsked, kInRest, kFinishing };

  void start() {
    Result<http::Request> rest = rpc_.to_rest(request_);
    if (!rest.is_ok()) {
      finish(to_grpc_status(rest.status()));
      return;
    }
    const auto& metadata = context_.client_metadata();
    for (std::string_view key : kForwardedMetadata) {
      const auto found = metadata.find(grpc::string_ref(key.data(), key.size()));
      if (found != metadata.end()) {
        rest->headers.emplace_back(std::string(key),
                                   std::string(found->second.data(), found->second.size()));
      }
    }
    step_ = Step::kInRest;
    const bool sent = owner_.submit(std::move(*rest), [this](http::Response&& answer) {
      answer_ = std::move(answer);
      alarm_.Set(queue_, gpr_time_0(GPR_CLOCK_MONOTONIC), this);
    });
    if (!sent) {
      finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
    }
  }

  void finish(const grpc::Status& status) {
    step_ = Step::kFinishing;
    responder_.Finish(response_, status, this);
  }

  GrpcServerImpl& owner_;
  const Rpc<Request, Response>& rpc_;
  grpc::ServerCompletionQueue* queue_;
  grpc::ServerContext context_;
  Request request_;
  Response response_;
  grpc::ServerAsyncResponseWriter<Response> responder_;
  http::Response answer_;
  grpc::Alarm alarm_;
  Step step_ = Step::kAsked;
};

template <typename Request, typename Response>
void GrpcServerImpl::await(const Rpc<Request, Response>& rpc) {
  MutexLock lock(mutex_);
  if (!queue_closed_) {
    new Call<Request, Response>(*this, rpc);
  }
}

Status GrpcServerImpl::start(const GrpcServerOptions& options) {
  const size_t colon = options.address.rfind(':');
  if (colon == std::string::npos || colon + 1 == options.address.size()) {
    return invalid_argument("gRPC address '" + options.address + "' has no port");
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.address, grpc::InsecureServerCredentials(), &port);
  // gRPC binds with SO_REUSEPORT by default: a second server on the same port would then
  // share it silently instead of failing.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // gRPC takes an int: a cap past it (--max-body-bytes allows 4 GiB) is as good as none.
  const int max_message = static_cast<int>(std::min<size_t>(options.max_message_bytes, INT_MAX));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  builder.RegisterService(&service_);
  queue_ = builder.AddCompletionQueue();
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) {
    server_.reset();
    close_queue();
    return unavailable("cannot listen for gRPC on " + options.address);
  }
  port_ = static_cast<uint16_t>(port);
  await(kServerLive);
  await(kServerReady);
  await(kModelReady);
  await(kServerMetadata);
  await(kModelMetadata);
  for (int i = 0; i < kInferCallsWaiting; ++i) {
    await(kModelInfer);
  }
  poller_ = std::thread([this] {
    void* tag = nullptr;
    bool ok = false;
    while (queue_->Next(&tag, &ok)) {
      static_cast<Tag*>(tag)->proceed(ok);
    }
  });
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<GrpcServer>> GrpcServer::start(const GrpcServerOptions& options,
                                                      http::Server& rest) {
  auto server = std::make_unique<GrpcServerImpl>(rest);
  FLOTILLA_RETURN_IF_ERROR(server->start(options));
  return std::unique_ptr<GrpcServer>(std::move(server));
}

}  // namespace flotilla::oip_grpc

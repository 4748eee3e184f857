// GrpcServer: gRPC's callback API in front of http::Server::submit. A call's handler runs on
// one of gRPC's threads only long enough to build the REST request; the REST handler runs on
// an HTTP worker, and the worker that answers finishes the call.
#include <algorithm>
#include <climits>
#include <shared_mutex>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "common/common.h"
#include "grpc_predict_v2.grpc.pb.h"
#include "oip_grpc/oip_grpc.h"
#include "oip_grpc/oip_translate.h"

namespace flotilla::oip_grpc {
namespace {

// Metadata a call's REST request carries as headers: the token, the request id and the
// trace context.
constexpr std::string_view kForwardedMetadata[] = {"authorization", "x-request-id", "traceparent",
                                                   "tracestate"};

class Service final : public inference::GRPCInferenceService::CallbackService {
 public:
  explicit Service(http::Server& rest) : rest_(rest) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context,
                                       const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* response) override {
    return forward(context, rest_get("/v2/health/live"), [response](http::Response& answer) {
      return health(answer, [response](bool up) { response->set_live(up); });
    });
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context,
                                        const inference::ServerReadyRequest*,
                                        inference::ServerReadyResponse* response) override {
    return forward(context, rest_get("/v2/health/ready"), [response](http::Response& answer) {
      return health(answer, [response](bool up) { response->set_ready(up); });
    });
  }

  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override {
    return forward(context, rest_model_request(request->name(), request->version(), "/ready"),
                   [response](http::Response& answer) {
                     return health(answer, [response](bool up) { response->set_ready(up); });
                   });
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse* response) override {
    return forward(context, rest_get("/v2"), [response](http::Response& answer) {
      return decoded(answer, [&] { return decode_server_metadata_answer(answer.body, *response); });
    });
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override {
    return forward(context, rest_model_request(request->name(), request->version(), ""),
                   [response](http::Response& answer) {
                     return decoded(answer, [&] {
                       return decode_model_metadata_answer(answer.body, *response);
                     });
                   });
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override {
    return forward(context, rest_infer_request(*request), [response](http::Response& answer) {
      return decoded(answer, [&] { return decode_infer_answer(answer.body, *response); });
    });
  }

 private:
  // Live or ready: 200 is yes, 503 (not ready, draining) no; any other answer (401, 404, ...)
  // is the call's error.
  template <typename Set>
  static grpc::Status health(const http::Response& answer, Set set) {
    if (answer.status == 200 || answer.status == 503) {
      set(answer.status == 200);
      return grpc::Status::OK;
    }
    return status_of_answer(answer);
  }

  // A 2xx answer decoded by `decode`; any other is the call's error.
  template <typename Decode>
  static grpc::Status decoded(const http::Response& answer, Decode decode) {
    if (answer.status < 200 || answer.status >= 300) {
      return status_of_answer(answer);
    }
    const Status status = decode();
    if (!status.is_ok()) {
      spdlog::warn("gRPC: cannot translate the REST answer: {}", status.message());
    }
    return to_grpc_status(status);
  }

  // Sends the REST request (or finishes with its translation's error) and finishes the call
  // with `finish(answer)`, on the HTTP worker that answers. The response message and context
  // stay valid until Finish (gRPC's unary callback contract).
  template <typename Finish>
  grpc::ServerUnaryReactor* forward(grpc::CallbackServerContext* context,
                                    Result<http::Request> request, Finish finish) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (!request.is_ok()) {
      reactor->Finish(to_grpc_status(request.status()));
      return reactor;
    }
    const auto& metadata = context->client_metadata();
    for (std::string_view key : kForwardedMetadata) {
      const auto found = metadata.find(grpc::string_ref(key.data(), key.size()));
      if (found != metadata.end()) {
        request->headers.emplace_back(std::string(key),
                                      std::string(found->second.data(), found->second.size()));
      }
    }
    std::shared_lock lock(closing_);
    if (closed_) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down"));
      return reactor;
    }
    rest_.submit(std::move(*request),
                 [context, reactor, finish = std::move(finish)](http::Response&& answer) mutable {
                   const std::string_view id = http::find_header(answer.headers, "x-request-id");
                   if (!id.empty()) {
                     context->AddInitialMetadata("x-request-id", std::string(id));
                   }
                   reactor->Finish(finish(answer));
                 });
    return reactor;
  }

 public:
  // No call reaches `rest_` once this returns.
  void close() {
    std::unique_lock lock(closing_);
    closed_ = true;
  }

 private:
  http::Server& rest_;
  // Taken shared by each call while it hands its request to `rest_`, exclusively by close().
  std::shared_mutex closing_;
  bool closed_ = false;
};

class GrpcServerImpl final : public GrpcServer {
 public:
  explicit GrpcServerImpl(http::Server& rest) : service_(rest) {}

  ~GrpcServerImpl() override {
    shutdown(std::chrono::milliseconds(0));
    if (shutdown_thread_.joinable()) {
      shutdown_thread_.join();
    }
  }

  Status start(const GrpcServerOptions& options) {
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
    server_ = builder.BuildAndStart();
    if (!server_ || port == 0) {
      server_.reset();
      return unavailable("cannot listen for gRPC on " + options.address);
    }
    port_ = static_cast<uint16_t>(port);
    return Status::ok();
  }

  uint16_t port() const override { return port_; }

  void shutdown(std::chrono::milliseconds grace) override {
    if (shutting_down_.exchange(true) || !server_) {
      return;
    }
    service_.close();
    shutdown_thread_ = std::thread([this, grace] {
      server_->Shutdown(std::chrono::system_clock::now() + grace);
      server_->Wait();
    });
  }

 private:
  Service service_;
  std::unique_ptr<grpc::Server> server_;
  uint16_t port_ = 0;
  std::atomic<bool> shutting_down_{false};
  std::thread shutdown_thread_;
};

}  // namespace

Result<std::unique_ptr<GrpcServer>> GrpcServer::start(const GrpcServerOptions& options,
                                                      http::Server& rest) {
  auto server = std::make_unique<GrpcServerImpl>(rest);
  FLOTILLA_RETURN_IF_ERROR(server->start(options));
  return std::unique_ptr<GrpcServer>(std::move(server));
}

}  // namespace flotilla::oip_grpc

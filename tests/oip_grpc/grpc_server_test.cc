// GrpcServer against a real http::Server on loopback, called with the generated client stub.
#include <atomic>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "grpc_predict_v2.grpc.pb.h"
#include "http/http.h"
#include "oip_grpc/oip_grpc.h"

namespace flotilla::oip_grpc {
namespace {

using nlohmann::json;

// An HTTP server whose handler the test sets, a gRPC server in front of it, and a client stub.
class GrpcFront : public ::testing::Test {
 protected:
  void start(http::Handler handler, size_t max_message_bytes = 8 << 20) {
    handler_ = std::move(handler);
    http::ServerOptions options;
    options.workers = 2;
    auto server =
        http::Server::create(options, [this](http::Request&& request, http::Responder&& responder) {
          handled_.fetch_add(1);
          handler_(std::move(request), std::move(responder));
        });
    ASSERT_TRUE(server.is_ok()) << server.status().to_string();
    http_ = std::move(server).value();
    auto grpc_server = GrpcServer::start({"127.0.0.1:0", max_message_bytes}, *http_);
    ASSERT_TRUE(grpc_server.is_ok()) << grpc_server.status().to_string();
    grpc_ = std::move(grpc_server).value();
    ASSERT_NE(grpc_->port(), 0);
    runner_ = std::thread([this] { http_->run(); });
    stub_ = inference::GRPCInferenceService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(grpc_->port()), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (grpc_) {
      grpc_->shutdown(std::chrono::milliseconds(0));
    }
    if (http_) {
      http_->drain(std::chrono::milliseconds(1'000));
    }
    if (runner_.joinable()) {
      runner_.join();
    }
    http_.reset();
    grpc_.reset();
  }

  static std::unique_ptr<grpc::ClientContext> context(std::string token = "") {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) {
      context->AddMetadata("authorization", "Bearer " + token);
    }
    return context;
  }

  static inference::ModelInferRequest infer_request(const std::string& model) {
    inference::ModelInferRequest request;
    request.set_model_name(model);
    auto* input = request.add_inputs();
    input->set_name("x");
    input->set_datatype("FP32");
    input->add_shape(1);
    input->add_shape(2);
    input->mutable_contents()->add_fp32_contents(1.5F);
    input->mutable_contents()->add_fp32_contents(2.5F);
    return request;
  }

  http::Handler handler_;
  std::atomic<int> handled_{0};
  std::unique_ptr<http::Server> http_;
  std::unique_ptr<GrpcServer> grpc_;
  std::thread runner_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

TEST_F(GrpcFront, ModelInferTakesTheRestRouteWithItsMetadata) {
  std::string seen_target, seen_auth, seen_body;
  start([&](http::Request&& request, http::Responder&& responder) {
    seen_target = request.target;
    seen_auth = std::string(http::find_header(request.headers, "authorization"));
    seen_body = request.body;
    http::Response response;
    response.body = R"({"model_name":"m","outputs":[
        {"name":"sum","datatype":"FP32","shape":[1],"data":[4.0]}]})";
    response.headers.emplace_back("X-Request-Id", "abc123");
    responder.send(std::move(response));
  });
  auto ctx = context("secret");
  inference::ModelInferResponse response;
  const grpc::Status status = stub_->ModelInfer(ctx.get(), infer_request("m"), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(seen_target, "/v2/models/m/infer");
  EXPECT_EQ(seen_auth, "Bearer secret");
  EXPECT_EQ(json::parse(seen_body)["inputs"][0]["data"], json::array({1.5, 2.5}));
  EXPECT_EQ(response.model_name(), "m");
  ASSERT_EQ(response.raw_output_contents_size(), 1);
  float sum = 0;
  std::memcpy(&sum, response.raw_output_contents(0).data(), sizeof(float));
  EXPECT_EQ(sum, 4.0F);
  const auto& initial = ctx->GetServerInitialMetadata();
  const auto id = initial.find("x-request-id");
  ASSERT_NE(id, initial.end());
  EXPECT_EQ(std::string(id->second.data(), id->second.size()), "abc123");
}

TEST_F(GrpcFront, ErrorsBecomeStatusCodesAndBadRequestsNeverReachTheHandler) {
  start([](http::Request&& request, http::Responder&& responder) {
    http::Response response;
    response.status = request.target == "/v2/models/locked/infer" ? 401 : 400;
    response.body = R"({"error":"shape [1,2] does not fit the model"})";
    responder.send(std::move(response));
  });
  inference::ModelInferResponse response;
  auto ctx = context();
  grpc::Status status = stub_->ModelInfer(ctx.get(), infer_request("m"), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "shape [1,2] does not fit the model");
  ctx = context();
  status = stub_->ModelInfer(ctx.get(), infer_request("locked"), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(handled_.load(), 2);

  ctx = context();
  status = stub_->ModelInfer(ctx.get(), infer_request(""), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "the model name is empty");
  EXPECT_EQ(handled_.load(), 2) << "refused before the handler";
}

TEST_F(GrpcFront, HealthMetadataAndAGatheredStream) {
  start([](http::Request&& request, http::Responder&& responder) {
    http::Response response;
    if (request.target == "/v2/health/live") {
      response.body = "{}";
    } else if (request.target == "/v2/health/ready") {
      response.status = 503;
      response.body = R"({"error":"draining"})";
    } else if (request.target == "/v2/models/m/versions/7/ready") {
      response.body = "{}";
    } else if (request.target == "/v2") {
      // Streamed in pieces: the gRPC front gathers them into one answer.
      responder.start_stream(200, "application/json");
      responder.write(R"({"name":"flot)");
      responder.write(R"(illa","version":"9"})");
      responder.finish();
      return;
    } else {
      response.status = 404;
      response.body = R"({"error":"no model"})";
    }
    responder.send(std::move(response));
  });
  auto ctx = context();
  inference::ServerLiveResponse live;
  ASSERT_TRUE(stub_->ServerLive(ctx.get(), {}, &live).ok());
  EXPECT_TRUE(live.live());
  ctx = context();
  inference::ServerReadyResponse ready;
  ASSERT_TRUE(stub_->ServerReady(ctx.get(), {}, &ready).ok());
  EXPECT_FALSE(ready.ready());
  ctx = context();
  inference::ModelReadyRequest model_ready;
  model_ready.set_name("m");
  model_ready.set_version("7");
  inference::ModelReadyResponse model_ready_response;
  ASSERT_TRUE(stub_->ModelReady(ctx.get(), model_ready, &model_ready_response).ok());
  EXPECT_TRUE(model_ready_response.ready());
  ctx = context();
  inference::ServerMetadataResponse metadata;
  ASSERT_TRUE(stub_->ServerMetadata(ctx.get(), {}, &metadata).ok());
  EXPECT_EQ(metadata.name(), "flotilla");
  EXPECT_EQ(metadata.version(), "9");
  ctx = context();
  inference::ModelMetadataRequest model_metadata;
  model_metadata.set_name("gone");
  inference::ModelMetadataResponse model_metadata_response;
  const grpc::Status status =
      stub_->ModelMetadata(ctx.get(), model_metadata, &model_metadata_response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "no model");
}

TEST_F(GrpcFront, AMessageOverTheCapIsRefusedBeforeTheHandler) {
  start([](http::Request&&, http::Responder&& responder) { responder.send({}); }, 1024);
  inference::ModelInferRequest request = infer_request("m");
  request.add_raw_input_contents(std::string(4096, 'x'));
  auto ctx = context();
  inference::ModelInferResponse response;
  const grpc::Status status = stub_->ModelInfer(ctx.get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_EQ(handled_.load(), 0);
}

TEST_F(GrpcFront, AHandlerThatDropsTheRequestAnswersInternal) {
  start([](http::Request&&, http::Responder&&) {});
  auto ctx = context();
  inference::ModelInferResponse response;
  const grpc::Status status = stub_->ModelInfer(ctx.get(), infer_request("m"), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(status.error_message().find("not answered"), std::string::npos);
}

// A drain stops the gRPC intake (the servers' owners wire ServerOptions::on_drain to
// shutdown(), as this test does by hand) and waits for a call in flight, which finishes.
TEST_F(GrpcFront, ShutdownLetsACallInFlightFinishAndRefusesNewOnes) {
  std::atomic<bool> release{false};
  std::atomic<bool> arrived{false};
  start([&](http::Request&&, http::Responder&& responder) {
    arrived = true;
    auto held = std::make_shared<http::Responder>(std::move(responder));
    std::thread([held, &release] {
      while (!release.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      http::Response response;
      response.body = R"({"outputs":[]})";
      held->send(std::move(response));
    }).detach();
  });
  grpc::Status in_flight_status;
  std::thread in_flight([&] {
    auto ctx = context();
    inference::ModelInferResponse response;
    in_flight_status = stub_->ModelInfer(ctx.get(), infer_request("m"), &response);
  });
  while (!arrived.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  grpc_->shutdown(std::chrono::seconds(10));
  http_->drain(std::chrono::seconds(10));
  // A new call after the shutdown fails without reaching the handler: gRPC cancels it
  // (CANCELLED) while the server shuts down, or finds the port closed (UNAVAILABLE).
  auto ctx = context();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  inference::ModelInferResponse response;
  const grpc::Status refused = stub_->ModelInfer(ctx.get(), infer_request("m"), &response);
  EXPECT_TRUE(refused.error_code() == grpc::StatusCode::CANCELLED ||
              refused.error_code() == grpc::StatusCode::UNAVAILABLE)
      << refused.error_code() << " " << refused.error_message();
  EXPECT_EQ(handled_.load(), 1);
  release = true;
  in_flight.join();
  EXPECT_TRUE(in_flight_status.ok()) << in_flight_status.error_message();
}

TEST(GrpcServerStart, RefusesAnAddressWithoutAPortAndOneInUse) {
  http::ServerOptions options;
  options.workers = 1;
  auto http_server = http::Server::create(options, [](http::Request&&, http::Responder&&) {});
  ASSERT_TRUE(http_server.is_ok());
  auto no_port = GrpcServer::start({"127.0.0.1"}, **http_server);
  ASSERT_FALSE(no_port.is_ok());
  EXPECT_EQ(no_port.status().code(), StatusCode::kInvalidArgument);
  auto first = GrpcServer::start({"127.0.0.1:0"}, **http_server);
  ASSERT_TRUE(first.is_ok());
  auto second = GrpcServer::start({"127.0.0.1:" + std::to_string((*first)->port())}, **http_server);
  ASSERT_FALSE(second.is_ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace flotilla::oip_grpc

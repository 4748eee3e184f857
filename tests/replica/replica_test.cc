#include "replica/replica.h"

#include <atomic>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flotilla::replica {
namespace {

using ::testing::HasSubstr;

// An in-memory tabular model (a fake): one output of zeros, one per row, answered inline.
class ZerosRuntime final : public runtime::Runtime {
 public:
  ZerosRuntime() {
    metadata_.name = "zeros";
    metadata_.platform = "fake";
    metadata_.inputs.push_back({"input", DataType::kFp32, {-1, -1}});
    metadata_.outputs.push_back({"output", DataType::kFp32, {-1}});
  }
  const ModelMetadata& metadata() const override { return metadata_; }
  bool can_batch() const override { return true; }
  Result<runtime::ModelInput> prepare(const InferRequest& request) const override {
    if (request.inputs.empty()) {
      return invalid_argument("no inputs");
    }
    const Tensor& first = request.inputs[0];
    const int64_t rows = first.shape.empty() ? 1 : first.shape[0];
    const int64_t columns = first.shape.size() >= 2 ? first.shape[1] : 1;
    return runtime::ModelInput{rows, columns, std::vector<float>(rows * columns, 0.0f)};
  }
  void run(runtime::ModelInput&& input, runtime::RunCallback done) override {
    Tensor output{"output", DataType::kFp32, {input.rows}, {}};
    for (int64_t row = 0; row < input.rows; ++row) {
      output.append(0.0f);
    }
    done(std::vector<Tensor>{std::move(output)});
  }

 private:
  ModelMetadata metadata_;
};

// A language model that generates nothing (a fake): what the replica's routing needs of one.
class FakeLanguageModel final : public runtime::Runtime, public runtime::Generator {
 public:
  FakeLanguageModel() {
    metadata_.name = "tiny";
    metadata_.platform = "fake_llm";
  }
  const ModelMetadata& metadata() const override { return metadata_; }
  bool can_batch() const override { return false; }
  Result<runtime::ModelInput> prepare(const InferRequest&) const override {
    return Status(StatusCode::kUnimplemented, "a language model");
  }
  void run(runtime::ModelInput&&, runtime::RunCallback done) override {
    done(Status(StatusCode::kUnimplemented, "a language model"));
  }
  runtime::Generator* generator() override { return this; }
  int context_length() const override { return 64; }
  Result<uint64_t> generate(GenerationInput&&, EventCallback) override {
    return invalid_argument("the fake generates nothing");
  }
  void cancel(uint64_t) override {}
  TokenForms token_forms(int32_t id) const override {
    return {std::nullopt, "token_id:" + std::to_string(id)};
  }
  runtime::GeneratorStats stats() const override { return {}; }

 private:
  ModelMetadata metadata_;
};

constexpr std::string_view kInferBody =
    R"({"inputs":[{"name":"input","shape":[2,3],"datatype":"FP32","data":[1,2,3,4,5,6]}]})";

ReplicaOptions test_options() {
  ReplicaOptions options;
  options.server.host = "127.0.0.1";
  options.server.port = 0;
  options.server.workers = 2;
  options.drain_timeout = std::chrono::milliseconds(5'000);
  return options;
}

// test_options() with a drained-while-loading hook that counts its calls in `calls`.
ReplicaOptions counting_hook_options(std::atomic<int>& calls) {
  ReplicaOptions options = test_options();
  options.on_drained_while_loading = [&calls] {
    calls.fetch_add(1);
  };
  return options;
}

http::ClientResponse send(const Replica& replica, http::Method method, std::string target,
                          std::string body = "") {
  http::ClientRequest request;
  request.method = method;
  request.target = std::move(target);
  request.body = std::move(body);
  if (!request.body.empty()) {
    request.headers.emplace_back("Content-Type", "application/json");
  }
  return http::fetch("127.0.0.1", replica.port(), std::move(request),
                     std::chrono::milliseconds(10'000));
}

http::ClientResponse get(const Replica& replica, std::string target) {
  return send(replica, http::Method::kGet, std::move(target));
}

http::ClientResponse post(const Replica& replica, std::string target, std::string_view body) {
  return send(replica, http::Method::kPost, std::move(target), std::string(body));
}

void expect_loading(const http::ClientResponse& response, std::string_view error_shape) {
  EXPECT_EQ(response.failure, http::UpstreamFailure::kNone) << response.error;
  EXPECT_EQ(response.status, 503) << response.body;
  EXPECT_EQ(http::find_header(response.headers, "Retry-After"), "1");
  EXPECT_THAT(response.content_type, HasSubstr("application/json"));
  EXPECT_THAT(response.body, HasSubstr(error_shape));
  EXPECT_THAT(response.body, HasSubstr("model is loading"));
}

TEST(ReplicaTest, AnswersWhileLoadingAndServesOnceServed) {
  MetricsRegistry registry;
  auto replica = Replica::listen(test_options(), registry);
  ASSERT_TRUE(replica.is_ok()) << replica.status().message();
  Replica& r = **replica;

  EXPECT_EQ(get(r, "/v2/health/live").status, 200);
  const http::ClientResponse ready = get(r, "/v2/health/ready");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.body, R"({"ready":false,"state":"loading"})");
  EXPECT_EQ(get(r, "/v2").status, 200);
  EXPECT_EQ(get(r, "/version").status, 200);
  const http::ClientResponse metrics = get(r, "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_THAT(metrics.body, HasSubstr("flotilla_replica_model_load_seconds 0"));
  expect_loading(post(r, "/invocations", R"({"instances":[[1,2,3]]})"),
                 R"("error_code":"TEMPORARILY_UNAVAILABLE")");
  expect_loading(get(r, "/ping"), R"("error_code":"TEMPORARILY_UNAVAILABLE")");
  expect_loading(post(r, "/v2/models/zeros/infer", kInferBody), R"({"error":")");
  expect_loading(get(r, "/v2/models/zeros"), R"({"error":")");
  expect_loading(get(r, "/v2/models/anything/ready"), R"({"error":")");
  expect_loading(get(r, "/v1/models"), R"({"error":{"message":")");
  EXPECT_EQ(get(r, "/nowhere").status, 404);
  EXPECT_EQ(post(r, "/v2/health/live", "{}").status, 405);

  ASSERT_TRUE(
      r.serve(std::make_unique<ZerosRuntime>(), std::chrono::duration<double>(2.5)).is_ok());
  EXPECT_EQ(get(r, "/v2/health/ready").status, 200);
  EXPECT_EQ(get(r, "/v2/models/zeros/ready").status, 200);
  EXPECT_EQ(get(r, "/ping").status, 200);
  const http::ClientResponse infer = post(r, "/v2/models/zeros/infer", kInferBody);
  EXPECT_EQ(infer.status, 200) << infer.body;
  EXPECT_THAT(infer.body, HasSubstr(R"("model_name":"zeros")"));
  EXPECT_EQ(post(r, "/invocations", R"({"instances":[[1,2,3]]})").status, 200);
  EXPECT_EQ(get(r, "/v1/models").status, 404);  // not a language model
  EXPECT_THAT(get(r, "/metrics").body, HasSubstr("flotilla_replica_model_load_seconds 2.5"));

  r.drain();
  EXPECT_TRUE(r.run());
}

// Requests racing serve() see either "loading" or the model, never anything half-built (run
// under TSan to check the publication).
TEST(ReplicaTest, RequestsRacingServeSeeLoadingOrTheModel) {
  MetricsRegistry registry;
  auto replica = Replica::listen(test_options(), registry);
  ASSERT_TRUE(replica.is_ok()) << replica.status().message();
  Replica& r = **replica;

  std::atomic<bool> served{false};
  std::atomic<int> loading{0};
  std::atomic<int> answered{0};
  std::atomic<int> other{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back([&] {
      // Until a few answers came after serve(); bounded so a broken server cannot hang it.
      for (int n = 0; n < 5'000; ++n) {
        const bool after = served.load();
        const http::ClientResponse response = post(r, "/v2/models/zeros/infer", kInferBody);
        if (response.status == 503) {
          EXPECT_FALSE(after) << "loading after serve() returned";
          loading.fetch_add(1);
        } else if (response.status == 200) {
          answered.fetch_add(1);
          if (after) {
            return;
          }
        } else {
          other.fetch_add(1);
          ADD_FAILURE() << response.status << " " << response.error << " " << response.body;
          return;
        }
      }
    });
  }
  // Wait for at least one "loading" answer (with a deadline) so the race is exercised.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (loading.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_GT(loading.load(), 0);
  ASSERT_TRUE(r.serve(std::make_unique<ZerosRuntime>(), std::chrono::duration<double>(0)).is_ok());
  served.store(true);
  for (std::thread& client : clients) {
    client.join();
  }
  EXPECT_GT(answered.load(), 0);
  EXPECT_EQ(other.load(), 0);
  r.drain();
  EXPECT_TRUE(r.run());
}

TEST(ReplicaTest, DrainWhileLoadingEndsRunAndRefusesTheModel) {
  MetricsRegistry registry;
  std::atomic<int> hook_calls{0};
  const ReplicaOptions options = counting_hook_options(hook_calls);
  auto replica = Replica::listen(options, registry);
  ASSERT_TRUE(replica.is_ok()) << replica.status().message();
  Replica& r = **replica;
  ASSERT_EQ(get(r, "/v2/health/live").status, 200);

  r.drain();
  EXPECT_TRUE(r.run());  // nothing in flight: the drain completes by itself
  EXPECT_EQ(hook_calls.load(), 1);

  std::unique_ptr<runtime::Runtime> runtime = std::make_unique<ZerosRuntime>();
  const Status served = r.serve(std::move(runtime), std::chrono::duration<double>(0));
  EXPECT_EQ(served.code(), StatusCode::kUnavailable);
  EXPECT_THAT(served.message(), HasSubstr("zeros"));
  EXPECT_NE(runtime, nullptr);  // left with the caller
  EXPECT_TRUE(r.run());         // returns at once
}

TEST(ReplicaTest, DrainAfterServeIsAnOrdinaryDrain) {
  MetricsRegistry registry;
  std::atomic<int> hook_calls{0};
  const ReplicaOptions options = counting_hook_options(hook_calls);
  auto replica = Replica::listen(options, registry);
  ASSERT_TRUE(replica.is_ok()) << replica.status().message();
  Replica& r = **replica;
  ASSERT_TRUE(r.serve(std::make_unique<ZerosRuntime>(), std::chrono::duration<double>(0)).is_ok());
  r.drain();
  EXPECT_TRUE(r.run());
  EXPECT_EQ(hook_calls.load(), 0);
}

TEST(ReplicaTest, DestroyedWhileLoadingStopsWithoutTheHook) {
  MetricsRegistry registry;
  std::atomic<int> hook_calls{0};
  const ReplicaOptions options = counting_hook_options(hook_calls);
  uint16_t port = 0;
  {
    auto replica = Replica::listen(options, registry);
    ASSERT_TRUE(replica.is_ok()) << replica.status().message();
    port = (*replica)->port();
    ASSERT_EQ(get(**replica, "/v2/health/live").status, 200);
  }
  EXPECT_EQ(hook_calls.load(), 0);
  http::ClientRequest request;
  request.method = http::Method::kGet;
  request.target = "/v2/health/live";
  EXPECT_EQ(
      http::fetch("127.0.0.1", port, std::move(request), std::chrono::milliseconds(2'000)).failure,
      http::UpstreamFailure::kConnect);
}

TEST(ReplicaTest, ListenOnABadAddressFails) {
  MetricsRegistry registry;
  ReplicaOptions options = test_options();
  options.server.host = "not an address";
  EXPECT_EQ(Replica::listen(options, registry).status().code(), StatusCode::kInvalidArgument);
}

// Issue 18: a version path names the served version (--model-version), or it is 404.
TEST(ReplicaTest, VersionPathsServeOnlyTheServedVersion) {
  MetricsRegistry registry;
  ReplicaOptions options = test_options();
  options.model_version = "7";
  auto replica = Replica::listen(options, registry);
  ASSERT_TRUE(replica.is_ok()) << replica.status().message();
  Replica& r = **replica;
  ASSERT_TRUE(r.serve(std::make_unique<ZerosRuntime>(), std::chrono::duration<double>(0)).is_ok());

  for (const char* target : {"/v2/models/zeros", "/v2/models/zeros/versions/7"}) {
    const http::ClientResponse metadata = get(r, target);
    EXPECT_EQ(metadata.status, 200) << target;
    EXPECT_THAT(metadata.body, HasSubstr(R"("versions":["7"])")) << target;
  }
  EXPECT_EQ(get(r, "/v2/models/zeros/versions/7/ready").status, 200);
  for (const char* target : {"/v2/models/zeros/infer", "/v2/models/zeros/versions/7/infer"}) {
    const http::ClientResponse infer = post(r, target, kInferBody);
    EXPECT_EQ(infer.status, 200) << target << ": " << infer.body;
    EXPECT_THAT(infer.body, HasSubstr(R"("model_name":"zeros","model_version":"7")")) << target;
  }
  const http::ClientResponse unknown = get(r, "/v2/models/zeros/versions/9");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_THAT(unknown.body, HasSubstr(R"({"error":")"));
  EXPECT_THAT(unknown.body, HasSubstr("version '9' of model 'zeros'"));
  EXPECT_EQ(get(r, "/v2/models/zeros/versions/9/ready").status, 404);
  const http::ClientResponse infer = post(r, "/v2/models/zeros/versions/9/infer", kInferBody);
  EXPECT_EQ(infer.status, 404);
  EXPECT_THAT(infer.body, HasSubstr("'9'"));
  EXPECT_EQ(get(r, "/v2/models/zeros/versions/").status, 404);
  r.drain();
  EXPECT_TRUE(r.run());
}

TEST(ReplicaTest, TheDefaultVersionIsOne) {
  MetricsRegistry registry;
  auto replica = Replica::listen(test_options(), registry);
  ASSERT_TRUE(replica.is_ok()) << replica.status().message();
  Replica& r = **replica;
  ASSERT_TRUE(r.serve(std::make_unique<ZerosRuntime>(), std::chrono::duration<double>(0)).is_ok());
  EXPECT_THAT(get(r, "/v2/models/zeros/versions/1").body, HasSubstr(R"("versions":["1"])"));
  EXPECT_EQ(get(r, "/v2/models/zeros/versions/2").status, 404);
  EXPECT_THAT(post(r, "/v2/models/zeros/infer", kInferBody).body,
              HasSubstr(R"("model_version":"1")"));
  r.drain();
  EXPECT_TRUE(r.run());
}

// Issue 18: a language model cannot serve MLflow pyfunc or OIP tensor requests: 501 in the
// route's own shape, whatever the body (docs/replica.md, docs/llm.md).
TEST(ReplicaTest, LanguageModelTensorRoutesAnswer501) {
  MetricsRegistry registry;
  auto replica = Replica::listen(test_options(), registry);
  ASSERT_TRUE(replica.is_ok()) << replica.status().message();
  Replica& r = **replica;
  ASSERT_TRUE(
      r.serve(std::make_unique<FakeLanguageModel>(), std::chrono::duration<double>(0)).is_ok());
  for (std::string_view body :
       {std::string_view(R"({"instances":[[1,2,3]]})"), std::string_view("{not json")}) {
    const http::ClientResponse invocations = post(r, "/invocations", body);
    EXPECT_EQ(invocations.status, 501) << invocations.body;
    EXPECT_THAT(invocations.body, HasSubstr(R"({"error_code":"NOT_IMPLEMENTED","message":")"));
    EXPECT_THAT(invocations.body, HasSubstr("/v1/completions"));
  }
  http::ClientRequest csv;
  csv.method = http::Method::kPost;
  csv.target = "/invocations";
  csv.body = "a,b\n1,2\n";
  csv.headers.emplace_back("Content-Type", "text/plain");
  EXPECT_EQ(
      http::fetch("127.0.0.1", r.port(), std::move(csv), std::chrono::milliseconds(10'000)).status,
      501);
  const http::ClientResponse infer = post(r, "/v2/models/tiny/infer", "{not json");
  EXPECT_EQ(infer.status, 501) << infer.body;
  EXPECT_THAT(infer.body, HasSubstr(R"({"error":")"));
  r.drain();
  EXPECT_TRUE(r.run());
}

// Issue 18: GET /v1/models/{id}, with OpenAI's 404 for another id.
TEST(ReplicaTest, OpenAiModelRouteNamesTheServedModel) {
  MetricsRegistry registry;
  auto replica = Replica::listen(test_options(), registry);
  ASSERT_TRUE(replica.is_ok()) << replica.status().message();
  Replica& r = **replica;
  ASSERT_TRUE(
      r.serve(std::make_unique<FakeLanguageModel>(), std::chrono::duration<double>(0)).is_ok());
  const http::ClientResponse model = get(r, "/v1/models/tiny");
  EXPECT_EQ(model.status, 200) << model.body;
  EXPECT_THAT(model.body, HasSubstr(R"({"id":"tiny","object":"model",)"));
  EXPECT_THAT(model.body, HasSubstr(R"("max_model_len":64})"));
  EXPECT_THAT(get(r, "/v1/models").body, HasSubstr(R"("data":[)" + model.body + "]"));
  for (const char* target : {"/v1/models/other", "/v1/models/org/tiny"}) {
    const http::ClientResponse other = get(r, target);
    EXPECT_EQ(other.status, 404) << target;
    EXPECT_THAT(other.body, HasSubstr(R"({"error":{"message":")")) << target;
    EXPECT_THAT(other.body, HasSubstr(R"("type":"not_found_error")")) << target;
  }
  const http::ClientResponse post_model = post(r, "/v1/models/tiny", "{}");
  EXPECT_EQ(post_model.status, 405);
  EXPECT_EQ(http::find_header(post_model.headers, "Allow"), "GET");
  r.drain();
  EXPECT_TRUE(r.run());
}

}  // namespace
}  // namespace flotilla::replica

#include <gtest/gtest.h>

#include "gateway/gateway.h"

namespace flotilla::gateway {
namespace {

using http::Method;

struct RouteCase {
  const char* name;
  Method method;
  const char* target;
  const char* body;
  const char* default_endpoint;
  RouteKind kind;
  const char* endpoint;
  const char* upstream_target;
};

class RouteRequestTest : public ::testing::TestWithParam<RouteCase> {};

TEST_P(RouteRequestTest, Classifies) {
  const RouteCase& c = GetParam();
  const Route route = route_request(c.method, c.target, c.body, c.default_endpoint);
  EXPECT_EQ(route.kind, c.kind);
  EXPECT_EQ(route.endpoint, c.endpoint);
  EXPECT_EQ(route.upstream_target, c.upstream_target);
}

INSTANTIATE_TEST_SUITE_P(
    Routes, RouteRequestTest,
    ::testing::Values(
        RouteCase{"Invocations", Method::kPost, "/serving-endpoints/fraud/invocations", "", "",
                  RouteKind::kInvocations, "fraud", "/invocations"},
        RouteCase{"InvocationsKeepsQuery", Method::kPost,
                  "/serving-endpoints/fraud/invocations?x=1", "", "", RouteKind::kInvocations,
                  "fraud", "/invocations?x=1"},
        RouteCase{"InvocationsWrongTail", Method::kPost, "/serving-endpoints/fraud/other", "", "",
                  RouteKind::kNotFound, "", ""},
        RouteCase{"InvocationsNoName", Method::kPost, "/serving-endpoints//invocations", "", "",
                  RouteKind::kNotFound, "", ""},
        RouteCase{"OipInfer", Method::kPost, "/v2/models/fraud/infer", "", "", RouteKind::kOip,
                  "fraud", "/v2/models/fraud/infer"},
        RouteCase{"OipMetadata", Method::kGet, "/v2/models/fraud", "", "", RouteKind::kOip, "fraud",
                  "/v2/models/fraud"},
        RouteCase{"OipNoName", Method::kGet, "/v2/models/", "", "", RouteKind::kNotFound, "", ""},
        RouteCase{"Chat", Method::kPost, "/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"hi"}],"model":"llm"})", "",
                  RouteKind::kOpenAi, "llm", "/v1/chat/completions"},
        RouteCase{"CompletionsEscapedName", Method::kPost, "/v1/completions",
                  R"({"model":"ll\u006d","prompt":"x"})", "", RouteKind::kOpenAi, "llm",
                  "/v1/completions"},
        RouteCase{"NestedModelIgnored", Method::kPost, "/v1/completions",
                  R"({"extra":{"model":"no"},"model":"yes"})", "", RouteKind::kOpenAi, "yes",
                  "/v1/completions"},
        RouteCase{"ChatWithoutModel", Method::kPost, "/v1/chat/completions", R"({"x":1})", "",
                  RouteKind::kBadRequest, "", ""},
        RouteCase{"ChatModelNotString", Method::kPost, "/v1/chat/completions", R"({"model":3})", "",
                  RouteKind::kBadRequest, "", ""},
        RouteCase{"ChatMalformed", Method::kPost, "/v1/chat/completions", R"({"model":)", "",
                  RouteKind::kBadRequest, "", ""},
        RouteCase{"ChatNotObject", Method::kPost, "/v1/chat/completions", "[]", "",
                  RouteKind::kBadRequest, "", ""},
        RouteCase{"ChatGet", Method::kGet, "/v1/chat/completions", "", "",
                  RouteKind::kMethodNotAllowed, "", ""},
        RouteCase{"InvocationsGet", Method::kGet, "/serving-endpoints/fraud/invocations", "", "",
                  RouteKind::kMethodNotAllowed, "", ""},
        RouteCase{"OipInferGet", Method::kGet, "/v2/models/fraud/infer", "", "",
                  RouteKind::kMethodNotAllowed, "", ""},
        RouteCase{"ListModelsPost", Method::kPost, "/v1/models", "", "",
                  RouteKind::kMethodNotAllowed, "", ""},
        RouteCase{"Model", Method::kGet, "/v1/models/llm", "", "", RouteKind::kModel, "llm", ""},
        RouteCase{"ModelNested", Method::kGet, "/v1/models/a/b", "", "", RouteKind::kNotFound, "",
                  ""},
        RouteCase{"ServerMetadata", Method::kGet, "/v2", "", "", RouteKind::kServerMetadata, "",
                  ""},
        RouteCase{"OipVersionInfer", Method::kPost, "/v2/models/fraud/versions/v2/infer?q=1", "",
                  "", RouteKind::kOip, "fraud", "/v2/models/fraud/infer?q=1"},
        RouteCase{"OipVersionMetadata", Method::kGet, "/v2/models/fraud/versions/v2", "", "",
                  RouteKind::kOip, "fraud", "/v2/models/fraud"},
        RouteCase{"OipVersionReady", Method::kGet, "/v2/models/fraud/versions/v2/ready", "", "",
                  RouteKind::kOip, "fraud", "/v2/models/fraud/ready"},
        RouteCase{"OipVersionEmpty", Method::kGet, "/v2/models/fraud/versions//ready", "", "",
                  RouteKind::kNotFound, "", ""},
        RouteCase{"InvalidUtf8Path", Method::kGet, "/\xff", "", "", RouteKind::kNotFound, "", ""},
        RouteCase{"InvalidUtf8Endpoint", Method::kPost, "/serving-endpoints/\xff/invocations", "",
                  "", RouteKind::kInvocations, "\xff", "/invocations"},
        RouteCase{"ListModels", Method::kGet, "/v1/models", "", "", RouteKind::kListModels, "", ""},
        RouteCase{"Live", Method::kGet, "/v2/health/live", "", "", RouteKind::kHealth, "", ""},
        RouteCase{"Ready", Method::kGet, "/v2/health/ready", "", "", RouteKind::kHealth, "", ""},
        RouteCase{"Metrics", Method::kGet, "/metrics", "", "", RouteKind::kMetrics, "", ""},
        RouteCase{"Stats", Method::kGet, "/gateway/stats", "", "", RouteKind::kStats, "", ""},
        RouteCase{"UnknownPath", Method::kPost, "/predict", "", "", RouteKind::kNotFound, "", ""},
        RouteCase{"CatchAll", Method::kPost, "/predict?a=b", "", "default", RouteKind::kCatchAll,
                  "default", "/predict?a=b"},
        RouteCase{"CatchAllDoesNotTakeMetrics", Method::kGet, "/metrics", "", "default",
                  RouteKind::kMetrics, "", ""}),
    [](const ::testing::TestParamInfo<RouteCase>& info) { return info.param.name; });

TEST(RouteRequestTest, VersionPathNamesTheVersion) {
  EXPECT_EQ(route_request(Method::kPost, "/v2/models/fraud/versions/v2/infer", "", "").version,
            "v2");
  EXPECT_EQ(route_request(Method::kPost, "/v2/models/fraud/infer", "", "").version, "");
}

TEST(RouteRequestTest, MethodNotAllowedSaysWhatIs) {
  EXPECT_EQ(route_request(Method::kGet, "/v1/completions", "", "").allow, "POST");
  EXPECT_EQ(route_request(Method::kPost, "/v1/models/x", "", "").allow, "GET, HEAD");
}

TEST(RouteRequestTest, BadRequestSaysWhy) {
  const Route route = route_request(Method::kPost, "/v1/completions", R"({"prompt":"x"})", "");
  ASSERT_EQ(route.kind, RouteKind::kBadRequest);
  EXPECT_NE(route.error.find("'model'"), std::string::npos) << route.error;
}

}  // namespace
}  // namespace flotilla::gateway

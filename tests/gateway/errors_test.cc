// The gateway's own error bodies per route kind (issue 18 items 6 and 14) and the retry
// decision for failed attempts (item 1).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gateway/gateway.h"

namespace flotilla::gateway {
namespace {

using http::UpstreamFailure;
using nlohmann::json;

TEST(ErrorShapeTest, FollowsTheRoute) {
  EXPECT_EQ(error_shape_for("/v1/chat/completions"), ErrorShape::kOpenAi);
  EXPECT_EQ(error_shape_for("/v1/models/x?y=1"), ErrorShape::kOpenAi);
  EXPECT_EQ(error_shape_for("/serving-endpoints/fraud/invocations"), ErrorShape::kMlflow);
  EXPECT_EQ(error_shape_for("/v2/models/fraud/infer"), ErrorShape::kPlain);
  EXPECT_EQ(error_shape_for("/v1x"), ErrorShape::kPlain);
  EXPECT_EQ(error_shape_for("/nope"), ErrorShape::kPlain);
}

struct OpenAiCase {
  int status;
  const char* param;
  const char* type;
  json code;
};

TEST(ErrorBodyTest, OpenAiShapeWithOpenAiTypesAndCodes) {
  const OpenAiCase cases[] = {
      {400, "model", "invalid_request_error", nullptr},
      {401, "", "authentication_error", "invalid_api_key"},
      {403, "", "permission_error", nullptr},
      {404, "model", "not_found_error", "model_not_found"},
      {404, "", "not_found_error", nullptr},
      {405, "", "invalid_request_error", "method_not_supported"},
      {413, "", "invalid_request_error", nullptr},
      {429, "", "rate_limit_error", "rate_limit_exceeded"},
      {502, "", "server_error", nullptr},
      {503, "", "unavailable_error", nullptr},
      {504, "", "server_error", nullptr},
  };
  for (const OpenAiCase& c : cases) {
    SCOPED_TRACE(c.status);
    const json body = json::parse(error_body(ErrorShape::kOpenAi, c.status, "why", c.param));
    ASSERT_TRUE(body.contains("error") && body["error"].is_object()) << body;
    const json& error = body["error"];
    EXPECT_EQ(error.size(), 4u) << body;  // message, type, param, code: what the SDK reads
    EXPECT_EQ(error["message"], "why");
    EXPECT_EQ(error["type"], c.type);
    EXPECT_EQ(error["param"], std::string(c.param).empty() ? json(nullptr) : json(c.param));
    EXPECT_EQ(error["code"], c.code);
  }
}

TEST(ErrorBodyTest, MlflowShapeWithMlflowCodes) {
  const std::pair<int, const char*> cases[] = {
      {400, "BAD_REQUEST"},
      {401, "UNAUTHENTICATED"},
      {403, "PERMISSION_DENIED"},
      {404, "RESOURCE_DOES_NOT_EXIST"},
      {405, "BAD_REQUEST"},
      {413, "INVALID_PARAMETER_VALUE"},
      {429, "REQUEST_LIMIT_EXCEEDED"},
      {502, "INTERNAL_ERROR"},
      {503, "TEMPORARILY_UNAVAILABLE"},
      {504, "DEADLINE_EXCEEDED"},
  };
  for (const auto& [status, code] : cases) {
    SCOPED_TRACE(status);
    const json body = json::parse(error_body(ErrorShape::kMlflow, status, "why"));
    EXPECT_EQ(body, (json{{"error_code", code}, {"message", "why"}}));
  }
}

TEST(ErrorBodyTest, PlainShapeIsOipError) {
  EXPECT_EQ(json::parse(error_body(ErrorShape::kPlain, 404, "no route")),
            (json{{"error", "no route"}}));
}

// Issue 18 item 6: a message quoting a path of invalid UTF-8 threw in nlohmann's dump(), and
// the request was answered 500 "request handler threw".
TEST(ErrorBodyTest, InvalidUtf8InTheMessageStillGivesValidJson) {
  const std::string message = "no route for /\xff\xfe/invocations \xc3";
  for (ErrorShape shape : {ErrorShape::kPlain, ErrorShape::kOpenAi, ErrorShape::kMlflow}) {
    const std::string body = error_body(shape, 404, message, "model");
    const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(parsed.is_discarded()) << body;
    EXPECT_NE(body.find("\xef\xbf\xbd"), std::string::npos) << body;  // U+FFFD
  }
}

TEST(ShouldRetryTest, RetriesWhatNoClientSawWhileAttemptsLast) {
  struct Case {
    const char* name;
    FailedAttempt attempt;
    bool retry;
  };
  const Case cases[] = {
      {"connect refused", {UpstreamFailure::kConnect, true, false, 1}, true},
      {"reset before the response", {UpstreamFailure::kClosedBeforeResponse, true, false, 1}, true},
      {"cut mid-response, none passed on",
       {UpstreamFailure::kClosedDuringResponse, true, false, 1},
       true},
      // A single replica killed: the retry meets it again before it is ejected, then waits for
      // its replacement; the attempts before the cap cover the ejection (3 failures).
      {"third attempt", {UpstreamFailure::kConnect, true, false, 3}, true},
      {"attempts used up", {UpstreamFailure::kConnect, true, false, kMaxAttempts}, false},
      {"request not handed back", {UpstreamFailure::kConnect, false, false, 1}, false},
      {"client gone", {UpstreamFailure::kClosedBeforeResponse, true, true, 1}, false},
      {"timeout is a 504", {UpstreamFailure::kTimeout, true, false, 1}, false},
      {"bad response is a 502", {UpstreamFailure::kBadResponse, true, false, 1}, false},
      {"stream bytes went on", {UpstreamFailure::kStreamInterrupted, true, false, 1}, false},
      {"cancelled", {UpstreamFailure::kCancelled, true, false, 1}, false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(should_retry(c.attempt), c.retry) << c.name;
  }
}

}  // namespace
}  // namespace flotilla::gateway

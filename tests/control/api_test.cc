// The REST API's routes over an in-memory ApiService: auth, routing, status mapping and the
// JSON shapes, without a store, an orchestrator or a gateway.
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "control/control_api.h"
#include "control/control_metrics.h"

namespace flotilla::control {
namespace {

using ::testing::HasSubstr;

constexpr std::string_view kAdmin = "Bearer admin";
constexpr std::string_view kUser = "Bearer user";

// Two tokens: "admin" and "user" (scoped to "fraud"); endpoints in a map; calls recorded.
class FakeService final : public ApiService {
 public:
  Result<auth::AuthResult> check_admin(std::string_view authorization,
                                       std::string* token_id) override {
    if (tokens_unavailable_) {
      return Status(StatusCode::kUnavailable, "the token store is away");
    }
    if (authorization.empty()) {
      return auth::AuthResult::kMissing;
    }
    if (authorization == kAdmin) {
      *token_id = "admin";
      return auth::AuthResult::kAllowed;
    }
    return authorization == kUser ? auth::AuthResult::kForbidden : auth::AuthResult::kInvalid;
  }
  Result<auth::AuthResult> check_token(std::string_view authorization,
                                       std::vector<std::string>* scope) override {
    if (tokens_unavailable_) {
      return Status(StatusCode::kUnavailable, "the token store is away");
    }
    if (authorization.empty()) {
      return auth::AuthResult::kMissing;
    }
    if (authorization == kUser) {
      *scope = {"fraud"};
    }
    return authorization == kUser || authorization == kAdmin ? auth::AuthResult::kAllowed
                                                             : auth::AuthResult::kInvalid;
  }
  std::string render_metrics() override {
    return "# HELP m M.\n# TYPE m gauge\nm{endpoint=\"fraud\"} 1\nm{endpoint=\"llm\"} 2\n";
  }
  nlohmann::json info() override { return {{"version", "test"}}; }
  Result<nlohmann::json> create_endpoint(std::string_view body, const std::string& actor) override {
    const nlohmann::json spec = nlohmann::json::parse(body, nullptr, false);
    if (spec.is_discarded() || !spec.contains("name")) {
      return invalid_argument("name: required");
    }
    const std::string name = spec["name"];
    if (endpoints_.contains(name)) {
      return Status(StatusCode::kFailedPrecondition, "endpoint '" + name + "' already exists");
    }
    endpoints_[name] = {{"name", name}, {"by", actor}};
    return endpoints_[name];
  }
  Result<nlohmann::json> update_endpoint(const std::string& name, std::string_view,
                                         const std::string&) override {
    return endpoint_view(name);
  }
  Status delete_endpoint(const std::string& name, const std::string&) override {
    return endpoints_.erase(name) == 1 ? Status::ok()
                                       : not_found("endpoint '" + name + "' does not exist");
  }
  Result<nlohmann::json> endpoint_view(const std::string& name) override {
    auto it = endpoints_.find(name);
    if (it == endpoints_.end()) {
      return not_found("endpoint '" + name + "' does not exist");
    }
    return it->second;
  }
  Result<std::vector<nlohmann::json>> endpoint_views() override {
    std::vector<nlohmann::json> views;
    for (const auto& [name, view] : endpoints_) {
      views.push_back(view);
    }
    return views;
  }
  Result<std::vector<EventRow>> list_events(const std::string& endpoint, size_t limit) override {
    last_events_limit_ = limit;
    std::vector<EventRow> events;
    if (endpoint == "fraud" || endpoint == "deleted") {
      events.push_back(EventRow{7, 1000, endpoint, "created", "admin", "created"});
    }
    return events;
  }
  Result<nlohmann::json> endpoint_metrics(const std::string& name, int64_t seconds) override {
    if (!endpoints_.contains(name)) {
      return not_found("endpoint '" + name + "' does not exist");
    }
    last_metrics_window_ = seconds;
    return nlohmann::json{{"name", name}};
  }
  Result<nlohmann::json> create_token(const std::string& id, std::vector<std::string> endpoints,
                                      bool admin, const std::string& comment,
                                      const std::string& actor) override {
    return nlohmann::json{{"token", "flt_" + id + "_x"},
                          {"token_info",
                           {{"id", id},
                            {"endpoints", endpoints},
                            {"admin", admin},
                            {"comment", comment},
                            {"by", actor}}}};
  }
  Status revoke_token(const std::string& id, const std::string&) override {
    revoked_.push_back(id);
    return Status::ok();
  }
  Result<nlohmann::json> list_tokens() override {
    return nlohmann::json::array({{{"id", "admin"}}});
  }

  std::map<std::string, nlohmann::json> endpoints_;
  bool tokens_unavailable_ = false;
  size_t last_events_limit_ = 0;
  int64_t last_metrics_window_ = 0;
  std::vector<std::string> revoked_;
};

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override { make(/*metrics_open=*/false); }

  void make(bool metrics_open) {
    http::ServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    auto created = ApiServer::create(options, service_, metrics_open);
    ASSERT_TRUE(created.is_ok()) << created.status().message();
    api_ = std::move(created).value();
  }

  http::Response call(http::Method method, const std::string& target, std::string_view token,
                      const std::string& body = "") {
    http::Request request;
    request.method = method;
    request.target = target;
    request.body = body;
    if (!token.empty()) {
      request.headers.emplace_back("Authorization", std::string(token));
    }
    return api_->handle(request);
  }

  static nlohmann::json json(const http::Response& response) {
    return nlohmann::json::parse(response.body, nullptr, false);
  }

  FakeService service_;
  std::unique_ptr<ApiServer> api_;
};

TEST_F(ApiTest, AnswersHealthWithoutATokenAndTheRestOnlyToAdmins) {
  EXPECT_EQ(call(http::Method::kGet, "/health", "").status, 200);
  const http::Response missing = call(http::Method::kGet, "/api/2.0/info", "");
  EXPECT_EQ(missing.status, 401);
  EXPECT_EQ(json(missing)["error_code"], "UNAUTHENTICATED");
  EXPECT_EQ(call(http::Method::kGet, "/api/2.0/info", "Bearer nonsense").status, 401);
  const http::Response user = call(http::Method::kGet, "/api/2.0/info", kUser);
  EXPECT_EQ(user.status, 403);
  EXPECT_EQ(json(user)["error_code"], "PERMISSION_DENIED");
  const http::Response info = call(http::Method::kGet, "/api/2.0/info", kAdmin);
  EXPECT_EQ(info.status, 200);
  EXPECT_EQ(json(info)["version"], "test");
  const http::Response unknown = call(http::Method::kGet, "/api/2.0/nothing", kAdmin);
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(json(unknown)["error_code"], "ENDPOINT_NOT_FOUND");
}

TEST_F(ApiTest, TokensThatCannotBeCheckedNowAre503NotAVerdictOnTheToken) {
  service_.tokens_unavailable_ = true;
  for (const char* target : {"/api/2.0/serving-endpoints", "/metrics"}) {
    const http::Response answer = call(http::Method::kGet, target, kAdmin);
    EXPECT_EQ(answer.status, 503) << target;
    EXPECT_EQ(json(answer)["error_code"], "TEMPORARILY_UNAVAILABLE") << target;
    EXPECT_THAT(json(answer)["message"].get<std::string>(), HasSubstr("token store")) << target;
  }
}

TEST_F(ApiTest, MetricsTakeAnyTokenAndShowOnlyItsScope) {
  EXPECT_EQ(call(http::Method::kGet, "/metrics", "").status, 401);
  const http::Response user = call(http::Method::kGet, "/metrics", kUser);
  EXPECT_EQ(user.status, 200);
  EXPECT_THAT(user.body, HasSubstr("m{endpoint=\"fraud\"} 1"));
  EXPECT_THAT(user.body, ::testing::Not(HasSubstr("llm")));
  EXPECT_THAT(call(http::Method::kGet, "/metrics", kAdmin).body, HasSubstr("llm"));
  make(/*metrics_open=*/true);
  EXPECT_EQ(call(http::Method::kGet, "/metrics", "").status, 200);
}

TEST_F(ApiTest, EndpointRoutesMapStatusesToHttpAndErrorCodes) {
  const std::string prefix = "/api/2.0/serving-endpoints";
  const http::Response created = call(http::Method::kPost, prefix, kAdmin, R"({"name": "fraud"})");
  EXPECT_EQ(created.status, 200);
  EXPECT_EQ(json(created)["by"], "admin");  // the token id is the actor
  const http::Response again = call(http::Method::kPost, prefix, kAdmin, R"({"name": "fraud"})");
  EXPECT_EQ(again.status, 409);
  EXPECT_EQ(json(again)["error_code"], "RESOURCE_ALREADY_EXISTS");
  const http::Response bad = call(http::Method::kPost, prefix, kAdmin, "{}");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(json(bad)["error_code"], "INVALID_PARAMETER_VALUE");

  const http::Response list = call(http::Method::kGet, prefix, kAdmin);
  ASSERT_EQ(json(list)["endpoints"].size(), 1u);
  const http::Response one = call(http::Method::kGet, prefix + "/fraud", kAdmin);
  EXPECT_EQ(one.status, 200);
  EXPECT_EQ(json(one)["events"][0]["kind"], "created");
  EXPECT_EQ(service_.last_events_limit_, 20u);
  const http::Response missing = call(http::Method::kGet, prefix + "/nope", kAdmin);
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(json(missing)["error_code"], "RESOURCE_DOES_NOT_EXIST");

  const http::Response wrong = call(http::Method::kPut, prefix, kAdmin);
  EXPECT_EQ(wrong.status, 405);
  EXPECT_EQ(http::find_header(wrong.headers, "allow"), "GET, POST");

  // Events: a limit from 1 to 10000; a deleted endpoint's stay readable.
  EXPECT_EQ(call(http::Method::kGet, prefix + "/fraud/events?limit=5", kAdmin).status, 200);
  EXPECT_EQ(service_.last_events_limit_, 5u);
  EXPECT_EQ(call(http::Method::kGet, prefix + "/fraud/events?limit=0", kAdmin).status, 400);
  EXPECT_EQ(call(http::Method::kGet, prefix + "/fraud/events?limit=x", kAdmin).status, 400);
  const http::Response deleted = call(http::Method::kGet, prefix + "/deleted/events", kAdmin);
  EXPECT_EQ(deleted.status, 200);
  EXPECT_EQ(json(deleted)["events"][0]["id"], 7);
  EXPECT_EQ(call(http::Method::kGet, prefix + "/never/events", kAdmin).status, 404);

  EXPECT_EQ(call(http::Method::kDelete, prefix + "/fraud", kAdmin).status, 200);
  EXPECT_EQ(call(http::Method::kDelete, prefix + "/fraud", kAdmin).status, 404);
}

TEST_F(ApiTest, MetricsRouteTakesAWindowUpToAnHour) {
  const std::string prefix = "/api/2.0/serving-endpoints";
  ASSERT_EQ(call(http::Method::kPost, prefix, kAdmin, R"({"name": "fraud"})").status, 200);
  EXPECT_EQ(call(http::Method::kGet, prefix + "/fraud/metrics", kAdmin).status, 200);
  EXPECT_EQ(service_.last_metrics_window_, kMetricsWindowDefaultSeconds);
  for (const auto& [window, seconds] : std::vector<std::pair<std::string, int64_t>>{
           {"90", 90}, {"90s", 90}, {"15m", 900}, {"1h", 3600}, {"60m", 3600}}) {
    EXPECT_EQ(call(http::Method::kGet, prefix + "/fraud/metrics?window=" + window, kAdmin).status,
              200)
        << window;
    EXPECT_EQ(service_.last_metrics_window_, seconds) << window;
  }
  for (const char* window :
       {"0", "2h", "3601", "61m", "-5", "5x", "m", "1.5h", "99999999999999h"}) {
    const http::Response bad =
        call(http::Method::kGet, prefix + "/fraud/metrics?window=" + window, kAdmin);
    EXPECT_EQ(bad.status, 400) << window;
    EXPECT_THAT(json(bad)["message"].get<std::string>(), HasSubstr("window")) << window;
  }
  EXPECT_EQ(call(http::Method::kGet, prefix + "/nope/metrics", kAdmin).status, 404);
  EXPECT_EQ(call(http::Method::kPost, prefix + "/fraud/metrics", kAdmin).status, 405);
  EXPECT_EQ(call(http::Method::kGet, prefix + "/fraud/metrics", kUser).status, 403);
}

TEST_F(ApiTest, TheDashboardsFilesNeedNoTokenAndAreOnlyWhatIsEmbedded) {
  const http::Response page = call(http::Method::kGet, "/dashboard/", "");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_THAT(page.body, HasSubstr("<script src=\"chart.min.js\">"));
  EXPECT_THAT(http::find_header(page.headers, "content-security-policy"),
              HasSubstr("default-src 'self'"));
  const http::Response chart = call(http::Method::kGet, "/dashboard/chart.min.js", "");
  EXPECT_EQ(chart.status, 200);
  EXPECT_THAT(chart.body, HasSubstr("Chart.js v3"));
  EXPECT_EQ(call(http::Method::kGet, "/dashboard/dashboard.js", "").content_type,
            "text/javascript; charset=utf-8");
  const http::Response bare = call(http::Method::kGet, "/dashboard", "");
  EXPECT_EQ(bare.status, 308);
  EXPECT_EQ(http::find_header(bare.headers, "location"), "/dashboard/");
  EXPECT_EQ(call(http::Method::kGet, "/dashboard/../admin.token", "").status, 404);
  EXPECT_EQ(call(http::Method::kGet, "/dashboard/nothing.js", "").status, 404);
  EXPECT_EQ(call(http::Method::kPost, "/dashboard/", "").status, 405);
}

TEST_F(ApiTest, TokenRoutesCheckTheBodyAndRefuseToRevokeTheCaller) {
  const std::string prefix = "/api/2.0/tokens";
  EXPECT_EQ(json(call(http::Method::kGet, prefix, kAdmin))["tokens"][0]["id"], "admin");
  const http::Response created =
      call(http::Method::kPost, prefix, kAdmin, R"({"id": "ci", "endpoints": ["fraud"]})");
  EXPECT_EQ(created.status, 200);
  EXPECT_EQ(json(created)["token_info"]["endpoints"][0], "fraud");
  EXPECT_EQ(json(created)["token_info"]["admin"], false);
  for (const char* body : {"[]", R"({"id": 1})", R"({"id": "x", "endpoints": "fraud"})",
                           R"({"id": "x", "other": 1})", R"({"id": "x", "admin": "yes"})",
                           R"({"id": "x", "admin": true, "endpoints": ["fraud"]})"}) {
    const http::Response refused = call(http::Method::kPost, prefix, kAdmin, body);
    EXPECT_EQ(refused.status, 400) << body;
    EXPECT_EQ(json(refused)["error_code"], "INVALID_PARAMETER_VALUE") << body;
  }
  const http::Response self = call(http::Method::kDelete, prefix + "/admin", kAdmin);
  EXPECT_EQ(self.status, 400);
  EXPECT_THAT(json(self)["message"].get<std::string>(), HasSubstr("the one making this call"));
  EXPECT_EQ(call(http::Method::kDelete, prefix + "/ci", kAdmin).status, 200);
  EXPECT_EQ(service_.revoked_, std::vector<std::string>{"ci"});
}

TEST(ApiErrorBodyTest, NamesTheServersOwnErrors) {
  const nlohmann::json body = nlohmann::json::parse(api_error_body(413, "too large"));
  EXPECT_EQ(body["error_code"], "REQUEST_TOO_LARGE");
  EXPECT_EQ(body["message"], "too large");
  EXPECT_EQ(nlohmann::json::parse(api_error_body(503, "x"))["error_code"],
            "TEMPORARILY_UNAVAILABLE");
}

}  // namespace
}  // namespace flotilla::control

// The control plane over its two seams (issue #19): a FakeOrchestrator and a RecordingGateway
// stand in for the replica driver and the gateway, so what it publishes and asks for is read
// directly. Real parts otherwise: the SQLite store in a temporary directory and the REST API on
// a loopback port.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "control/control.h"
#include "control/store.h"
#include "fakes/autoscaler/load_samples.h"
#include "fakes/common/fake_clock.h"
#include "fakes/gateway/recording_gateway.h"
#include "fakes/orchestrator/fake_orchestrator.h"
#include "http/http.h"

namespace flotilla::control {
namespace {

using testing::FakeOrchestrator;
using testing::RecordingGateway;

constexpr auto kWait = std::chrono::seconds(20);  // a bound on waits for the reconciler

class ControlPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("flotilla-control-plane-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    options_.data_dir = dir_.string();
    options_.api.host = "127.0.0.1";
    options_.api.port = 0;
    options_.reconcile_interval = std::chrono::milliseconds(20);
    // The spec checks that the model exists; the fake orchestrator never reads it.
    std::filesystem::create_directories(dir_);
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all);
    model_ = (dir_ / "model.json").string();
    std::ofstream(model_) << "{}";
  }
  void TearDown() override {
    stop();
    std::filesystem::remove_all(dir_);
  }

  void start() {
    auto created = ControlPlane::create(options_, orchestrator_, gateway_, registry_, clock_);
    ASSERT_TRUE(created.is_ok()) << created.status().message();
    control_ = std::move(created).value();
    api_thread_ = std::thread([this] { control_->run(); });
  }
  void stop() {
    if (control_ != nullptr) {
      // The order of `flotilla up`: the control plane, then the orchestrator, whose watcher
      // calls into the control plane until it is shut down.
      control_->shutdown(std::chrono::seconds(5));
      api_thread_.join();
      orchestrator_.shutdown(std::chrono::seconds(5));
      control_.reset();
    }
  }

  http::ClientResponse api(http::Method method, const std::string& target, std::string body = "") {
    http::ClientRequest request;
    request.method = method;
    request.target = target;
    request.body = std::move(body);
    request.headers.emplace_back("Authorization", "Bearer " + control_->new_admin_token());
    request.headers.emplace_back("Content-Type", "application/json");
    return http::fetch("127.0.0.1", control_->api_port(), std::move(request),
                       std::chrono::seconds(10));
  }

  // A spec of one version of `model_`; `extra` goes into the served model.
  std::string spec(const std::string& name, int min_concurrency, const std::string& extra = "",
                   int max_concurrency = 8) {
    return R"({"name": ")" + name + R"(", "served_models": [{"name": "v1", "model": ")" + model_ +
           R"(", "runtime": "xgboost", "concurrency": {"min": )" + std::to_string(min_concurrency) +
           R"(, "max": )" + std::to_string(max_concurrency) + "}" + extra + "}]}";
  }

  // Creates endpoint `fraud` (concurrency 1..256, xgboost) and waits for its one replica;
  // returns its deployment key.
  std::string deploy_fraud() {
    EXPECT_EQ(
        api(http::Method::kPost, "/api/2.0/serving-endpoints", spec("fraud", 1, "", 256)).status,
        200);
    EXPECT_TRUE(orchestrator_.wait_for_wanted("fraud", 1, kWait));
    return orchestrator_.list().at(0).deployment.key;
  }
  // One fake second: the clock moves, the gateway's samples become `samples`, and two passes of
  // the reconciler run (the second began after the clock moved and the samples grew).
  void pass_a_second(std::vector<LoadSample> samples) {
    const int reads = gateway_.sample_reads();
    clock_.advance(std::chrono::seconds(1));
    gateway_.set_samples("fraud", std::move(samples));
    ASSERT_TRUE(gateway_.wait_for_sample_reads(reads + 2, kWait));
  }

  std::filesystem::path dir_;
  std::string model_;
  ControlOptions options_;
  MetricsRegistry registry_;
  testing::FakeClock clock_;
  FakeOrchestrator orchestrator_;
  RecordingGateway gateway_;
  std::unique_ptr<ControlPlane> control_;
  std::thread api_thread_;
};

const gateway::VersionEntry* version_of(const gateway::EndpointTable& table,
                                        std::string_view endpoint) {
  const gateway::EndpointEntry* entry = table.find(endpoint);
  return entry == nullptr || entry->versions.empty() ? nullptr : &entry->versions[0];
}

// A table predicate: `endpoint`'s first version has exactly one replica.
std::function<bool(const gateway::EndpointTable&)> serves_with_one_replica(std::string endpoint) {
  return [endpoint = std::move(endpoint)](const gateway::EndpointTable& table) {
    const gateway::VersionEntry* v1 = version_of(table, endpoint);
    return v1 != nullptr && v1->replicas.size() == 1;
  };
}

TEST_F(ControlPlaneTest, PublishesTokensAndSubscribesToCapacityUntilShutdown) {
  start();
  const gateway::AuthConfig auth = gateway_.auth();
  EXPECT_TRUE(auth.enabled);
  ASSERT_EQ(auth.tokens.size(), 1u);
  EXPECT_EQ(auth.tokens[0].id, "admin");
  EXPECT_EQ(auth.open_routes, std::vector<std::string>{"health"});
  EXPECT_NE(gateway_.requester(), nullptr);

  stop();
  EXPECT_EQ(gateway_.requester(), nullptr);  // nothing calls a destroyed control plane
}

TEST_F(ControlPlaneTest, AnEndpointReachesTheGatewayWithTheReplicasTheOrchestratorMade) {
  start();
  const http::ClientResponse created =
      api(http::Method::kPost, "/api/2.0/serving-endpoints", spec("fraud", 1));
  ASSERT_EQ(created.status, 200) << created.body;

  ASSERT_TRUE(orchestrator_.wait_for_wanted("fraud", 1, kWait));
  ASSERT_TRUE(gateway_.wait_for_table(serves_with_one_replica("fraud"), kWait));
  const gateway::EndpointTable table = gateway_.table();
  const gateway::VersionEntry& v1 = *version_of(table, "fraud");
  EXPECT_EQ(v1.name, "v1");
  EXPECT_EQ(v1.traffic, 100);
  EXPECT_EQ(v1.runtime, "xgboost");
  const orchestrator::Replica made = orchestrator_.list().at(0);
  EXPECT_EQ(v1.replicas[0].id, made.id);
  EXPECT_EQ(v1.replicas[0].port, made.port);
  EXPECT_GT(v1.replicas[0].max_in_flight, 0);

  const http::ClientResponse deleted =
      api(http::Method::kDelete, "/api/2.0/serving-endpoints/fraud");
  ASSERT_EQ(deleted.status, 200) << deleted.body;
  ASSERT_TRUE(gateway_.wait_for_table(
      [](const gateway::EndpointTable& table) { return table.find("fraud") == nullptr; }, kWait));
  EXPECT_EQ(orchestrator_.wanted(made.deployment.key), 0);
}

// A replica that becomes ready reaches the gateway's table on its event, not at the reconciler's
// next interval (an hour here): the cold start a scale-up pays is the replica's own.
TEST_F(ControlPlaneTest, AReadyReplicaReachesTheTableOnItsEvent) {
  options_.reconcile_interval = std::chrono::hours(1);
  start();
  ASSERT_EQ(api(http::Method::kPost, "/api/2.0/serving-endpoints", spec("fraud", 1)).status, 200);
  ASSERT_TRUE(orchestrator_.wait_for_wanted("fraud", 1, kWait));
  EXPECT_TRUE(gateway_.wait_for_table(serves_with_one_replica("fraud"), kWait));
}

TEST_F(ControlPlaneTest, ACapacityRequestFromTheGatewayStartsAScaledToZeroEndpoint) {
  start();
  const http::ClientResponse created = api(http::Method::kPost, "/api/2.0/serving-endpoints",
                                           spec("rare", 0, R"(, "scale_to_zero": true)"));
  ASSERT_EQ(created.status, 200) << created.body;
  ASSERT_TRUE(gateway_.wait_for_table(
      [](const gateway::EndpointTable& table) { return table.find("rare") != nullptr; }, kWait));
  EXPECT_TRUE(version_of(gateway_.table(), "rare")->replicas.empty());
  EXPECT_FALSE(orchestrator_.wait_for_wanted("rare", 1, std::chrono::seconds(0)));

  // What the gateway does for a request that finds no ready replica.
  gateway_.requester()->request_capacity("rare");
  ASSERT_TRUE(orchestrator_.wait_for_wanted("rare", 1, kWait));
  ASSERT_TRUE(gateway_.wait_for_table(serves_with_one_replica("rare"), kWait));
}

// The autoscaler runs on the injected clock and reads the gateway's samples through the sink:
// fake seconds of steady load pass without sleeping, and its decision reaches the orchestrator.
TEST_F(ControlPlaneTest, TheAutoscalerScalesOnTheGatewaysSamplesAtItsCadence) {
  start();
  const std::string key = deploy_fraud();

  // 40 in flight on one replica at a learned target of 16 asks for ceil(40 / 16) = 3 replicas.
  // More than the ready replica holds: the fast path decides at the next 1 s sample, not at the
  // 5 s cycle.
  const int64_t from_ms = clock_.unix_ms();
  int seconds = 0;
  for (; seconds < 30 && orchestrator_.wanted(key) < 3; ++seconds) {
    pass_a_second(sample_builders::steady(from_ms, seconds + 1, 40));
  }
  EXPECT_EQ(orchestrator_.wanted(key), 3);
  EXPECT_LE(seconds, 2);
}

// The forecast on compressed days (a "day" of 20 s, looking 10 s ahead): two days of a peak of
// 40 in flight from the 11th to the 15th second are stored in the state database, and on the
// third day the replicas are asked for before the peak comes, as an event that gives the
// forecast.
TEST_F(ControlPlaneTest, TheForecastStoresDemandAndRaisesTheFloorBeforeADailyPeak) {
  options_.autoscaling.forecast_day = std::chrono::seconds(20);
  // Short windows and cycles: the replicas the peaks themselves brought are gone before the
  // next day's peak, so what raises them then is the forecast.
  options_.autoscaling.horizontal_period = std::chrono::seconds(1);
  options_.autoscaling.up_window = std::chrono::seconds(2);
  options_.autoscaling.down_window = std::chrono::seconds(2);
  options_.autoscaling.vertical_period = std::chrono::hours(1);  // the target stays 16
  start();
  const std::string key = deploy_fraud();
  // Days start at a multiple of 20 s, as the forecaster's seasons do.
  clock_.advance(std::chrono::milliseconds(20'000 - clock_.unix_ms() % 20'000));
  const int64_t day0_ms = clock_.unix_ms();
  std::vector<LoadSample> samples;
  const auto live_second = [&](int second) {
    const int of_day = second % 20;
    const bool peak = of_day >= 11 && of_day <= 15;
    samples.push_back(sample_builders::steady(day0_ms + second * 1'000, 1, peak ? 40 : 2)[0]);
    pass_a_second(samples);
  };
  for (int second = 0; second < 40; ++second) {
    live_second(second);
  }
  ASSERT_EQ(orchestrator_.wanted(key), 1);  // down again after day 1's peak
  // Day 2, before the peak: 2 in flight, which asks for one replica. The forecast looks 10 s
  // ahead and sees the peak from the day's second 1 on.
  for (int second = 40; second <= 50 && orchestrator_.wanted(key) < 3; ++second) {
    live_second(second);
  }
  EXPECT_EQ(orchestrator_.wanted(key), 3);  // ceil(40 / 16), with 2 in flight
  const http::ClientResponse response =
      api(http::Method::kGet, "/api/2.0/serving-endpoints/fraud/events?limit=1000");
  ASSERT_EQ(response.status, 200);
  std::string raise;
  const nlohmann::json body = nlohmann::json::parse(response.body);
  for (const auto& event : body["events"]) {
    const std::string message = event["message"].get<std::string>();
    raise = message.find("forecast:") != std::string::npos ? message : raise;
  }
  EXPECT_NE(raise.find("horizontal: 1 -> 3 replicas: forecast: "), std::string::npos) << raise;
  EXPECT_NE(raise.find("concurrency 40.0 (the median of the last 2 days)"), std::string::npos)
      << raise;

  // The history is in the database, for the next start.
  auto store = Store::open((dir_ / "state.db").string());
  ASSERT_TRUE(store.is_ok()) << store.status().message();
  auto history = store.value()->list_demand("fraud");
  ASSERT_TRUE(history.is_ok());
  EXPECT_GE(history->size(), 39u);  // every second but the newest
  const auto peaks = std::count_if(history->begin(), history->end(),
                                   [](const DemandBucket& bucket) { return bucket.peak == 40; });
  EXPECT_EQ(peaks, 10);  // five seconds a day, two days
}

}  // namespace
}  // namespace flotilla::control

// The local orchestrator against real `flotilla replica` processes on 127.0.0.1, serving a
// synthetic model (a YAML file) so no training is needed.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "http/http.h"
#include "orchestrator/orchestrator.h"

extern char** environ;

namespace flotilla::orchestrator {
namespace {

using namespace std::chrono_literals;

// Polls `condition` until it holds or `timeout` passes.
bool wait_for(const std::function<bool()>& condition, std::chrono::milliseconds timeout = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) {
      return true;
    }
    std::this_thread::sleep_for(10ms);
  }
  return condition();
}

bool process_exists(int64_t pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0) {
    return false;
  }
  // A zombie still "exists" for kill(); /proc tells.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] != 'Z';
}

class LocalOrchestratorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("flotilla-orchestrator-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "model.yaml") << "service_time: {dist: fixed, mean_ms: 1}\n";
    std::ofstream(dir_ / "broken.yaml") << "service_time: {dist: nonsense}\n";
    options_.binary = FLOTILLA_BIN;
    options_.log_dir = (dir_ / "logs").string();
    options_.warm_pool_size = 0;
    options_.drain_delay = 100ms;
    options_.stop_timeout = 5s;
    options_.restart_backoff = 200ms;
    options_.replica_args = {"--log-level", "warn", "--workers", "1"};
  }

  void TearDown() override {
    orchestrator_.reset();
    std::filesystem::remove_all(dir_);
  }

  void start() {
    auto created = create_local_orchestrator(options_);
    ASSERT_TRUE(created.is_ok()) << created.status().message();
    orchestrator_ = std::move(created).value();
    orchestrator_->watch([this](const ReplicaEvent& event) {
      std::lock_guard lock(mu_);
      events_.push_back(event);
    });
  }

  Deployment deployment(const std::string& model = "model.yaml") const {
    Deployment result;
    result.key = "fraud/v1/" + model;
    result.endpoint = "fraud";
    result.version = "v1";
    result.model = (dir_ / model).string();
    result.runtime = "synthetic";
    return result;
  }

  std::vector<Replica> in_state(ReplicaState state) const {
    std::vector<Replica> matching;
    for (const Replica& replica : orchestrator_->list()) {
      if (replica.state == state) {
        matching.push_back(replica);
      }
    }
    return matching;
  }

  int count_events(const std::string& kind) {
    std::lock_guard lock(mu_);
    return static_cast<int>(std::count_if(events_.begin(), events_.end(),
                                          [&](const ReplicaEvent& e) { return e.kind == kind; }));
  }

  std::vector<ReplicaEvent> events_of(const std::string& kind) {
    std::lock_guard lock(mu_);
    std::vector<ReplicaEvent> matching;
    for (const ReplicaEvent& event : events_) {
      if (event.kind == kind) {
        matching.push_back(event);
      }
    }
    return matching;
  }

  std::filesystem::path dir_;
  LocalOptions options_;
  std::unique_ptr<Orchestrator> orchestrator_;
  std::mutex mu_;
  std::vector<ReplicaEvent> events_;
};

TEST_F(LocalOrchestratorTest, StartsReplicasThatServe) {
  start();
  orchestrator_->ensure(deployment(), 2);
  ASSERT_TRUE(wait_for([&] { return in_state(ReplicaState::kReady).size() == 2; }));
  for (const Replica& replica : in_state(ReplicaState::kReady)) {
    http::ClientRequest request;
    request.method = http::Method::kGet;
    request.target = "/v2/models/fraud";
    const http::ClientResponse response =
        http::fetch(replica.host, replica.port, std::move(request), 5s);
    EXPECT_EQ(response.status, 200) << response.error;
    EXPECT_GT(replica.process_start_ticks, 0u);
    EXPECT_GE(replica.ready_unix_ms, replica.started_unix_ms);
    EXPECT_NE(replica.id.find("fraud-v1-"), std::string::npos);
  }
  EXPECT_EQ(count_events("started"), 2);
  EXPECT_EQ(count_events("ready"), 2);
  orchestrator_->ensure(deployment(), 2);  // idempotent: nothing new starts
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(count_events("started"), 2);
}

TEST_F(LocalOrchestratorTest, ReplacesAKilledReplicaAndSaysWhy) {
  start();
  orchestrator_->ensure(deployment(), 1);
  ASSERT_TRUE(wait_for([&] { return in_state(ReplicaState::kReady).size() == 1; }));
  const Replica victim = in_state(ReplicaState::kReady).front();
  ASSERT_EQ(::kill(static_cast<pid_t>(victim.pid), SIGKILL), 0);
  ASSERT_TRUE(wait_for([&] { return count_events("failed") == 1; }));
  EXPECT_EQ(events_of("failed").front().replica.id, victim.id);
  EXPECT_NE(events_of("failed").front().message.find("killed by signal 9"), std::string::npos);
  ASSERT_TRUE(wait_for([&] {
    const auto ready = in_state(ReplicaState::kReady);
    return ready.size() == 1 && ready.front().id != victim.id;
  }));
  // The failed one stays listed for a while to show why.
  ASSERT_EQ(in_state(ReplicaState::kFailed).size(), 1u);
}

TEST_F(LocalOrchestratorTest, BacksOffAFailingDeploymentAndReportsTheReplicasError) {
  start();
  orchestrator_->ensure(deployment("broken.yaml"), 1);
  ASSERT_TRUE(wait_for([&] { return count_events("failed") >= 2; }));
  const ReplicaEvent failure = events_of("failed").front();
  EXPECT_NE(failure.message.find("exited with status 2"), std::string::npos) << failure.message;
  EXPECT_NE(failure.message.find("cannot load model"), std::string::npos) << failure.message;
  // Backoff 200 ms doubling: starts at about 0, 0.2, 0.6, 1.4 s. Without it a failing replica
  // restarts every few milliseconds.
  const int started = count_events("started");
  std::this_thread::sleep_for(1200ms);
  EXPECT_LE(count_events("started") - started, 4);
}

TEST_F(LocalOrchestratorTest, ScalesDownAndRetiresByDrainingThenStopping) {
  start();
  orchestrator_->ensure(deployment(), 2);
  ASSERT_TRUE(wait_for([&] { return in_state(ReplicaState::kReady).size() == 2; }));
  const std::vector<Replica> before = in_state(ReplicaState::kReady);
  orchestrator_->ensure(deployment(), 1);
  ASSERT_TRUE(wait_for([&] { return count_events("stopped") == 1; }));
  EXPECT_EQ(events_of("draining").front().message, "scaled down");
  EXPECT_EQ(events_of("stopped").front().message, "exited with status 0");  // a clean drain
  orchestrator_->ensure(deployment(), 0);
  ASSERT_TRUE(wait_for([&] { return orchestrator_->list().empty(); }));
  for (const Replica& replica : before) {
    EXPECT_TRUE(wait_for([&] { return !process_exists(replica.pid); }));
  }
}

TEST_F(LocalOrchestratorTest, DrainOfOneReplicaStartsAReplacement) {
  start();
  orchestrator_->ensure(deployment(), 1);
  ASSERT_TRUE(wait_for([&] { return in_state(ReplicaState::kReady).size() == 1; }));
  const Replica first = in_state(ReplicaState::kReady).front();
  ASSERT_TRUE(orchestrator_->drain(first.id).is_ok());
  EXPECT_EQ(orchestrator_->drain("no-such-replica").code(), StatusCode::kNotFound);
  ASSERT_TRUE(wait_for([&] {
    const auto ready = in_state(ReplicaState::kReady);
    return ready.size() == 1 && ready.front().id != first.id && count_events("stopped") == 1;
  }));
}

TEST_F(LocalOrchestratorTest, WarmPoolReplicasOnlyLoadTheirModel) {
  options_.warm_pool_size = 1;
  options_.warm_pool_runtimes = {"synthetic"};
  start();
  std::this_thread::sleep_for(300ms);  // the pool fills; a replica started earlier is fine too
  orchestrator_->ensure(deployment(), 1);
  ASSERT_TRUE(wait_for([&] { return in_state(ReplicaState::kReady).size() == 1; }));
  const Replica replica = in_state(ReplicaState::kReady).front();
  EXPECT_TRUE(replica.from_warm_pool);
  EXPECT_TRUE(std::filesystem::exists(options_.log_dir + "/" + replica.id + ".log"));
}

TEST_F(LocalOrchestratorTest, AdoptsARunningReplicaAndReportsLostOnes) {
  // A replica process this orchestrator did not start, as after a restart of `flotilla up`.
  const std::string port = "0";
  std::vector<std::string> args = {
      FLOTILLA_BIN, "replica",   "--model",     (dir_ / "model.yaml").string(),
      "--runtime",  "synthetic", "--name",      "fraud",
      "--port",     "0",         "--log-level", "warn"};
  std::vector<char*> argv;
  for (std::string& arg : args) {
    argv.push_back(arg.data());
  }
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);

  start();
  Replica adopted;
  adopted.id = "fraud-v1-adopted";
  adopted.deployment = deployment();
  adopted.host = "127.0.0.1";
  adopted.port = 1;  // not probed: it is adopted as ready
  adopted.pid = pid;
  ASSERT_TRUE(wait_for([&] {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    return stat.good();
  }));
  {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), {});
    std::istringstream fields(text.substr(text.rfind(')') + 2));
    std::string field;
    for (int index = 3; index <= 22; ++index) {
      fields >> field;
    }
    adopted.process_start_ticks = std::stoull(field);
  }
  adopted.state = ReplicaState::kReady;
  Replica lost = adopted;
  lost.id = "fraud-v1-lost";
  lost.process_start_ticks += 1;  // the pid was reused by another process
  orchestrator_->adopt({adopted, lost});
  // Reported from the orchestrator's thread, like every event.
  ASSERT_TRUE(wait_for([&] { return count_events("adopted") == 1 && count_events("lost") == 1; }));

  orchestrator_->ensure(deployment(), 1);  // the adopted replica counts
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(count_events("started"), 0);

  ::kill(pid, SIGKILL);
  ASSERT_TRUE(wait_for([&] { return count_events("failed") == 1; }));
  ASSERT_TRUE(wait_for([&] { return in_state(ReplicaState::kReady).size() == 1; }));
  ::waitpid(pid, nullptr, WNOHANG);
}

TEST_F(LocalOrchestratorTest, ShutdownStopsEveryProcess) {
  options_.warm_pool_size = 1;
  options_.warm_pool_runtimes = {"synthetic"};
  start();
  orchestrator_->ensure(deployment(), 2);
  ASSERT_TRUE(wait_for([&] { return in_state(ReplicaState::kReady).size() == 2; }));
  const std::vector<Replica> replicas = in_state(ReplicaState::kReady);
  orchestrator_->shutdown(5s);
  for (const Replica& replica : replicas) {
    EXPECT_FALSE(process_exists(replica.pid)) << replica.id;
  }
  orchestrator_->ensure(deployment(), 1);  // ignored after shutdown
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(in_state(ReplicaState::kStarting).empty());
}

TEST(ProcessCpuTest, ReadsThisProcessAndRefusesAMissingOne) {
  const double before = process_cpu_seconds(::getpid());
  ASSERT_GE(before, 0);
  volatile double sink = 0;
  for (int i = 0; i < 50'000'000; ++i) {
    sink = sink + i;
  }
  EXPECT_GT(process_cpu_seconds(::getpid()), before);
  EXPECT_EQ(process_cpu_seconds(0), -1);
}

TEST(CgroupTest, ReasonNamesWhatIsMissing) {
  const std::string reason = cgroup_unavailable_reason("/nonexistent-root/flotilla");
  EXPECT_NE(reason.find("/nonexistent-root"), std::string::npos) << reason;
}

}  // namespace
}  // namespace flotilla::orchestrator

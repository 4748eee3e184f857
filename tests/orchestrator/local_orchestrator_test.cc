// The local orchestrator against real `flotilla replica` processes on 127.0.0.1, serving a
// synthetic model (a YAML file) so no training is needed.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fakes/common/fake_clock.h"
#include "http/http.h"
#include "orchestrator/external.h"
#include "orchestrator/orchestrator.h"
#include "orchestrator/process_util.h"

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
    auto created = create_local_orchestrator(options_, *clock_);
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
  flotilla::testing::FakeClock fake_clock_;  // outlives orchestrator_ (reset in TearDown)
  Clock* clock_ = &real_clock();             // a test may point it at fake_clock_ before start()
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
  flotilla::testing::FakeClock& clock = fake_clock_;
  clock_ = &clock;
  options_.drain_delay = 0ms;  // the drains of shutdown() need no clock time
  start();
  orchestrator_->ensure(deployment("broken.yaml"), 1);
  ASSERT_TRUE(wait_for([&] { return count_events("failed") == 1; }));
  const ReplicaEvent failure = events_of("failed").front();
  EXPECT_NE(failure.message.find("exited with status 2"), std::string::npos) << failure.message;
  EXPECT_NE(failure.message.find("cannot load model"), std::string::npos) << failure.message;
  // Backoff 200 ms doubling, on the orchestrator's clock: the second start comes 200 ms after
  // the first failure, the third 400 ms after the second. Without it a failing replica
  // restarts every few milliseconds. The sleeps only let ticks pass; the clock stands still.
  EXPECT_EQ(count_events("started"), 1);
  clock.advance(199ms);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(count_events("started"), 1);
  clock.advance(1ms);
  ASSERT_TRUE(wait_for([&] { return count_events("failed") == 2; }));
  EXPECT_EQ(count_events("started"), 2);
  clock.advance(399ms);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(count_events("started"), 2);
  clock.advance(1ms);
  ASSERT_TRUE(wait_for([&] { return count_events("started") == 3; }));
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

  options_.liveness_timeout = 0ms;  // its record's port (1) answers no liveness probe
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

// Issue 18: a spec asking for 100,000 replicas started 178 processes in 4.7 s. The cap holds
// across deployments, counts draining replicas until they exit, and is reported once.
TEST_F(LocalOrchestratorTest, NeverStartsPastTheHostWideCap) {
  options_.max_replicas = 3;
  start();
  orchestrator_->ensure(deployment(), 5);
  ASSERT_TRUE(wait_for([&] { return in_state(ReplicaState::kReady).size() == 3; }));
  Deployment other = deployment();
  other.key = "other/v1/model.yaml";
  other.endpoint = "other";
  orchestrator_->ensure(other, 1);
  std::this_thread::sleep_for(300ms);  // many ticks
  EXPECT_EQ(orchestrator_->list().size(), 3u);
  EXPECT_EQ(count_events("started"), 3);
  ASSERT_TRUE(wait_for([&] { return count_events("capped") == 2; }));
  const std::vector<ReplicaEvent> capped = events_of("capped");
  EXPECT_EQ(capped[0].replica.deployment.key, deployment().key);
  EXPECT_TRUE(capped[0].replica.id.empty());
  EXPECT_NE(capped[0].message.find("wants 5 replicas and has 0; the host-wide cap of 3 replica "
                                   "processes (flotilla up --max-replicas) leaves room for 3 more"),
            std::string::npos)
      << capped[0].message;
  EXPECT_EQ(capped[1].replica.deployment.key, other.key);
  // Room made by a scale-down goes to the other deployment once the drained replica exited.
  orchestrator_->ensure(deployment(), 2);
  ASSERT_TRUE(wait_for([&] {
    const auto ready = in_state(ReplicaState::kReady);
    return ready.size() == 3 && std::any_of(ready.begin(), ready.end(), [&](const Replica& r) {
             return r.deployment.key == other.key;
           });
  }));
  EXPECT_EQ(count_events("stopped"), 1);
  EXPECT_EQ(count_events("capped"), 2);  // once per deployment, not per tick
}

// Issue 18: a replica that stops answering (SIGSTOP) was only routed around. Its liveness
// probes fail; after liveness_timeout it is killed (SIGTERM would do nothing to a stopped
// process) and replaced.
TEST_F(LocalOrchestratorTest, ReplacesAHungReplica) {
  options_.liveness_timeout = 1000ms;
  start();
  orchestrator_->ensure(deployment(), 1);
  ASSERT_TRUE(wait_for([&] { return in_state(ReplicaState::kReady).size() == 1; }));
  const Replica victim = in_state(ReplicaState::kReady).front();
  ASSERT_EQ(::kill(static_cast<pid_t>(victim.pid), SIGSTOP), 0);
  const auto stopped = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_for([&] { return count_events("hung") == 1; }));
  const ReplicaEvent hung = events_of("hung").front();
  EXPECT_EQ(hung.replica.id, victim.id);
  EXPECT_EQ(hung.replica.state, ReplicaState::kFailed);
  EXPECT_NE(hung.message.find("hung: no liveness answer in "), std::string::npos) << hung.message;
  EXPECT_NE(hung.message.find(" s; replaced"), std::string::npos) << hung.message;
  ASSERT_TRUE(wait_for([&] {
    const auto ready = in_state(ReplicaState::kReady);
    return ready.size() == 1 && ready.front().id != victim.id;
  }));
  // Not before the timeout: a replica is hung only after liveness_timeout without an answer.
  EXPECT_GE(std::chrono::steady_clock::now() - stopped, 1000ms);
  EXPECT_TRUE(wait_for([&] { return !process_exists(victim.pid); }));
  EXPECT_EQ(count_events("hung"), 1);  // the healthy replacement is left alone
}

std::vector<std::string> ids_of(const std::vector<Replica>& replicas) {
  std::vector<std::string> ids;
  for (const Replica& replica : replicas) {
    ids.push_back(replica.id);
  }
  return ids;
}

// Issue 19: the autoscaler's per-replica usage comes from the orchestrator, which reads the
// processes (/proc) and each replica's in-replica queue (its /metrics).
TEST_F(LocalOrchestratorTest, UsageReadsEachReplicasCpuMemoryAndQueue) {
  start();
  orchestrator_->ensure(deployment(), 2);
  ASSERT_TRUE(wait_for([&] { return in_state(ReplicaState::kReady).size() == 2; }));
  const std::vector<Replica> ready = in_state(ReplicaState::kReady);
  std::vector<std::string> ids = ids_of(ready);
  ids.push_back("nobody");  // unknown: left out
  const std::vector<UsageReading> readings = orchestrator_->usage(ids, 5s);
  ASSERT_EQ(readings.size(), 2u);
  for (const UsageReading& reading : readings) {
    EXPECT_TRUE(std::any_of(ready.begin(), ready.end(),
                            [&](const Replica& r) { return r.id == reading.replica_id; }));
    EXPECT_GE(reading.cpu_seconds, 0) << reading.replica_id;
    EXPECT_GT(reading.memory_bytes, 0) << reading.replica_id;
    ASSERT_TRUE(reading.queue_wait_seconds.has_value()) << reading.replica_id;
    EXPECT_GE(*reading.queue_wait_seconds, 0);
  }
}

// Issue 19: the reconciler used to read each replica's /metrics one after another with 500 ms
// each, so hung replicas stalled it for 500 ms apiece. The query reads them at once and ends
// by its deadline, with what /proc tells of the hung ones.
TEST_F(LocalOrchestratorTest, HungReplicasDoNotStallTheUsageQueryPastItsDeadline) {
  options_.liveness_timeout = 0ms;  // the stopped replicas stay listed as ready
  start();
  orchestrator_->ensure(deployment(), 4);
  ASSERT_TRUE(wait_for([&] { return in_state(ReplicaState::kReady).size() == 4; }));
  const std::vector<Replica> ready = in_state(ReplicaState::kReady);
  for (size_t i = 1; i < ready.size(); ++i) {
    ASSERT_EQ(::kill(static_cast<pid_t>(ready[i].pid), SIGSTOP), 0);
  }
  // kill() returns before the stop takes effect: on a loaded machine a replica could still
  // answer a request the query sends at once. Wait until /proc shows each one stopped (T).
  for (size_t i = 1; i < ready.size(); ++i) {
    const std::string stat = "/proc/" + std::to_string(ready[i].pid) + "/stat";
    ASSERT_TRUE(wait_for([&] {
      std::ifstream in(stat);
      const std::string line((std::istreambuf_iterator<char>(in)), {});
      const size_t paren = line.rfind(')');
      return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T';
    })) << ready[i].id;
  }
  const auto before = std::chrono::steady_clock::now();
  const std::vector<UsageReading> readings = orchestrator_->usage(ids_of(ready), 400ms);
  const auto took = std::chrono::steady_clock::now() - before;
  for (size_t i = 1; i < ready.size(); ++i) {
    ::kill(static_cast<pid_t>(ready[i].pid), SIGCONT);
  }
  EXPECT_LT(took, 1000ms);  // one after another: 3 x 400 ms
  ASSERT_EQ(readings.size(), 4u);
  for (const UsageReading& reading : readings) {
    const bool hung = reading.replica_id != ready[0].id;
    EXPECT_EQ(reading.queue_wait_seconds.has_value(), !hung) << reading.replica_id;
    EXPECT_GE(reading.cpu_seconds, 0) << reading.replica_id;  // /proc answers for a stopped one
  }
}

// Starts `command` under /bin/sh in the background and returns the background job's pid: once
// the shell exits, that process is no child of ours (as a replica left by a killed `flotilla
// up` is no child of the next one).
int64_t start_orphan(const std::filesystem::path& dir, const std::string& command) {
  const std::filesystem::path pid_file = dir / ("orphan-" + std::to_string(std::rand()));
  const std::string script = command + " >/dev/null 2>&1 & echo $! > " + pid_file.string();
  std::vector<std::string> args = {"/bin/sh", "-c", script};
  std::vector<char*> argv;
  for (std::string& arg : args) {
    argv.push_back(arg.data());
  }
  argv.push_back(nullptr);
  pid_t shell = 0;
  if (posix_spawn(&shell, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
    return 0;
  }
  ::waitpid(shell, nullptr, 0);
  std::ifstream in(pid_file);
  int64_t pid = 0;
  in >> pid;
  return pid;
}

uint64_t start_ticks_of(int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  if (text.rfind(')') == std::string::npos) {
    return 0;
  }
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  for (int index = 3; index <= 22; ++index) {
    fields >> field;
  }
  return std::stoull(field);
}

// Issue 18: a replica spawned a moment before its record was written (then kill -9 of `flotilla
// up`) was never adopted and ran forever. Processes with our marker that no record describes
// are stopped by adopt(); recorded ones and other instances' are left alone.
TEST_F(LocalOrchestratorTest, AdoptStopsUnrecordedProcessesWithOurMarker) {
  options_.instance = dir_.string();
  options_.liveness_timeout = 0ms;  // the record's port (1) answers no liveness probe
  const std::string replica = std::string(FLOTILLA_BIN) + " replica --model " +
                              (dir_ / "model.yaml").string() +
                              " --runtime synthetic --name fraud --port 0 --log-level warn";
  const std::string ours = std::string(kInstanceEnv) + "=" + options_.instance;
  // Each in a session and process group of its own, as spawn() starts replicas; setsid (not a
  // group leader in the background) execs in place, so the pid stays the job's.
  const int64_t stray = start_orphan(dir_, ours + " setsid " + replica);
  const int64_t recorded = start_orphan(dir_, ours + " setsid " + replica);
  const int64_t foreign =
      start_orphan(dir_, std::string(kInstanceEnv) + "=/elsewhere setsid " + replica);
  // Marked but in another's group: what a replica's server started (its workers), not a stray.
  const int64_t worker = start_orphan(dir_, ours + " " + replica);
  ASSERT_GT(stray, 0);
  ASSERT_GT(recorded, 0);
  ASSERT_GT(foreign, 0);
  ASSERT_GT(worker, 0);
  ASSERT_TRUE(wait_for([&] {
    return start_ticks_of(stray) && start_ticks_of(recorded) && start_ticks_of(foreign) &&
           start_ticks_of(worker);
  }));
  start();
  Replica record;
  record.id = "fraud-v1-recorded";
  record.deployment = deployment();
  record.host = "127.0.0.1";
  record.port = 1;
  record.pid = recorded;
  record.process_start_ticks = start_ticks_of(recorded);
  record.state = ReplicaState::kReady;
  orchestrator_->adopt({record});
  EXPECT_TRUE(wait_for([&] { return !process_exists(stray); }, 10s)) << "the unrecorded one";
  ASSERT_TRUE(wait_for([&] { return count_events("adopted") == 1; }));
  EXPECT_TRUE(process_exists(recorded));
  EXPECT_TRUE(process_exists(foreign));
  EXPECT_TRUE(process_exists(worker));
  ::kill(static_cast<pid_t>(recorded), SIGKILL);
  ::kill(static_cast<pid_t>(foreign), SIGKILL);
  ::kill(static_cast<pid_t>(worker), SIGKILL);
}

// Issue 18: after kill -9 of `flotilla up` its standbys must not run on under pid 1, even
// when something still holds their stdin open (no end of input to see).
TEST_F(LocalOrchestratorTest, AStandbyDiesWithItsParent) {
  int keep_open[2];
  ASSERT_EQ(::pipe(keep_open), 0);
  // The shell is the standby's parent; the pipe is its stdin, our end stays open.
  const std::filesystem::path pid_file = dir_ / "standby.pid";
  const std::string script =
      std::string(FLOTILLA_BIN) +
      " replica --standby --runtime synthetic <&3 >/dev/null 2>&1 & echo $! > " +
      pid_file.string() + "; wait";
  std::vector<std::string> args = {"/bin/sh", "-c", script};
  std::vector<char*> argv;
  for (std::string& arg : args) {
    argv.push_back(arg.data());
  }
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, keep_open[0], 3);
  pid_t shell = 0;
  ASSERT_EQ(posix_spawn(&shell, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  int64_t standby = 0;
  ASSERT_TRUE(wait_for([&] {
    std::ifstream in(pid_file);
    return static_cast<bool>(in >> standby) && standby > 0;
  }));
  // Up and waiting on its stdin (the log line it writes then is not ours to read: poll a while).
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(process_exists(standby));
  ::kill(shell, SIGKILL);
  ::waitpid(shell, nullptr, 0);
  EXPECT_TRUE(wait_for([&] { return !process_exists(standby); }, 10s));
  ::kill(static_cast<pid_t>(standby), SIGKILL);  // should the test have failed
  ::close(keep_open[0]);
  ::close(keep_open[1]);
}

// A standby whose orchestrator died before it could arm the death signal sees a parent that
// is not the one named in its environment, and exits at once.
TEST_F(LocalOrchestratorTest, AStandbyWhoseParentIsAlreadyGoneExits) {
  int keep_open[2];
  ASSERT_EQ(::pipe(keep_open), 0);
  std::vector<std::string> args = {FLOTILLA_BIN, "replica", "--standby", "--runtime", "synthetic"};
  std::vector<char*> argv;
  for (std::string& arg : args) {
    argv.push_back(arg.data());
  }
  argv.push_back(nullptr);
  std::vector<std::string> env_text;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    env_text.emplace_back(*entry);
  }
  env_text.push_back(std::string(kParentEnv) + "=1");  // not us
  std::vector<char*> env;
  for (std::string& entry : env_text) {
    env.push_back(entry.data());
  }
  env.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, keep_open[0], 0);
  pid_t standby = 0;
  ASSERT_EQ(posix_spawn(&standby, argv[0], &actions, nullptr, argv.data(), env.data()), 0);
  posix_spawn_file_actions_destroy(&actions);
  int status = -1;
  EXPECT_TRUE(wait_for([&] { return ::waitpid(standby, &status, WNOHANG) == standby; }, 10s));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ::kill(standby, SIGKILL);
  ::waitpid(standby, nullptr, WNOHANG);
  ::close(keep_open[0]);
  ::close(keep_open[1]);
}

// ---- The external runtime ----------------------------------------------------------------

// A user's own server for the external runtime, in Python (not C++, and not `flotilla replica`):
// GET /ready answers 200, GET /info what it was started with, and it starts a child process, as
// servers with worker processes do, whose pid /info gives too.
constexpr char kExternalServer[] = R"(import http.server, json, os, subprocess, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
child = subprocess.Popen(["sleep", "600"])
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path == "/ready":
            body = b"{}"
        elif self.path == "/info":
            body = json.dumps({"args": args, "PORT": os.environ.get("PORT"), "cwd": os.getcwd(),
                               "greeting": os.environ.get("GREETING"), "child": child.pid}).encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(args["--port"])), Handler).serve_forever()
)";

class ExternalRuntimeTest : public LocalOrchestratorTest {
 protected:
  void SetUp() override {
    LocalOrchestratorTest::SetUp();
    std::ofstream(dir_ / "server.py") << kExternalServer;
    std::filesystem::create_directories(dir_ / "model");
  }

  Deployment external_deployment() const {
    Deployment result;
    result.key = "iris/v1/external";
    result.endpoint = "iris";
    result.version = "v1";
    result.model = (dir_ / "model").string();
    result.runtime = "external";
    result.external =
        ExternalCommand{{"python3", "../server.py", "--port", "{port}", "--grpc", "{port:grpc}",
                         "--model", "{model}", "--name", "{endpoint}-{version}"},
                        {{"GREETING", "hi {replica}"}},
                        "",  // the model's directory
                        "/ready"};
    return result;
  }

  // The server's /info.
  nlohmann::json info(const Replica& replica) {
    http::ClientRequest request;
    request.method = http::Method::kGet;
    request.target = "/info";
    const http::ClientResponse response =
        http::fetch(replica.host, replica.port, std::move(request), 5s);
    EXPECT_EQ(response.status, 200) << response.error;
    return nlohmann::json::parse(response.body, nullptr, false);
  }
};

TEST_F(ExternalRuntimeTest, StartsTheServerWithItsPortsModelAndNamesAndProbesItsReadyPath) {
  start();
  orchestrator_->ensure(external_deployment(), 1);
  ASSERT_TRUE(wait_for([&] { return in_state(ReplicaState::kReady).size() == 1; }));
  const Replica replica = in_state(ReplicaState::kReady).front();
  EXPECT_FALSE(replica.from_warm_pool);
  const nlohmann::json seen = info(replica);
  ASSERT_TRUE(seen.is_object());
  EXPECT_EQ(seen["args"]["--port"], std::to_string(replica.port));
  EXPECT_EQ(seen["PORT"], std::to_string(replica.port));
  const std::string grpc = seen["args"]["--grpc"];
  EXPECT_NE(grpc, std::to_string(replica.port));
  EXPECT_GT(std::stoi(grpc), 0);
  EXPECT_EQ(seen["args"]["--model"], (dir_ / "model").string());
  EXPECT_EQ(seen["args"]["--name"], "iris-v1");
  EXPECT_EQ(seen["greeting"], "hi " + replica.id);
  EXPECT_EQ(seen["cwd"], (dir_ / "model").string());
  // Its output goes to the replica's log file, as a replica's does.
  EXPECT_TRUE(std::filesystem::exists(dir_ / "logs" / (replica.id + ".log")));

  // Retired: drained, SIGTERM to its process group, so its child goes with it.
  const int64_t child = seen["child"];
  ASSERT_TRUE(process_exists(child));
  orchestrator_->ensure(external_deployment(), 0);
  ASSERT_TRUE(wait_for([&] { return count_events("stopped") == 1; }));
  EXPECT_TRUE(wait_for([&] { return !process_exists(replica.pid) && !process_exists(child); }));
}

TEST_F(ExternalRuntimeTest, ReplacesACrashedServerAndStopsWhatItLeftBehind) {
  start();
  orchestrator_->ensure(external_deployment(), 1);
  ASSERT_TRUE(wait_for([&] { return in_state(ReplicaState::kReady).size() == 1; }));
  const Replica victim = in_state(ReplicaState::kReady).front();
  const int64_t child = info(victim)["child"];
  ASSERT_EQ(::kill(static_cast<pid_t>(victim.pid), SIGKILL), 0);
  ASSERT_TRUE(wait_for([&] { return count_events("failed") == 1; }));
  EXPECT_NE(events_of("failed").front().message.find("killed by signal 9"), std::string::npos);
  // Its child would hold on to what the server opened: it is killed with the group.
  EXPECT_TRUE(wait_for([&] { return !process_exists(child); }));
  ASSERT_TRUE(wait_for([&] {
    const auto ready = in_state(ReplicaState::kReady);
    return ready.size() == 1 && ready.front().id != victim.id;
  }));
  orchestrator_->ensure(external_deployment(), 0);
  ASSERT_TRUE(wait_for([&] { return in_state(ReplicaState::kReady).empty(); }));
}

TEST_F(ExternalRuntimeTest, AServerThatNeverAnswersItsReadyPathTimesOut) {
  options_.ready_timeout = 1500ms;
  start();
  Deployment deployment = external_deployment();
  deployment.external->ready_path = "/not-served";  // 404: alive, never ready
  orchestrator_->ensure(deployment, 1);
  ASSERT_TRUE(wait_for([&] { return count_events("timeout") >= 1; }));
  EXPECT_EQ(events_of("timeout").front().message, "not ready within 1 s");
  orchestrator_->ensure(deployment, 0);
}

TEST(ExternalLaunchTest, ReplacesOnlyItsOwnPlaceholders) {
  const std::map<std::string, std::string> values = {{"port", "8000"}, {"port:grpc", "9000"}};
  EXPECT_EQ(expand_placeholders("--port={port}", values), "--port=8000");
  EXPECT_EQ(expand_placeholders("{port}{port:grpc}{port}", values), "800090008000");
  EXPECT_EQ(expand_placeholders("{\"a\": {port}}", values), "{\"a\": 8000}");
  EXPECT_EQ(expand_placeholders("{nope} {port", values), "{nope} {port");
  EXPECT_EQ(expand_placeholders("{{port}}", values), "{8000}");
  EXPECT_EQ(expand_placeholders("", values), "");
  ExternalCommand external;
  external.command = {"srv", "{port:grpc}", "{port:metrics}{port:grpc}", "{port:}"};
  external.env = {{"A", "{port:admin}"}, {"B", "{port}"}};
  EXPECT_EQ(extra_port_names(external), (std::vector<std::string>{"grpc", "metrics", "admin"}));
}

TEST(ExternalLaunchTest, GivesEachPortPlaceholderItsOwnFreePort) {
  Deployment deployment;
  deployment.endpoint = "iris";
  deployment.version = "v1";
  deployment.model = "/";
  deployment.external = ExternalCommand{{"sh", "{port:a}", "{port:b}", "{port:a}"}, {}, "", "/"};
  auto launch = external_launch(deployment, "iris-v1-abc", "127.0.0.1", 8000);
  ASSERT_TRUE(launch.is_ok()) << launch.status().message();
  EXPECT_EQ(launch->argv[0].back(), 'h');
  EXPECT_TRUE(launch->argv[0].starts_with("/"));  // found on PATH
  EXPECT_NE(launch->argv[1], launch->argv[2]);
  EXPECT_EQ(launch->argv[1], launch->argv[3]);
  EXPECT_NE(launch->argv[1], "8000");
  EXPECT_EQ(launch->env, (std::vector<std::string>{"PORT=8000"}));
  EXPECT_EQ(launch->workdir, "/");
  deployment.external->command = {"no-such-program-x"};
  EXPECT_EQ(external_launch(deployment, "r", "127.0.0.1", 8000).status().code(),
            StatusCode::kNotFound);
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

TEST(ExitReasonTest, PrefersTheCommandsErrorElseTheLastLineAndReadsJsonLogLines) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("flotilla-exit-reason-" + std::to_string(::getpid()) + ".log"))
                               .string();
  auto reason_of = [&](const std::string& log) {
    std::ofstream(path, std::ios::trunc) << log;
    return exit_reason_from_log(path);
  };
  EXPECT_EQ(reason_of("2026-12-05T17:35:00.123 info listening\nlast words \n\n"), "last words");
  EXPECT_EQ(reason_of("{\"time\":\"t\",\"level\":\"error\",\"component\":\"replica\","
                      "\"message\":\"cannot load model 'm': \\\"bad\\\"\"}\n"),
            "error: cannot load model 'm': \"bad\"");
  EXPECT_EQ(reason_of("{\"level\":\"info\",\"message\":\"draining\"}\n"
                      "flotilla replica: cannot load model 'm'\n"
                      "{\"level\":\"info\",\"message\":\"exiting\"}\n"),
            "flotilla replica: cannot load model 'm'");
  // Not a log object (a truncated line, a JSON value without a message): as it is.
  EXPECT_EQ(reason_of("{\"level\":\"error\",\"mess\n"), "{\"level\":\"error\",\"mess");
  EXPECT_EQ(reason_of("{\"level\":7,\"message\":1}\n"), "{\"level\":7,\"message\":1}");
  std::filesystem::remove(path);
  EXPECT_EQ(exit_reason_from_log(path), "");
}

TEST(CgroupTest, ReasonNamesWhatIsMissing) {
  const std::string reason = cgroup_unavailable_reason("/nonexistent-root/flotilla");
  EXPECT_NE(reason.find("/nonexistent-root"), std::string::npos) << reason;
}

}  // namespace
}  // namespace flotilla::orchestrator

// The local orchestrator: replicas as child processes of `flotilla replica`
// (docs/control-plane.md).
//
// One thread owns the processes. Every tick it reaps exited children, notices adopted
// processes that are gone, probes starting replicas for readiness, moves draining replicas on
// to SIGTERM and SIGKILL, starts or drains replicas to match what ensure() asked for, and keeps
// the warm pool full. State is guarded by mu_; the thread drops it for readiness probes (I/O)
// and to call watchers, so list() and ensure() never wait on a slow replica.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "http/http.h"
#include "orchestrator/external.h"
#include "orchestrator/orchestrator.h"
#include "orchestrator/process_util.h"
#include "replica/replica_standby.h"

namespace flotilla::orchestrator {
namespace {

using TimePoint = Clock::TimePoint;
using std::chrono::milliseconds;

constexpr milliseconds kProbeTimeout{500};
constexpr int kMaxStartsPerTick = 8;

struct Process {
  Replica replica;
  bool child = true;  // ours to waitpid; adopted ones are watched through /proc
  TimePoint started;
  TimePoint drain_started;
  TimePoint term_sent;
  bool terminated = false;  // SIGTERM sent
  bool timed_out = false;   // not ready in time: SIGKILL sent
  TimePoint failed_at;
  std::string cgroup;     // the cgroup directory made for it, "" when none
  TimePoint last_live;    // ready, adopted, or its last liveness answer
  int failed_probes = 0;  // liveness probes failed in a row
};

// How long after adopt() the orchestrator keeps looking for strays (an exec in flight then).
constexpr std::chrono::seconds kStraysRescan{2};

// A process with our marker that no record describes: being stopped.
struct Stray {
  int64_t pid = 0;
  uint64_t start_ticks = 0;
  TimePoint term_sent;
};

// An idle `flotilla replica --standby` process waiting on its stdin for the replica's flags.
struct Standby {
  int64_t pid = 0;
  int control_fd = -1;  // our end of the socket pair that is its stdin; -1 once closed
  std::string log_path;
  std::chrono::steady_clock::time_point started;
};

void close_control(Standby& standby) {
  if (standby.control_fd >= 0) {
    ::close(standby.control_fd);
    standby.control_fd = -1;
  }
}

struct Wanted {
  Deployment deployment;
  int replicas = 0;
  int failures = 0;  // consecutive failures, reset when a replica becomes ready
  TimePoint next_start;
  bool capped = false;  // short of replicas for the host-wide cap (reported once)
};

// Where a replica is probed: Flotilla's own serve OIP's health routes; an external server is
// probed on its spec's ready_path for both (a server may have no separate liveness route),
// with {endpoint} and {version} in it replaced (/v2/models/{endpoint}/ready).
std::string external_probe_path(const Deployment& deployment) {
  return expand_placeholders(deployment.external->ready_path,
                             {{"endpoint", deployment.endpoint}, {"version", deployment.version}});
}

std::string ready_path(const Deployment& deployment) {
  return deployment.external ? external_probe_path(deployment) : "/v2/health/ready";
}

std::string live_path(const Deployment& deployment) {
  return deployment.external ? external_probe_path(deployment) : "/v2/health/live";
}

std::string random_suffix() {
  static Mutex mu;
  static std::mt19937_64 engine FLOTILLA_GUARDED_BY(mu)(std::random_device{}());
  MutexLock lock(mu);
  char text[7];
  std::snprintf(text, sizeof(text), "%06llx",
                static_cast<unsigned long long>(engine() & 0xffffffULL));
  return text;
}

class LocalOrchestrator final : public Orchestrator {
 public:
  LocalOrchestrator(LocalOptions options, Clock& clock)
      : options_(std::move(options)),
        clock_(clock),
        cgroup_reason_(cgroup_unavailable_reason(options_.cgroup_root)) {
    thread_ = std::thread([this] { loop(); });
    if (options_.liveness_timeout.count() > 0) {
      liveness_thread_ = std::thread([this] { liveness_loop(); });
    }
  }

  ~LocalOrchestrator() override {
    shutdown(options_.stop_timeout);
    {
      MutexLock lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    liveness_wake_.notify_all();
    thread_.join();
    if (liveness_thread_.joinable()) {
      liveness_thread_.join();
    }
  }

  void ensure(const Deployment& deployment, int replicas) override {
    MutexLock lock(mu_);
    if (shut_down_) {
      return;
    }
    auto it = wanted_.find(deployment.key);
    if (it == wanted_.end()) {
      if (replicas == 0) {
        // Nothing wanted and nothing known: still drain leftovers of this key (adopted ones).
        bool any = std::any_of(processes_.begin(), processes_.end(), [&](const auto& entry) {
          return entry.second.replica.deployment.key == deployment.key;
        });
        if (!any) {
          return;
        }
      }
      it = wanted_.emplace(deployment.key, Wanted{deployment, replicas, 0, clock_.now(), false})
               .first;
    } else if (!deployment.model.empty()) {
      it->second.deployment = deployment;
    }
    if (it->second.replicas != replicas) {
      it->second.replicas = replicas;
      wake_.notify_all();
    }
  }

  Status drain(const std::string& replica_id) override {
    {
      MutexLock lock(mu_);
      auto it = processes_.find(replica_id);
      if (it == processes_.end() || it->second.replica.state == ReplicaState::kFailed) {
        return not_found("replica '" + replica_id + "' does not exist");
      }
      start_drain(it->second, "drained by request", pending_events_);
    }
    wake_.notify_all();
    return Status::ok();
  }

  std::vector<Replica> list() const override {
    MutexLock lock(mu_);
    std::vector<Replica> replicas;
    replicas.reserve(processes_.size());
    for (const auto& [id, process] : processes_) {
      replicas.push_back(process.replica);
    }
    return replicas;
  }

  std::vector<UsageReading> usage(const std::vector<std::string>& replica_ids,
                                  milliseconds deadline) override {
    struct Target {
      std::string id;
      std::string host;
      uint16_t port = 0;
      int64_t pid = 0;
    };
    std::vector<Target> targets;
    {
      MutexLock lock(mu_);
      for (const std::string& id : replica_ids) {
        auto it = processes_.find(id);
        if (it == processes_.end()) {
          continue;
        }
        const Replica& replica = it->second.replica;
        if (replica.state != ReplicaState::kFailed && replica.state != ReplicaState::kStopped) {
          targets.push_back({id, replica.host, replica.port, replica.pid});
        }
      }
    }
    // A bound on this call's blocking, in real time whatever the clock: every replica's
    // /metrics within one deadline (fetch_each).
    std::vector<std::pair<std::string, uint16_t>> origins;
    origins.reserve(targets.size());
    for (const Target& target : targets) {
      origins.emplace_back(target.host, target.port);
    }
    const std::vector<http::ClientResponse> responses =
        http::fetch_each(origins, "/metrics", deadline);
    std::vector<UsageReading> readings(targets.size());
    for (size_t i = 0; i < targets.size(); ++i) {
      UsageReading& reading = readings[i];
      reading.replica_id = targets[i].id;
      if (responses[i].failure == http::UpstreamFailure::kNone && responses[i].status == 200) {
        reading.queue_wait_seconds =
            metric_value(responses[i].body, "flotilla_replica_queue_wait_seconds_total");
      }
      reading.cpu_seconds = process_cpu_seconds(targets[i].pid);
      reading.memory_bytes = process_resident_bytes(targets[i].pid);
      reading.at = clock_.now();
    }
    return readings;
  }

  void watch(std::function<void(const ReplicaEvent&)> on_change) override {
    MutexLock lock(mu_);
    watchers_.push_back(std::move(on_change));
  }

  void adopt(std::vector<Replica> replicas) override {
    {
      MutexLock lock(mu_);
      std::vector<ReplicaEvent>& events = pending_events_;
      for (Replica& replica : replicas) {
        if (replica.state == ReplicaState::kFailed || replica.state == ReplicaState::kStopped) {
          continue;
        }
        if (!process_matches(replica.pid, replica.process_start_ticks)) {
          replica.state = ReplicaState::kStopped;
          events.push_back({replica, "lost",
                            "process " + std::to_string(replica.pid) +
                                " is gone (it exited while no orchestrator ran)"});
          continue;
        }
        Process process;
        process.replica = replica;
        process.child = false;
        process.started = clock_.now();
        process.last_live = clock_.now();
        if (replica.state == ReplicaState::kDraining) {
          process.drain_started = clock_.now() - options_.drain_delay;
        }
        events.push_back({replica, "adopted",
                          "process " + std::to_string(replica.pid) + " adopted as " +
                              std::string(state_name(replica.state))});
        processes_.emplace(replica.id, std::move(process));
      }
      stop_strays();
      strays_rescan_until_ = clock_.now() + kStraysRescan;
    }
    wake_.notify_all();
  }

  void shutdown(milliseconds timeout) override {
    {
      MutexLock lock(mu_);
      if (shut_down_) {
        return;
      }
      shut_down_ = true;
      for (auto& [key, wanted] : wanted_) {
        wanted.replicas = 0;
      }
      for (auto& [id, process] : processes_) {
        if (process.replica.state != ReplicaState::kFailed) {
          start_drain(process, "shutting down", pending_events_);
        }
      }
      for (auto& [runtime, pool] : pools_) {
        for (Standby& standby : pool) {
          close_control(standby);  // EOF on its stdin: it exits
        }
      }
    }
    wake_.notify_all();
    // The loop thread carries the drains through; wait for it to finish them.
    MutexLock lock(mu_);
    // A bound on a blocking wait, in real time whatever the clock.
    const auto deadline = std::chrono::steady_clock::now() + timeout + options_.drain_delay;
    while (live_process_count() != 0) {
      if (!idle_.wait_until(mu_, deadline)) {
        break;
      }
    }
    for (auto& [id, process] : processes_) {
      if (process.replica.state != ReplicaState::kFailed &&
          process.replica.state != ReplicaState::kStopped) {
        signal_group(process.replica.pid, SIGKILL);
      }
    }
    for (const Stray& stray : strays_) {
      if (process_matches(stray.pid, stray.start_ticks)) {
        ::kill(static_cast<pid_t>(stray.pid), SIGKILL);
      }
    }
  }

 private:
  // Whether a replica waits for its first successful probe: those are probed more often, so
  // readiness is seen within milliseconds rather than a tick.
  bool any_starting() const FLOTILLA_REQUIRES(mu_) {
    return std::any_of(processes_.begin(), processes_.end(), [](const auto& entry) {
      const ReplicaState state = entry.second.replica.state;
      return state == ReplicaState::kStarting || state == ReplicaState::kLoading;
    });
  }

  size_t live_process_count() const FLOTILLA_REQUIRES(mu_) {
    size_t live = 0;
    for (const auto& [id, process] : processes_) {
      live += process.replica.state != ReplicaState::kFailed &&
              process.replica.state != ReplicaState::kStopped;
    }
    for (const auto& [runtime, pool] : pools_) {
      live += pool.size();
    }
    return live + strays_.size();
  }

  // Replica processes that count against the host-wide cap.
  int replica_process_count() const FLOTILLA_REQUIRES(mu_) {
    int count = 0;
    for (const auto& [id, process] : processes_) {
      count += process.replica.state != ReplicaState::kFailed &&
               process.replica.state != ReplicaState::kStopped;
    }
    return count;
  }

  // Processes with our marker that are neither our children nor adopted: started by an
  // earlier orchestrator of this instance a moment before it died, before their record was
  // written. SIGTERM now; advance_strays() sends SIGKILL after the stop timeout.
  void stop_strays() FLOTILLA_REQUIRES(mu_) {
    if (options_.instance.empty()) {
      return;
    }
    for (const int64_t pid : find_marked_processes(marker())) {
      const bool known = std::any_of(processes_.begin(), processes_.end(), [&](const auto& entry) {
        return entry.second.replica.pid == pid;
      });
      const bool standby = std::any_of(pools_.begin(), pools_.end(), [&](const auto& entry) {
        return std::any_of(entry.second.begin(), entry.second.end(),
                           [&](const Standby& s) { return s.pid == pid; });
      });
      const bool stopping = std::any_of(strays_.begin(), strays_.end(),
                                        [&](const Stray& stray) { return stray.pid == pid; });
      const uint64_t ticks = process_start_ticks(pid);
      if (known || standby || stopping || ticks == 0) {
        continue;
      }
      spdlog::warn(
          "stopping process {} (`{}`): started by an earlier flotilla up on this data "
          "directory, and no replica record describes it",
          pid, command_line(pid));
      signal_group(pid, SIGTERM);
      strays_.push_back(Stray{pid, ticks, clock_.now()});
    }
  }

  void advance_strays() FLOTILLA_REQUIRES(mu_) {
    const auto now = clock_.now();
    std::erase_if(strays_, [&](Stray& stray) {
      if (!process_matches(stray.pid, stray.start_ticks)) {
        return true;
      }
      if (now - stray.term_sent >= options_.stop_timeout) {
        signal_group(stray.pid, SIGKILL);
        stray.term_sent = now;
      }
      return false;
    });
  }

  std::string marker() const { return std::string(kInstanceEnv) + "=" + options_.instance; }

  std::vector<std::string> child_env() const {
    if (options_.instance.empty()) {
      return {};
    }
    return {marker()};
  }

  void publish(const std::vector<ReplicaEvent>& events) FLOTILLA_EXCLUDES(mu_) {
    if (events.empty()) {
      return;
    }
    std::vector<std::function<void(const ReplicaEvent&)>> watchers;
    {
      MutexLock lock(mu_);
      watchers = watchers_;
    }
    for (const ReplicaEvent& event : events) {
      spdlog::info("replica {} ({} {}): {}{}", event.replica.id, event.replica.deployment.endpoint,
                   event.replica.deployment.version, event.kind,
                   event.message.empty() ? "" : ": " + event.message);
      for (const auto& watcher : watchers) {
        watcher(event);
      }
    }
  }

  void start_drain(Process& process, const std::string& why, std::vector<ReplicaEvent>& events)
      FLOTILLA_REQUIRES(mu_) {
    if (process.replica.state == ReplicaState::kDraining ||
        process.replica.state == ReplicaState::kStopped) {
      return;
    }
    process.replica.state = ReplicaState::kDraining;
    process.replica.reason = why;
    process.drain_started = clock_.now();
    events.push_back({process.replica, "draining", why});
  }

  // Holds mu_ but for the probes and the watchers' calls; Mutex's own lock() and unlock(),
  // which the analysis follows, in place of a std::unique_lock.
  void loop() FLOTILLA_EXCLUDES(mu_) {
    mu_.lock();
    while (!stopping_) {
      // Events of drain(), adopt() and shutdown() first: watchers see every event from this
      // thread, in order.
      std::vector<ReplicaEvent> events = std::move(pending_events_);
      pending_events_.clear();
      reap(events);
      mu_.unlock();
      probe_starting(events);
      mu_.lock();
      advance_drains();
      // A child the earlier orchestrator spawned just before it died may still be between fork
      // and exec at adopt(), without our marker in its environment yet: look again for a while.
      if (clock_.now() < strays_rescan_until_) {
        stop_strays();
      }
      advance_strays();
      if (!shut_down_) {
        scale(events);
        // A new standby's start-up competes for the CPU with replicas loading their models:
        // refill the pool once they are ready.
        if (!any_starting() && clock_.now() >= next_pool_fill_) {
          fill_pools();
        }
      }
      expire_failed();
      forget_retired();
      mu_.unlock();
      publish(events);
      mu_.lock();
      idle_.notify_all();
      wake_.wait_for(mu_, any_starting() ? options_.probe_interval : options_.tick);
    }
    mu_.unlock();
  }

  // Reaps exited children and notices adopted processes that are gone.
  void reap(std::vector<ReplicaEvent>& events) FLOTILLA_REQUIRES(mu_) {
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) {
        break;
      }
      on_exit(pid, describe_exit(status), WIFEXITED(status), events);
    }
    for (auto& [id, process] : processes_) {
      const ReplicaState state = process.replica.state;
      if (!process.child && state != ReplicaState::kFailed && state != ReplicaState::kStopped &&
          !process_matches(process.replica.pid, process.replica.process_start_ticks)) {
        on_exit(static_cast<pid_t>(process.replica.pid), "exited (exit status unknown: adopted)",
                true, events);
      }
    }
  }

  void on_exit(pid_t pid, const std::string& how, bool exited_by_itself,
               std::vector<ReplicaEvent>& events) FLOTILLA_REQUIRES(mu_) {
    for (auto& [runtime, pool] : pools_) {
      auto it = std::find_if(pool.begin(), pool.end(),
                             [&](const Standby& standby) { return standby.pid == pid; });
      if (it != pool.end()) {
        if (!shut_down_) {
          spdlog::warn("warm pool process {} {}: {}", pid, how, exit_reason_from_log(it->log_path));
        }
        close_control(*it);
        if (!shut_down_ && clock_.now() - it->started < std::chrono::seconds(1)) {
          // A standby that dies at once will again: refill with a doubling backoff.
          pool_backoff_ = std::min<milliseconds>(
              std::max(options_.restart_backoff, pool_backoff_ * 2), options_.max_restart_backoff);
          next_pool_fill_ = clock_.now() + pool_backoff_;
        }
        pool.erase(it);
        return;
      }
    }
    for (auto& [id, process] : processes_) {
      Replica& replica = process.replica;
      if (replica.pid != pid) {
        continue;
      }
      if (replica.deployment.external) {
        // What a user's server started (its workers) may outlive it and hold its ports.
        signal_group(pid, SIGKILL);
      }
      if (replica.state == ReplicaState::kFailed || replica.state == ReplicaState::kStopped) {
        remove_cgroup(process);  // a hung one, failed when killed: its cgroup is empty now
        continue;
      }
      remove_cgroup(process);
      if (replica.state == ReplicaState::kDraining) {
        replica.state = ReplicaState::kStopped;
        events.push_back({replica, "stopped", how});
        return;
      }
      if (process.timed_out) {
        replica.state = ReplicaState::kFailed;
        process.failed_at = clock_.now();
        count_failure(replica.deployment.key);
        events.push_back({replica, "failed", replica.reason});
        return;
      }
      replica.state = ReplicaState::kFailed;
      // A replica that exits on its own says why on its last log line ("cannot load model").
      const std::string last_line =
          exited_by_itself ? exit_reason_from_log(log_path(replica.id)) : "";
      replica.reason = how + (last_line.empty() ? "" : ": " + last_line);
      process.failed_at = clock_.now();
      count_failure(replica.deployment.key);
      events.push_back({replica, "failed", replica.reason});
      return;
    }
  }

  void count_failure(const std::string& key) FLOTILLA_REQUIRES(mu_) {
    auto it = wanted_.find(key);
    if (it == wanted_.end()) {
      return;
    }
    Wanted& wanted = it->second;
    wanted.failures += 1;
    auto backoff = options_.restart_backoff * (1LL << std::min(wanted.failures - 1, 16));
    backoff = std::min<milliseconds>(backoff, options_.max_restart_backoff);
    wanted.next_start = clock_.now() + backoff;
  }

  // Probes replicas that are not ready yet, without holding mu_ during the requests.
  void probe_starting(std::vector<ReplicaEvent>& events) FLOTILLA_EXCLUDES(mu_) {
    std::vector<std::tuple<std::string, std::string, uint16_t, std::string>> targets;
    {
      MutexLock lock(mu_);
      for (const auto& [id, process] : processes_) {
        const ReplicaState state = process.replica.state;
        if (state == ReplicaState::kStarting || state == ReplicaState::kLoading) {
          targets.emplace_back(id, process.replica.host, process.replica.port,
                               ready_path(process.replica.deployment));
        }
      }
    }
    for (const auto& [id, host, port, path] : targets) {
      http::ClientRequest request;
      request.method = http::Method::kGet;
      request.target = path;
      const http::ClientResponse response =
          http::fetch(host, port, std::move(request), kProbeTimeout);
      MutexLock lock(mu_);
      auto it = processes_.find(id);
      if (it == processes_.end()) {
        continue;
      }
      Process& process = it->second;
      Replica& replica = process.replica;
      if (replica.state != ReplicaState::kStarting && replica.state != ReplicaState::kLoading) {
        continue;
      }
      if (response.failure == http::UpstreamFailure::kNone && response.status == 200) {
        replica.state = ReplicaState::kReady;
        replica.ready_unix_ms = unix_time_ms();
        process.last_live = clock_.now();
        process.failed_probes = 0;
        if (auto wanted = wanted_.find(replica.deployment.key); wanted != wanted_.end()) {
          wanted->second.failures = 0;
        }
        events.push_back({replica, "ready",
                          "ready in " +
                              std::to_string(replica.ready_unix_ms - replica.started_unix_ms) +
                              " ms" + (replica.from_warm_pool ? " (from the warm pool)" : "")});
      } else if (response.failure == http::UpstreamFailure::kNone &&
                 replica.state == ReplicaState::kStarting) {
        // It answers but is not ready: listening while it fetches and loads its model.
        replica.state = ReplicaState::kLoading;
      }
      if (replica.state != ReplicaState::kReady && !process.timed_out &&
          clock_.now() - process.started > options_.ready_timeout) {
        // Reaped as failed on a later tick; the reason stays this one.
        process.timed_out = true;
        signal_group(replica.pid, SIGKILL);
        replica.reason =
            "not ready within " + std::to_string(options_.ready_timeout.count() / 1000) + " s";
        events.push_back({replica, "timeout", replica.reason});
      }
    }
  }

  void advance_drains() FLOTILLA_REQUIRES(mu_) {
    const auto now = clock_.now();
    for (auto& [id, process] : processes_) {
      if (process.replica.state != ReplicaState::kDraining) {
        continue;
      }
      const int64_t pid = process.replica.pid;
      if (!process.terminated && now - process.drain_started >= options_.drain_delay) {
        signal_group(pid, SIGTERM);
        process.terminated = true;
        process.term_sent = now;
      } else if (process.terminated && now - process.term_sent >= options_.stop_timeout) {
        signal_group(pid, SIGKILL);
        process.term_sent = now;  // once per stop timeout, should SIGKILL ever not land
      }
    }
  }

  void scale(std::vector<ReplicaEvent>& events) FLOTILLA_REQUIRES(mu_) {
    const auto now = clock_.now();
    for (auto& [key, wanted] : wanted_) {
      std::vector<Process*> live;
      for (auto& [id, process] : processes_) {
        const ReplicaState state = process.replica.state;
        if (process.replica.deployment.key == key &&
            (state == ReplicaState::kStarting || state == ReplicaState::kLoading ||
             state == ReplicaState::kReady)) {
          live.push_back(&process);
        }
      }
      if (static_cast<int>(live.size()) > wanted.replicas) {
        // Not ready first, then the newest.
        std::sort(live.begin(), live.end(), [](const Process* a, const Process* b) {
          const bool a_ready = a->replica.state == ReplicaState::kReady;
          const bool b_ready = b->replica.state == ReplicaState::kReady;
          if (a_ready != b_ready) {
            return !a_ready;
          }
          return a->replica.started_unix_ms > b->replica.started_unix_ms;
        });
        const char* why =
            wanted.replicas == 0 ? "retired: its version is no longer wanted" : "scaled down";
        for (size_t i = 0; i < live.size() - static_cast<size_t>(wanted.replicas); ++i) {
          start_drain(*live[i], why, events);
        }
      }
      if (wanted.deployment.model.empty() || now < wanted.next_start) {
        continue;  // known only as a key to retire, or backing off after a failure
      }
      // At most kMaxStartsPerTick a tick: a large scale-up goes on over the next ticks, and
      // list() and ensure() never wait long on mu_. Never past the host-wide cap.
      const int missing_now = wanted.replicas - static_cast<int>(live.size());
      int allowed = std::min(missing_now, kMaxStartsPerTick);
      if (options_.max_replicas > 0 && missing_now > 0) {
        const int room = std::max(0, options_.max_replicas - replica_process_count());
        if (room < missing_now && !wanted.capped) {
          wanted.capped = true;
          Replica about;
          about.deployment = wanted.deployment;
          events.push_back({about, "capped",
                            "wants " + std::to_string(wanted.replicas) + " replicas and has " +
                                std::to_string(live.size()) + "; the host-wide cap of " +
                                std::to_string(options_.max_replicas) +
                                " replica processes (flotilla up --max-replicas) leaves room "
                                "for " +
                                std::to_string(room) + " more"});
        }
        allowed = std::min(allowed, room);
      }
      if (missing_now <= 0) {
        wanted.capped = false;
      }
      for (int missing = allowed; missing > 0; --missing) {
        Result<Replica> started = start_replica(wanted.deployment);
        if (!started.is_ok()) {
          spdlog::error("cannot start a replica of {}: {}", key, started.status().message());
          count_failure(key);
          break;
        }
        events.push_back(
            {*started, "started",
             "pid " + std::to_string(started->pid) + ", port " + std::to_string(started->port) +
                 (started->from_warm_pool ? ", from the warm pool" : "") + "; " + started->limits});
      }
    }
  }

  void forget_retired() FLOTILLA_REQUIRES(mu_) {
    for (auto it = wanted_.begin(); it != wanted_.end();) {
      const bool has_process = std::any_of(processes_.begin(), processes_.end(), [&](auto& entry) {
        const ReplicaState state = entry.second.replica.state;
        return entry.second.replica.deployment.key == it->first && state != ReplicaState::kFailed &&
               state != ReplicaState::kStopped;
      });
      it = it->second.replicas == 0 && !has_process ? wanted_.erase(it) : std::next(it);
    }
    std::erase_if(processes_, [](const auto& entry) {
      return entry.second.replica.state == ReplicaState::kStopped;
    });
  }

  void expire_failed() FLOTILLA_REQUIRES(mu_) {
    const auto now = clock_.now();
    std::erase_if(processes_, [&](const auto& entry) {
      return entry.second.replica.state == ReplicaState::kFailed &&
             now - entry.second.failed_at > options_.keep_failed;
    });
  }

  std::string log_path(const std::string& name) const {
    return options_.log_dir + "/" + name + ".log";
  }

  Result<Replica> start_replica(const Deployment& deployment) FLOTILLA_REQUIRES(mu_) {
    Replica replica;
    // Names are up to 64 characters each; the gateway takes ids up to 128.
    do {
      replica.id = deployment.endpoint.substr(0, 48) + "-" + deployment.version.substr(0, 48) +
                   "-" + random_suffix();
    } while (processes_.contains(replica.id));
    replica.deployment = deployment;
    replica.host = options_.host;
    FLOTILLA_ASSIGN_OR_RETURN(replica.port, pick_free_port(options_.host));
    std::vector<std::string> args = {"--model",   deployment.model,
                                     "--runtime", deployment.runtime,
                                     "--name",    deployment.endpoint,
                                     "--host",    options_.host,
                                     "--port",    std::to_string(replica.port)};
    args.insert(args.end(), {"--model-version", deployment.version, "--replica-id", replica.id});
    args.insert(args.end(), options_.replica_args.begin(), options_.replica_args.end());

    if (deployment.external) {
      FLOTILLA_ASSIGN_OR_RETURN(
          ExternalLaunch launch,
          external_launch(deployment, replica.id, options_.host, replica.port));
      std::vector<std::string> env = child_env();
      env.insert(env.end(), launch.env.begin(), launch.env.end());
      FLOTILLA_ASSIGN_OR_RETURN(replica.pid,
                                spawn(launch.argv, log_path(replica.id), -1, env, launch.workdir));
    }
    auto pool = pools_.find(deployment.runtime);
    if (replica.pid == 0 && pool != pools_.end() && !pool->second.empty()) {
      Standby standby = pool->second.front();
      pool->second.erase(pool->second.begin());
      const std::string line = replica::encode_standby_command(args);
      const bool sent = ::send(standby.control_fd, line.data(), line.size(), MSG_NOSIGNAL) ==
                        static_cast<ssize_t>(line.size());
      close_control(standby);
      if (sent) {
        std::error_code ignored;
        std::filesystem::rename(standby.log_path, log_path(replica.id), ignored);
        replica.pid = standby.pid;
        replica.from_warm_pool = true;
        replica.state = ReplicaState::kLoading;
      } else {
        ::kill(static_cast<pid_t>(standby.pid), SIGKILL);  // reaped by the next tick
      }
    }
    if (replica.pid == 0) {
      std::vector<std::string> argv = {options_.binary, "replica"};
      argv.insert(argv.end(), args.begin(), args.end());
      FLOTILLA_ASSIGN_OR_RETURN(replica.pid, spawn(argv, log_path(replica.id), -1, child_env()));
    }
    replica.process_start_ticks = process_start_ticks(replica.pid);
    replica.started_unix_ms = unix_time_ms();
    Process process;
    process.replica = replica;
    process.started = clock_.now();
    apply_limits(process);
    replica.limits = process.replica.limits;
    processes_.emplace(replica.id, std::move(process));
    return replica;
  }

  void fill_pools() FLOTILLA_REQUIRES(mu_) {
    for (const std::string& runtime : options_.warm_pool_runtimes) {
      auto& pool = pools_[runtime];
      while (static_cast<int>(pool.size()) < options_.warm_pool_size) {
        int fds[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
          spdlog::error("warm pool: socketpair: {}", std::strerror(errno));
          return;
        }
        Standby standby;
        standby.log_path = log_path("standby-" + runtime + "-" + random_suffix());
        std::vector<std::string> env = child_env();
        env.push_back(std::string(kParentEnv) + "=" + std::to_string(::getpid()));
        Result<int64_t> pid = spawn({options_.binary, "replica", "--standby", "--runtime", runtime},
                                    standby.log_path, fds[1], env);
        ::close(fds[1]);
        if (!pid.is_ok()) {
          ::close(fds[0]);
          spdlog::error("warm pool: {}", pid.status().message());
          return;
        }
        standby.pid = *pid;
        standby.control_fd = fds[0];
        standby.started = clock_.now();
        pool.push_back(standby);
      }
    }
  }

  // The liveness prober's thread: every interval, GET /v2/health/live on every ready replica
  // (in parallel, so a hung one delays no other's probe), without holding mu_ during the
  // requests; then replaces those that stopped answering.
  // Like loop(), holds mu_ with Mutex's lock() and unlock() but for the probes.
  void liveness_loop() FLOTILLA_EXCLUDES(mu_) {
    const milliseconds interval = std::clamp<milliseconds>(options_.liveness_timeout / 4,
                                                           milliseconds(50), milliseconds(1'000));
    struct Target {
      std::string id;
      std::string host;
      uint16_t port = 0;
      int64_t pid = 0;
      std::string path;
    };
    mu_.lock();
    // The rounds' cadence is real time (a wait); whether a replica is hung is the clock's.
    auto next_round = std::chrono::steady_clock::now() + interval;
    while (!stopping_) {
      // A round every interval, start to start: a round of failing probes takes one interval.
      while (!stopping_) {
        if (!liveness_wake_.wait_until(mu_, next_round)) {
          break;
        }
      }
      next_round = std::max(next_round + interval, std::chrono::steady_clock::now());
      if (stopping_ || shut_down_) {
        continue;
      }
      std::vector<Target> targets;
      for (const auto& [id, process] : processes_) {
        if (process.replica.state == ReplicaState::kReady) {
          targets.push_back({id, process.replica.host, process.replica.port, process.replica.pid,
                             live_path(process.replica.deployment)});
        }
      }
      mu_.unlock();
      constexpr size_t kParallel = 32;
      std::vector<char> alive(targets.size(), 0);
      for (size_t begin = 0; begin < targets.size(); begin += kParallel) {
        std::vector<std::thread> probes;
        for (size_t i = begin; i < std::min(targets.size(), begin + kParallel); ++i) {
          probes.emplace_back([&, i] {
            http::ClientRequest request;
            request.method = http::Method::kGet;
            request.target = targets[i].path;
            const http::ClientResponse response =
                http::fetch(targets[i].host, targets[i].port, std::move(request), interval);
            alive[i] = response.failure == http::UpstreamFailure::kNone && response.status == 200;
          });
        }
        for (std::thread& probe : probes) {
          probe.join();
        }
      }
      mu_.lock();
      const auto now = clock_.now();
      bool replaced = false;
      for (size_t i = 0; i < targets.size(); ++i) {
        auto it = processes_.find(targets[i].id);
        if (it == processes_.end() || it->second.replica.state != ReplicaState::kReady ||
            it->second.replica.pid != targets[i].pid) {
          continue;
        }
        Process& process = it->second;
        if (alive[i]) {
          process.last_live = now;
          process.failed_probes = 0;
          continue;
        }
        process.failed_probes += 1;
        if (process.failed_probes < 2 || now - process.last_live < options_.liveness_timeout) {
          continue;
        }
        Replica& replica = process.replica;
        signal_group(replica.pid, SIGKILL);
        char seconds[32];
        std::snprintf(seconds, sizeof(seconds), "%.1f",
                      std::chrono::duration<double>(now - process.last_live).count());
        replica.state = ReplicaState::kFailed;
        replica.reason = std::string("hung: no liveness answer in ") + seconds + " s; replaced";
        process.failed_at = now;
        count_failure(replica.deployment.key);
        pending_events_.push_back({replica, "hung", replica.reason});
        replaced = true;
      }
      if (replaced) {
        wake_.notify_all();
      }
    }
    mu_.unlock();
  }

  void apply_limits(Process& process) {
    const Deployment& deployment = process.replica.deployment;
    if (deployment.cpus <= 0 && deployment.memory_bytes <= 0) {
      process.replica.limits = "no limits asked";
      return;
    }
    if (!cgroup_reason_.empty()) {
      process.replica.limits = "limits not applied: " + cgroup_reason_;
      return;
    }
    const std::string dir = options_.cgroup_root + "/" + process.replica.id;
    Status status = make_cgroup(dir, deployment.cpus, deployment.memory_bytes, process.replica.pid);
    if (!status.is_ok()) {
      process.replica.limits = "limits not applied: " + status.message();
      return;
    }
    process.cgroup = dir;
    std::ostringstream text;
    text << "cgroup v2 " << dir << ":";
    if (deployment.cpus > 0) {
      text << " cpus " << deployment.cpus;
    }
    if (deployment.memory_bytes > 0) {
      text << " memory " << deployment.memory_bytes / (1024 * 1024) << " MiB";
    }
    process.replica.limits = text.str();
  }

  void remove_cgroup(Process& process) {
    if (!process.cgroup.empty()) {
      ::rmdir(process.cgroup.c_str());
      process.cgroup.clear();
    }
  }

  const LocalOptions options_;
  Clock& clock_;  // the caller's (create_local_orchestrator), outlives this
  const std::string cgroup_reason_;
  mutable Mutex mu_;
  CondVar wake_;           // the loop waits on it between ticks
  CondVar idle_;           // notified after every tick (shutdown waits on it)
  CondVar liveness_wake_;  // the liveness prober waits on it
  std::map<std::string, Process> processes_ FLOTILLA_GUARDED_BY(mu_);           // by replica id
  std::map<std::string, Wanted> wanted_ FLOTILLA_GUARDED_BY(mu_);               // by deployment key
  std::map<std::string, std::vector<Standby>> pools_ FLOTILLA_GUARDED_BY(mu_);  // by runtime
  std::vector<std::function<void(const ReplicaEvent&)>> watchers_ FLOTILLA_GUARDED_BY(mu_);
  // For the loop thread to publish.
  std::vector<ReplicaEvent> pending_events_ FLOTILLA_GUARDED_BY(mu_);
  // Unrecorded processes of ours being stopped.
  std::vector<Stray> strays_ FLOTILLA_GUARDED_BY(mu_);
  TimePoint strays_rescan_until_ FLOTILLA_GUARDED_BY(mu_);
  TimePoint next_pool_fill_ FLOTILLA_GUARDED_BY(mu_);
  milliseconds pool_backoff_ FLOTILLA_GUARDED_BY(mu_){0};
  bool shut_down_ FLOTILLA_GUARDED_BY(mu_) = false;
  bool stopping_ FLOTILLA_GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::thread liveness_thread_;
};

}  // namespace

std::string_view state_name(ReplicaState state) {
  switch (state) {
    case ReplicaState::kStarting:
      return "starting";
    case ReplicaState::kLoading:
      return "loading";
    case ReplicaState::kReady:
      return "ready";
    case ReplicaState::kDraining:
      return "draining";
    case ReplicaState::kStopped:
      return "stopped";
    case ReplicaState::kFailed:
      return "failed";
  }
  return "unknown";
}

Result<ReplicaState> parse_state(std::string_view name) {
  for (ReplicaState state :
       {ReplicaState::kStarting, ReplicaState::kLoading, ReplicaState::kReady,
        ReplicaState::kDraining, ReplicaState::kStopped, ReplicaState::kFailed}) {
    if (state_name(state) == name) {
      return state;
    }
  }
  return invalid_argument("unknown replica state '" + std::string(name) + "'");
}

Result<std::unique_ptr<Orchestrator>> create_local_orchestrator(const LocalOptions& options,
                                                                Clock& clock) {
  if (::access(options.binary.c_str(), X_OK) != 0) {
    return invalid_argument("replica binary '" + options.binary + "' is not executable");
  }
  std::error_code error;
  std::filesystem::create_directories(options.log_dir, error);
  if (error) {
    return invalid_argument("cannot create log directory '" + options.log_dir +
                            "': " + error.message());
  }
  return std::unique_ptr<Orchestrator>(std::make_unique<LocalOrchestrator>(options, clock));
}

}  // namespace flotilla::orchestrator

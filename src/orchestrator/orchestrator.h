// The orchestrator module's contract (DESIGN.md §5): where replicas run and how they live and
// die. The control plane's reconciler says how many replicas of each deployment it wants; the
// orchestrator starts, probes, restarts, drains and stops them, and reports every change.
// The `local` driver runs replicas as child processes of this one (docs/control-plane.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/common.h"

namespace flotilla::orchestrator {

// starting (a new process) or loading (a warm-pool process given its model) → ready →
// draining → stopped, or failed with a reason.
enum class ReplicaState { kStarting, kLoading, kReady, kDraining, kStopped, kFailed };

std::string_view state_name(ReplicaState state);  // "starting", "loading", ...
Result<ReplicaState> parse_state(std::string_view name);

// What the replicas of one endpoint version run. Replicas with the same key are
// interchangeable; replicas of different keys never share a process.
struct Deployment {
  std::string key;  // unique per endpoint version and model config (control::deployment_key)
  std::string endpoint;
  std::string version;
  std::string model;    // absolute path
  std::string runtime;  // auto | xgboost | llm | synthetic | external
  // runtime external: the user's server each replica runs instead of `flotilla replica`; its
  // ready_path is probed for readiness and liveness, and it takes no warm-pool process.
  std::optional<ExternalCommand> external;
  double cpus = 0;           // cgroup v2 cpu.max; 0: no limit
  int64_t memory_bytes = 0;  // cgroup v2 memory.max; 0: no limit
  bool operator==(const Deployment&) const = default;
};

struct Replica {
  std::string id;  // "<endpoint>-<version>-<6 hex>", unique among the replicas known
  Deployment deployment;
  std::string host;
  uint16_t port = 0;
  int64_t pid = 0;
  // The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid
  // it identifies the process across a restart of the orchestrator, pid reuse included.
  uint64_t process_start_ticks = 0;
  ReplicaState state = ReplicaState::kStarting;
  std::string reason;  // why it failed or is draining; "" otherwise
  int64_t started_unix_ms = 0;
  int64_t ready_unix_ms = 0;  // 0 until ready
  bool from_warm_pool = false;
  std::string limits;  // the resource limits applied, or why none could be
};

// One change of one replica, reported to watchers.
struct ReplicaEvent {
  Replica replica;   // the replica after the change
  std::string kind;  // "started", "ready", "timeout", "hung", "failed", "draining",
                     // "stopped", "adopted", "lost"; and "capped" (replica.id empty, only
                     // replica.deployment set): the host-wide cap keeps the deployment short
  std::string message;
};

// What one replica has used so far, as its driver measures it: running totals, so that the
// caller turns two readings into rates.
struct UsageReading {
  std::string replica_id;
  double cpu_seconds = -1;    // CPU time used (user + system); -1: unknown
  int64_t memory_bytes = -1;  // resident memory now; -1: unknown
  // Seconds requests have waited inside the replica for its engine, summed
  // (flotilla_replica_queue_wait_seconds_total): its rate is the mean number queued. None: the
  // replica does not report it, or did not answer within the query's deadline.
  std::optional<double> queue_wait_seconds;
  Clock::TimePoint at{};  // when it was read, on the orchestrator's clock
};

// Thread-safety: every method may be called from any thread. Watch callbacks run on the
// orchestrator's own thread, one at a time; they must not block for long and must not call
// shutdown().
class Orchestrator {
 public:
  virtual ~Orchestrator() = default;

  // Keeps `replicas` live (starting, loading or ready) replicas of `deployment`: starts missing
  // ones, replaces failed ones after a backoff, drains surplus ones (those not ready first,
  // then the newest). `replicas` = 0 retires the deployment. Idempotent; never blocks.
  virtual void ensure(const Deployment& deployment, int replicas) = 0;
  // Takes the replica out of service: state draining at once (so it leaves the gateway table),
  // SIGTERM after the drain delay (the replica finishes its in-flight requests), SIGKILL if it
  // outlives the stop timeout. Its deployment's count is not lowered, so ensure() starts a
  // replacement. Unknown id: kNotFound.
  virtual Status drain(const std::string& replica_id) = 0;
  // Every replica known: live, draining, and failed ones kept for a while to show why.
  virtual std::vector<Replica> list() const = 0;
  // What each replica named in `replica_ids` has used (CPU, memory, its in-replica queue), for
  // the autoscaler. Ids not known or no longer live are left out. Replicas are read at the
  // same time, not one after another, and the call returns within about `deadline`: a replica
  // that has not answered by then comes back with what could be read without it. Blocks.
  virtual std::vector<UsageReading> usage(const std::vector<std::string>& replica_ids,
                                          std::chrono::milliseconds deadline) = 0;
  // Adds a watcher of replica changes (see ReplicaEvent). Call before the first ensure().
  virtual void watch(std::function<void(const ReplicaEvent&)> on_change) = 0;
  // Takes over replicas a previous process of ours started and left running (their records
  // from the state store): each one whose process still runs (same pid and start time) is
  // adopted as it was; the others are reported "lost". Processes carrying this orchestrator's
  // marker (LocalOptions::instance) that no record describes (started a moment before a
  // kill -9 let their record be written) are stopped: SIGTERM, SIGKILL after the stop
  // timeout. Call before the first ensure().
  virtual void adopt(std::vector<Replica> replicas) = 0;
  // Drains and stops every replica and the warm pool, waiting up to `timeout`; blocks. After
  // it, the orchestrator starts nothing.
  virtual void shutdown(std::chrono::milliseconds timeout) = 0;
};

struct LocalOptions {
  std::string binary;   // the `flotilla` executable that runs `flotilla replica`
  std::string log_dir;  // one log file per replica: <log_dir>/<replica id>.log
  std::string host = "127.0.0.1";
  // Idle `flotilla replica --standby` processes kept per runtime (process up and libraries
  // loaded, no model): a new replica takes one and only loads its model. 0: no pool.
  int warm_pool_size = 1;
  std::vector<std::string> warm_pool_runtimes = {"xgboost"};
  std::chrono::milliseconds tick{50};  // how often processes are checked
  // How often replicas that are not ready yet are probed (GET /v2/health/ready).
  std::chrono::milliseconds probe_interval{5};
  std::chrono::milliseconds ready_timeout{120'000};  // start to ready, else failed
  std::chrono::milliseconds restart_backoff{500};    // after a failure, doubling per failure
  std::chrono::milliseconds max_restart_backoff{30'000};
  // Between draining (the gateway stops sending) and SIGTERM: time for the new table to
  // reach every gateway worker.
  std::chrono::milliseconds drain_delay{1'000};
  std::chrono::milliseconds stop_timeout{30'000};  // SIGTERM to exit, else SIGKILL
  std::chrono::milliseconds keep_failed{300'000};  // how long failed replicas stay listed
  // Where per-replica cgroups are made when a deployment has limits (cgroup v2 only).
  std::string cgroup_root = "/sys/fs/cgroup/flotilla";
  std::vector<std::string> replica_args;  // extra flags for every replica (--log-level warn)
  // Marks every process this orchestrator starts: FLOTILLA_INSTANCE=<instance> in its
  // environment (/proc/PID/environ), so that a later orchestrator of the same instance (the
  // data directory of `flotilla up`) finds the ones no record describes. "": no marker.
  std::string instance;
  // Host-wide cap on replica processes (starting, loading, ready or draining): ensure() asks
  // beyond it start nothing more, and a "capped" event says so once per deployment until it
  // is no longer short. 0: no cap. Warm-pool standbys are a reserve on top (warm_pool_size per
  // runtime); one that becomes a replica counts.
  int max_replicas = 0;
  // Liveness of ready replicas: GET /v2/health/live every liveness_timeout / 4 (at most 1 s,
  // at least 50 ms), each probe with the same timeout, from a thread of its own. A ready
  // replica that answered no probe for liveness_timeout, with at least two failed in a row, is
  // hung (stopped, deadlocked): SIGKILL (SIGTERM does nothing to a stopped process), a "hung"
  // event, and it is replaced as a crashed one is. 0: no liveness probes.
  std::chrono::milliseconds liveness_timeout{5'000};
};

// The environment variable that carries LocalOptions::instance.
inline constexpr std::string_view kInstanceEnv = "FLOTILLA_INSTANCE";
// Set for warm-pool standbys: the pid of the orchestrator that started them. A standby whose
// parent is no longer that process (it died before the standby armed PR_SET_PDEATHSIG) exits.
inline constexpr std::string_view kParentEnv = "FLOTILLA_ORCHESTRATOR_PID";

// For `flotilla replica --standby`: die with the orchestrator thread that started it
// (PR_SET_PDEATHSIG, SIGKILL), and see whether it died before that was armed. A no-op outside
// Linux. Call first thing; false: the orchestrator is gone already (exit). Call
// disarm_parent_death() once handed a model: a replica outlives a restart of its orchestrator
// and is adopted.
bool exit_with_parent();
void disarm_parent_death();

// Why per-replica cgroup v2 limits cannot be applied on this machine, or "" when they can.
std::string cgroup_unavailable_reason(const std::string& cgroup_root);

// Starts the local orchestrator's threads. `clock` decides restart backoffs, ready and
// liveness timeouts, drain delays and stop timeouts (its waits between ticks are real time);
// it must outlive the orchestrator. Errors: kInvalidArgument when `binary` is not an
// executable file or `log_dir` cannot be created.
Result<std::unique_ptr<Orchestrator>> create_local_orchestrator(const LocalOptions& options,
                                                                Clock& clock = real_clock());

}  // namespace flotilla::orchestrator

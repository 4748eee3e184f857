// The control plane: endpoint operations, tokens and events over the SQLite store, the
// reconciler thread, and the service behind the REST API (api.h, an ApiServer).
//
// Concurrency: API calls run on the API server's worker and the reconciler on its own thread;
// both take mu_ for any read-modify-write of endpoints_ or tokens_ and the store write that goes
// with it, so concurrent calls on one endpoint are serialized and memory never disagrees with
// the database. Orchestrator events arrive on the orchestrator's thread and only touch the
// store (which serializes itself) and wake the reconciler. The gateway and orchestrator are
// called without holding mu_ when a call may take long (table swaps, ensure()).
#include "control/control_plane.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "control/replica_json.h"
#include "runtime/runtime_detect.h"

namespace flotilla::control {
namespace {

// How long a usage query (the vertical autoscaler's, once per period) may hold the reconciler.
constexpr std::chrono::milliseconds kUsageDeadline{500};

std::string describe_versions(const EndpointSpec& spec) {
  std::string text;
  for (const ServedModelSpec& served : spec.served_models) {
    text += (text.empty() ? "" : ", ") + served.name + " " + std::to_string(served.traffic) + "%";
  }
  return text;
}

// What an update does to the running replicas: which versions need new ones.
std::string describe_update(const std::string& endpoint, const EndpointSpec& before,
                            const EndpointSpec& after) {
  std::vector<std::string> starting;
  for (const ServedModelSpec& served : after.served_models) {
    const std::string key = deployment_key(endpoint, served);
    bool kept = false;
    for (const ServedModelSpec& old : before.served_models) {
      kept = kept || deployment_key(endpoint, old) == key;
    }
    if (!kept) {
      starting.push_back(served.name);
    }
  }
  if (starting.empty()) {
    return "applied without restarting replicas: " + describe_versions(after);
  }
  std::string names;
  for (const std::string& name : starting) {
    names += (names.empty() ? "" : ", ") + name;
  }
  return "rollout started: starting " + names + "; traffic moves to " + describe_versions(after) +
         " once they are ready";
}

}  // namespace

Status write_secret_file(const std::string& path, const std::string& text, bool replace) {
  struct stat existing {};
  if (replace && ::lstat(path.c_str(), &existing) == 0 && !S_ISDIR(existing.st_mode)) {
    // A file no token row backs (a start that failed before its row committed): replaced. A
    // directory is an error below, never removed.
    ::unlink(path.c_str());
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    return unavailable("cannot create '" + path + "': " + std::strerror(errno));
  }
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      const std::string error = std::strerror(errno);
      ::close(fd);
      ::unlink(path.c_str());
      return unavailable("cannot write '" + path + "': " + error);
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string error = std::strerror(errno);
    ::unlink(path.c_str());
    return unavailable("cannot write '" + path + "': " + error);
  }
  return Status::ok();
}

Status make_data_dir(const std::string& path) {
  const std::filesystem::path dir(path);
  std::error_code error;
  if (dir.has_parent_path()) {
    std::filesystem::create_directories(dir.parent_path(), error);
    if (error) {
      return unavailable("cannot create data directory '" + path + "': " + error.message());
    }
  }
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return unavailable("cannot create data directory '" + path + "': " + std::strerror(errno));
  }
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return unavailable("data directory '" + path + "' is not a directory");
  }
  if ((info.st_mode & 0077) != 0) {
    spdlog::warn("data directory {} is mode {:o}: other users may list it (chmod 700 {})", path,
                 info.st_mode & 0777, path);
  }
  return Status::ok();
}

int64_t default_max_replicas(int64_t cores, int64_t memory_bytes) {
  if (cores <= 0) {
    cores = std::max(1u, std::thread::hardware_concurrency());
  }
  if (memory_bytes <= 0) {
    memory_bytes = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  }
  const int64_t by_memory = memory_bytes / (int64_t{256} << 20);
  return std::max<int64_t>(4, std::min(32 * cores, by_memory));
}

Result<std::string> reset_admin_token(const std::string& data_dir) {
  const std::string db_path = data_dir + "/state.db";
  if (!std::filesystem::exists(db_path)) {
    return unavailable("no state database " + db_path + " (is --data-dir the one of flotilla up?)");
  }
  // The running flotilla up keeps its tokens in memory: a reset under it would not take.
  const std::string lock_path = data_dir + "/lock";
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock < 0) {
    return unavailable("cannot open '" + lock_path + "': " + std::strerror(errno));
  }
  if (::flock(lock, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock);
    return unavailable("data directory '" + data_dir +
                       "' is in use by a running flotilla up: stop it first (lock " + lock_path +
                       ")");
  }
  auto reset = [&]() -> Result<std::string> {
    FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, Store::open(db_path));
    FLOTILLA_ASSIGN_OR_RETURN(auth::NewToken token, auth::generate_token("admin", {}));
    TokenRow row{token.record, true, "reset by flotilla tokens reset-admin", unix_time_ms()};
    // A new file beside the old one, then the row, then the file in place: a failure before
    // the row leaves everything as it was.
    const std::string path = data_dir + "/" + std::string(kAdminTokenFile);
    const std::string fresh = path + ".new";
    FLOTILLA_RETURN_IF_ERROR(write_secret_file(fresh, token.token + "\n", /*replace=*/true));
    if (Status stored = store->put_token(row); !stored.is_ok()) {
      ::unlink(fresh.c_str());
      return stored;
    }
    if (::rename(fresh.c_str(), path.c_str()) != 0) {
      return unavailable("the new admin token is in " + fresh + " but cannot replace " + path +
                         ": " + std::strerror(errno));
    }
    (void)store->append_event(EventRow{0, unix_time_ms(), "", "token_created",
                                       "flotilla tokens reset-admin",
                                       "admin token 'admin' reset from the data directory"});
    return token.token;
  };
  Result<std::string> result = reset();
  ::close(lock);
  return result;
}

std::string resolve_runtime(const ServedModelSpec& served) {
  if (served.runtime != "auto") {
    return served.runtime;
  }
  Result<runtime::RuntimeKind> kind = runtime::detect_runtime(served.model);
  if (kind.is_ok() && *kind == runtime::RuntimeKind::kXgboost) {
    return "xgboost";
  }
  if (kind.is_ok() && *kind == runtime::RuntimeKind::kLlm) {
    return "llm";
  }
  return "auto";  // the replica reports why it cannot tell
}

Result<std::unique_ptr<ControlPlane>> ControlPlane::create(const ControlOptions& options,
                                                           orchestrator::Orchestrator& orchestrator,
                                                           gateway::GatewaySink& gateway,
                                                           MetricsRegistry& registry,
                                                           const Clock& clock) {
  FLOTILLA_RETURN_IF_ERROR(make_data_dir(options.data_dir));
  FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<Store> store,
                            Store::open(options.data_dir + "/state.db"));
  auto plane = std::unique_ptr<ControlPlaneImpl>(
      new ControlPlaneImpl(options, std::move(store), orchestrator, gateway, registry, clock));
  FLOTILLA_RETURN_IF_ERROR(plane->start());
  return std::unique_ptr<ControlPlane>(std::move(plane));
}

ControlPlaneImpl::ControlPlaneImpl(const ControlOptions& options, std::unique_ptr<Store> store,
                                   orchestrator::Orchestrator& orchestrator,
                                   gateway::GatewaySink& gateway, MetricsRegistry& registry,
                                   const Clock& clock)
    : options_(options),
      clock_(clock),
      store_(std::move(store)),
      orchestrator_(orchestrator),
      gateway_(gateway),
      registry_(registry),
      rollouts_(registry.counter("flotilla_rollouts_total",
                                 "Endpoint configs that became the serving config")),
      cold_start_warm_(registry.histogram(
          "flotilla_replica_cold_start_seconds", "Replica start to ready",
          {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}, {{"warm_pool", "true"}})),
      cold_start_fresh_(registry.histogram(
          "flotilla_replica_cold_start_seconds", "Replica start to ready",
          {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}, {{"warm_pool", "false"}})),
      replica_failures_(registry.counter("flotilla_replica_failures_total",
                                         "Replicas that exited, hung or timed out unasked")),
      replicas_capped_(registry.counter(
          "flotilla_replicas_capped_total",
          "Times a deployment was kept short of replicas by the host-wide cap (--max-replicas)")) {
  for (orchestrator::ReplicaState state :
       {orchestrator::ReplicaState::kStarting, orchestrator::ReplicaState::kLoading,
        orchestrator::ReplicaState::kReady, orchestrator::ReplicaState::kDraining,
        orchestrator::ReplicaState::kFailed}) {
    replicas_by_state_.emplace_back(
        state, &registry.gauge("flotilla_replicas", "Replicas by state",
                               {{"state", std::string(orchestrator::state_name(state))}}));
  }
}

ControlPlaneImpl::~ControlPlaneImpl() {
  shutdown(std::chrono::milliseconds(1'000));
}

// Reads and fills the guarded state before the reconciler and API threads exist, so without mu_.
Status ControlPlaneImpl::start() FLOTILLA_NO_THREAD_SAFETY_ANALYSIS {
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<EndpointRecord> records, store_->list_endpoints());
  for (const EndpointRecord& record : records) {
    Result<EndpointSpec> target = parse_endpoint_spec(record.spec_json);
    if (!target.is_ok()) {
      return target.status().with_context("stored endpoint '" + record.name + "'");
    }
    Stored stored;
    stored.state.target = std::move(target).value();
    if (!record.serving_json.empty()) {
      Result<EndpointSpec> serving = parse_endpoint_spec(record.serving_json);
      if (!serving.is_ok()) {
        return serving.status().with_context("stored endpoint '" + record.name + "'");
      }
      stored.state.serving = std::move(serving).value();
    }
    stored.record = record;
    endpoints_.emplace(record.name, std::move(stored));
  }
  FLOTILLA_ASSIGN_OR_RETURN(auto learned, store_->list_autoscaler_states());
  for (const auto& [name, json] : learned) {
    // A state we cannot read is only a lost optimization: the autoscaler learns again.
    if (std::optional<LearnedTarget> state = learned_target_from_json(json)) {
      learned_.emplace(name, *state);
    } else {
      spdlog::warn("control: ignoring the unreadable autoscaler state of '{}'", name);
    }
  }
  FLOTILLA_ASSIGN_OR_RETURN(tokens_, store_->list_tokens());
  if (tokens_.empty()) {
    FLOTILLA_RETURN_IF_ERROR(mint_first_admin_token());
  } else if (const std::string path = options_.data_dir + "/" + std::string(kAdminTokenFile);
             !std::filesystem::exists(path)) {
    spdlog::warn(
        "no admin token file {}: the admin token is shown only once, at the first start. To "
        "make a new one, stop flotilla up and run: flotilla tokens reset-admin --data-dir {}",
        path, options_.data_dir);
  }

  FLOTILLA_ASSIGN_OR_RETURN(std::vector<ReplicaRecord> replica_records, store_->list_replicas());

  // The API binds first: once the orchestrator holds the watcher below, nothing may fail (a
  // failed create() destroys this object).
  const bool metrics_open = std::find(options_.open_routes.begin(), options_.open_routes.end(),
                                      "metrics") != options_.open_routes.end();
  FLOTILLA_ASSIGN_OR_RETURN(api_, ApiServer::create(options_.api, *this, metrics_open));
  orchestrator_.watch([this](const orchestrator::ReplicaEvent& event) { on_replica(event); });
  std::vector<orchestrator::Replica> leftovers;
  for (const ReplicaRecord& record : replica_records) {
    Result<orchestrator::Replica> replica =
        replica_from_json(nlohmann::json::parse(record.json, nullptr, false));
    if (replica.is_ok()) {
      leftovers.push_back(std::move(replica).value());
    } else {
      spdlog::warn("ignoring stored replica {}: {}", record.id, replica.status().message());
      (void)store_->delete_replica(record.id);
    }
  }
  orchestrator_.adopt(std::move(leftovers));
  publish_auth();

  reconcile_once();
  gateway_.set_capacity_requester(this);
  reconciler_ = std::thread([this] { reconcile_loop(); });
  return Status::ok();
}

Status ControlPlaneImpl::mint_first_admin_token() {
  FLOTILLA_ASSIGN_OR_RETURN(auth::NewToken token, auth::generate_token("admin", {}));
  TokenRow row{token.record, true, "created by the first start of flotilla up", clock_.unix_ms()};
  // The file first, then the row: a failed write leaves no token that nobody holds.
  const std::string path = options_.data_dir + "/" + std::string(kAdminTokenFile);
  FLOTILLA_RETURN_IF_ERROR(write_secret_file(path, token.token + "\n", /*replace=*/true));
  if (Status stored = store_->create_token(row); !stored.is_ok()) {
    ::unlink(path.c_str());
    return stored;
  }
  tokens_.push_back(row);
  new_admin_token_ = token.token;
  record_event("", "token_created", "flotilla", "admin token 'admin' created");
  return Status::ok();
}

uint16_t ControlPlaneImpl::api_port() const {
  return api_->port();
}

void ControlPlaneImpl::run() {
  api_->run();
}

void ControlPlaneImpl::shutdown(std::chrono::milliseconds timeout) {
  {
    MutexLock lock(mu_);
    if (stopping_) {
      return;
    }
    stopping_ = true;
  }
  // Outside mu_, which request_capacity() takes: this waits for a request in progress.
  gateway_.set_capacity_requester(nullptr);
  wake_.notify_all();
  applied_.notify_all();
  if (reconciler_.joinable()) {
    reconciler_.join();
  }
  if (api_) {
    api_->drain(timeout);
  }
}

void ControlPlaneImpl::record_event(const std::string& endpoint, const std::string& kind,
                                    const std::string& actor, const std::string& message) {
  Result<int64_t> id =
      store_->append_event(EventRow{0, clock_.unix_ms(), endpoint, kind, actor, message});
  if (!id.is_ok()) {
    spdlog::error("cannot record event '{}': {}", message, id.status().message());
  }
}

void ControlPlaneImpl::on_replica(const orchestrator::ReplicaEvent& event) {
  const orchestrator::Replica& replica = event.replica;
  if (event.kind == "capped") {  // about a deployment, not a replica: nothing to store
    replicas_capped_.inc();
    record_event(replica.deployment.endpoint, "replicas_capped", "orchestrator",
                 replica.deployment.version + ": " + event.message);
    return;
  }
  record_event(replica.deployment.endpoint, "replica_" + event.kind, "orchestrator",
               replica.id + (event.message.empty() ? "" : ": " + event.message));
  const bool gone = replica.state == orchestrator::ReplicaState::kStopped ||
                    replica.state == orchestrator::ReplicaState::kFailed;
  Status stored = gone ? store_->delete_replica(replica.id)
                       : store_->put_replica(ReplicaRecord{replica.id, replica.deployment.endpoint,
                                                           to_json(replica).dump()});
  if (!stored.is_ok()) {
    spdlog::error("cannot store replica {}: {}", replica.id, stored.message());
  }
  if (event.kind == "ready") {
    const double seconds =
        static_cast<double>(replica.ready_unix_ms - replica.started_unix_ms) / 1000.0;
    (replica.from_warm_pool ? cold_start_warm_ : cold_start_fresh_).observe(seconds);
    if (replica.started_unix_ms > 0 && replica.ready_unix_ms >= replica.started_unix_ms) {
      MutexLock lock(mu_);  // an orchestrator that does not time its starts leaves it unknown
      replica_start_ms_by_endpoint_[replica.deployment.endpoint] =
          replica.ready_unix_ms - replica.started_unix_ms;
    }
  } else if (event.kind == "failed" || event.kind == "hung") {  // a timeout is followed by its
                                                                // "failed"
    replica_failures_.inc();
    MutexLock lock(mu_);
    ++replica_failures_by_endpoint_[replica.deployment.endpoint];
  }
  {
    // A change the reconciler acts on now (a ready replica joins the gateway's table, a
    // rollout promotes), not at its next interval: the loop waits for a new generation.
    MutexLock lock(mu_);
    ++change_generation_;
  }
  wake_.notify_all();
}

void ControlPlaneImpl::reconcile_loop() {
  mu_.lock();
  while (!stopping_) {
    const auto deadline = std::chrono::steady_clock::now() + options_.reconcile_interval;
    while (!stopping_ && change_generation_ <= applied_generation_ && capacity_requests_.empty()) {
      if (!wake_.wait_until(mu_, deadline)) {
        break;
      }
    }
    if (stopping_) {
      break;
    }
    mu_.unlock();
    reconcile_once();
    mu_.lock();
  }
  mu_.unlock();
}

void ControlPlaneImpl::request_capacity(const std::string& endpoint) {
  {
    MutexLock lock(mu_);
    capacity_requests_.insert(endpoint);
  }
  wake_.notify_all();
}

ReplicaUsage ControlPlaneImpl::replica_usage(const std::vector<orchestrator::Replica>& replicas) {
  const double machine_cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::string> ids;
  ids.reserve(replicas.size());
  for (const orchestrator::Replica& replica : replicas) {
    ids.push_back(replica.id);
  }
  // Blocks this thread for at most the deadline, however many replicas there are.
  std::map<std::string, orchestrator::UsageReading> readings;
  for (orchestrator::UsageReading& reading : orchestrator_.usage(ids, kUsageDeadline)) {
    std::string id = reading.replica_id;
    readings.emplace(std::move(id), std::move(reading));
  }
  std::vector<UsageChange> changes;
  for (const orchestrator::Replica& replica : replicas) {
    auto found = readings.find(replica.id);
    if (found == readings.end()) {
      continue;  // gone since the list was read
    }
    const orchestrator::UsageReading& reading = found->second;
    UsageChange change;
    change.now = {reading.cpu_seconds, reading.queue_wait_seconds,
                  replica.deployment.cpus > 0 ? std::min(replica.deployment.cpus, machine_cores)
                                              : machine_cores,
                  reading.at};
    if (auto previous = usage_readings_.find(replica.id); previous != usage_readings_.end()) {
      change.before = previous->second;
    }
    usage_readings_[replica.id] = change.now;
    changes.push_back(change);
  }
  return usage_from_changes(changes);
}

void ControlPlaneImpl::autoscale(const std::vector<orchestrator::Replica>& replicas,
                                 const std::map<std::string, std::vector<LoadSample>>& samples) {
  if (!options_.autoscaling.enabled) {
    return;
  }
  // What each endpoint runs now, read under mu_; the policies run without it.
  std::map<std::string, EndpointSpec> specs;
  std::set<std::string> requests;
  std::map<std::string, int64_t> failures;
  std::map<std::string, int64_t> start_ms;
  {
    MutexLock lock(mu_);
    for (const auto& [name, stored] : endpoints_) {
      specs.emplace(name, stored.state.serving.value_or(stored.state.target));
    }
    requests.swap(capacity_requests_);
    failures = replica_failures_by_endpoint_;
    start_ms = replica_start_ms_by_endpoint_;
  }
  std::erase_if(scalers_, [&](const auto& entry) { return !specs.contains(entry.first); });
  std::erase_if(learned_, [&](const auto& entry) { return !specs.contains(entry.first); });
  const autoscaler::Millis now(clock_.unix_ms());
  std::map<std::string, std::pair<Scale, std::vector<std::string>>> decisions;
  for (const auto& [name, spec] : specs) {
    std::vector<orchestrator::Replica> ready;
    int64_t pending = 0;
    for (const orchestrator::Replica& replica : replicas) {
      if (replica.deployment.endpoint != name) {
        continue;
      }
      if (replica.state == orchestrator::ReplicaState::kReady) {
        ready.push_back(replica);
      } else if (replica.state == orchestrator::ReplicaState::kStarting ||
                 replica.state == orchestrator::ReplicaState::kLoading) {
        pending += 1;
      }
    }
    auto& scaler = scalers_[name];
    if (!scaler) {
      // After a restart, what already runs stays: no scale-down before the down window.
      std::vector<int64_t> running;
      for (const ServedModelSpec& served : spec.served_models) {
        const std::string key = deployment_key(name, served);
        running.push_back(std::count_if(replicas.begin(), replicas.end(), [&](const auto& r) {
          return r.deployment.key == key && (r.state == orchestrator::ReplicaState::kReady ||
                                             r.state == orchestrator::ReplicaState::kStarting ||
                                             r.state == orchestrator::ReplicaState::kLoading);
        }));
      }
      const auto saved = learned_.find(name);
      scaler = std::make_unique<EndpointScaler>(
          spec, options_.autoscaling, replicas_matching(spec, running), now,
          saved != learned_.end() ? std::optional(saved->second) : std::nullopt);
      restore_demand(name, *scaler);
    }
    scaler->update_spec(spec);
    if (auto took = start_ms.find(name); took != start_ms.end()) {
      scaler->observe_start(autoscaler::Millis(took->second));
    }
    const auto found = samples.find(name);
    scaler->add_samples(found != samples.end() ? found->second : std::vector<LoadSample>{},
                        static_cast<int64_t>(ready.size()));
    std::vector<std::string> changes =
        scaler->tick(now, static_cast<int64_t>(ready.size()), pending, failures[name],
                     [&] { return replica_usage(ready); });
    if (requests.contains(name) && scaler->request_capacity()) {
      changes.push_back("scale from zero: 0 -> 1 replica, a request is waiting");
    }
    decisions[name] = {scaler->scale(), std::move(changes)};
    save_learned(name, scaler->learned());
    save_demand(name, *scaler, now);
  }
  // Only now: each endpoint's pass reads its own replicas, and must not forget the others'.
  std::erase_if(usage_readings_, [&](const auto& entry) {
    return std::none_of(replicas.begin(), replicas.end(),
                        [&](const auto& replica) { return replica.id == entry.first; });
  });
  MutexLock lock(mu_);
  for (auto& [name, decision] : decisions) {
    auto it = endpoints_.find(name);
    if (it == endpoints_.end()) {
      continue;
    }
    it->second.state.scale = decision.first;
    for (const std::string& change : decision.second) {
      record_event(name, "autoscaler", "autoscaler", change);
    }
    registry_
        .gauge("flotilla_autoscaler_desired_replicas", "Replicas the autoscaler wants per endpoint",
               {{"endpoint", name}})
        .set(static_cast<double>(decision.first.replicas));
    registry_
        .gauge("flotilla_autoscaler_target_concurrency",
               "Learned per-replica target concurrency per endpoint", {{"endpoint", name}})
        .set(decision.first.target);
  }
}

void ControlPlaneImpl::record_metrics(
    const std::vector<orchestrator::Replica>& replicas,
    const std::map<std::string, std::vector<LoadSample>>& samples) {
  std::map<std::string, std::optional<Scale>> scales;
  {
    MutexLock lock(mu_);
    for (const auto& [name, stored] : endpoints_) {
      scales.emplace(name, stored.state.scale);
    }
  }
  std::vector<std::string> names;
  for (const auto& [name, scale] : scales) {
    ReplicaCounts counts;
    for (const orchestrator::Replica& replica : replicas) {
      if (replica.deployment.endpoint == name) {
        counts[replica.deployment.version][std::string(orchestrator::state_name(replica.state))] +=
            1;
      }
    }
    const auto found = samples.find(name);
    metrics_history_.record(name,
                            found != samples.end() ? found->second : std::vector<LoadSample>{},
                            counts, scale ? std::optional(scale->replicas) : std::nullopt,
                            scale ? std::optional(scale->target) : std::nullopt);
    names.push_back(name);
  }
  metrics_history_.retain(names);
}

void ControlPlaneImpl::save_learned(const std::string& endpoint, const LearnedTarget& learned) {
  auto it = learned_.find(endpoint);
  if (it != learned_.end() && it->second == learned) {
    return;
  }
  // A failed write (a full disk, the endpoint deleted meanwhile) is retried on the next pass.
  if (Status saved = store_->put_autoscaler_state(endpoint, learned_target_to_json(learned));
      !saved.is_ok()) {
    spdlog::warn("control: cannot save the autoscaler state of '{}': {}", endpoint,
                 saved.message());
    return;
  }
  learned_[endpoint] = learned;
}

void ControlPlaneImpl::restore_demand(const std::string& endpoint, EndpointScaler& scaler) {
  Result<std::vector<DemandBucket>> stored = store_->list_demand(endpoint);
  if (!stored.is_ok()) {
    // The forecast then starts from no history: it raises nothing until days repeat.
    spdlog::warn("control: cannot read the demand history of '{}': {}", endpoint,
                 stored.status().message());
    return;
  }
  std::vector<std::pair<autoscaler::Millis, double>> buckets;
  buckets.reserve(stored->size());
  for (const DemandBucket& bucket : *stored) {
    buckets.emplace_back(autoscaler::Millis(bucket.start_unix_ms), bucket.peak);
  }
  scaler.restore_demand(buckets);
}

void ControlPlaneImpl::save_demand(const std::string& endpoint, EndpointScaler& scaler,
                                   autoscaler::Millis now) {
  const auto closed = scaler.take_closed_demand();
  if (closed.empty()) {
    return;
  }
  std::vector<DemandBucket> buckets;
  buckets.reserve(closed.size());
  for (const auto& [start, peak] : closed) {
    buckets.push_back({start.count(), peak});
  }
  // A failed write (a full disk, the endpoint deleted meanwhile) loses these buckets from the
  // stored history only; the forecast in memory keeps them.
  if (Status saved = store_->put_demand(endpoint, buckets, scaler.demand_kept_from(now).count());
      !saved.is_ok()) {
    spdlog::warn("control: cannot save the demand history of '{}': {}", endpoint, saved.message());
  }
}

void ControlPlaneImpl::reconcile_once() {
  // One pass: read the replicas, let the autoscaler decide, decide under mu_ (promotions are
  // written there), then act without it.
  const std::vector<orchestrator::Replica> replicas = orchestrator_.list();
  // Each endpoint's last seconds from the gateway, read once for the autoscaler and the history.
  std::map<std::string, std::vector<LoadSample>> samples;
  for (const std::string& name : endpoint_names()) {
    samples[name] = gateway_.samples(name, 30);
  }
  autoscale(replicas, samples);
  record_metrics(replicas, samples);
  for (auto& [key, gauge] : replicas_by_state_) {
    const auto state = key;  // a copy: clang 14 cannot capture a structured binding
    gauge->set(static_cast<double>(
        std::count_if(replicas.begin(), replicas.end(),
                      [&](const auto& replica) { return replica.state == state; })));
  }
  ReconcilePlan plan;
  uint64_t generation = 0;
  {
    MutexLock lock(mu_);
    generation = change_generation_;
    std::vector<EndpointState> states;
    states.reserve(endpoints_.size());
    for (const auto& [name, stored] : endpoints_) {
      states.push_back(stored.state);
    }
    plan = reconcile(states, replicas, resolve_runtime, [](const ServedModelSpec& served) {
      Result<int64_t> length = runtime::llm_context_length(served.model);
      return length.is_ok() ? *length : int64_t{0};
    });
    for (const std::string& name : plan.promoted) {
      Stored& stored = endpoints_.at(name);
      const bool first = !stored.state.serving.has_value();
      stored.state.serving = stored.state.target;
      stored.record.serving_json = to_json(stored.state.target).dump();
      stored.record.updated_unix_ms = clock_.unix_ms();
      if (Status status = store_->update_endpoint(stored.record); !status.is_ok()) {
        spdlog::error("cannot store the serving config of '{}': {}", name, status.message());
      }
      rollouts_.inc();
      record_event(
          name, first ? "ready" : "rollout_complete", "reconciler",
          (first ? "serving " : "traffic switched to ") + describe_versions(stored.state.target));
    }
  }
  if (!(plan.table == published_table_)) {
    if (Status status = gateway_.update_table(plan.table); status.is_ok()) {
      published_table_ = plan.table;
    } else {
      // Retiring replicas the gateway may still route to would drop requests: wait for a
      // table it takes.
      spdlog::error("gateway refused the endpoint table: {}", status.message());
      return;
    }
  }
  std::set<std::string> planned;
  for (const auto& [deployment, count] : plan.ensure) {
    orchestrator_.ensure(deployment, count);
    planned.insert(deployment.key);
    if (count > 0) {
      ensured_[deployment.key] = deployment;
    } else {
      ensured_.erase(deployment.key);
    }
  }
  // Deployments asked for before and gone from the plan without a live replica to retire
  // (all failed, or none started yet): tell the orchestrator too, or it keeps restarting them.
  for (auto it = ensured_.begin(); it != ensured_.end();) {
    if (planned.contains(it->first)) {
      ++it;
      continue;
    }
    orchestrator_.ensure(it->second, 0);
    it = ensured_.erase(it);
  }
  {
    MutexLock lock(mu_);
    applied_generation_ = std::max(applied_generation_, generation);
  }
  applied_.notify_all();
}

void ControlPlaneImpl::wait_until_applied() {
  MutexLock lock(mu_);
  const uint64_t generation = ++change_generation_;
  wake_.notify_all();
  // A reconciler pass takes milliseconds; the bound only matters if it is stuck.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (applied_generation_ < generation && !stopping_) {
    if (!applied_.wait_until(mu_, deadline)) {
      break;
    }
  }
}

void ControlPlaneImpl::publish_auth() {
  gateway::AuthConfig auth;
  auth.enabled = true;
  auth.open_routes = options_.open_routes;
  std::vector<auth::TokenRecord> admins;
  for (const TokenRow& row : tokens_) {
    auth.tokens.push_back(row.record);
    if (row.admin) {
      admins.push_back(row.record);
    }
  }
  admin_auth_ = std::make_shared<const auth::Authenticator>(std::move(admins));
  gateway_.update_auth(std::move(auth));
}

// ---- Endpoint operations (called by the API with mu_ not held) --------------------------------

Result<nlohmann::json> ControlPlaneImpl::create_endpoint(std::string_view body,
                                                         const std::string& actor) {
  FLOTILLA_ASSIGN_OR_RETURN(EndpointSpec spec, parse_endpoint_spec(body));
  FLOTILLA_RETURN_IF_ERROR(
      check_replica_cap(spec, options_.max_replicas, options_.autoscaling.enabled));
  FLOTILLA_RETURN_IF_ERROR(check_model_paths(spec));
  FLOTILLA_RETURN_IF_ERROR(serve_mlflow_flavors(spec));
  {
    MutexLock lock(mu_);
    if (endpoints_.contains(spec.name)) {
      return Status(StatusCode::kFailedPrecondition, "endpoint '" + spec.name + "' already exists");
    }
    Stored stored;
    stored.state.target = spec;
    stored.record =
        EndpointRecord{spec.name, to_json(spec).dump(), "", clock_.unix_ms(), clock_.unix_ms()};
    FLOTILLA_RETURN_IF_ERROR(store_->create_endpoint(stored.record));
    endpoints_.emplace(spec.name, std::move(stored));
    record_event(spec.name, "created", actor, "created: starting " + describe_versions(spec));
  }
  wait_until_applied();
  return endpoint_view(spec.name);
}

Result<nlohmann::json> ControlPlaneImpl::update_endpoint(const std::string& name,
                                                         std::string_view body,
                                                         const std::string& actor) {
  FLOTILLA_ASSIGN_OR_RETURN(EndpointSpec spec, parse_endpoint_spec(body, name));
  FLOTILLA_RETURN_IF_ERROR(
      check_replica_cap(spec, options_.max_replicas, options_.autoscaling.enabled));
  FLOTILLA_RETURN_IF_ERROR(check_model_paths(spec));
  FLOTILLA_RETURN_IF_ERROR(serve_mlflow_flavors(spec));
  {
    MutexLock lock(mu_);
    auto it = endpoints_.find(name);
    if (it == endpoints_.end()) {
      return not_found("endpoint '" + name + "' does not exist");
    }
    Stored& stored = it->second;
    if (stored.state.target != spec) {
      const EndpointSpec before = stored.state.serving.value_or(stored.state.target);
      EndpointRecord record = stored.record;
      record.spec_json = to_json(spec).dump();
      record.updated_unix_ms = clock_.unix_ms();
      FLOTILLA_RETURN_IF_ERROR(store_->update_endpoint(record));
      stored.record = std::move(record);
      stored.state.target = spec;
      record_event(name, "updated", actor, describe_update(name, before, spec));
    }
  }
  wait_until_applied();
  return endpoint_view(name);
}

Status ControlPlaneImpl::delete_endpoint(const std::string& name, const std::string& actor) {
  {
    MutexLock lock(mu_);
    if (!endpoints_.contains(name)) {
      return not_found("endpoint '" + name + "' does not exist");
    }
    FLOTILLA_RETURN_IF_ERROR(store_->delete_endpoint(name));
    endpoints_.erase(name);
    record_event(name, "deleted", actor, "deleted: its replicas drain and stop");
  }
  wait_until_applied();
  return Status::ok();
}

Result<nlohmann::json> ControlPlaneImpl::endpoint_view(const std::string& name) {
  EndpointState state;
  EndpointRecord record;
  {
    MutexLock lock(mu_);
    auto it = endpoints_.find(name);
    if (it == endpoints_.end()) {
      return not_found("endpoint '" + name + "' does not exist");
    }
    state = it->second.state;
    record = it->second.record;
  }
  const std::vector<orchestrator::Replica> replicas = orchestrator_.list();
  nlohmann::json view;
  view["name"] = name;
  // READY: every serving version with traffic has a ready replica (or the autoscaler scaled
  // the endpoint to zero: requests are held until one is).
  bool ready = state.serving.has_value();
  if (state.serving && !(state.scale && state.scale->replicas == 0)) {
    for (const ServedModelSpec& served : state.serving->served_models) {
      const std::string key = deployment_key(name, served);
      const bool any_ready = std::any_of(replicas.begin(), replicas.end(), [&](const auto& r) {
        return r.deployment.key == key && r.state == orchestrator::ReplicaState::kReady;
      });
      ready = ready && (served.traffic == 0 || any_ready);
    }
  }
  nlohmann::json versions = nlohmann::json::array();
  std::vector<const EndpointSpec*> specs = {&state.target};
  if (state.serving && *state.serving != state.target) {
    specs.push_back(&*state.serving);
  }
  for (const EndpointSpec* spec : specs) {
    for (const ServedModelSpec& served : spec->served_models) {
      const std::string key = deployment_key(name, served);
      int ready_replicas = 0;
      for (const auto& replica : replicas) {
        ready_replicas +=
            replica.deployment.key == key && replica.state == orchestrator::ReplicaState::kReady;
      }
      const bool serving =
          state.serving &&
          std::any_of(state.serving->served_models.begin(), state.serving->served_models.end(),
                      [&](const ServedModelSpec& s) { return deployment_key(name, s) == key; });
      nlohmann::json version = to_json(served);
      version["deployment_key"] = key;
      version["role"] = spec == &state.target ? "target" : "previous";
      version["serving"] = serving;
      version["replicas_wanted"] = version_replicas(served, state.scale);
      version["replicas_ready"] = ready_replicas;
      version["target_concurrency_per_replica"] = replica_cap(served, state.scale);
      versions.push_back(std::move(version));
    }
  }
  view["state"] = {
      {"ready", ready ? "READY" : "NOT_READY"},
      {"config_update", state.serving == state.target ? "NOT_UPDATING" : "IN_PROGRESS"}};
  view["config"] = state.serving ? to_json(*state.serving) : nlohmann::json(nullptr);
  view["pending_config"] =
      state.serving == state.target ? nlohmann::json(nullptr) : to_json(state.target);
  view["versions"] = std::move(versions);
  nlohmann::json replica_list = nlohmann::json::array();
  for (const auto& replica : replicas) {
    if (replica.deployment.endpoint == name) {
      nlohmann::json entry = to_json(replica);
      entry.erase("deployment");
      entry.erase("process_start_ticks");
      replica_list.push_back(std::move(entry));
    }
  }
  view["replicas"] = std::move(replica_list);
  if (state.scale) {
    view["autoscaler"] = {{"replicas", state.scale->replicas},
                          {"target_concurrency", state.scale->target}};
  }
  view["creation_timestamp"] = record.created_unix_ms;
  view["last_updated_timestamp"] = record.updated_unix_ms;
  return view;
}

Result<nlohmann::json> ControlPlaneImpl::endpoint_metrics(const std::string& name,
                                                          int64_t seconds) {
  {
    MutexLock lock(mu_);
    if (!endpoints_.contains(name)) {
      return not_found("endpoint '" + name + "' does not exist");
    }
  }
  return metrics_window_to_json(name, seconds,
                                metrics_history_.window(name, clock_.unix_ms(), seconds));
}

std::vector<std::string> ControlPlaneImpl::endpoint_names() {
  MutexLock lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, stored] : endpoints_) {
    names.push_back(name);
  }
  return names;
}

Result<std::vector<nlohmann::json>> ControlPlaneImpl::endpoint_views() {
  std::vector<nlohmann::json> views;
  for (const std::string& name : endpoint_names()) {
    // One deleted since the names were read is left out.
    if (Result<nlohmann::json> view = endpoint_view(name); view.is_ok()) {
      views.push_back(std::move(view).value());
    }
  }
  return views;
}

// ---- Tokens ------------------------------------------------------------------------------------

Result<nlohmann::json> ControlPlaneImpl::create_token(const std::string& id,
                                                      std::vector<std::string> endpoints,
                                                      bool admin, const std::string& comment,
                                                      const std::string& actor) {
  FLOTILLA_ASSIGN_OR_RETURN(auth::NewToken token, auth::generate_token(id, endpoints));
  TokenRow row{token.record, admin, comment, clock_.unix_ms()};
  {
    MutexLock lock(mu_);
    FLOTILLA_RETURN_IF_ERROR(store_->create_token(row));
    tokens_.push_back(row);
    publish_auth();
  }
  record_event("", "token_created", actor, "token '" + id + "' created");
  nlohmann::json info = token_view(row);
  return nlohmann::json{{"token", token.token}, {"token_info", info}};
}

Status ControlPlaneImpl::revoke_token(const std::string& id, const std::string& actor) {
  {
    MutexLock lock(mu_);
    FLOTILLA_RETURN_IF_ERROR(store_->delete_token(id));
    std::erase_if(tokens_, [&](const TokenRow& row) { return row.record.id == id; });
    publish_auth();
  }
  record_event("", "token_revoked", actor, "token '" + id + "' revoked");
  return Status::ok();
}

nlohmann::json ControlPlaneImpl::token_view(const TokenRow& row) {
  return {{"id", row.record.id},
          {"endpoints", row.record.endpoints},
          {"admin", row.admin},
          {"comment", row.comment},
          {"creation_timestamp", row.created_unix_ms}};
}

Result<nlohmann::json> ControlPlaneImpl::list_tokens() {
  MutexLock lock(mu_);
  nlohmann::json list = nlohmann::json::array();
  for (const TokenRow& row : tokens_) {
    list.push_back(token_view(row));
  }
  return list;
}

Result<auth::AuthResult> ControlPlaneImpl::check_token(std::string_view authorization,
                                                       std::vector<std::string>* scope) {
  MutexLock lock(mu_);
  std::vector<auth::TokenRecord> records;
  for (const TokenRow& row : tokens_) {
    records.push_back(row.record);
  }
  return auth::Authenticator(std::move(records)).check_scope(authorization, scope);
}

nlohmann::json ControlPlaneImpl::info() {
  return {{"gateway", options_.gateway_url},
          {"api", "http://" + options_.api.host + ":" + std::to_string(api_port())},
          {"data_dir", options_.data_dir},
          {"version", FLOTILLA_VERSION}};
}

Result<auth::AuthResult> ControlPlaneImpl::check_admin(std::string_view authorization,
                                                       std::string* token_id) {
  std::shared_ptr<const auth::Authenticator> admins;
  {
    MutexLock lock(mu_);
    admins = admin_auth_;
  }
  return auth::check_admin(
      *admins, authorization,
      [this](std::string_view presented) {
        std::vector<auth::TokenRecord> records;
        {
          MutexLock lock(mu_);
          for (const TokenRow& row : tokens_) {
            records.push_back(row.record);
          }
        }
        return auth::Authenticator(std::move(records)).check(presented, "") ==
               auth::AuthResult::kAllowed;
      },
      token_id);
}

}  // namespace flotilla::control

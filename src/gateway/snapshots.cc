// Snapshot publication (snapshots.h). Moved out of gateway_server.cc (issue #19).
#include "gateway/snapshots.h"

#include <algorithm>
#include <utility>

namespace flotilla::gateway {

Snapshots::Snapshots(const GatewayOptions& options, const Clock& clock, MetricsRegistry& registry,
                     Admission& admission, AuthConfig auth)
    : options_(options),
      clock_(clock),
      registry_(registry),
      admission_(admission),
      control_random_(options.seed != 0
                          ? options.seed
                          : static_cast<uint64_t>(SteadyClock::now().time_since_epoch().count())),
      control_balancer_(make_balancer(options.balancer)) {
  MutexLock lock(swap_mutex_);  // no other thread yet; the checker asks for it
  auth_ = std::move(auth);
}

uint64_t Snapshots::next_random() {
  MutexLock lock(swap_mutex_);
  return control_random_.next();
}

Status Snapshots::update_table(EndpointTable table) {
  FLOTILLA_RETURN_IF_ERROR(validate_endpoint_table(table));
  MutexLock lock(swap_mutex_);
  table_ = std::move(table);
  publish_locked();
  return Status::ok();
}

void Snapshots::update_auth(AuthConfig auth) {
  MutexLock lock(swap_mutex_);
  auth_ = std::move(auth);
  publish_locked();
}

void Snapshots::apply_config(EndpointTable table, AuthConfig auth) {
  MutexLock lock(swap_mutex_);
  table_ = std::move(table);
  auth_ = std::move(auth);
  publish_locked();
}

std::shared_ptr<const Snapshot> Snapshots::latest() const {
  MutexLock lock(snapshot_mutex_);
  return snapshot_;
}

std::vector<std::shared_ptr<EndpointRuntime>> Snapshots::endpoints() const {
  std::vector<std::shared_ptr<EndpointRuntime>> endpoints;
  MutexLock lock(swap_mutex_);
  for (const auto& [name, runtime] : endpoints_) {
    endpoints.push_back(runtime);
  }
  return endpoints;
}

void Snapshots::drop_queued() {
  MutexLock lock(swap_mutex_);
  for (auto& [name, endpoint] : endpoints_) {
    MutexLock endpoint_lock(endpoint->mutex);
    endpoint->queue.expire(TimePoint::max());
  }
}

void Snapshots::publish_locked() {
  auto snapshot = std::make_shared<Snapshot>();
  std::map<std::string, std::shared_ptr<EndpointRuntime>> endpoints;
  for (const EndpointEntry& entry : table_.endpoints) {
    auto found = endpoints_.find(entry.name);
    std::shared_ptr<EndpointRuntime> runtime =
        found != endpoints_.end() ? found->second
                                  : std::make_shared<EndpointRuntime>(
                                        entry.name, options_.queue_capacity, registry_, clock_);
    auto view = std::make_shared<EndpointView>();
    view->runtime = runtime;
    view->inference_table = entry.inference_table;
    std::map<std::string, std::shared_ptr<ReplicaRuntime>> replicas;
    for (const VersionEntry& version : entry.versions) {
      VersionView& version_view = view->versions.emplace_back();
      version_view.name = version.name;
      view->weights.push_back(version.traffic);
      if (version.runtime == "llm") {
        view->generative = true;
        if (version.max_model_len > 0 &&
            (view->max_model_len == 0 || version.max_model_len < view->max_model_len)) {
          view->max_model_len = version.max_model_len;
        }
      }
      for (const ReplicaEntry& replica : version.replicas) {
        const std::string key = version.name + "/" + replica.id + "@" + replica.host + ":" +
                                std::to_string(replica.port);
        auto existing = runtime->replicas.find(key);
        std::shared_ptr<ReplicaRuntime> replica_runtime;
        if (existing != runtime->replicas.end()) {
          replica_runtime = existing->second;
          replica_runtime->apply(replica);
        } else {
          replica_runtime =
              std::make_shared<ReplicaRuntime>(entry.name, version.name, replica, registry_);
        }
        replicas[key] = replica_runtime;
        version_view.replicas.push_back(std::move(replica_runtime));
      }
    }
    // Replicas that left the table take no new requests; those in flight finish (the calls
    // hold them), which is the drain.
    for (auto& [key, old] : runtime->replicas) {
      if (!replicas.contains(key)) {
        old->removed.store(true);
      }
    }
    runtime->replicas = std::move(replicas);
    {
      MutexLock endpoint_lock(runtime->mutex);
      runtime->view = view;
    }
    snapshot->endpoints.emplace(entry.name, std::move(view));
    snapshot->names.push_back(entry.name);
    endpoints.emplace(entry.name, std::move(runtime));
  }
  std::sort(snapshot->names.begin(), snapshot->names.end());
  snapshot->auth_enabled = auth_.enabled;
  snapshot->auth = std::make_shared<const auth::Authenticator>(auth_.tokens);
  snapshot->open_routes = auth_.open_routes;

  // Endpoints that left the table: their waiting requests are answered now.
  for (auto& [name, old] : endpoints_) {
    if (endpoints.contains(name)) {
      continue;
    }
    old->removed.store(true);
    for (auto& [key, replica] : old->replicas) {
      replica->removed.store(true);
    }
    admission_.abandon(*old);
  }
  endpoints_ = std::move(endpoints);
  {
    MutexLock snapshot_lock(snapshot_mutex_);
    snapshot_ = std::move(snapshot);
    version_.fetch_add(1, std::memory_order_release);
  }
  // New or freed capacity goes to requests that were waiting for it.
  for (auto& [name, runtime] : endpoints_) {
    if (runtime->queued.load() > 0) {
      admission_.dispatch_waiting(*runtime, *control_balancer_, control_random_);
    }
  }
}

}  // namespace flotilla::gateway

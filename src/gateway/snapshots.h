// Snapshot publication: the control side of the gateway builds one immutable Snapshot per table
// or auth change (endpoint views over the runtimes kept across swaps) and publishes it; workers
// pick it up with one atomic load per request (current()).
//
// Threads: update_table(), update_auth(), apply_config(), latest() and endpoints() from any
// thread, serialized by the swap mutex; current() on a worker thread with that worker's state.
//
// Private to the gateway module.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/common.h"
#include "gateway/admission.h"
#include "gateway/gateway.h"
#include "gateway/runtime_state.h"

namespace flotilla::gateway {

class Snapshots {
 public:
  // `options`, `clock`, `registry` and `admission` are kept alive by the caller (the gateway).
  // No snapshot is published until the first update_table().
  Snapshots(const GatewayOptions& options, const Clock& clock, MetricsRegistry& registry,
            Admission& admission, AuthConfig auth);
  Snapshots(const Snapshots&) = delete;
  Snapshots& operator=(const Snapshots&) = delete;

  // The next number of the control side's random source (the workers' seeds derive from it).
  uint64_t next_random();

  // Publishes `table` (refused, the old one staying, when invalid: validate_endpoint_table).
  Status update_table(EndpointTable table);
  void update_auth(AuthConfig auth);
  // Publishes a config file's table (already validated) and auth at once.
  void apply_config(EndpointTable table, AuthConfig auth);

  // The worker's snapshot, re-read when a newer one was published. On the worker's thread.
  const std::shared_ptr<const Snapshot>& current(WorkerState& worker) const {
    const uint64_t version = version_.load(std::memory_order_acquire);
    if (version != worker.snapshot_version) {
      MutexLock lock(snapshot_mutex_);
      worker.snapshot = snapshot_;
      worker.snapshot_version = version_.load(std::memory_order_acquire);
    }
    return worker.snapshot;
  }

  // The latest published snapshot (null before the first). Any thread.
  std::shared_ptr<const Snapshot> latest() const;
  // Every endpoint's runtime, for the sampler. Any thread.
  std::vector<std::shared_ptr<EndpointRuntime>> endpoints() const;
  // At shutdown, after the loops stopped: requests still queued (a drain that timed out) hold
  // their endpoint; let them go.
  void drop_queued();

 private:
  void publish_locked() FLOTILLA_REQUIRES(swap_mutex_);

  const GatewayOptions& options_;
  const Clock& clock_;
  MetricsRegistry& registry_;
  Admission& admission_;

  // Table swaps: serialized by swap_mutex_, which also guards the runtime registries, auth_
  // and the control side's balancer and random source.
  mutable Mutex swap_mutex_;
  std::map<std::string, std::shared_ptr<EndpointRuntime>> endpoints_
      FLOTILLA_GUARDED_BY(swap_mutex_);
  EndpointTable table_ FLOTILLA_GUARDED_BY(swap_mutex_);
  AuthConfig auth_ FLOTILLA_GUARDED_BY(swap_mutex_);
  SeededRandom control_random_ FLOTILLA_GUARDED_BY(swap_mutex_);
  std::unique_ptr<Balancer> control_balancer_ FLOTILLA_GUARDED_BY(swap_mutex_);

  // The published snapshot; workers re-read it when the version moves.
  mutable Mutex snapshot_mutex_;
  std::shared_ptr<const Snapshot> snapshot_ FLOTILLA_GUARDED_BY(snapshot_mutex_);
  std::atomic<uint64_t> version_{0};
};

}  // namespace flotilla::gateway

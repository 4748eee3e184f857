// The replica module's contract: the model server process of DESIGN.md §2 — one runtime
// behind the Open Inference Protocol v2, MLflow's /invocations and Prometheus /metrics, with
// dynamic batching. See docs/replica.md for routes, errors and metrics.
#pragma once

#include <chrono>
#include <memory>

#include "common/common.h"
#include "http/http.h"
#include "runtime/runtime.h"

namespace flotilla::replica {

struct BatchingOptions {
  bool enabled = true;
  // Rows merged into one model call at most. A single request larger than this runs alone.
  int64_t max_batch_rows = 64;
  // How long a batch waits for more rows after its first request. 0: take what is queued when
  // the model is free, never wait (see bench/RESULTS.md for the measurement behind it).
  std::chrono::microseconds max_queue_delay{0};
};

struct ReplicaOptions {
  http::ServerOptions server;
  BatchingOptions batching;
  std::chrono::milliseconds drain_timeout{30'000};
  double model_load_seconds = 0;  // reported in /metrics
};

// Not thread-safe to construct or run twice; drain() may be called from any thread.
class Replica {
 public:
  // Binds the listening sockets. `registry` must outlive the replica.
  static Result<std::unique_ptr<Replica>> create(std::unique_ptr<runtime::Runtime> runtime,
                                                 const ReplicaOptions& options,
                                                 MetricsRegistry& registry);
  virtual ~Replica() = default;

  virtual uint16_t port() const = 0;
  // Serves until a drain (drain() or SIGTERM/SIGINT) completes; blocks. Returns true when
  // every in-flight request finished in time.
  virtual bool run() = 0;
  virtual void drain() = 0;
};

}  // namespace flotilla::replica

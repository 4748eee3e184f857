// The replica module's contract: the model server process of DESIGN.md §2 — one runtime
// behind the Open Inference Protocol v2, MLflow's /invocations and Prometheus /metrics, with
// dynamic batching. See docs/replica.md for routes, errors and metrics.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "common/common.h"
#include "http/http.h"
#include "runtime/runtime.h"
#include "trace/trace.h"

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
  // The version of the model this replica serves (the endpoint version's name when the
  // orchestrator starts it): what /v2/models/{name}/versions/{v}/... must name (else 404),
  // what metadata lists in `versions`, and each infer response's model_version.
  std::string model_version = "1";
  // Runs once, on a server thread, when a drain (SIGTERM, SIGINT or drain()) completes before
  // serve() installed a model: nothing is left to serve, while the caller may still be busy
  // fetching or loading it. The CLI exits the process from here, so that a signal during a
  // long model download ends the process at once. Must not call into the replica. Unset: the
  // replica only stops answering, and serve() then fails with kUnavailable.
  std::function<void()> on_drained_while_loading;
  // Where and how spans are exported (unset: none); docs/tracing.md.
  std::optional<trace::TracerOptions> tracing;
  // Where the Open Inference Protocol's gRPC service listens ("host:port", port 0: any free
  // one; "" for nowhere); its calls take the REST routes (oip_grpc/oip_grpc.h).
  std::string grpc_listen;
};

// A replica has two phases (Kubernetes' liveness vs readiness, see docs/replica.md):
//   listen()  binds and answers at once, with no model: liveness, /metrics and /v2 answer,
//             readiness and every model route answer 503 ("loading");
//   serve()   installs the model; from then on every route answers as usual.
// run() then blocks until a drain completes.
//
// Thread-safety: listen(), serve(), run() and the destructor on one thread (the owner's);
// port() and drain() from any thread. Requests are answered on the server's own threads from
// listen() on; serve() publishes the model to them without a lock.
class Replica {
 public:
  // Binds the listening sockets and starts answering on the server's threads, before this
  // returns; drains on SIGTERM and SIGINT from then on. Fails with kUnavailable when the
  // address cannot be bound, kInvalidArgument when it is not an address. `registry` must
  // outlive the replica.
  static Result<std::unique_ptr<Replica>> listen(const ReplicaOptions& options,
                                                 MetricsRegistry& registry);
  // Destroying a replica that run() did not end stops it at once (a drain with no grace time,
  // unless a drain already runs: that one goes on to its end) and joins its threads.
  virtual ~Replica() = default;

  virtual uint16_t port() const = 0;
  // The gRPC port (ReplicaOptions::grpc_listen); 0 when it does not listen.
  virtual uint16_t grpc_port() const = 0;
  // Installs the model and makes the replica ready; `model_load_time` goes to
  // flotilla_replica_model_load_seconds. Call at most once. Takes `runtime` on success. Fails
  // with kUnavailable, leaving `runtime` with the caller, when a drain has already begun: the
  // model is never served, and run() returns as soon as that drain completes (at once when it
  // has). Does not block on requests.
  virtual Status serve(std::unique_ptr<runtime::Runtime>&& runtime,
                       std::chrono::duration<double> model_load_time) = 0;
  // Blocks until a drain (drain() or SIGTERM/SIGINT) completes; returns at once if one already
  // has (with or without a model served). Returns true when every in-flight request finished
  // in time.
  virtual bool run() = 0;
  // Starts a graceful drain; thread-safe, idempotent.
  virtual void drain() = 0;
};

}  // namespace flotilla::replica

// The Open Inference Protocol over gRPC: KServe's inference.GRPCInferenceService
// (src/oip_grpc/grpc_predict_v2.proto), the service tritonclient[grpc] and KServe's clients call,
// served over HTTP/2 cleartext by a process that serves the protocol over HTTP already.
//
// Each call becomes the REST request it stands for (ModelInfer: POST
// /v2/models/{name}[/versions/{v}]/infer with the JSON body; ModelReady: GET .../ready; ...),
// handed to the process's own HTTP handler through http::Server::submit, and the REST answer
// becomes the call's response or its status. The gateway and the replica serve gRPC this way,
// so every rule of their REST path holds for a gRPC call too: routing, auth (the
// `authorization` metadata), admission and caps, the balancer, retries, batching, access and
// inference logs, traces (`traceparent` metadata). docs/grpc.md says why and what it costs.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/common.h"
#include "http/http.h"

namespace flotilla::oip_grpc {

struct GrpcServerOptions {
  std::string address;  // "host:port" ("[::1]:port" for IPv6); port 0: the kernel picks
  // The largest request message taken (RESOURCE_EXHAUSTED past it) and response sent.
  size_t max_message_bytes = 8 * 1024 * 1024;
};

// A gRPC listener in front of an http::Server's handler. Thread-safe.
class GrpcServer {
 public:
  // Listens on options.address and serves until shutdown(). `rest` must outlive the returned
  // server. Errors: kInvalidArgument for an address without a port, kUnavailable when it
  // cannot be bound (in use, say).
  static Result<std::unique_ptr<GrpcServer>> start(const GrpcServerOptions& options,
                                                   http::Server& rest);
  virtual ~GrpcServer() = default;

  virtual uint16_t port() const = 0;
  // Stops taking calls (new ones fail UNAVAILABLE; none reaches `rest` once this returns);
  // calls in flight may finish for `grace`, then are cancelled. Returns at once: the wait runs
  // on a thread of its own, which the destructor joins. Idempotent; the destructor calls it.
  //
  // The destructor waits until `rest` has answered every call in flight, which it does by
  // serving them or, destroyed, by abandoning them (500). So an owner calls shutdown() first,
  // then destroys `rest`, then this server.
  virtual void shutdown(std::chrono::milliseconds grace) = 0;
};

}  // namespace flotilla::oip_grpc

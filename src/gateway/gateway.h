// The gateway module's contract (DESIGN.md §1 "Request path", §2): the endpoint table, routing,
// errors, retries and the server. Its policies (the balancers and the admission queue) are in
// gateway/gateway_policy.h, included here, so that the fleet simulator drives the same code
// without the server's dependencies.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "auth/auth.h"
#include "common/common.h"
#include "gateway/gateway_policy.h"
#include "http/http.h"
#include "trace/trace.h"

namespace flotilla::gateway {

// ---- Endpoint table: endpoint → versions with traffic weights → replicas ----------------------

enum class ReplicaState { kReady, kStarting, kDraining };

struct ReplicaEntry {
  std::string id;
  std::string host;
  uint16_t port = 0;
  int64_t max_in_flight = 0;  // the per-replica cap; 0 means none
  ReplicaState state = ReplicaState::kReady;
  bool operator==(const ReplicaEntry&) const = default;
};

struct VersionEntry {
  std::string name;
  int64_t traffic = 0;  // percent; an endpoint's versions sum to 100
  std::vector<ReplicaEntry> replicas;
  // What the version's replicas run ("llm", "xgboost", "synthetic"; "" unknown): only "llm"
  // versions make an endpoint a generative model in `GET /v1/models`.
  std::string runtime;
  // The context length of an "llm" version's model (prompt plus generated tokens), shown as
  // `max_model_len` by `GET /v1/models`; 0 unknown.
  int64_t max_model_len = 0;
  bool operator==(const VersionEntry&) const = default;
};

struct EndpointEntry {
  std::string name;
  std::vector<VersionEntry> versions;
  InferenceTableConfig inference_table;
  bool operator==(const EndpointEntry&) const = default;
};

// An immutable snapshot of every endpoint, swapped as a whole (std::shared_ptr<const ...>).
struct EndpointTable {
  std::vector<EndpointEntry> endpoints;
  const EndpointEntry* find(std::string_view name) const;
  bool operator==(const EndpointTable&) const = default;
};

// Checks a table: names present and unique, traffic in [0, 100] summing to 100 per endpoint,
// replica ids unique per endpoint, addresses with a host and a port, caps >= 0. Errors name
// the field ("endpoints[0].versions[1].traffic: ...").
Status validate_endpoint_table(const EndpointTable& table);

// Reads the YAML form used by `flotilla gateway --config` (docs/gateway.md) and validates it.
Result<EndpointTable> parse_endpoint_table_yaml(std::string_view text);

// The `auth:` section of the gateway config (docs/gateway.md).
struct AuthConfig {
  bool enabled = false;                   // whether the section is present
  std::vector<auth::TokenRecord> tokens;  // checked as auth.h's rules say
  std::vector<std::string> open_routes;   // served without a token: health, metrics, stats, models
};

// Reads the `auth:` section of the gateway's YAML config text; other top-level sections (such as
// `endpoints:`) are ignored:
//   auth:
//     tokens:
//       - {id: ci, salt: "<32 hex>", sha256: "<64 hex>", endpoints: [fraud]}
//     open_routes: [health, metrics]
// Both keys are optional; `endpoints` may be omitted (all endpoints). Hex is stored lower case.
// Returns enabled = false when there is no `auth:` section. Errors: kInvalidArgument naming the
// field ("auth.tokens[1].sha256: must be 64 hex characters") for a YAML syntax error, a wrong
// type, an unknown key, a bad id, salt, digest, endpoint or route, or a duplicate id.
// Thread-safe.
Result<AuthConfig> parse_auth_config_yaml(std::string_view text);

// One YAML flow mapping for `record`, as parse_auth_config_yaml reads it under `tokens:` (no
// leading "- ", no newline); `endpoints` is left out when empty. Used by the CLI that mints
// tokens. Thread-safe.
std::string token_record_yaml(const auth::TokenRecord& record);

// A whole `--config` file: the endpoint table and the optional `auth:` section.
struct GatewayConfig {
  EndpointTable table;
  AuthConfig auth;
};

// Reads and parses the config file at `path`. Errors: "cannot read '<path>'", or
// "<path>: <field>: <problem>".
Result<GatewayConfig> load_gateway_config(const std::string& path);

// ---- Routing: which endpoint a request is for, and where it goes on the replica ---------------

enum class RouteKind {
  kInvocations,     // POST /serving-endpoints/{endpoint}/invocations → /invocations
  kOip,             // /v2/models/{endpoint}[/versions/{v}][/...] → /v2/models/{endpoint}[/...]
  kOpenAi,          // POST /v1/completions, /v1/chat/completions; endpoint from the body's "model"
  kCatchAll,        // any other path, to the default endpoint when one is set
  kListModels,      // GET /v1/models
  kModel,           // GET /v1/models/{endpoint}, answered by the gateway
  kServerMetadata,  // GET /v2 (OIP server metadata), answered by the gateway
  kHealth,          // /v2/health/live, /v2/health/ready
  kMetrics,         // /metrics
  kStats,           // /gateway/stats
  kNotFound,
  kBadRequest,        // an OpenAI body without a string "model"
  kMethodNotAllowed,  // a known route with the wrong method; `allow` lists the right ones
};

struct Route {
  RouteKind kind = RouteKind::kNotFound;
  std::string endpoint;
  // For an OIP version path (/v2/models/{e}/versions/{v}[/...]): the version whose replicas
  // alone may serve it, ignoring traffic weights; empty otherwise. The upstream target drops
  // the version segment, so the replica's own version check cannot disagree with the table.
  std::string version;
  std::string upstream_target;  // path and query to send to the replica
  std::string error;            // for kBadRequest
  std::string_view allow;       // for kMethodNotAllowed: the Allow header, a literal ("POST")
};

// Classifies a request. `default_endpoint` (may be empty) receives paths no route claims.
// Pure; the body is only scanned for the top-level "model" field of OpenAI routes. Any bytes
// are accepted (invalid UTF-8 included); names are taken as sent.
Route route_request(http::Method method, std::string_view target, std::string_view body,
                    std::string_view default_endpoint);

// ---- The gateway's own errors, in the protocol of the route they answer ------------------------

enum class ErrorShape {
  kPlain,   // {"error": "..."}: OIP's shape (/v2/*), also for the gateway's own and unknown routes
  kOpenAi,  // /v1/*: {"error": {"message", "type", "param", "code"}}
  kMlflow,  // /serving-endpoints/*: {"error_code": "RESOURCE_DOES_NOT_EXIST", "message"}
};

// The shape of the errors answered to a request for `target` (path and query).
ErrorShape error_shape_for(std::string_view target);

// The JSON body of an error answered with `status`. `message` may hold any bytes (a path as
// sent): invalid UTF-8 becomes U+FFFD, so the body is always valid JSON. OpenAI's `type` and
// `code` and MLflow's `error_code` follow from the status (docs/gateway.md lists them);
// `param` names an OpenAI request field when not empty. Pure; never throws.
std::string error_body(ErrorShape shape, int status, std::string_view message,
                       std::string_view param = {});

// ---- Retries ------------------------------------------------------------------------------------

// One failed attempt of a proxied request, as the gateway sees it.
struct FailedAttempt {
  http::UpstreamFailure failure = http::UpstreamFailure::kNone;
  bool request_kept = false;  // the pool handed the request back (ClientResponse::unsent)
  bool client_gone = false;
  int attempts = 0;  // attempts made so far, this one included
};

// Attempts a request may make: enough for a replica that dies to be ejected and the request to
// reach its replacement; few enough that a request that kills every replica it meets stops.
inline constexpr int kMaxAttempts = 5;

// Whether to send a failed request again, on another eligible replica or, when there is none,
// after waiting in the endpoint's admission queue (with the cold-start deadline when no
// replica at all is eligible): yes when no byte of the response reached the client (connect
// failures, a reset or close before or during a response the gateway had not passed on), the
// request is still at hand, its client is there and it has attempts left. A timeout is
// answered 504, a malformed response 502 and a broken stream is cut: none is retried. Pure.
bool should_retry(const FailedAttempt& attempt);

// ---- The gateway server ------------------------------------------------------------------------

// Asked for capacity when a request arrives for an endpoint with no ready replica (scale from
// zero). Called from a worker thread at most once per second per endpoint; must not block nor
// call back into the gateway. The control plane implements it.
class CapacityRequester {
 public:
  virtual ~CapacityRequester() = default;
  virtual void request_capacity(const std::string& endpoint) = 0;
};

// ---- Inference tables (docs/inference-tables.md) ----------------------------------------------

// The file names of an endpoint's table under `dir`/<endpoint>/, oldest first: closed files
// ("<start>-<pid>.jsonl.gz") and the one being written ("....jsonl.gz.partial").
std::vector<std::string> inference_table_files(const std::string& dir, const std::string& endpoint);
// Calls `each` with every whole JSON line of one such file, in order, until it returns false; a
// file being written may end in a partial line or block, which is skipped. Errors: kNotFound,
// kInvalidArgument (not gzip data).
Status read_inference_file(const std::string& path,
                           const std::function<bool(std::string_view line)>& each);

// ---- The gateway as the control plane drives it (issue #19) ------------------------------------

// The narrow seam between the control plane and the gateway: table and auth updates in, load
// samples and capacity requests out. The control plane is built over a gateway that already
// exists and subscribes to its capacity requests; the gateway is built knowing nothing of it.
// Thread-safe: every method from any thread.
class GatewaySink {
 public:
  virtual ~GatewaySink() = default;

  // Swaps the endpoint table atomically. An invalid table is refused (the old one stays).
  // Requests in flight finish where they are; removed replicas get no new requests, and
  // queued requests of endpoints that gained room are dispatched.
  virtual Status update_table(EndpointTable table) = 0;
  virtual void update_auth(AuthConfig auth) = 0;

  // The last `seconds` one-second samples of an endpoint, oldest first (at most 600 kept).
  virtual std::vector<LoadSample> samples(const std::string& endpoint, size_t seconds) const = 0;

  // Where capacity requests go from now on; null (the start) for nowhere. When it returns, no
  // call to the previous requester is running, so the caller may then destroy it. Must not be
  // called while holding a lock that the requester takes.
  virtual void set_capacity_requester(CapacityRequester* requester) = 0;
};

struct GatewayOptions {
  http::ServerOptions server;
  BalancerKind balancer = BalancerKind::kPowerOfTwo;
  size_t queue_capacity = 1024;  // per endpoint
  std::chrono::milliseconds queue_timeout{5'000};
  // How long a request waits for an endpoint with no ready replica (scale from zero).
  std::chrono::milliseconds cold_start_timeout{60'000};
  std::chrono::milliseconds upstream_timeout{60'000};
  http::ClientOptions client;
  // Outlier detection: this many consecutive failures eject a replica; it is probed back in
  // after `ejection_time`, doubling per repeated ejection up to `max_ejection_time`.
  int eject_after_failures = 3;
  std::chrono::milliseconds ejection_time{1'000};
  std::chrono::milliseconds max_ejection_time{30'000};
  // Where the Open Inference Protocol's gRPC service listens ("host:port", port 0: any free
  // one; "" for nowhere). Its calls take the REST path of the same requests (oip_grpc/oip_grpc.h).
  std::string grpc_listen;
  // Paths that no route claims go to this endpoint (empty: 404). `flotilla gateway
  // --upstreams` uses it to front plain HTTP servers.
  std::string default_endpoint;
  // JSON access log: a file path, "-" for stderr, "" for none.
  std::string access_log;
  // Where the endpoints' inference tables are written (a directory per endpoint); "" for
  // nowhere: an endpoint that enables one records nothing (said once in the log).
  std::string inference_dir;
  // How long each inference table file stays open before it is closed and a new one begun.
  std::chrono::seconds inference_period{3'600};
  // Records waiting to be written, at most: past it a record is dropped and counted.
  size_t inference_buffer_bytes = 64 * 1024 * 1024;
  // Where and how the gateway's spans are exported (unset: no spans; a client's traceparent
  // is then passed through unchanged). See docs/tracing.md.
  std::optional<trace::TracerOptions> tracing;
  uint64_t seed = 0;  // 0: seeded from the clock
};

// An HTTP gateway in front of the endpoints' replicas (DESIGN.md §1). Thread-safety: create()
// and run() on one thread; drain() and the GatewaySink methods from any thread.
//
// Locking on the request path (issue #19): a request that finds a replica with room (the fast
// path) takes no lock: replica and endpoint counters are atomics, and the table is one atomic
// load. Only a request that finds no room takes its endpoint's mutex, to join the
// AdmissionQueue; a freed slot, a table swap or a probe takes it only when the atomic queue
// counter shows waiters. That mutex is the right trade, rather than confining each queue to
// one owning worker and posting to it: requests and freed slots of one endpoint arise on every
// worker, so an owner would add a cross-thread hop to each enqueue, dispatch and cancellation
// and serialize all workers' waiters of a hot endpoint on one event loop, exactly when the
// endpoint is saturated; the mutex is held for a few queue operations and is uncontended
// unless the endpoint is both saturated and busy on several workers at once.
class Gateway : public GatewaySink {
 public:
  // Binds the listening socket. `table` must be valid (validate_endpoint_table). `auth`
  // disabled lets every request through. `registry` must outlive the gateway. Capacity
  // requests go nowhere until set_capacity_requester().
  static Result<std::unique_ptr<Gateway>> create(const GatewayOptions& options, EndpointTable table,
                                                 AuthConfig auth, MetricsRegistry& registry);
  ~Gateway() override = default;

  virtual uint16_t port() const = 0;
  // The gRPC port (GatewayOptions::grpc_listen); 0 when it does not listen.
  virtual uint16_t grpc_port() const = 0;
  // Serves until a drain completes; blocks. True when every in-flight request finished.
  virtual bool run() = 0;
  virtual void drain(std::chrono::milliseconds timeout) = 0;
  virtual void drain_on_signals(std::chrono::milliseconds timeout) = 0;

  // Reloads `path` (YAML with `endpoints:` and optionally `auth:`) whenever it changes,
  // checking every `interval`. A file that does not parse is logged and ignored.
  virtual void watch_config(const std::string& path, std::chrono::milliseconds interval) = 0;
};

}  // namespace flotilla::gateway

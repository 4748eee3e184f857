// The http module's contract: an HTTP/1.1 server on Boost.Asio/Beast with one event loop per
// worker thread, keep-alive, limits and timeouts, and graceful drain.
//
// Threading: the handler runs on the worker thread that owns the connection. It may answer at
// once or later from any thread through the Responder. A connection reads its next request
// only after the previous response is written (a streamed one: finished).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "common/common.h"

namespace flotilla::http {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: the kernel picks; Server::port() tells which
  int workers = 0;    // event loops; 0: one per core
  size_t max_body_bytes = 8 * 1024 * 1024;
  size_t max_header_bytes = 16 * 1024;
  // Open client connections at most; one past it is answered 503 (Connection: close) and
  // closed. create() lowers it to fit the process's descriptor limit (soft RLIMIT_NOFILE, see
  // raise_open_file_limit): of the limit, fd_reserve descriptors plus 4 per worker (its event
  // loop's and its listener's) are kept for everything that is not a client connection, and
  // client connections may take fd_share of the rest: 1 for a server that opens nothing per
  // connection, 0.5 for a proxy whose in-flight requests each hold an upstream connection too.
  // Server::max_connections() tells the cap in force; docs/gateway.md, "File descriptors".
  size_t max_connections = 10000;
  size_t fd_reserve = 64;
  double fd_share = 1.0;
  // The header of a connection's first request must arrive within header_timeout of the
  // accept, a connection that sends nothing included; a keep-alive connection waits
  // idle_timeout for the first byte of its next request, whose header must then arrive within
  // header_timeout of that byte (slowloris). The body must arrive within body_timeout of the
  // header.
  std::chrono::milliseconds header_timeout{10'000};
  std::chrono::milliseconds body_timeout{30'000};
  std::chrono::milliseconds idle_timeout{60'000};
  // A streamed response (Responder::start_stream) may hold at most this many bytes written
  // by the handler and not yet taken by the kernel; past it the client is reading too slowly,
  // and its connection is closed as if it had left. A stalled write also ends at body_timeout.
  size_t max_stream_buffer_bytes = 8 * 1024 * 1024;
  // Copy every request header into Request::headers (a proxy forwards them); off by default so
  // servers that do not need them pay nothing.
  bool capture_headers = false;
  // The body of the server's own error answers (413, 431, 503 for too many connections, 500
  // for a request left unanswered), for APIs with an error shape of their own; unset:
  // {"error": message}. Called on a worker thread; must not throw.
  std::function<std::string(int status, std::string_view message)> error_body;
  // Called once when a drain starts, on the thread that starts it (for a signal, a worker's), so
  // that the process's other intake (the gRPC front end) stops taking requests. Must not block.
  std::function<void()> on_drain;
  // Give each of those answers a fresh X-Request-Id, for servers whose every answer carries one
  // (the gateway): the server answers them before any handler could assign an id.
  bool error_request_ids = false;
};

// kPatch is for clients (the Kubernetes API's patches): the servers here parse a PATCH request
// as kOther, which every route refuses with 405.
enum class Method { kGet, kHead, kPost, kPut, kDelete, kPatch, kOther };

std::string_view method_name(Method method);  // "GET", ...; "" for kOther

// Inline room for the usual handful of headers: a request's headers cost no allocation of
// their own (the strings in them still may).
using Headers = boost::container::small_vector<std::pair<std::string, std::string>, 8>;

// The value of header `name` (case-insensitive) in `headers`, or "" when absent.
std::string_view find_header(const Headers& headers, std::string_view name);
// Sets header `name` to `value`: the first of that name (case-insensitive) is replaced, any
// others removed; appended when absent.
void set_header(Headers& headers, std::string_view name, std::string value);

struct Request {
  Method method = Method::kOther;
  std::string target;  // path and query, as sent
  std::string content_type;
  std::string body;
  // Every header as received, in order, when ServerOptions::capture_headers is set; else empty.
  Headers headers;
  // Inference-Header-Content-Length (Triton's binary tensor data extension), kept whatever
  // capture_headers says: the OIP decoder needs it. "" when absent.
  std::string inference_header_length;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  Headers headers;
};

namespace detail {
class Exchange;
class LocalAnswer;
}  // namespace detail

// Answers one request, either whole with send() or in pieces with start_stream(), write() and
// finish() (Server-Sent Events, say). Move-only; every call but on_client_gone() may come from
// any thread. A Responder destroyed without sending answers 500, so a request is never left
// hanging; one destroyed mid-stream closes the connection, the body being incomplete.
class Responder {
 public:
  explicit Responder(std::shared_ptr<detail::Exchange> exchange);
  Responder(Responder&&) noexcept;
  // No move-assignment: it would drop the request the target still held.
  Responder& operator=(Responder&&) = delete;
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;
  ~Responder();

  // Sends the whole response; call exactly once, and not after start_stream(). Never blocks.
  void send(Response&& response);

  // Starts a streamed response instead of send(): the status line and headers, with
  // Transfer-Encoding: chunked (to an HTTP/1.0 client the body is sent as is and the
  // connection closes at the end). `headers` go out as given (Cache-Control: no-cache, ...).
  // Call at most once; never blocks.
  void start_stream(int status, std::string content_type, Headers headers = {});
  // Queues one piece of the body after start_stream(); pieces go out in the order of the calls,
  // from whichever threads. Never blocks. Dropped without taking a lock once the client has
  // gone (see on_client_gone) or the server has stopped; an empty piece is ignored. Past
  // ServerOptions::max_stream_buffer_bytes of unsent data (a single piece larger than that
  // included) the connection is closed and the client treated as gone.
  void write(std::string chunk);
  // Ends the stream (the terminating zero-length chunk) once the queued pieces are out; the
  // connection then serves its next request. Call once, after start_stream(); never blocks.
  void finish();

  // Runs `on_gone` on the connection's worker thread if the client closes its connection before
  // the response is sent or, for a stream, before it is finished (also when the stream is cut
  // for a write error or a client reading too slowly), so the producer can stop. Call at most
  // once, from the handler's thread, before send() or finish(). Costs no system call while the
  // client stays.
  void on_client_gone(std::function<void()> on_gone);

 private:
  friend class ServerImpl;
  // For Server::submit: the answer goes to `on_answer` instead of a connection; `options`
  // (the server's) shape the error of a request left unanswered.
  static Responder local(const ServerOptions& options, std::function<void(Response&&)> on_answer);

  std::shared_ptr<detail::Exchange> exchange_;
  std::shared_ptr<detail::LocalAnswer> local_;  // set instead of exchange_ by local()
};

using Handler = std::function<void(Request&& request, Responder&& responder)>;

// Runs `task` later on the calling worker thread's event loop: after `delay`, and after the
// I/O completions already ready there, so work they queue can be handled together (the
// replica's dynamic batching). Never blocks the loop. Called from a thread that is not a
// server worker, runs `task` inline.
void defer_on_current_loop(std::function<void()> task,
                           std::chrono::microseconds delay = std::chrono::microseconds(0));

// The index of the server worker whose thread is running, in [0, Server::worker_count()), or
// -1 on any other thread. Lets a handler keep per-worker state without locks.
int current_worker_index();

// The event loop of a server worker: tasks posted to it run on that worker's thread. Cheap to
// copy; valid while the server runs (tasks posted after it stopped are dropped).
class Loop {
 public:
  Loop() = default;
  // The loop of the calling worker thread; a null Loop on other threads.
  static Loop current();
  bool valid() const { return context_ != nullptr; }
  void post(std::function<void()> task) const;
  // Runs `task` on this loop after `delay`.
  void post_after(std::chrono::microseconds delay, std::function<void()> task) const;
  // The underlying boost::asio::io_context, for module-internal code (the http client).
  void* native() const { return context_; }

 private:
  explicit Loop(void* context) : context_(context) {}
  void* context_ = nullptr;
};

class Server {
 public:
  // Binds the listening sockets (so port() is known) without serving yet. Fails with
  // kUnavailable when the address cannot be bound.
  static Result<std::unique_ptr<Server>> create(const ServerOptions& options, Handler handler);
  virtual ~Server() = default;

  virtual uint16_t port() const = 0;
  // Serves on the worker threads until a drain completes; blocks the calling thread. Returns
  // true when every in-flight request finished, false when the drain timed out.
  virtual bool run() = 0;
  // Starts a graceful drain (thread-safe, idempotent): stop accepting, close idle keep-alive
  // connections, let in-flight requests finish (their responses carry Connection: close; a
  // stream whose head is already out closes after its finish()), then make run() return. After
  // `timeout`, connections still open are closed and later Responder calls are dropped.
  virtual void drain(std::chrono::milliseconds timeout) = 0;
  // Drains on SIGTERM or SIGINT.
  virtual void drain_on_signals(std::chrono::milliseconds timeout) = 0;
  virtual size_t open_connections() const = 0;
  // The connection cap in force: ServerOptions::max_connections, lowered to fit the
  // descriptor limit.
  virtual size_t max_connections() const = 0;
  // True once a drain has started (readiness should then answer "not ready").
  virtual bool draining() const = 0;
  virtual int worker_count() const = 0;
  // Handles a request that arrived another way (the gRPC front end's calls, as the REST
  // requests they stand for) as if read from a connection: the handler runs on a worker (round
  // robin), and its answer goes to `on_answer` once, on the thread that gives it (a stream's
  // pieces gathered into one body; none given: 500). A drain waits for these as for open
  // connections; once the server has stopped, `on_answer` gets a 503 at once. Thread-safe.
  virtual void submit(Request&& request, std::function<void(Response&&)> on_answer) = 0;
};

// Raises this process's soft limit on open descriptors (RLIMIT_NOFILE) to its hard limit, so a
// server is not held to a shell's default 1024; returns the soft limit in force afterwards.
// Call once at the start of a long-running process, before any server is created; child
// processes inherit the raised limit.
uint64_t raise_open_file_limit();

// ---- Client: keep-alive connections to upstream servers -----------------------------------------

struct ClientOptions {
  std::chrono::milliseconds connect_timeout{2'000};
  size_t max_idle_per_upstream = 512;  // idle keep-alive connections kept per host:port
  // Idle connections unused this long are closed: below the replicas' own idle timeout
  // (60 s by default), so the pool rarely meets a connection the upstream already closed.
  std::chrono::milliseconds max_idle_time{30'000};
  size_t max_response_bytes = 64 * 1024 * 1024;
};

// Why an upstream exchange failed. kConnect and kClosedBeforeResponse are safe to retry on
// another server: no byte of the response was seen.
enum class UpstreamFailure {
  kNone,
  kConnect,               // connect refused, unreachable or timed out
  kClosedBeforeResponse,  // reset or closed before the first response byte
  kClosedDuringResponse,  // reset or closed mid-response
  kTimeout,               // no complete response within the request's timeout
  kBadResponse,           // unparsable or over-large response
  kCancelled,             // cancel() was called
  // A streamed response (see ClientStreamHandler) failed after its head was delivered:
  // closed, timed out or malformed mid-body. Never safe to retry: bytes went on.
  kStreamInterrupted,
};

std::string_view failure_name(UpstreamFailure failure);

// Receives a Server-Sent Events response (Content-Type text/event-stream) as it arrives, instead
// of whole: on_head() once with the status, content type and end-to-end headers, then on_body()
// for each piece of the body as read (chunk framing removed), then the call's Callback with the
// ClientResponse minus its body (kNone at the end of the stream, kStreamInterrupted or
// kCancelled when cut). Both run on the pool's loop thread and may call ClientPool::cancel().
// Other responses take the ordinary path, whole in the Callback. For a stream the call's
// timeout bounds the wait for the head and then each wait for the next piece.
struct ClientStreamHandler {
  std::function<void(int status, std::string content_type, Headers headers)> on_head;
  std::function<void(std::string piece)> on_body;
};

struct ClientRequest {
  Method method = Method::kPost;
  std::string target;
  Headers headers;  // sent as given, plus Host, Content-Length and keep-alive
  std::string body;
  // Set both to stream event-stream responses; empty (the default): every response is whole.
  ClientStreamHandler stream;
};

struct ClientResponse {
  UpstreamFailure failure = UpstreamFailure::kNone;
  std::string error;  // why, when failure != kNone
  // The failure is this process's own, not the upstream's: out of descriptors, memory or
  // local ports (EMFILE, ENFILE, ENOBUFS, ENOMEM, EADDRNOTAVAIL). It says nothing about the
  // upstream's health (a gateway must not eject a replica for it).
  bool local_failure = false;
  int status = 0;
  // End-to-end headers; hop-by-hop ones (Connection, Keep-Alive, Transfer-Encoding,
  // Content-Length, ...) are left out. Content-Type is in content_type.
  Headers headers;
  std::string content_type;
  std::string body;
  // The request, handed back when failure is kConnect, kClosedBeforeResponse or
  // kClosedDuringResponse (a whole response, none of it passed on) so the caller can send it
  // elsewhere. Optional: an empty one costs nothing to move.
  std::optional<ClientRequest> unsent;
};

// A pool of keep-alive HTTP/1.1 connections to any number of upstreams, confined to one event
// loop: create it, call it and destroy it on that loop's thread. A connection carries one
// request at a time; finished ones go back to the pool, idle ones are reused newest first.
// A request on a reused connection that fails before any response byte (the upstream closed
// it while idle) is retried once on a fresh connection, so callers see kClosedBeforeResponse
// only when the upstream itself failed.
class ClientPool {
 public:
  using Callback = std::function<void(ClientResponse&& response)>;
  // A cancellation handle for one call; a default one, or one whose call ended, does nothing.
  struct CallHandle {
    std::weak_ptr<void> connection;
    uint64_t generation = 0;
  };

  static std::unique_ptr<ClientPool> create(Loop loop, const ClientOptions& options);
  virtual ~ClientPool() = default;

  // Sends `request` to host:port and calls `done` exactly once on the loop's thread, never
  // inline. `timeout` bounds the whole exchange after the connection is made.
  virtual CallHandle send(const std::string& host, uint16_t port, ClientRequest&& request,
                          std::chrono::milliseconds timeout, Callback done) = 0;
  // Aborts a call: its connection is closed and `done` gets kCancelled.
  virtual void cancel(const CallHandle& handle) = 0;
  virtual size_t idle_connections() const = 0;
};

// ---- Blocking client: one connection, for tools, control loops and the store ------------------

// How a BlockingConnection's TLS trusts its peer and shows itself (a Kubernetes API server's
// own CA and a client certificate, from a kubeconfig). PEM text, not paths: kubeconfigs carry
// it inline as often as in files.
struct TlsOptions {
  std::string ca_pem;    // the CAs trusted; empty: the system's (SSL_CERT_FILE / SSL_CERT_DIR)
  std::string cert_pem;  // a client certificate chain, with key_pem; empty: none
  std::string key_pem;
  bool verify = true;  // false: the peer is not verified (tests; insecure-skip-tls-verify)
};

// Where a BlockingConnection connects. With tls, the peer's certificate is verified against
// tls_options' CAs and `host`.
struct Origin {
  Origin() = default;
  Origin(std::string host_in, uint16_t port_in, bool tls_in, TlsOptions tls_options_in = {})
      : host(std::move(host_in)),
        port(port_in),
        tls(tls_in),
        tls_options(std::move(tls_options_in)) {}

  std::string host;
  uint16_t port = 80;
  bool tls = false;
  TlsOptions tls_options;
  std::string text() const;  // "http://host:port", for messages
};

// An http:// or https:// URL, split for an Origin and a request target.
struct Url {
  bool tls = false;  // https
  std::string host;
  uint16_t port = 0;
  std::string target;        // path and query, starting with '/'
  std::string text() const;  // scheme://host:port/target
  Origin origin() const { return Origin(host, port, tls); }
};

// http:// or https:// URLs without credentials or a fragment; kInvalidArgument naming what is
// wrong. The port defaults to the scheme's.
Result<Url> parse_url(std::string_view text);

// Byte range [first, last], both included (as in the Range header).
struct ByteRange {
  uint64_t first = 0;
  uint64_t last = 0;
};

// A response's status line and headers, as a BlockingConnection's head callback sees them.
struct ResponseHead {
  int status = 0;
  std::string content_type;
  Headers headers;  // every other header, as received (hop-by-hop ones included)
  std::optional<uint64_t> content_length;
};

// One blocking HTTP/1.1 keep-alive connection to one origin, plain TCP or TLS, for code off the
// request path: the store's downloads, probes, the CLI (through fetch()). Every step (connect,
// TLS handshake, the write, each read) must progress within `io_timeout`, so a long body that
// keeps arriving is never cut while a stalled peer is; a send() may also carry a deadline for the
// whole exchange. Connects lazily, at the first send(); after a failure, a refused response or a
// server's close, the next send() connects again. Not thread-safe: one thread at a time.
class BlockingConnection {
 public:
  using HeadCallback = std::function<Status(const ResponseHead& head)>;
  using BodyCallback = std::function<Status(const char* data, size_t size)>;

  BlockingConnection(Origin origin, std::chrono::milliseconds io_timeout);
  ~BlockingConnection();
  BlockingConnection(const BlockingConnection&) = delete;
  BlockingConnection& operator=(const BlockingConnection&) = delete;

  // Sends `request` (its method, target, headers and body; Host, User-Agent and Content-Length
  // are added, a header of the request's own overrides them; `stream` is ignored) and blocks
  // until the response is read: `on_head` sees the head and may refuse the response (its error
  // is returned, the body left unread), then `on_body` receives the body in pieces, in order, and
  // may stop it the same way. `deadline`, when set, bounds the whole exchange. Transport
  // failures (resolve, connect, TLS, reset, timeout, truncated or malformed response) are
  // kUnavailable naming the URL; failure() then tells which kind.
  Status send(ClientRequest request, const HeadCallback& on_head, const BodyCallback& on_body,
              std::optional<Clock::TimePoint> deadline = std::nullopt);
  // GET `target`, optionally one byte range of it (the Range header).
  Status get(const std::string& target, std::optional<ByteRange> range, const HeadCallback& on_head,
             const BodyCallback& on_body);

  // Ends the exchange in progress on its owner's thread (it fails with kUnavailable) and every
  // later one: a watch stream blocked in a read stops at once. The only method another thread
  // may call; the connection must outlive the call.
  void cancel();

  // Why the last send() failed in transport (kConnect, kTimeout, kClosedBeforeResponse,
  // kClosedDuringResponse, kBadResponse); kNone after a success or a callback's refusal.
  UpstreamFailure failure() const;
  // The last failure was this process's own (see ClientResponse::local_failure).
  bool local_failure() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Sends one request to host:port on a fresh BlockingConnection (Connection: close) and waits for
// the whole response, at most `timeout` from the start; blocks the calling thread. For tools and
// control loops (the CLI, readiness probes), never for the request path. Failures come back in
// ClientResponse::failure as with ClientPool (kConnect, kTimeout, ...); response headers are all
// kept; a body over 64 MiB is kBadResponse.
ClientResponse fetch(const std::string& host, uint16_t port, ClientRequest request,
                     std::chrono::milliseconds timeout);

// GET `target` from each of `origins` (plain http), up to `parallel` at once on threads of their
// own, every fetch ending by `deadline` from the call: a slow or hung origin costs the deadline
// once, not once per origin. For control loops that read many replicas' /metrics. The answers
// come in the origins' order; one whose turn came after the deadline is kTimeout.
std::vector<ClientResponse> fetch_each(const std::vector<std::pair<std::string, uint16_t>>& origins,
                                       const std::string& target,
                                       std::chrono::milliseconds deadline, size_t parallel = 64);

}  // namespace flotilla::http

// The http module's contract: an HTTP/1.1 server on Boost.Asio/Beast with one event loop per
// worker thread, keep-alive, limits and timeouts, and graceful drain.
//
// Threading: the handler runs on the worker thread that owns the connection. It may answer at
// once or later from any thread through the Responder. A connection reads its next request
// only after the previous response is written.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/common.h"

namespace flotilla::http {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: the kernel picks; Server::port() tells which
  int workers = 0;    // event loops; 0: one per core
  size_t max_body_bytes = 8 * 1024 * 1024;
  size_t max_header_bytes = 16 * 1024;
  size_t max_connections = 10000;
  // The whole header must arrive within header_timeout of its first byte (slowloris), the
  // body within body_timeout of the header; a keep-alive connection waits idle_timeout for the
  // first byte of its next request.
  std::chrono::milliseconds header_timeout{10'000};
  std::chrono::milliseconds body_timeout{30'000};
  std::chrono::milliseconds idle_timeout{60'000};
};

enum class Method { kGet, kHead, kPost, kPut, kDelete, kOther };

struct Request {
  Method method = Method::kOther;
  std::string target;  // path and query, as sent
  std::string content_type;
  std::string body;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

namespace detail {
class Exchange;
}

// Answers one request. Move-only; send() may be called from any thread, exactly once. A
// Responder destroyed without sending answers 500, so a request is never left hanging.
class Responder {
 public:
  explicit Responder(std::shared_ptr<detail::Exchange> exchange);
  Responder(Responder&&) noexcept;
  // No move-assignment: it would drop the request the target still held.
  Responder& operator=(Responder&&) = delete;
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;
  ~Responder();

  void send(Response&& response);

 private:
  std::shared_ptr<detail::Exchange> exchange_;
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
  // connections, let in-flight requests finish (their responses carry Connection: close), then
  // make run() return. After `timeout`, connections still open are closed.
  virtual void drain(std::chrono::milliseconds timeout) = 0;
  // Drains on SIGTERM or SIGINT.
  virtual void drain_on_signals(std::chrono::milliseconds timeout) = 0;
  virtual size_t open_connections() const = 0;
  // True once a drain has started (readiness should then answer "not ready").
  virtual bool draining() const = 0;
  virtual int worker_count() const = 0;
};

}  // namespace flotilla::http

// HTTP/1.1 server: one io_context per worker thread, each with its own SO_REUSEPORT acceptor,
// so a connection lives on one thread for its whole life and no lock is taken per request.
//
// Connection life cycle (all on the owning worker's thread):
//   wait_for_request (idle timeout) → read_header (header timeout) → read_body (body timeout)
//   → handler → ... the Responder posts the response back → write → wait_for_request or close.
// A streamed response (Responder::start_stream) replaces "write" with: head → chunks as the
// producer queues them → terminating chunk → wait_for_request, or close when it is cut.
// Drain: acceptors close, sessions waiting idle close, the others close after their response
// (a stream: after finish()); when the last session is gone, every loop stops and run() returns.
//
// Descriptors (docs/gateway.md, "File descriptors"): the connection cap is sized from
// RLIMIT_NOFILE at bind(). Past the cap a connection is answered 503 with a lingering close
// (not counted against the cap); past a few more sessions in all (a sixteenth of the cap plus
// 16), 503 and an immediate close. Should accept still fail for want of a descriptor
// (something else took them), one spare descriptor held for the purpose is given up to accept
// the connection and answer it 503; when even that fails, the worker retries after a pause,
// and the failure is logged at most once per kLogPeriod.
#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <thread>
#include <unordered_set>

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include "http/asio_types.h"
#include "http/http.h"
#include "http/message_readers.h"

namespace flotilla::http {

using namespace std::string_view_literals;

using TimePoint = std::chrono::steady_clock::time_point;

// How often a worker looks for sessions past their deadline: timeouts are accurate to this.
constexpr auto kSweepPeriod = std::chrono::milliseconds(50);
// Lingering close (nginx's): after an answer to a request not read to its end, what the client
// still sends is read and dropped until it closes, for at most this long and this many bytes
// past the body limit, so that a client that sends its whole body before reading (Python's
// urllib, curl without Expect) reads the answer instead of a reset.
constexpr auto kLingerTime = std::chrono::seconds(5);
constexpr size_t kLingerBytesPastLimit = 16 << 20;
// How long a worker waits before it accepts again when no descriptor is left.
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);
// At most one log line per period for each kind of overload (accept failing, 503s past the
// cap); the line says how many it stands for.
constexpr auto kLogPeriod = std::chrono::seconds(10);

class ServerImpl;
class Session;

struct Worker {
  asio::io_context context{1};
  asio::executor_work_guard<asio::io_context::executor_type> guard{context.get_executor()};
  std::optional<tcp::acceptor> acceptor;
  std::unordered_set<Session*> sessions;  // touched only on this worker's thread
  std::optional<asio::steady_timer> sweep_timer;
  // Made with the worker, so that no descriptor or allocation is needed to back off once
  // descriptors run out.
  asio::steady_timer accept_timer{context};
  // Where lingering closes read the bytes they drop; shared by this worker's sessions (one
  // read runs at a time on the worker's thread, and the bytes are never looked at).
  std::array<char, 64 * 1024> discard;
  std::thread thread;
};

// Lets one line through per kLogPeriod and counts the ones it holds back. Thread-safe.
class LogLimiter {
 public:
  // True when a line may be written now; `held_back` is then how many were held back since
  // the last one.
  bool allow(uint64_t& held_back) {
    const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    int64_t last = last_.load(std::memory_order_relaxed);
    const int64_t period = std::chrono::steady_clock::duration(kLogPeriod).count();
    if ((last != kNever && now - last < period) ||
        !last_.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
      held_back_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    held_back = held_back_.exchange(0, std::memory_order_relaxed);
    return true;
  }

 private:
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::min();
  std::atomic<int64_t> last_{kNever};
  std::atomic<uint64_t> held_back_{0};
};

namespace {

// The event loop and index of the worker thread running now; null and -1 on other threads.
thread_local asio::io_context* current_loop = nullptr;
thread_local int current_worker = -1;

// 16 hex digits of a per-thread generator: an id to quote in a report, not a secret.
std::string fresh_request_id() {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string id(16, '0');
  uint64_t bits = generator();
  for (char& digit : id) {
    digit = kDigits[bits & 0xf];
    bits >>= 4;
  }
  return id;
}

Response error_response(const ServerOptions& options, int status, std::string_view message) {
  Response response;
  response.status = status;
  response.body = options.error_body ? options.error_body(status, message)
                                     : nlohmann::json{{"error", message}}.dump();
  if (options.error_request_ids) {
    response.headers.emplace_back("X-Request-Id", fresh_request_id());
  }
  return response;
}

}  // namespace

namespace detail {

// The head of a streamed response, as the handler gave it.
struct StreamHead {
  int status = 200;
  std::string content_type;
  Headers headers;
};

// What a session takes from its stream's Exchange in one flush; the bytes go separately.
struct StreamUpdate {
  std::optional<StreamHead> head;  // in the first flush only
  bool end = false;                // no more pieces: end once the queued ones are out
  bool complete = false;           // the end is finish(), not a Responder dropped mid-stream
  bool overflowed = false;         // over max_stream_buffer_bytes: cut the connection
};

}  // namespace detail

class ServerImpl final : public Server {
 public:
  ServerImpl(const ServerOptions& options, Handler handler)
      : options_(options), handler_(std::move(handler)) {}
  ~ServerImpl() override;

  Status bind();
  uint16_t port() const override { return port_; }
  bool run() override;
  void drain(std::chrono::milliseconds timeout) override;
  void drain_on_signals(std::chrono::milliseconds timeout) override;
  size_t open_connections() const override { return connections_.load(); }
  size_t max_connections() const override { return max_connections_; }

  const ServerOptions& options() const { return options_; }
  const Handler& handler() const { return handler_; }
  bool draining() const override { return draining_.load(std::memory_order_relaxed); }
  bool stopped() const { return stopped_.load(); }
  int worker_count() const override { return static_cast<int>(workers_.size()); }
  void submit(Request&& request, std::function<void(Response&&)> on_answer) override;
  // `served`: the session counted against the cap (it was not answered 503 at once).
  void session_closed(bool served);

 private:
  void size_connection_cap(int worker_count);
  void accept(Worker& worker);
  void accept_later(Worker& worker);
  // Past every cap, or out of descriptors: a 503 written at once (no lingering), then closed.
  void refuse(int descriptor);
  // Out of descriptors: gives up the spare one to accept a waiting connection and refuse it.
  enum class SpareOutcome { kRefused, kNothingWaiting, kFailed /* no spare, or no luck */ };
  SpareOutcome refuse_with_spare(Worker& worker);
  // Accepts once a connection waits (out of descriptors, accept fails even when none does).
  void accept_when_readable(Worker& worker);
  void sweep(Worker& worker);
  void stop_all();
  void stop_if_drained();

  ServerOptions options_;
  Handler handler_;
  // Declared before workers_, so they outlive it: work still queued on a loop when the server
  // is destroyed (a submit()'s request) answers, counts down and checks them.
  std::atomic<size_t> connections_{0};  // every session, 503s lingering included
  std::atomic<size_t> submitted_{0};    // submit()'s requests not answered yet
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopped_{false};
  std::vector<std::unique_ptr<Worker>> workers_;
  uint16_t port_ = 0;
  std::atomic<size_t> next_submit_worker_{0};
  std::atomic<size_t> served_{0};  // the sessions within the cap
  size_t max_connections_ = 0;     // options_.max_connections, lowered to fit the descriptors
  size_t max_lingering_ = 0;       // sessions at most, 503s lingering included
  std::string refusal_;            // the 503 that refuse() writes, made at bind()
  std::atomic<int> spare_descriptor_{-1};
  LogLimiter accept_log_;
  LogLimiter refusal_log_;
  std::atomic<bool> drained_cleanly_{true};
  std::optional<asio::signal_set> signals_;
  std::optional<asio::steady_timer> drain_timer_;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Socket&& socket, ServerImpl& server, Worker& worker)
      : socket_(std::move(socket)), server_(server), worker_(worker) {}

  // Timeouts cost no timer per operation: each session holds a deadline, and one sweep timer
  // per worker closes the sockets of sessions past theirs, which fails the pending operation.
  void expire_if_due(TimePoint now) {
    if (deadline_ <= now && !timed_out_) {
      timed_out_ = true;
      beast::error_code ignored;
      socket_.close(ignored);
    }
  }

  void start(bool reject) {
    worker_.sessions.insert(this);
    if (reject) {
      rejected_ = true;
      keep_alive_ = false;
      // The client may have sent its request already: closing with it unread would reset the
      // connection, which can destroy the 503 before the client reads it.
      unread_input_ = true;
      write(error_response(server_.options(), 503,
                           "too many connections: the server is at its limit of " +
                               std::to_string(server_.max_connections())));
      return;
    }
    // The first request's header timeout runs from the accept: a connection that sends
    // nothing is closed at header_timeout, not held for idle_timeout.
    first_header_deadline_ = std::chrono::steady_clock::now() + server_.options().header_timeout;
    wait_for_request();
  }

  // Closes the connection if it is between requests (drain).
  void close_if_idle() {
    if (idle_) {
      beast::error_code ignored;
      socket_.close(ignored);
    }
  }

  asio::io_context::executor_type executor() { return socket_.get_executor(); }

  // Waits for the socket to turn readable while the handler works: a FIN or RST then means the
  // client left. async_wait costs no system call (the descriptor is already in epoll); only a
  // readiness event is followed by a recv, whose bytes (a pipelined request) are kept.
  void watch_for_disconnect(std::function<void()> on_gone) {
    if (client_gone_) {
      // Only a stream gets here: it was cut before the handler asked (a slow reader, a write
      // error). Tell the producer now, but not from inside its own call.
      asio::post(socket_.get_executor(), std::move(on_gone));
      return;
    }
    on_gone_ = std::move(on_gone);
    if (!watching_) {  // a stream arms the watch itself, whether or not the handler asks
      arm_disconnect_watch();
    }
  }
  bool server_stopped() const { return server_.stopped(); }
  const ServerOptions& options() const { return server_.options(); }

  // Writes the handler's answer; runs on this session's worker thread. The head is written by
  // hand into a reused buffer and sent with the body in one gather write: Beast's serializer
  // would allocate a field list per response.
  void write(Response&& response) {
    stop_disconnect_watch();
    // While draining, requests the client already pipelined behind this one are still served;
    // the connection closes after the last of them.
    keep_alive_ = keep_alive_ && (!server_.draining() || buffer_.size() > 0);
    BodyRecycler::give(std::move(body_));  // the previous response's, long written
    body_ = std::move(response.body);
    begin_head(response.status, response.content_type, response.headers);
    if (head_request_) {
      body_.clear();  // a HEAD response has no body
    }
    append_header("Content-Length", std::to_string(body_.size()));
    end_head();
    // Most responses fit in the socket buffer: one non-blocking sendmsg and no asio operation
    // or timer. What does not fit is written asynchronously under the body timeout, so a
    // client that stops reading cannot hold the connection.
    const ssize_t sent = send_head_and_body(socket_.native_handle(), head_, body_);
    if (sent == static_cast<ssize_t>(head_.size() + body_.size())) {
      // Continue from the loop, not from this stack: pipelined requests cannot nest handlers
      // without bound, and the next read starts after the completions already due, by which
      // time the client has more often sent its next request (no recv failing with EAGAIN).
      asio::post(socket_.get_executor(),
                 [self = shared_from_this()] { self->on_write(beast::error_code()); });
      return;
    }
    if (sent < 0) {
      on_write(beast::error_code(static_cast<int>(-sent), boost::system::system_category()));
      return;
    }
    const auto rest = unsent_part(head_, body_, static_cast<size_t>(sent));
    deadline_ = std::chrono::steady_clock::now() + server_.options().body_timeout;
    asio::async_write(socket_, rest, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_write(ec);
    });
  }

  // Starts head_ with the status line, Content-Type and the handler's headers.
  void begin_head(int status, std::string_view content_type, const Headers& headers) {
    head_.clear();
    head_.append(request_version_ == 10 ? "HTTP/1.0 "sv : "HTTP/1.1 "sv);
    head_.append(std::to_string(status));
    head_.push_back(' ');
    const auto reason = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
    head_.append(reason.data(), reason.size());
    if (!content_type.empty()) {
      append_header("Content-Type", content_type);
    }
    for (const auto& [name, value] : headers) {
      append_header(name, value);
    }
  }

  // Ends head_ with the connection's fate.
  void end_head() {
    if (!keep_alive_) {
      append_header("Connection", "close");
    } else if (request_version_ == 10) {
      append_header("Connection", "keep-alive");
    }
    head_.append("\r\n\r\n"sv);
  }

  // Appends "\r\nName: value"; a header whose text could split the head is left out.
  void append_header(std::string_view name, std::string_view value) {
    // A plain scan: find_first_of calls memchr once per character (3% of the gateway's CPU).
    auto splits_head = [](std::string_view text, bool colon) {
      for (const char c : text) {
        if (c == '\r' || c == '\n' || (colon && c == ':')) {
          return true;
        }
      }
      return false;
    };
    if (splits_head(name, true) || splits_head(value, false)) {
      FLOTILLA_BUG("a response header holds CR, LF or a colon in its name");
      return;
    }
    head_.append("\r\n"sv);
    head_.append(name);
    head_.append(": "sv);
    head_.append(value);
  }

  void wait_for_request() {
    if (buffer_.size() > 0) {  // pipelined bytes already here
      start_request();
      return;
    }
    if (server_.draining()) {
      finish();
      return;
    }
    idle_ = true;
    deadline_ = first_request_ ? first_header_deadline_
                               : std::chrono::steady_clock::now() + server_.options().idle_timeout;
    socket_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t bytes) {
                              self->idle_ = false;
                              if (ec) {
                                self->finish();
                                return;
                              }
                              self->buffer_.commit(bytes);
                              self->start_request();
                            });
  }

  // Parses what is already buffered (usually the whole request, which arrived in one recv)
  // and reads the rest asynchronously only when something is missing: most requests then
  // cost no extra event-loop pass and no timer update.
  void start_request() {
    reader_.emplace(server_.options().capture_headers);
    reader_->header_limit(static_cast<uint32_t>(server_.options().max_header_bytes));
    reader_->body_limit(server_.options().max_body_bytes);
    reader_->eager(true);
    beast::error_code ec;
    while (buffer_.size() > 0 && !reader_->is_done()) {
      const size_t used = reader_->put(buffer_.data(), ec);
      buffer_.consume(used);
      if (ec == bhttp::error::need_more) {
        ec = {};
        break;
      }
      if (ec || used == 0) {
        break;
      }
    }
    if (ec) {
      fail(ec);
    } else if (reader_->is_done()) {
      dispatch();
    } else if (reader_->is_header_done()) {
      on_header({});
    } else {
      read_header();
    }
  }

  // The header timeout of a later request on a keep-alive connection runs from its first byte
  // (it has just arrived: the read that brought it is what led here).
  void read_header() {
    deadline_ = first_request_
                    ? first_header_deadline_
                    : std::chrono::steady_clock::now() + server_.options().header_timeout;
    bhttp::async_read_header(
        socket_, buffer_, *reader_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) {
      fail(ec);
      return;
    }
    if (reader_->expects_continue() && !reader_->is_done()) {
      continue_.emplace(bhttp::status::continue_, 11);
      bhttp::async_write(socket_, *continue_,
                         [self = shared_from_this()](beast::error_code ec, size_t) {
                           if (ec) {
                             self->finish();
                             return;
                           }
                           self->read_body();
                         });
      return;
    }
    read_body();
  }

  void read_body() {
    deadline_ = std::chrono::steady_clock::now() + server_.options().body_timeout;
    bhttp::async_read(socket_, buffer_, *reader_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) {
                          self->fail(ec);
                          return;
                        }
                        self->dispatch();
                      });
  }

  void arm_disconnect_watch() {
    watching_ = true;
    socket_.async_wait(
        tcp::socket::wait_read,
        [self = shared_from_this(), generation = watch_generation_](beast::error_code ec) {
          if (ec || generation != self->watch_generation_ || !self->watching_) {
            return;
          }
          self->on_readable();
        });
  }

  void on_readable() {
    auto space = buffer_.prepare(4096);
    const ssize_t got = ::recv(socket_.native_handle(), space.data(), space.size(), MSG_DONTWAIT);
    if (got > 0) {
      // A pipelined request: keep it for later; a close behind it goes unnoticed until then.
      buffer_.commit(static_cast<size_t>(got));
      watching_ = false;
      return;
    }
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      arm_disconnect_watch();
      return;
    }
    watching_ = false;
    if (streaming_) {
      abandon_stream("the client closed the connection", false);
      return;
    }
    keep_alive_ = false;
    client_gone_ = true;
    if (auto on_gone = std::move(on_gone_)) {
      on_gone_ = nullptr;
      on_gone();
    }
  }

  void stop_disconnect_watch() {
    on_gone_ = nullptr;
    if (watching_) {
      watching_ = false;
      ++watch_generation_;
      beast::error_code ignored;
      socket_.cancel(ignored);
    }
  }

  void fail(beast::error_code ec) {
    if (ec == bhttp::error::body_limit) {
      reject(413, "request body is larger than the limit of " +
                      std::to_string(server_.options().max_body_bytes) + " bytes");
    } else if (ec == bhttp::error::header_limit) {
      reject(431, "request header is larger than the limit of " +
                      std::to_string(server_.options().max_header_bytes) + " bytes");
    } else if (ec == bhttp::error::bad_transfer_encoding) {
      reject(400,
             "unsupported Transfer-Encoding: only 'chunked', alone and without Content-Length, "
             "is accepted");
    } else if (is_malformed_http(ec)) {
      reject(400, "malformed HTTP request: " + ec.message());
    } else {
      // Timeouts, resets and closed connections: nobody is left to answer.
      spdlog::debug("connection closed: {}", ec.message());
      finish();
    }
  }

  // Answers an unreadable request and closes: the rest of the stream cannot be trusted.
  void reject(int status, const std::string& message) {
    keep_alive_ = false;
    unread_input_ = true;
    write(error_response(server_.options(), status, message));
  }

  void dispatch() {
    deadline_ = TimePoint::max();
    first_request_ = false;
    keep_alive_ = reader_->keep_alive();
    request_version_ = reader_->version();
    Request request = std::move(reader_->request());
    head_request_ = request.method == Method::kHead;
    reader_.reset();
    auto exchange = std::make_shared<detail::Exchange>(shared_from_this(), request_version_ >= 11,
                                                       !head_request_);
    try {
      server_.handler()(std::move(request), Responder(std::move(exchange)));
    } catch (const std::exception& e) {
      // Handlers must not throw (STYLE.md §3); if one does (say, bad_alloc), the Responder it
      // dropped on the way out has answered 500, and this worker keeps serving.
      spdlog::error("request handler threw: {}", e.what());
    }
  }

  void on_write(beast::error_code ec) {
    if (ec) {
      finish();
      return;
    }
    if (!keep_alive_) {
      beast::error_code ignored;
      socket_.shutdown(tcp::socket::shutdown_send, ignored);
      if (unread_input_ && !client_gone_) {
        linger();
      } else {
        finish();
      }
      return;
    }
    wait_for_request();
  }

  // After answering a request that was not read to its end (the answer is out, our side is
  // shut down): read and drop what the client still sends (say, the rest of an over-large
  // body) until it closes, for at most kLingerTime and the body limit plus
  // kLingerBytesPastLimit. Closing with unread input makes the kernel send RST, which can
  // destroy the response before the client reads it (nginx's lingering close).
  void linger() {
    deadline_ = std::chrono::steady_clock::now() + kLingerTime;
    drop_input();
  }
  void drop_input() {
    socket_.async_read_some(asio::buffer(worker_.discard),
                            [self = shared_from_this()](beast::error_code ec, size_t bytes) {
                              self->on_dropped(ec, bytes);
                            });
  }
  void on_dropped(beast::error_code ec, size_t bytes) {
    lingered_bytes_ += bytes;
    if (ec || lingered_bytes_ > server_.options().max_body_bytes + kLingerBytesPastLimit) {
      finish();
      return;
    }
    drop_input();
  }

  // ---- Streamed responses: all on this session's worker thread ----------------------------

  // Takes what the producer queued since the last flush and writes it. Posted by the Exchange
  // at most once per batch of calls, so chunks queued together go out in one sendmsg.
  void flush_stream(const std::shared_ptr<detail::Exchange>& exchange);
  // Writes the head into stream_out_ and watches for the client leaving.
  void begin_stream(const detail::StreamHead& head,
                    const std::shared_ptr<detail::Exchange>& exchange);
  // Sends stream_out_ now as far as the socket buffer takes it, the rest asynchronously (one
  // write in flight; pieces queued meanwhile wait in stream_next_); ends the stream when asked
  // and nothing is left to send.
  void pump_stream(std::shared_ptr<detail::Exchange> exchange);
  // Everything is written: back to keep-alive reading after finish(), else close.
  void end_stream();
  // The client is gone or must be (a write failed, it reads too slowly): drop the producer's
  // later pieces, close (with RST when `reset`: no point delivering what the kernel holds) and
  // run on_gone.
  void abandon_stream(std::string_view why, bool reset);

  void finish() {
    if (finished_) {
      return;
    }
    finished_ = true;
    beast::error_code ignored;
    socket_.close(ignored);
    worker_.sessions.erase(this);
    server_.session_closed(!rejected_);
  }

  Socket socket_;
  TimePoint deadline_ = TimePoint::max();
  bool timed_out_ = false;
  ServerImpl& server_;
  Worker& worker_;
  beast::flat_buffer buffer_;
  std::optional<RequestReader> reader_;
  std::optional<bhttp::response<bhttp::empty_body>> continue_;
  std::string head_;  // the response head being written, reused across responses
  std::string body_;
  // A streamed response: its exchange, while the stream runs (weak: the Exchange owns this
  // session, and a stream cut by a stopped server must not leak both). Three buffers that swap
  // rather than copy: stream_out_ is being sent (stable while an async_write is in flight),
  // stream_next_ queues behind it, stream_in_ receives each flush from the producer.
  std::weak_ptr<detail::Exchange> stream_;
  std::string stream_out_;
  std::string stream_next_;
  std::string stream_in_;
  bool streaming_ = false;
  bool stream_writing_ = false;
  bool stream_ending_ = false;
  bool stream_complete_ = false;
  size_t lingered_bytes_ = 0;
  TimePoint first_header_deadline_;  // the accept plus header_timeout
  bool rejected_ = false;            // answered 503 at the accept, not counted against the cap
  bool first_request_ = true;        // no request dispatched yet on this connection
  std::function<void()> on_gone_;
  uint64_t watch_generation_ = 0;
  bool watching_ = false;
  bool client_gone_ = false;
  bool unread_input_ = false;
  bool head_request_ = false;
  unsigned request_version_ = 11;
  bool idle_ = false;
  bool keep_alive_ = true;
  bool finished_ = false;
};

namespace detail {

// One request's answer, shared by its Responder and the tasks it posts to the session.
//
// Thread-safety: the Responder's calls come from any thread. A whole response is handed to the
// session's loop as it is, without a lock, and pays for no stream state: start_stream()
// allocates it. A stream's queued bytes and flags are guarded by Stream::mutex, taken briefly
// by the producer's calls and by the session's flush: chunks written from several threads must
// go out in call order, which posting each chunk would not keep (asio queues a post from the
// loop's own thread behind the running handler, one from another thread at once), and one
// flush per loop pass then carries every chunk queued meanwhile. Stream::gone is also an
// atomic so that dropping a write costs no lock.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  // `chunked`: the client speaks HTTP/1.1; `body_allowed`: not a HEAD request.
  Exchange(std::shared_ptr<Session> session, bool chunked, bool body_allowed)
      : session_(std::move(session)), chunked_(chunked), body_allowed_(body_allowed) {}

  void send(Response&& response) {
    if (sent_.exchange(true)) {
      FLOTILLA_BUG("a response was sent twice, or sent after start_stream()");
      return;
    }
    auto session = std::move(session_);
    auto executor = session->executor();
    // Inline when already on the connection's loop (the usual case), else queued to it. Inline
    // without asio::dispatch, whose handler would move the response (headers one by one) twice.
    if (executor.running_in_this_thread()) {
      session->write(std::move(response));
      return;
    }
    asio::post(executor, [session = std::move(session), response = std::move(response)]() mutable {
      session->write(std::move(response));
    });
  }
  void on_client_gone(std::function<void()> on_gone) {
    FLOTILLA_DCHECK(current_loop != nullptr);
    if (!session_) {
      return;  // sent
    }
    if (Stream* stream = started_stream()) {
      MutexLock lock(stream->mutex);
      if (stream->finished) {
        return;  // too late: the connection may already serve its next request
      }
    } else if (sent_.load()) {
      return;
    }
    session_->watch_for_disconnect(std::move(on_gone));
  }
  bool sent() const { return sent_.load(); }
  bool server_stopped() const { return session_ && session_->server_stopped(); }
  const ServerOptions& options() const {
    static const ServerOptions kDefaults;
    return session_ ? session_->options() : kDefaults;
  }

  // ---- Producer side (any thread) ----

  void start_stream(int status, std::string content_type, Headers headers) {
    if (sent_.exchange(true)) {
      FLOTILLA_BUG("start_stream() after the response was sent or started");
      return;
    }
    auto stream = std::make_unique<Stream>();
    stream->max_queued_bytes = session_->options().max_stream_buffer_bytes;
    {
      // Not shared yet: the lock is never contended, and keeps every access to the guarded
      // fields checked.
      MutexLock lock(stream->mutex);
      stream->head.emplace(StreamHead{status, std::move(content_type), std::move(headers)});
      stream->flush_posted = true;  // the flush posted below; nothing can be queued before it
    }
    stream_ = std::move(stream);
    // Publishes stream_ to producers on other threads, and to the session through the post.
    streaming_.store(true, std::memory_order_release);
    post_flush();
  }

  void write(std::string chunk) {
    if (chunk.empty() || !body_allowed_) {
      return;  // an empty chunk would end the body; a HEAD response has none
    }
    Stream* stream = started_stream();
    if (stream == nullptr) {
      FLOTILLA_BUG("write() before start_stream()");
      return;
    }
    // The usual drop (the client left, the server stopped) takes no lock.
    if (stream->gone.load(std::memory_order_relaxed) || session_->server_stopped()) {
      return;
    }
    // "<size in hex>\r\n" before the chunk, "\r\n" after it.
    std::array<char, 24> size_line;
    size_t size_line_length = 0;
    if (chunked_) {
      const auto result = std::to_chars(size_line.data(), size_line.data() + 16, chunk.size(), 16);
      result.ptr[0] = '\r';
      result.ptr[1] = '\n';
      size_line_length = static_cast<size_t>(result.ptr + 2 - size_line.data());
    }
    const size_t framed = chunk.size() + (chunked_ ? size_line_length + 2 : 0);
    bool post = false;
    {
      MutexLock lock(stream->mutex);
      if (stream->gone.load(std::memory_order_relaxed)) {
        return;
      }
      if (stream->finished) {
        FLOTILLA_BUG("write() after finish()");
        return;
      }
      if (stream->queued_bytes.load() + framed > stream->max_queued_bytes) {
        // The session cuts the connection and runs on_gone; until then every write drops.
        stream->gone.store(true);
        stream->overflowed = true;
        stream->pending = std::string();
      } else {
        stream->queued_bytes.fetch_add(framed);
        if (!chunked_ && stream->pending.empty()) {
          stream->pending = std::move(chunk);
        } else {
          stream->pending.append(size_line.data(), size_line_length);
          stream->pending.append(chunk);
          if (chunked_) {
            stream->pending.append("\r\n"sv);
          }
        }
      }
      post = !std::exchange(stream->flush_posted, true);
    }
    if (post) {
      post_flush();
    }
  }

  void finish() {
    if (started_stream() == nullptr) {
      FLOTILLA_BUG("finish() before start_stream()");
      return;
    }
    end(/*complete=*/true);
  }

  // From ~Responder: ends a stream left unfinished (the connection closes); no-op otherwise.
  void drop() {
    if (started_stream() != nullptr) {
      end(/*complete=*/false);
    }
  }

  // ---- Session side (the connection's worker thread, after start_stream()) ----

  // Moves the queued bytes into `bytes` (empty; its capacity is handed back for reuse) and
  // returns what else happened since the last flush.
  StreamUpdate take_update(std::string& bytes) {
    StreamUpdate update;
    MutexLock lock(stream_->mutex);
    stream_->flush_posted = false;
    update.head = std::move(stream_->head);
    stream_->head.reset();
    bytes.swap(stream_->pending);
    update.end = stream_->finished;
    update.complete = stream_->complete;
    update.overflowed = stream_->overflowed;
    return update;
  }
  // The connection is gone: later writes drop, queued ones are freed.
  void mark_gone() {
    MutexLock lock(stream_->mutex);
    stream_->gone.store(true);
    stream_->pending = std::string();
  }
  void add_queued(size_t bytes) { stream_->queued_bytes.fetch_add(bytes); }
  // `bytes` left the server (into the kernel's socket buffer).
  void release(size_t bytes) { stream_->queued_bytes.fetch_sub(bytes); }

 private:
  struct Stream {
    std::atomic<bool> gone{false};        // writes are dropped from now on
    std::atomic<size_t> queued_bytes{0};  // written, not yet in the kernel
    size_t max_queued_bytes = 0;
    Mutex mutex;
    std::optional<StreamHead> head FLOTILLA_GUARDED_BY(mutex);
    std::string pending FLOTILLA_GUARDED_BY(mutex);  // framed chunks not yet taken by the session
    bool flush_posted FLOTILLA_GUARDED_BY(mutex) = false;
    bool finished FLOTILLA_GUARDED_BY(mutex) = false;  // finish() or drop()
    bool complete FLOTILLA_GUARDED_BY(mutex) = false;  // finish()
    bool overflowed FLOTILLA_GUARDED_BY(mutex) = false;
  };

  // The stream, once start_stream() has published it; null before (or for a whole response).
  Stream* started_stream() const {
    return streaming_.load(std::memory_order_acquire) ? stream_.get() : nullptr;
  }

  void end(bool complete) {
    {
      MutexLock lock(stream_->mutex);
      if (stream_->finished) {
        if (complete) {
          FLOTILLA_BUG("finish() called twice");
        }
        return;
      }
      stream_->finished = true;
      if (stream_->gone.load(std::memory_order_relaxed)) {
        return;  // the session has closed, or will at the flush already posted
      }
      stream_->complete = complete;
      if (complete && chunked_ && body_allowed_) {
        static constexpr std::string_view kLastChunk = "0\r\n\r\n";
        stream_->pending.append(kLastChunk);
        stream_->queued_bytes.fetch_add(kLastChunk.size());
      }
      if (std::exchange(stream_->flush_posted, true)) {
        return;
      }
    }
    post_flush();
  }

  void post_flush() {
    asio::post(session_->executor(),
               [self = shared_from_this()] { self->session_->flush_stream(self); });
  }

  std::shared_ptr<Session> session_;    // moved out by send(); kept by a stream
  std::atomic<bool> sent_{false};       // send() or start_stream() was called
  std::atomic<bool> streaming_{false};  // stream_ is set
  const bool chunked_;
  const bool body_allowed_;
  std::unique_ptr<Stream> stream_;  // set once, by start_stream()
};

}  // namespace detail

void Session::flush_stream(const std::shared_ptr<detail::Exchange>& exchange) {
  if (finished_) {
    // The connection closed under the stream (a timeout, the client left): drop what comes.
    exchange->mark_gone();
    return;
  }
  FLOTILLA_DCHECK(stream_in_.empty());
  detail::StreamUpdate update = exchange->take_update(stream_in_);
  if (update.head) {
    begin_stream(*update.head, exchange);
  }
  if (client_gone_) {
    // The client left while the handler worked, before the stream started.
    abandon_stream("the client closed the connection", false);
    return;
  }
  if (update.overflowed) {
    abandon_stream("the client reads too slowly: over " +
                       std::to_string(server_.options().max_stream_buffer_bytes) +
                       " bytes of the response are queued",
                   true);
    return;
  }
  std::string& target = stream_writing_ ? stream_next_ : stream_out_;
  if (target.empty()) {
    target.swap(stream_in_);
  } else {
    target.append(stream_in_);
    stream_in_.clear();
  }
  if (update.end) {
    stream_ending_ = true;
    stream_complete_ = update.complete;
  }
  pump_stream(exchange);
}

void Session::begin_stream(const detail::StreamHead& head,
                           const std::shared_ptr<detail::Exchange>& exchange) {
  FLOTILLA_DCHECK(!streaming_ && stream_out_.empty());
  streaming_ = true;
  stream_ = exchange;
  deadline_ = TimePoint::max();
  const bool chunked = request_version_ >= 11;
  // Without chunks, only the close can end the body. A draining server closes after this
  // stream unless the client has already pipelined more requests (as write() does).
  keep_alive_ = keep_alive_ && chunked && (!server_.draining() || buffer_.size() > 0);
  begin_head(head.status, head.content_type, head.headers);
  if (chunked) {
    append_header("Transfer-Encoding", "chunked");
  }
  end_head();
  stream_out_.append(head_);
  exchange->add_queued(head_.size());
  if (!watching_ && !client_gone_) {
    arm_disconnect_watch();
  }
}

void Session::pump_stream(std::shared_ptr<detail::Exchange> exchange) {
  if (stream_writing_ || finished_) {
    return;
  }
  if (!stream_out_.empty()) {
    const ssize_t sent = send_head_and_body(socket_.native_handle(), stream_out_, {});
    if (sent < 0) {
      abandon_stream(
          beast::error_code(static_cast<int>(-sent), boost::system::system_category()).message(),
          false);
      return;
    }
    exchange->release(static_cast<size_t>(sent));
    if (static_cast<size_t>(sent) < stream_out_.size()) {
      // The socket buffer is full: the rest goes asynchronously, under the body timeout, so a
      // client that stops reading cannot hold the connection.
      stream_writing_ = true;
      deadline_ = std::chrono::steady_clock::now() + server_.options().body_timeout;
      asio::async_write(socket_, asio::buffer(stream_out_.data() + sent, stream_out_.size() - sent),
                        [self = shared_from_this(), exchange = std::move(exchange)](
                            beast::error_code ec, size_t bytes) mutable {
                          self->stream_writing_ = false;
                          self->deadline_ = TimePoint::max();
                          if (self->finished_) {
                            return;  // cut meanwhile (the client left)
                          }
                          if (ec) {
                            self->abandon_stream(ec.message(), false);
                            return;
                          }
                          exchange->release(bytes);
                          self->stream_out_.clear();
                          self->stream_out_.swap(self->stream_next_);
                          self->pump_stream(std::move(exchange));
                        });
      return;
    }
    stream_out_.clear();
  }
  if (stream_ending_) {
    end_stream();
  }
}

void Session::end_stream() {
  streaming_ = false;
  stream_ending_ = false;
  stream_.reset();
  stop_disconnect_watch();  // no write is in flight, so its cancel() stops only the watch
  if (!stream_complete_) {
    spdlog::debug("a streamed response was dropped before finish(): closing the connection");
    keep_alive_ = false;
  }
  on_write(beast::error_code());
}

void Session::abandon_stream(std::string_view why, bool reset) {
  spdlog::debug("streamed response cut: {}", why);
  if (auto exchange = stream_.lock()) {
    exchange->mark_gone();
  }
  stream_.reset();
  stream_in_.clear();  // stream_out_ may still be an in-flight write's buffer: left as it is
  streaming_ = false;
  stream_ending_ = false;
  client_gone_ = true;
  keep_alive_ = false;
  watching_ = false;
  ++watch_generation_;
  if (reset) {
    beast::error_code ignored;
    socket_.set_option(asio::socket_base::linger(true, 0), ignored);
  }
  auto on_gone = std::move(on_gone_);
  on_gone_ = nullptr;
  finish();
  if (on_gone) {
    on_gone();
  }
}

namespace detail {

// A local() responder's answer: gathered (a stream's pieces may come from any thread) and
// handed over once.
class LocalAnswer {
 public:
  // `options` (the server's, which outlives it) shape the error of an unanswered request.
  LocalAnswer(const ServerOptions& options, std::function<void(Response&&)> on_answer)
      : options_(options), on_answer_(std::move(on_answer)) {}

  void send(Response&& response) {
    if (answered_.exchange(true)) {
      FLOTILLA_BUG("a response was sent twice, or sent after start_stream()");
      return;
    }
    on_answer_(std::move(response));
  }
  void start_stream(int status, std::string content_type, Headers headers) {
    MutexLock lock(mutex_);
    if (answered_.load() || streaming_) {
      FLOTILLA_BUG("start_stream() after the response was sent or started");
      return;
    }
    streaming_ = true;
    gathered_.status = status;
    gathered_.content_type = std::move(content_type);
    gathered_.headers = std::move(headers);
  }
  void write(std::string chunk) {
    MutexLock lock(mutex_);
    if (!streaming_) {
      FLOTILLA_BUG("write() before start_stream()");
      return;
    }
    gathered_.body.append(chunk);
  }
  void finish() {
    Response response;
    {
      MutexLock lock(mutex_);
      if (!streaming_) {
        FLOTILLA_BUG("finish() before start_stream()");
        return;
      }
      response = std::move(gathered_);
      streaming_ = false;
    }
    send(std::move(response));
  }
  // For the destructor of an unanswered responder.
  void abandon() {
    bool cut = false;
    {
      MutexLock lock(mutex_);
      cut = streaming_;
    }
    if (!answered_.load()) {
      send(error_response(
          options_, cut ? 502 : 500,
          cut ? "the response stream was cut" : "internal error: the request was not answered"));
    }
  }

 private:
  const ServerOptions& options_;
  const std::function<void(Response&&)> on_answer_;
  std::atomic<bool> answered_{false};
  Mutex mutex_;
  bool streaming_ FLOTILLA_GUARDED_BY(mutex_) = false;
  Response gathered_ FLOTILLA_GUARDED_BY(mutex_);
};

}  // namespace detail

Responder::Responder(std::shared_ptr<detail::Exchange> exchange) : exchange_(std::move(exchange)) {}
Responder Responder::local(const ServerOptions& options,
                           std::function<void(Response&&)> on_answer) {
  Responder responder(nullptr);
  responder.local_ = std::make_shared<detail::LocalAnswer>(options, std::move(on_answer));
  return responder;
}
Responder::Responder(Responder&&) noexcept = default;
Responder::~Responder() {
  if (local_) {
    local_->abandon();
    return;
  }
  if (!exchange_) {
    return;
  }
  if (exchange_->sent()) {
    exchange_->drop();
    return;
  }
  // After a drain timed out, work still held somewhere is dropped on purpose.
  if (!exchange_->server_stopped()) {
    FLOTILLA_BUG("a request was dropped without a response");
  }
  exchange_->send(
      error_response(exchange_->options(), 500, "internal error: the request was not answered"));
}
void Responder::send(Response&& response) {
  if (local_) {
    local_->send(std::move(response));
    return;
  }
  FLOTILLA_CHECK(exchange_ != nullptr);
  exchange_->send(std::move(response));
}
void Responder::start_stream(int status, std::string content_type, Headers headers) {
  if (local_) {
    local_->start_stream(status, std::move(content_type), std::move(headers));
    return;
  }
  FLOTILLA_CHECK(exchange_ != nullptr);
  exchange_->start_stream(status, std::move(content_type), std::move(headers));
}
void Responder::write(std::string chunk) {
  if (local_) {
    local_->write(std::move(chunk));
    return;
  }
  FLOTILLA_CHECK(exchange_ != nullptr);
  exchange_->write(std::move(chunk));
}
void Responder::finish() {
  if (local_) {
    local_->finish();
    return;
  }
  FLOTILLA_CHECK(exchange_ != nullptr);
  exchange_->finish();
}
void Responder::on_client_gone(std::function<void()> on_gone) {
  if (local_) {
    return;  // no connection to watch
  }
  FLOTILLA_CHECK(exchange_ != nullptr);
  exchange_->on_client_gone(std::move(on_gone));
}

std::string_view method_name(Method method) {
  switch (method) {
    case Method::kGet:
      return "GET";
    case Method::kHead:
      return "HEAD";
    case Method::kPost:
      return "POST";
    case Method::kPut:
      return "PUT";
    case Method::kDelete:
      return "DELETE";
    case Method::kPatch:
      return "PATCH";
    case Method::kOther:
      break;
  }
  return "";
}

std::string_view find_header(const Headers& headers, std::string_view name) {
  for (const auto& [key, value] : headers) {
    if (equals_ignore_case(key, name)) {
      return value;
    }
  }
  return {};
}

void set_header(Headers& headers, std::string_view name, std::string value) {
  const auto named = [name](const auto& header) {
    return equals_ignore_case(header.first, name);
  };
  const auto first = std::find_if(headers.begin(), headers.end(), named);
  if (first == headers.end()) {
    headers.emplace_back(std::string(name), std::move(value));
    return;
  }
  first->second = std::move(value);
  headers.erase(std::remove_if(first + 1, headers.end(), named), headers.end());
}

Loop Loop::current() {
  return Loop(current_loop);
}

void Loop::post(std::function<void()> task) const {
  FLOTILLA_CHECK(context_ != nullptr);
  asio::post(*static_cast<asio::io_context*>(context_), std::move(task));
}

void Loop::post_after(std::chrono::microseconds delay, std::function<void()> task) const {
  FLOTILLA_CHECK(context_ != nullptr);
  auto& context = *static_cast<asio::io_context*>(context_);
  auto timer = std::make_shared<asio::steady_timer>(context, delay);
  timer->async_wait([timer, task = std::move(task)](beast::error_code) { task(); });
}

// ---------------------------------------------------------------------------------------------

ServerImpl::~ServerImpl() {
  stop_all();
  for (auto& worker : workers_) {
    if (worker->thread.joinable()) {
      worker->thread.join();
    }
  }
  if (const int spare = spare_descriptor_.exchange(-1); spare >= 0) {
    ::close(spare);
  }
}

uint64_t raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return 0;
  }
  if (limit.rlim_cur < limit.rlim_max) {
    const rlim_t before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
      spdlog::warn("cannot raise the open-file limit from {} to {}: {}", before, limit.rlim_max,
                   std::strerror(errno));
      limit.rlim_cur = before;
    }
  }
  return limit.rlim_cur == RLIM_INFINITY ? std::numeric_limits<uint64_t>::max()
                                         : static_cast<uint64_t>(limit.rlim_cur);
}

// The descriptor budget (docs/gateway.md, "File descriptors"): of the soft RLIMIT_NOFILE,
// fd_reserve plus 4 per worker (epoll, eventfd and timerfd of its loop, its listener) plus the
// spare are kept back; client connections may take fd_share of the rest, B. The cap is B less
// a sixteenth, which 503s with a lingering close may hold; past B, a 503 closes at once.
void ServerImpl::size_connection_cap(int worker_count) {
  rlimit limit{};
  uint64_t soft = std::numeric_limits<uint64_t>::max();
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    soft = limit.rlim_cur;
  }
  const uint64_t kept = options_.fd_reserve + 4 * static_cast<uint64_t>(worker_count) + 1;
  const double share = std::clamp(options_.fd_share, 0.0, 1.0);
  const uint64_t budget =
      soft > kept ? static_cast<uint64_t>(static_cast<double>(soft - kept) * share) : 0;
  const uint64_t fits = std::max<uint64_t>(1, budget - budget / 16);
  max_connections_ = static_cast<size_t>(std::min<uint64_t>(options_.max_connections, fits));
  max_lingering_ =
      static_cast<size_t>(std::min<uint64_t>(std::max<uint64_t>(budget, max_connections_ + 1),
                                             max_connections_ + max_connections_ / 16 + 16));
  if (max_connections_ < options_.max_connections) {
    spdlog::info(
        "serving at most {} connections (not {}) to fit the open-file limit of {} descriptors; "
        "raise the hard limit (ulimit -Hn) for more",
        max_connections_, options_.max_connections, soft);
  }
}

Status ServerImpl::bind() {
  int count = options_.workers > 0
                  ? options_.workers
                  : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  beast::error_code ec;
  auto address = asio::ip::make_address(options_.host, ec);
  if (ec) {
    return invalid_argument("invalid listen address '" + options_.host + "': " + ec.message());
  }
  // One listening socket, shared by every worker through a dup() of its descriptor: the
  // port stays exclusive (SO_REUSEPORT would let a second server silently share it), and the
  // kernel hands each connection to whichever worker accepts first.
  for (int i = 0; i < count; ++i) {
    workers_.push_back(std::make_unique<Worker>());
  }
  tcp::acceptor& first = workers_[0]->acceptor.emplace(workers_[0]->context);
  const tcp::endpoint endpoint(address, options_.port);
  first.open(endpoint.protocol(), ec);
  if (!ec)
    first.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec)
    first.bind(endpoint, ec);
  if (!ec)
    first.listen(asio::socket_base::max_listen_connections, ec);
  for (int i = 1; i < count && !ec; ++i) {
    const int descriptor = ::dup(first.native_handle());
    if (descriptor < 0) {
      ec.assign(errno, boost::system::system_category());
      break;
    }
    workers_[i]->acceptor.emplace(workers_[i]->context).assign(endpoint.protocol(), descriptor, ec);
  }
  if (ec) {
    return unavailable("cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                       ": " + ec.message());
  }
  const uint16_t port = first.local_endpoint().port();
  port_ = port;
  size_connection_cap(count);
  spare_descriptor_.store(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  Response refusal = error_response(options_, 503, "too many connections");
  refusal_ = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: " + refusal.content_type +
             "\r\nContent-Length: " + std::to_string(refusal.body.size()) +
             "\r\nConnection: close\r\n\r\n" + refusal.body;
  return Status::ok();
}

// Nothing on this path may throw for want of descriptors: the accepted socket comes in the
// completion (an accept failure is an error code), a Session opens none, and the back-off
// timer exists already.
void ServerImpl::accept(Worker& worker) {
  worker.acceptor->async_accept(worker.context.get_executor(), [this, &worker](beast::error_code ec,
                                                                               Socket socket) {
    if (ec == asio::error::operation_aborted || !worker.acceptor->is_open()) {
      return;
    }
    if (ec == asio::error::connection_aborted) {
      accept(worker);  // the client left while queued: nothing wrong here
      return;
    }
    if (ec) {
      // Linux fails accept for want of a descriptor before it looks at the queue: the
      // error says nothing about whether a connection waits.
      const SpareOutcome outcome =
          is_local_resource_error(ec) ? refuse_with_spare(worker) : SpareOutcome::kFailed;
      if (outcome == SpareOutcome::kRefused) {
        accept(worker);  // more may wait
        return;
      }
      if (outcome == SpareOutcome::kNothingWaiting) {
        accept_when_readable(worker);
        return;
      }
      // Out of descriptors with no spare (or another failure): pause instead of spinning
      // on a listener that stays readable.
      if (uint64_t held_back = 0; accept_log_.allow(held_back)) {
        spdlog::warn("accept failed: {} ({} more failures in the last {} s); retrying every {} ms",
                     ec.message(), held_back, kLogPeriod.count(), kAcceptRetry.count());
      }
      accept_later(worker);
      return;
    }
    const size_t open = connections_.fetch_add(1);
    if (open >= max_lingering_) {
      connections_.fetch_sub(1);
      refuse(socket.release(ec));
      accept(worker);
      return;
    }
    socket.set_option(tcp::no_delay(true), ec);
    // Connections answered 503 and lingering do not count against the cap: one served
    // connection closing frees a slot at once.
    const size_t served = served_.fetch_add(1);
    const bool reject = served >= max_connections_;
    if (reject) {
      served_.fetch_sub(1);
      if (uint64_t held_back = 0; refusal_log_.allow(held_back)) {
        spdlog::warn(
            "too many connections: {} served, at the limit of {}; answering 503 ({} more "
            "in the last {} s)",
            served, max_connections_, held_back, kLogPeriod.count());
      }
    }
    std::make_shared<Session>(std::move(socket), *this, worker)->start(reject);
    accept(worker);
  });
}

void ServerImpl::accept_later(Worker& worker) {
  worker.accept_timer.expires_after(kAcceptRetry);
  worker.accept_timer.async_wait([this, &worker](beast::error_code ec) {
    if (ec || !worker.acceptor->is_open()) {
      return;
    }
    if (spare_descriptor_.load(std::memory_order_relaxed) < 0) {
      // Given up earlier and not taken back then: try again now that time has passed.
      const int spare = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      int none = -1;
      if (spare >= 0 && !spare_descriptor_.compare_exchange_strong(none, spare)) {
        ::close(spare);
      }
    }
    accept_when_readable(worker);
  });
}

void ServerImpl::refuse(int descriptor) {
  if (descriptor < 0) {
    return;
  }
  // Small enough for any socket buffer; a request already received is dropped unread, which
  // may reset the connection: past every cap, a descriptor freed now matters more.
  std::string answer = refusal_;
  if (options_.error_request_ids) {  // after the status line, like error_response()'s header
    answer.insert(answer.find("\r\n") + 2, "X-Request-Id: " + fresh_request_id() + "\r\n");
  }
  [[maybe_unused]] const ssize_t sent = send_head_and_body(descriptor, answer, {});
  ::close(descriptor);
  if (uint64_t held_back = 0; refusal_log_.allow(held_back)) {
    spdlog::warn(
        "too many connections: {} open; answering 503 and closing at once ({} more in "
        "the last {} s)",
        connections_.load(), held_back, kLogPeriod.count());
  }
}

ServerImpl::SpareOutcome ServerImpl::refuse_with_spare(Worker& worker) {
  const int spare = spare_descriptor_.exchange(-1);
  if (spare < 0) {
    return SpareOutcome::kFailed;
  }
  ::close(spare);
  const int descriptor =
      ::accept4(worker.acceptor->native_handle(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  const int accept_error = errno;
  refuse(descriptor);
  // Taken back at once: the descriptor the refusal freed is the lowest free one, hence likely
  // the spare's again. When another thread took it meanwhile, accept_later() tries again.
  const int again = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int none = -1;
  if (again >= 0 && !spare_descriptor_.compare_exchange_strong(none, again)) {
    ::close(again);
  }
  if (descriptor >= 0) {
    return SpareOutcome::kRefused;
  }
  return accept_error == EAGAIN || accept_error == EWOULDBLOCK ? SpareOutcome::kNothingWaiting
                                                               : SpareOutcome::kFailed;
}

void ServerImpl::accept_when_readable(Worker& worker) {
  worker.acceptor->async_wait(tcp::acceptor::wait_read, [this, &worker](beast::error_code ec) {
    if (ec || !worker.acceptor->is_open()) {
      return;
    }
    accept(worker);
  });
}

int current_worker_index() {
  return current_worker;
}

void defer_on_current_loop(std::function<void()> task, std::chrono::microseconds delay) {
  if (current_loop == nullptr) {
    task();
    return;
  }
  if (delay.count() <= 0) {
    // post() from inside a handler queues behind the completions already taken from epoll.
    asio::post(*current_loop, std::move(task));
    return;
  }
  auto timer = std::make_shared<asio::steady_timer>(*current_loop, delay);
  timer->async_wait([timer, task = std::move(task)](beast::error_code) { task(); });
}

void ServerImpl::sweep(Worker& worker) {
  worker.sweep_timer->expires_after(kSweepPeriod);
  worker.sweep_timer->async_wait([this, &worker](beast::error_code ec) {
    if (ec) {
      return;
    }
    const TimePoint now = std::chrono::steady_clock::now();
    // expire_if_due() only closes sockets; sessions leave the set later, from their handlers.
    for (Session* session : worker.sessions) {
      session->expire_if_due(now);
    }
    sweep(worker);
  });
}

bool ServerImpl::run() {
  for (auto& worker : workers_) {
    accept(*worker);
    worker->sweep_timer.emplace(worker->context);
    sweep(*worker);
  }
  auto run_loop = [](Worker& worker, int index) {
    current_loop = &worker.context;
    current_worker = index;
    worker.context.run();
    current_loop = nullptr;
    current_worker = -1;
  };
  for (size_t i = 1; i < workers_.size(); ++i) {
    Worker& worker = *workers_[i];
    worker.thread = std::thread([&worker, run_loop, i] { run_loop(worker, static_cast<int>(i)); });
  }
  run_loop(*workers_[0], 0);
  for (size_t i = 1; i < workers_.size(); ++i) {
    workers_[i]->thread.join();
  }
  return drained_cleanly_.load();
}

void ServerImpl::drain(std::chrono::milliseconds timeout) {
  if (draining_.exchange(true)) {
    return;
  }
  spdlog::info("draining: {} open connections", connections_.load());
  if (options_.on_drain) {
    options_.on_drain();
  }
  for (auto& worker_ptr : workers_) {
    Worker& worker = *worker_ptr;
    asio::post(worker.context, [&worker] {
      beast::error_code ignored;
      worker.acceptor->close(ignored);
      std::vector<Session*> sessions(worker.sessions.begin(), worker.sessions.end());
      for (Session* session : sessions) {
        session->close_if_idle();
      }
    });
  }
  Worker& first = *workers_[0];
  asio::post(first.context, [this, &first, timeout] {
    drain_timer_.emplace(first.context, timeout);
    drain_timer_->async_wait([this](beast::error_code ec) {
      if (ec) {
        return;
      }
      spdlog::warn("drain timed out with {} connections open", connections_.load());
      drained_cleanly_ = false;
      stop_all();
    });
    stop_if_drained();
  });
}

void ServerImpl::drain_on_signals(std::chrono::milliseconds timeout) {
  signals_.emplace(workers_[0]->context, SIGTERM, SIGINT);
  signals_->async_wait([this, timeout](beast::error_code ec, int signal) {
    if (!ec) {
      spdlog::info("received signal {}", signal);
      drain(timeout);
    }
  });
}

void ServerImpl::session_closed(bool served) {
  if (served) {
    served_.fetch_sub(1);
  }
  connections_.fetch_sub(1);
  stop_if_drained();
}

void ServerImpl::stop_if_drained() {
  // Both counters are read after the caller's decrement (sequentially consistent), so of two
  // last decrements racing, at least one sees the other's.
  if (draining_.load() && connections_.load() == 0 && submitted_.load() == 0) {
    stop_all();
  }
}

void ServerImpl::submit(Request&& request, std::function<void(Response&&)> on_answer) {
  if (stopped_.load()) {
    Response refusal = error_response(options_, 503, "the server has stopped");
    on_answer(std::move(refusal));
    return;
  }
  submitted_.fetch_add(1);
  Responder responder =
      Responder::local(options_, [this, on_answer = std::move(on_answer)](Response&& response) {
        on_answer(std::move(response));
        submitted_.fetch_sub(1);
        stop_if_drained();
      });
  // Loop::post takes a copyable task; the request and responder travel in a shared holder.
  struct Work {
    Request request;
    Responder responder;
  };
  auto work = std::make_shared<Work>(Work{std::move(request), std::move(responder)});
  Worker& worker =
      *workers_[next_submit_worker_.fetch_add(1, std::memory_order_relaxed) % workers_.size()];
  asio::post(worker.context,
             [this, work] { handler_(std::move(work->request), std::move(work->responder)); });
}

void ServerImpl::stop_all() {
  if (stopped_.exchange(true)) {
    return;
  }
  for (auto& worker : workers_) {
    worker->guard.reset();
    worker->context.stop();
  }
}

Result<std::unique_ptr<Server>> Server::create(const ServerOptions& options, Handler handler) {
  auto server = std::make_unique<ServerImpl>(options, std::move(handler));
  FLOTILLA_RETURN_IF_ERROR(server->bind());
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace flotilla::http

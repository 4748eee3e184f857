// HTTP/1.1 client with keep-alive connection pools, confined to one event loop.
//
// A connection carries one exchange at a time: connect (first use only) → write the request
// (head serialized into a reused buffer, body as a second buffer: one gather write) → read the
// response with a Beast parser → back to the idle list when both sides keep the connection
// alive. Everything runs on the loop thread, so the pool takes no lock.
//
// Timeouts cost no timer per request: busy connections carry a deadline, and one sweep timer
// per pool (every 50 ms while any connection is busy) closes those past it, which fails their
// pending operation. Timeouts are thus accurate to the sweep period.
#include <deque>
#include <optional>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "http/asio_types.h"
#include "http/http.h"
#include "http/message_readers.h"

namespace flotilla::http {

using namespace std::string_view_literals;

std::string_view failure_name(UpstreamFailure failure) {
  switch (failure) {
    case UpstreamFailure::kNone:
      return "none";
    case UpstreamFailure::kConnect:
      return "connect";
    case UpstreamFailure::kClosedBeforeResponse:
      return "closed_before_response";
    case UpstreamFailure::kClosedDuringResponse:
      return "closed_during_response";
    case UpstreamFailure::kTimeout:
      return "timeout";
    case UpstreamFailure::kBadResponse:
      return "bad_response";
    case UpstreamFailure::kCancelled:
      return "cancelled";
    case UpstreamFailure::kStreamInterrupted:
      return "stream_interrupted";
  }
  return "unknown";
}

class PoolCore;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(asio::io_context& context, std::shared_ptr<PoolCore> pool, std::string key,
             std::string host, uint16_t port)
      : socket_(context.get_executor()),
        pool_(std::move(pool)),
        key_(std::move(key)),
        host_(std::move(host)),
        port_(port) {}

  const std::string& key() const { return key_; }
  uint64_t generation() const { return generation_; }
  bool busy() const { return static_cast<bool>(done_); }
  std::chrono::steady_clock::time_point deadline() const { return deadline_; }
  size_t busy_index = 0;                             // position in the pool's busy list, while busy
  std::chrono::steady_clock::time_point idle_since;  // while in the pool's idle list

  // Called by the sweep when the deadline passed: the pending operation fails.
  void expire() {
    if (!busy() || timed_out_) {
      return;
    }
    timed_out_ = true;
    beast::error_code ignored;
    socket_.close(ignored);
  }

  // Starts one exchange. `reused`: the connection was idle in the pool before.
  void start(ClientRequest&& request, std::chrono::milliseconds timeout, ClientPool::Callback done,
             bool reused);
  void cancel();
  // After a transparent resend, the call lives on `next`: cancel() follows it there. `next`
  // keeps this connection alive until its call ends, so the caller's handle stays valid.
  void forward_to(const std::shared_ptr<Connection>& next) {
    forwarded_ = next;
    forwarded_generation_ = next->generation();
    next->predecessor_ = shared_from_this();
  }

 private:
  void connect();
  void resolve(const std::shared_ptr<Resolver>& resolver);
  void on_connect(beast::error_code ec);
  void write();
  void read();
  void on_read(beast::error_code ec);
  void on_read_header(beast::error_code ec);
  void read_stream();
  void on_read_stream(beast::error_code ec);
  void fail_read(beast::error_code ec);
  // `local`: the failure is this process's (out of descriptors...), see ClientResponse.
  void fail(UpstreamFailure failure, const std::string& error, bool local = false);
  void finish(ClientResponse&& response, bool keep);

  Socket socket_;
  std::shared_ptr<PoolCore> pool_;
  std::string key_;
  std::string host_;
  uint16_t port_;
  bool connected_ = false;
  bool reused_ = false;
  bool cancelled_ = false;
  bool timed_out_ = false;
  std::chrono::steady_clock::time_point deadline_;
  uint64_t generation_ = 0;
  std::weak_ptr<Connection> forwarded_;
  uint64_t forwarded_generation_ = 0;
  std::shared_ptr<Connection> predecessor_;  // the connection this call was resent from
  ClientRequest request_;
  std::chrono::milliseconds timeout_{0};
  ClientPool::Callback done_;
  std::string head_;
  beast::flat_buffer buffer_;
  std::optional<ResponseReader> reader_;
  bool head_delivered_ = false;
};

namespace {

bool is_event_stream(std::string_view content_type) {
  constexpr std::string_view kEventStream = "text/event-stream";
  const size_t start = content_type.find_first_not_of(" \t");
  if (start == std::string_view::npos) {
    return false;
  }
  content_type.remove_prefix(start);
  return content_type.size() >= kEventStream.size() &&
         equals_ignore_case(content_type.substr(0, kEventStream.size()), kEventStream) &&
         (content_type.size() == kEventStream.size() || content_type[kEventStream.size()] == ';' ||
          content_type[kEventStream.size()] == ' ');
}

}  // namespace

// The pool's state, shared with its connections so an operation completing during shutdown
// never touches freed memory.
class PoolCore : public std::enable_shared_from_this<PoolCore> {
 public:
  PoolCore(asio::io_context& context, const ClientOptions& options)
      : context_(context), options_(options), sweep_timer_(context.get_executor()) {}

  asio::io_context& context() { return context_; }
  const ClientOptions& options() const { return options_; }

  ClientPool::CallHandle send(const std::string& host, uint16_t port, ClientRequest&& request,
                              std::chrono::milliseconds timeout, ClientPool::Callback done) {
    key_buffer_.assign(host);
    key_buffer_.push_back(':');
    key_buffer_.append(std::to_string(port));
    std::shared_ptr<Connection> connection;
    bool reused = false;
    auto it = idle_.find(key_buffer_);
    if (it != idle_.end() && !it->second.empty()) {
      connection = std::move(it->second.back());
      it->second.pop_back();
      --idle_count_;
      reused = true;
    } else {
      connection =
          std::make_shared<Connection>(context_, shared_from_this(), key_buffer_, host, port);
    }
    connection->start(std::move(request), timeout, std::move(done), reused);
    return {connection, connection->generation()};
  }

  // A fresh connection for a request whose pooled connection turned out closed.
  std::shared_ptr<Connection> resend_fresh(const std::string& key, const std::string& host,
                                           uint16_t port, ClientRequest&& request,
                                           std::chrono::milliseconds timeout,
                                           ClientPool::Callback done) {
    auto connection = std::make_shared<Connection>(context_, shared_from_this(), key, host, port);
    connection->start(std::move(request), timeout, std::move(done), false);
    return connection;
  }

  void release(std::shared_ptr<Connection>&& connection) {
    auto& idle = idle_[connection->key()];
    if (idle.size() >= options_.max_idle_per_upstream) {
      return;  // dropped: closes the socket
    }
    connection->idle_since = std::chrono::steady_clock::now();
    idle.push_back(std::move(connection));
    ++idle_count_;
  }

  // Busy connections are swept for their deadline.
  void mark_busy(Connection* connection) {
    connection->busy_index = busy_.size();
    busy_.push_back(connection);
    if (!sweeping_) {
      sweeping_ = true;
      arm_sweep();
    }
  }
  void mark_idle(Connection* connection) {
    const size_t index = connection->busy_index;
    FLOTILLA_DCHECK(index < busy_.size() && busy_[index] == connection);
    busy_[index] = busy_.back();
    busy_[index]->busy_index = index;
    busy_.pop_back();
  }

  size_t idle_count() const { return idle_count_; }

  // Idle connections hold the core: the pool's owner going away must drop them.
  void close_idle() {
    idle_.clear();
    idle_count_ = 0;
    sweep_timer_.cancel();
  }

 private:
  void arm_sweep() {
    sweep_timer_.expires_after(std::chrono::milliseconds(50));
    sweep_timer_.async_wait([weak = weak_from_this()](beast::error_code ec) {
      auto self = weak.lock();
      if (ec || !self) {
        return;
      }
      self->sweep();
    });
  }

  void sweep() {
    const auto now = std::chrono::steady_clock::now();
    // expire() only closes sockets; the failures complete later, so busy_ is stable here.
    for (Connection* connection : busy_) {
      if (connection->deadline() <= now) {
        connection->expire();
      }
    }
    // Idle lists are used newest first, so their fronts are the oldest: connections unused
    // for max_idle_time are closed before the upstream's own idle timeout closes them (which
    // would leave them half-closed here until reused).
    for (auto& [key, idle] : idle_) {
      size_t stale = 0;
      while (stale < idle.size() && now - idle[stale]->idle_since >= options_.max_idle_time) {
        ++stale;
      }
      idle.erase(idle.begin(), idle.begin() + static_cast<std::ptrdiff_t>(stale));
      idle_count_ -= stale;
    }
    if (busy_.empty() && idle_count_ == 0) {
      sweeping_ = false;
      return;
    }
    arm_sweep();
  }

  asio::io_context& context_;
  ClientOptions options_;
  std::string key_buffer_;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Connection>>> idle_;
  size_t idle_count_ = 0;
  std::vector<Connection*> busy_;
  SteadyTimer sweep_timer_;
  bool sweeping_ = false;
};

void Connection::start(ClientRequest&& request, std::chrono::milliseconds timeout,
                       ClientPool::Callback done, bool reused) {
  ++generation_;
  request_ = std::move(request);
  timeout_ = timeout;
  done_ = std::move(done);
  reused_ = reused;
  cancelled_ = false;
  timed_out_ = false;
  head_delivered_ = false;
  pool_->mark_busy(this);
  if (connected_) {
    deadline_ = std::chrono::steady_clock::now() + timeout_;
    write();
  } else {
    deadline_ = std::chrono::steady_clock::now() + pool_->options().connect_timeout;
    connect();
  }
}

void Connection::on_connect(beast::error_code ec) {
  if (ec) {
    if (timed_out_) {
      fail(UpstreamFailure::kConnect, "connect timed out");
    } else if (is_local_resource_error(ec)) {
      // Opening the socket failed here, or the kernel had no local port for it.
      fail(UpstreamFailure::kConnect, "connect: local: " + ec.message(), /*local=*/true);
    } else {
      fail(UpstreamFailure::kConnect, "connect: " + ec.message());
    }
    return;
  }
  connected_ = true;
  beast::error_code ignored;
  socket_.set_option(tcp::no_delay(true), ignored);
  deadline_ = std::chrono::steady_clock::now() + timeout_;
  write();
}

void Connection::connect() {
  beast::error_code ec;
  auto address = asio::ip::make_address(host_ == "localhost" ? "127.0.0.1" : host_, ec);
  if (!ec) {
    socket_.async_connect(
        tcp::endpoint(address, port_),
        [self = shared_from_this()](beast::error_code ec) { self->on_connect(ec); });
    return;
  }
  // Host names: resolve asynchronously (Kubernetes mode); loopback tests use literals. Asio's
  // resolver starts a thread of its own at its first use, which throws when none can be made.
  try {
    auto resolver = std::make_shared<Resolver>(socket_.get_executor());
    resolve(resolver);
  } catch (const std::exception& e) {
    // Posted: the caller's callback never runs inside send().
    asio::post(socket_.get_executor(), [self = shared_from_this(), what = std::string(e.what())] {
      self->fail(UpstreamFailure::kConnect, "cannot resolve '" + self->host_ + "': local: " + what,
                 /*local=*/true);
    });
  }
}

void Connection::resolve(const std::shared_ptr<Resolver>& resolver) {
  resolver->async_resolve(
      host_, std::to_string(port_),
      [self = shared_from_this(), resolver](beast::error_code ec,
                                            tcp::resolver::results_type results) {
        if (ec || results.empty()) {
          self->fail(UpstreamFailure::kConnect,
                     "cannot resolve '" + self->host_ + "': " + (ec ? ec.message() : "no address"));
          return;
        }
        asio::async_connect(
            self->socket_, results,
            [self](beast::error_code ec, const tcp::endpoint&) { self->on_connect(ec); });
      });
}

void Connection::write() {
  if (cancelled_) {
    fail(UpstreamFailure::kCancelled, "cancelled");
    return;
  }
  // The head is written by hand into a reused buffer: Beast's serializer would allocate a
  // field list per request. Header values come from Beast's parser, which refuses CR and LF.
  head_.clear();
  head_.append(method_name(request_.method));
  head_.push_back(' ');
  head_.append(request_.target);
  head_.append(" HTTP/1.1\r\nHost: "sv);
  head_.append(key_);
  head_.append("\r\n"sv);
  for (const auto& [name, value] : request_.headers) {
    head_.append(name);
    head_.append(": "sv);
    head_.append(value);
    head_.append("\r\n"sv);
  }
  if (!request_.body.empty() || request_.method == Method::kPost ||
      request_.method == Method::kPut) {
    head_.append("Content-Length: "sv);
    head_.append(std::to_string(request_.body.size()));
    head_.append("\r\n"sv);
  }
  head_.append("\r\n"sv);
  // One non-blocking sendmsg sends most requests whole: no asio operation. The response
  // cannot be here yet, and reading now would cost a recv failing with EAGAIN: the read is
  // posted, to start after the completions already due on this loop.
  const ssize_t sent = send_head_and_body(socket_.native_handle(), head_, request_.body);
  if (sent == static_cast<ssize_t>(head_.size() + request_.body.size())) {
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->read(); });
    return;
  }
  if (sent < 0) {
    fail(
        UpstreamFailure::kClosedBeforeResponse,
        "write: " +
            beast::error_code(static_cast<int>(-sent), boost::system::system_category()).message());
    return;
  }
  asio::async_write(socket_, unsent_part(head_, request_.body, static_cast<size_t>(sent)),
                    [self = shared_from_this()](beast::error_code ec, size_t) {
                      if (ec) {
                        self->fail(self->timed_out_   ? UpstreamFailure::kTimeout
                                   : self->cancelled_ ? UpstreamFailure::kCancelled
                                                      : UpstreamFailure::kClosedBeforeResponse,
                                   "write: " + ec.message());
                        return;
                      }
                      self->read();
                    });
}

void Connection::read() {
  reader_.emplace();
  reader_->body_limit(pool_->options().max_response_bytes);
  reader_->eager(true);
  reader_->skip(request_.method == Method::kHead);  // a HEAD response has no body
  if (request_.stream.on_head && request_.method != Method::kHead) {
    // The head first, to choose between streaming and reading whole. Not eager: no body byte
    // is parsed before that choice.
    reader_->eager(false);
    bhttp::async_read_header(
        socket_, buffer_, *reader_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read_header(ec); });
    return;
  }
  bhttp::async_read(
      socket_, buffer_, *reader_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
}

void Connection::on_read_header(beast::error_code ec) {
  if (ec || cancelled_) {
    fail_read(ec);
    return;
  }
  const ClientResponse& head = reader_->response();
  if (reader_->is_done() || !is_event_stream(head.content_type)) {
    // Not a stream: the rest as usual, whole. The body is usually in the buffer already:
    // parsed here, it costs no further asynchronous hop.
    reader_->eager(true);
    if (!reader_->is_done() && buffer_.size() > 0) {
      beast::error_code put_ec;
      buffer_.consume(reader_->put(buffer_.data(), put_ec));
      if (put_ec && put_ec != bhttp::error::need_more) {
        fail_read(put_ec);
        return;
      }
    }
    if (reader_->is_done()) {
      on_read({});
      return;
    }
    bhttp::async_read(
        socket_, buffer_, *reader_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
    return;
  }
  reader_->stream_pieces();
  reader_->body_limit(boost::none);  // nothing accumulates
  // Not eager: an eager parser that meets the CRLF ending a chunk goes on to the next chunk's
  // header, gets need_more, and the read waits for the next event, holding this one back.
  reader_->eager(false);
  head_delivered_ = true;
  // From here the timeout bounds each wait for the next piece, not the whole stream.
  deadline_ = std::chrono::steady_clock::now() + timeout_;
  // Copies: the response handed to finish() at the end carries the head too.
  request_.stream.on_head(head.status, std::string(head.content_type), Headers(head.headers));
  read_stream();
}

void Connection::read_stream() {
  if (cancelled_) {
    // on_head() or on_body() cancelled the call: the socket is already closed.
    fail(UpstreamFailure::kCancelled, "cancelled");
    return;
  }
  bhttp::async_read_some(
      socket_, buffer_, *reader_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read_stream(ec); });
}

void Connection::on_read_stream(beast::error_code ec) {
  if (ec) {
    fail_read(ec);
    return;
  }
  std::string piece = reader_->take_piece();
  if (!piece.empty()) {
    deadline_ = std::chrono::steady_clock::now() + timeout_;
    request_.stream.on_body(std::move(piece));
  }
  if (!reader_->is_done()) {
    read_stream();
    return;
  }
  if (cancelled_) {
    fail(UpstreamFailure::kCancelled, "cancelled");
    return;
  }
  on_read({});
}

void Connection::on_read(beast::error_code ec) {
  if (ec) {
    fail_read(ec);
    return;
  }
  // Bytes past the response on a request/response connection mean a confused upstream.
  const bool keep = reader_->keep_alive() && buffer_.size() == 0;
  ClientResponse response = std::move(reader_->response());
  reader_.reset();
  finish(std::move(response), keep);
}

void Connection::fail_read(beast::error_code ec) {
  if (cancelled_) {
    fail(UpstreamFailure::kCancelled, "cancelled");
  } else if (head_delivered_) {
    // Bytes of this response went on to the caller: whatever the cause, not retryable.
    fail(UpstreamFailure::kStreamInterrupted,
         timed_out_ ? "stream stalled for " + std::to_string(timeout_.count()) + " ms"
                    : "stream cut: " + ec.message());
  } else if (timed_out_) {
    fail(UpstreamFailure::kTimeout,
         "no response within " + std::to_string(timeout_.count()) + " ms");
  } else if (ec == bhttp::error::body_limit || ec == bhttp::error::header_limit ||
             is_malformed_http(ec)) {
    fail(UpstreamFailure::kBadResponse, "bad response: " + ec.message());
  } else if ((!reader_ || !reader_->got_some()) && buffer_.size() == 0) {
    fail(UpstreamFailure::kClosedBeforeResponse, "closed before responding: " + ec.message());
  } else {
    fail(UpstreamFailure::kClosedDuringResponse, "closed mid-response: " + ec.message());
  }
}

void Connection::fail(UpstreamFailure failure, const std::string& error, bool local) {
  connected_ = false;
  buffer_.clear();
  reader_.reset();
  beast::error_code ignored;
  socket_.close(ignored);
  if (reused_ && failure == UpstreamFailure::kClosedBeforeResponse && !cancelled_) {
    // The upstream closed this connection while it sat idle (a keep-alive timeout race), not
    // a failure of the upstream: once more on a fresh connection.
    pool_->mark_idle(this);
    reused_ = false;
    auto done = std::move(done_);
    done_ = nullptr;
    forward_to(
        pool_->resend_fresh(key_, host_, port_, std::move(request_), timeout_, std::move(done)));
    return;
  }
  ClientResponse response;
  response.failure = failure;
  response.error = error;
  response.local_failure = local;
  if (failure == UpstreamFailure::kConnect || failure == UpstreamFailure::kClosedBeforeResponse ||
      failure == UpstreamFailure::kClosedDuringResponse) {
    response.unsent = std::move(request_);
  }
  finish(std::move(response), false);
}

void Connection::finish(ClientResponse&& response, bool keep) {
  pool_->mark_idle(this);
  predecessor_.reset();
  auto done = std::move(done_);
  done_ = nullptr;
  BodyRecycler::give(std::move(request_.body));  // written: the next parse on this loop takes it
  request_ = {};
  if (keep) {
    pool_->release(shared_from_this());
  } else {
    connected_ = false;
    beast::error_code ignored;
    socket_.close(ignored);
  }
  if (done) {
    done(std::move(response));
  }
}

void Connection::cancel() {
  if (!busy()) {
    auto next = forwarded_.lock();
    if (next && next->generation() == forwarded_generation_) {
      next->cancel();
    }
    return;
  }
  if (cancelled_) {
    return;
  }
  cancelled_ = true;
  beast::error_code ignored;
  socket_.close(ignored);
}

class ClientPoolImpl final : public ClientPool {
 public:
  ClientPoolImpl(asio::io_context& context, const ClientOptions& options)
      : core_(std::make_shared<PoolCore>(context, options)) {}
  ~ClientPoolImpl() override { core_->close_idle(); }

  CallHandle send(const std::string& host, uint16_t port, ClientRequest&& request,
                  std::chrono::milliseconds timeout, Callback done) override {
    return core_->send(host, port, std::move(request), timeout, std::move(done));
  }

  void cancel(const CallHandle& handle) override {
    auto connection = std::static_pointer_cast<Connection>(handle.connection.lock());
    if (connection && connection->generation() == handle.generation) {
      connection->cancel();
    }
  }

  size_t idle_connections() const override { return core_->idle_count(); }

 private:
  std::shared_ptr<PoolCore> core_;
};

std::unique_ptr<ClientPool> ClientPool::create(Loop loop, const ClientOptions& options) {
  FLOTILLA_CHECK(loop.valid());
  return std::make_unique<ClientPoolImpl>(*static_cast<asio::io_context*>(loop.native()), options);
}

}  // namespace flotilla::http

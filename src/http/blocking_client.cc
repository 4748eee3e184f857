// The blocking client: one HTTP/1.1 keep-alive connection (plain TCP or TLS) run to completion
// on its own io_context, every step an asynchronous Beast operation under a deadline (Beast's
// synchronous calls have none). Serves the store's downloads (ranges, long streamed bodies), the
// orchestrator's probes and the CLI (fetch(), below).
#include <algorithm>
#include <limits>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include <boost/asio/ssl.hpp>
#include <boost/beast/ssl.hpp>

#include "http/asio_types.h"
#include "http/http.h"

namespace flotilla::http {
namespace {

bhttp::verb to_verb(Method method) {
  switch (method) {
    case Method::kGet:
      return bhttp::verb::get;
    case Method::kHead:
      return bhttp::verb::head;
    case Method::kPost:
      return bhttp::verb::post;
    case Method::kPut:
      return bhttp::verb::put;
    case Method::kDelete:
      return bhttp::verb::delete_;
    case Method::kPatch:
      return bhttp::verb::patch;
    case Method::kOther:
      break;
  }
  return bhttp::verb::get;
}

// Reads of a body of known length go straight into a buffer of this size: far fewer, larger
// reads than through the parser.
constexpr size_t kChunkBytes = 1 << 20;

}  // namespace

std::string Origin::text() const {
  return std::string(tls ? "https://" : "http://") + host + ":" + std::to_string(port);
}

struct BlockingConnection::Impl {
  Impl(Origin origin_in, std::chrono::milliseconds io_timeout_in)
      : origin(std::move(origin_in)), io_timeout(io_timeout_in) {}

  const Origin origin;
  const std::chrono::milliseconds io_timeout;
  // Made at the first connect, not in the constructor: Asio throws when an io_context cannot get
  // its descriptors, and that failure must come back as a Status.
  std::optional<asio::io_context> io;
  std::optional<asio::ssl::context> tls;
  std::optional<beast::tcp_stream> plain;
  std::optional<beast::ssl_stream<beast::tcp_stream>> secure;
  beast::flat_buffer buffer;
  std::vector<char> chunk;
  // The exchange in progress: what messages name, and its bounds.
  std::string url;
  std::optional<Clock::TimePoint> deadline;
  bool deadline_hit = false;  // the last step's expiry was the deadline, not io_timeout
  UpstreamFailure failure = UpstreamFailure::kNone;
  bool local_failure = false;

  // cancel() may come from another thread: it posts to `io`, whose creation it must see.
  Mutex cancel_mutex;
  bool cancelled FLOTILLA_GUARDED_BY(cancel_mutex) = false;

  bool is_cancelled() {
    MutexLock lock(cancel_mutex);
    return cancelled;
  }

  bool connected() const { return plain.has_value() || secure.has_value(); }
  beast::tcp_stream& lowest() { return secure ? beast::get_lowest_layer(*secure) : *plain; }

  void disconnect() {
    secure.reset();
    plain.reset();
    buffer.clear();
  }

  // Starts one asynchronous operation through `start(handler)` and runs it to completion within
  // io_timeout, and within the deadline when there is one. The clock is the real one: Asio's
  // timers run on it.
  template <typename Start>
  beast::error_code run(Start start, size_t* transferred = nullptr) {
    beast::error_code result;
    Clock::TimePoint expiry = real_clock().now() + io_timeout;
    deadline_hit = deadline && *deadline <= expiry;
    if (deadline_hit) {
      expiry = *deadline;
    }
    lowest().expires_at(expiry);
    start([&result, transferred](beast::error_code ec, auto&&... rest) {
      result = ec;
      // Reads and writes complete with a byte count; connect with an endpoint.
      auto count = [transferred](const auto& value) {
        if constexpr (std::is_integral_v<std::decay_t<decltype(value)>>) {
          if (transferred != nullptr) {
            *transferred = static_cast<size_t>(value);
          }
        }
      };
      (count(rest), ...);
      (void)count;  // handlers with no value after the error code
    });
    io->restart();
    io->run();
    return result;
  }

  template <typename Operation>
  beast::error_code on_stream(Operation operation, size_t* transferred = nullptr) {
    if (secure) {
      return run([&](auto handler) { operation(*secure, handler); }, transferred);
    }
    return run([&](auto handler) { operation(*plain, handler); }, transferred);
  }

  Status fail(UpstreamFailure why, const std::string& what, const beast::error_code& ec) {
    disconnect();
    failure = ec == beast::error::timeout ? UpstreamFailure::kTimeout : why;
    local_failure = is_local_resource_error(ec);
    std::string reason;
    if (ec == beast::error::timeout) {
      reason = deadline_hit ? "past the request's deadline"
                            : "no progress for " + std::to_string(io_timeout.count()) + " ms";
    } else {
      reason = (local_failure ? "local: " : "") + ec.message();
    }
    return unavailable(url + ": " + what + ": " + reason);
  }

  Status fail_local(const std::string& what, std::string_view reason) {
    disconnect();
    failure = UpstreamFailure::kConnect;
    local_failure = true;
    return unavailable(url + ": " + what + ": local: " + std::string(reason));
  }

  // The TLS context of origin.tls_options; a CA, certificate or key that does not load is
  // kInvalidArgument naming it, and no context is kept.
  Status make_tls_context() {
    const TlsOptions& options = origin.tls_options;
    tls.emplace(asio::ssl::context::tls_client);
    beast::error_code ec;
    if (options.ca_pem.empty()) {
      tls->set_default_verify_paths(ec);  // honours SSL_CERT_FILE / SSL_CERT_DIR
    } else {
      tls->add_certificate_authority(asio::buffer(options.ca_pem), ec);
    }
    if (ec) {
      tls.reset();
      return invalid_argument(url + ": the CA certificates do not load: " + ec.message());
    }
    if (!options.cert_pem.empty()) {
      tls->use_certificate_chain(asio::buffer(options.cert_pem), ec);
      if (!ec) {
        tls->use_private_key(asio::buffer(options.key_pem), asio::ssl::context::pem, ec);
      }
      if (ec) {
        tls.reset();
        return invalid_argument(url +
                                ": the client certificate or key does not load: " + ec.message());
      }
    }
    tls->set_verify_mode(options.verify ? asio::ssl::verify_peer : asio::ssl::verify_none);
    return Status::ok();
  }

  Status connect() {
    disconnect();
    // Asio throws where it cannot get descriptors or memory (the io_context's epoll and eventfd,
    // a TLS context): a probe must not take the process down when descriptors run out.
    try {
      if (!io) {
        MutexLock lock(cancel_mutex);
        io.emplace();
      }
      if (origin.tls && !tls) {
        FLOTILLA_RETURN_IF_ERROR(make_tls_context());
      }
    } catch (const boost::system::system_error& e) {
      failure = UpstreamFailure::kConnect;
      local_failure = true;
      return unavailable(url + ": cannot connect: local: " + e.code().message());
    } catch (const std::exception& e) {
      return fail_local("cannot connect", e.what());
    }
    tcp::resolver resolver(*io);
    beast::error_code ec;
    const auto addresses = resolver.resolve(origin.host, std::to_string(origin.port), ec);
    if (ec) {
      failure = UpstreamFailure::kConnect;
      return unavailable(url + ": cannot resolve '" + origin.host + "': " + ec.message());
    }
    if (origin.tls) {
      secure.emplace(*io, *tls);
    } else {
      plain.emplace(*io);
    }
    ec = run([&](auto handler) { lowest().async_connect(addresses, handler); });
    if (ec) {
      return fail(UpstreamFailure::kConnect, "cannot connect", ec);
    }
    lowest().socket().set_option(tcp::no_delay(true), ec);
    if (secure) {
      if (SSL_set_tlsext_host_name(secure->native_handle(), origin.host.c_str()) != 1) {
        disconnect();
        failure = UpstreamFailure::kConnect;
        return unavailable(url + ": cannot set the TLS server name");
      }
      if (origin.tls_options.verify) {
        secure->set_verify_callback(asio::ssl::host_name_verification(origin.host));
      }
      ec = run(
          [&](auto handler) { secure->async_handshake(asio::ssl::stream_base::client, handler); });
      if (ec) {
        return fail(UpstreamFailure::kConnect, "TLS handshake failed", ec);
      }
    }
    return Status::ok();
  }

  // A body of `length` bytes, read straight from the stream into `chunk` after what the header
  // read left in `buffer`.
  Status read_sized_body(uint64_t length, const BlockingConnection::BodyCallback& on_body) {
    while (length > 0 && buffer.size() > 0) {
      const auto buffered = buffer.data();
      const size_t take = static_cast<size_t>(std::min<uint64_t>(length, buffered.size()));
      FLOTILLA_RETURN_IF_ERROR(on_body(static_cast<const char*>(buffered.data()), take));
      buffer.consume(take);
      length -= take;
    }
    if (length > 0 && chunk.size() < kChunkBytes) {
      // Sized to the body: a probe's small answer does not cost a megabyte.
      chunk.resize(
          static_cast<size_t>(std::min<uint64_t>(std::max(length, chunk.size()), kChunkBytes)));
    }
    while (length > 0) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(length, chunk.size()));
      size_t got = 0;
      const beast::error_code ec = on_stream(
          [&](auto& stream, auto handler) {
            stream.async_read_some(asio::buffer(chunk.data(), want), handler);
          },
          &got);
      if (ec) {
        return fail(UpstreamFailure::kClosedDuringResponse,
                    "reading the body (" + std::to_string(length) + " bytes short)", ec);
      }
      FLOTILLA_RETURN_IF_ERROR(on_body(chunk.data(), got));
      length -= got;
    }
    return Status::ok();
  }

  Status exchange(ClientRequest&& request, const BlockingConnection::HeadCallback& on_head,
                  const BlockingConnection::BodyCallback& on_body);
};

Status BlockingConnection::Impl::exchange(ClientRequest&& request, const HeadCallback& on_head,
                                          const BodyCallback& on_body) {
  failure = UpstreamFailure::kNone;
  local_failure = false;
  url = origin.text() + request.target;
  if (is_cancelled()) {
    disconnect();
    failure = UpstreamFailure::kConnect;
    return unavailable(url + ": the connection was cancelled");
  }
  if (!connected()) {
    FLOTILLA_RETURN_IF_ERROR(connect());
  }
  bhttp::request<bhttp::string_body> message{to_verb(request.method), request.target, 11};
  const bool default_port = origin.port == (origin.tls ? 443 : 80);
  message.set(bhttp::field::host,
              default_port ? origin.host : origin.host + ":" + std::to_string(origin.port));
  message.set(bhttp::field::user_agent, "flotilla");
  message.keep_alive(true);
  for (const auto& [name, value] : request.headers) {
    message.set(name, value);  // after keep_alive(): a caller's Connection: close stands
  }
  message.body() = std::move(request.body);
  message.prepare_payload();
  beast::error_code ec =
      on_stream([&](auto& stream, auto handler) { bhttp::async_write(stream, message, handler); });
  if (ec) {
    return fail(UpstreamFailure::kClosedBeforeResponse, "sending the request", ec);
  }

  bhttp::response_parser<bhttp::buffer_body> parser;
  parser.body_limit(std::numeric_limits<uint64_t>::max());  // on_body decides how much is enough
  parser.skip(request.method == Method::kHead);             // a HEAD response has no body
  ec = on_stream([&](auto& stream, auto handler) {
    bhttp::async_read_header(stream, buffer, parser, handler);
  });
  if (ec) {
    return fail(is_malformed_http(ec) ? UpstreamFailure::kBadResponse
                : parser.got_some()   ? UpstreamFailure::kClosedDuringResponse
                                      : UpstreamFailure::kClosedBeforeResponse,
                "reading the response", ec);
  }
  ResponseHead head;
  head.status = static_cast<int>(parser.get().result_int());
  if (parser.content_length()) {
    head.content_length = *parser.content_length();
  }
  for (const auto& field : parser.get()) {
    if (field.name() == bhttp::field::content_type) {
      head.content_type = std::string(field.value());
    } else {
      head.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
  }
  if (Status accepted = on_head(head); !accepted.is_ok()) {
    disconnect();  // the body is not read: the connection cannot be reused
    return accepted;
  }
  // A callback's refusal ends the exchange and the connection, whose rest is unread.
  const auto take = [&](const char* data, size_t size) {
    Status taken = on_body(data, size);
    if (!taken.is_ok()) {
      disconnect();
    }
    return taken;
  };
  if (!parser.is_done() && !parser.chunked() && head.content_length) {
    Status read = read_sized_body(*head.content_length, take);
    if (read.is_ok() && !parser.keep_alive()) {
      disconnect();
    }
    return read;
  }
  if (!parser.is_done() && chunk.size() < kChunkBytes) {
    chunk.resize(kChunkBytes);
  }
  while (!parser.is_done()) {
    parser.get().body().data = chunk.data();
    parser.get().body().size = chunk.size();
    // read_some, not read: a piece goes to on_body as soon as it arrives (a watch stream's
    // events, a server-sent event), not when the chunk buffer is full.
    ec = on_stream([&](auto& stream, auto handler) {
      bhttp::async_read_some(stream, buffer, parser, handler);
    });
    if (ec == bhttp::error::need_buffer) {
      ec = {};
    }
    if (ec) {
      // A truncated body ends here (partial_message).
      return fail(is_malformed_http(ec) ? UpstreamFailure::kBadResponse
                                        : UpstreamFailure::kClosedDuringResponse,
                  "reading the body", ec);
    }
    const size_t got = chunk.size() - parser.get().body().size;
    if (got > 0) {
      FLOTILLA_RETURN_IF_ERROR(take(chunk.data(), got));
    }
  }
  if (!parser.keep_alive()) {
    disconnect();
  }
  return Status::ok();
}

BlockingConnection::BlockingConnection(Origin origin, std::chrono::milliseconds io_timeout)
    : impl_(std::make_unique<Impl>(std::move(origin), io_timeout)) {}

BlockingConnection::~BlockingConnection() = default;

Status BlockingConnection::send(ClientRequest request, const HeadCallback& on_head,
                                const BodyCallback& on_body,
                                std::optional<Clock::TimePoint> deadline) {
  impl_->deadline = deadline;
  // Asio throws where it cannot get descriptors (the reactor's epoll and eventfd are made at the
  // first socket or resolver, not with the io_context): a probe must not take the process down
  // when descriptors run out; the exchange fails like a connect that could not be made.
  try {
    return impl_->exchange(std::move(request), on_head, on_body);
  } catch (const boost::system::system_error& e) {
    return impl_->fail_local("cannot connect", e.code().message());
  } catch (const std::exception& e) {
    return impl_->fail_local("cannot connect", e.what());
  }
}

Status BlockingConnection::get(const std::string& target, std::optional<ByteRange> range,
                               const HeadCallback& on_head, const BodyCallback& on_body) {
  ClientRequest request;
  request.method = Method::kGet;
  request.target = target;
  if (range) {
    request.headers.emplace_back(
        "Range", "bytes=" + std::to_string(range->first) + "-" + std::to_string(range->last));
  }
  return send(std::move(request), on_head, on_body);
}

void BlockingConnection::cancel() {
  MutexLock lock(impl_->cancel_mutex);
  impl_->cancelled = true;
  if (impl_->io) {
    // Runs on the owner's thread, inside its exchange (or at its next one): the pending
    // operation completes with operation_aborted and the exchange fails.
    asio::post(*impl_->io, [impl = impl_.get()] {
      if (impl->connected()) {
        beast::error_code ignored;
        impl->lowest().socket().cancel(ignored);
      }
    });
  }
}

UpstreamFailure BlockingConnection::failure() const {
  return impl_->failure;
}

bool BlockingConnection::local_failure() const {
  return impl_->local_failure;
}

std::vector<ClientResponse> fetch_each(const std::vector<std::pair<std::string, uint16_t>>& origins,
                                       const std::string& target,
                                       std::chrono::milliseconds deadline, size_t parallel) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  std::vector<ClientResponse> responses(origins.size());
  parallel = std::max<size_t>(parallel, 1);
  for (size_t begin = 0; begin < origins.size(); begin += parallel) {
    std::vector<std::thread> fetchers;
    for (size_t i = begin; i < std::min(origins.size(), begin + parallel); ++i) {
      // Each thread writes its own element only.
      fetchers.emplace_back([&, i] {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            until - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
          responses[i].failure = UpstreamFailure::kTimeout;
          responses[i].error = "the deadline passed before this fetch's turn";
          return;
        }
        ClientRequest request;
        request.method = Method::kGet;
        request.target = target;
        responses[i] = fetch(origins[i].first, origins[i].second, std::move(request), left);
      });
    }
    for (std::thread& fetcher : fetchers) {
      fetcher.join();
    }
  }
  return responses;
}

ClientResponse fetch(const std::string& host, uint16_t port, ClientRequest request,
                     std::chrono::milliseconds timeout) {
  BlockingConnection connection(Origin{host, port, false}, timeout);
  request.headers.emplace_back("Connection", "close");  // one request: no keep-alive
  constexpr size_t kMaxBody = 64 * 1024 * 1024;
  ClientResponse response;
  bool too_large = false;
  const Status status = connection.send(
      std::move(request),
      [&](const ResponseHead& head) {
        response.status = head.status;
        response.content_type = head.content_type;
        response.headers = head.headers;
        return Status::ok();
      },
      [&](const char* data, size_t size) {
        if (response.body.size() + size > kMaxBody) {
          too_large = true;
          return invalid_argument("the response body is over 64 MiB");
        }
        response.body.append(data, size);
        return Status::ok();
      },
      real_clock().now() + timeout);
  if (!status.is_ok()) {
    ClientResponse failed;
    failed.failure = too_large ? UpstreamFailure::kBadResponse : connection.failure();
    failed.local_failure = connection.local_failure();
    failed.error = status.message();
    return failed;
  }
  return response;
}

}  // namespace flotilla::http

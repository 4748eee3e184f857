// Blocking GETs on Boost.Beast: every step is an async operation with a deadline, run to
// completion on the connection's own io_context (Beast's synchronous calls have no timeouts).
#include "store/http_get.h"

#include <algorithm>
#include <limits>
#include <type_traits>
#include <utility>  // Boost 1.74 asio uses std::exchange without including it
#include <vector>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

namespace flotilla::store {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

struct HttpConnection::Impl {
  Impl(const Url& url, std::chrono::milliseconds io_timeout)
      : origin(url), timeout(io_timeout), chunk(1 << 20) {
    tls.set_default_verify_paths();  // honours SSL_CERT_FILE / SSL_CERT_DIR
    tls.set_verify_mode(asio::ssl::verify_peer);
  }

  Url origin;
  std::chrono::milliseconds timeout;
  asio::io_context io;
  asio::ssl::context tls{asio::ssl::context::tls_client};
  std::optional<beast::tcp_stream> plain;
  std::optional<beast::ssl_stream<beast::tcp_stream>> secure;
  beast::flat_buffer buffer;
  std::vector<char> chunk;

  bool connected() const { return plain.has_value() || secure.has_value(); }
  beast::tcp_stream& lowest() { return secure ? beast::get_lowest_layer(*secure) : *plain; }

  void disconnect() {
    secure.reset();
    plain.reset();
    buffer.clear();
  }

  // Starts one asynchronous operation through `start(handler)` and runs it to completion under
  // the I/O deadline.
  template <typename Start>
  beast::error_code run(Start start, size_t* transferred = nullptr) {
    beast::error_code result;
    lowest().expires_after(timeout);
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
    io.restart();
    io.run();
    return result;
  }

  template <typename Operation>
  beast::error_code on_stream(Operation operation, size_t* transferred = nullptr) {
    if (secure) {
      return run([&](auto handler) { operation(*secure, handler); }, transferred);
    }
    return run([&](auto handler) { operation(*plain, handler); }, transferred);
  }

  // A body of known length, read straight from the stream into `chunk` (after what the header
  // read left in `buffer`): far fewer, larger reads than through the parser.
  Status read_sized_body(uint64_t length,
                         const std::function<Status(const char* data, size_t size)>& on_body) {
    while (length > 0 && buffer.size() > 0) {
      const auto buffered = buffer.data();
      const size_t take = static_cast<size_t>(std::min<uint64_t>(length, buffered.size()));
      FLOTILLA_RETURN_IF_ERROR(on_body(static_cast<const char*>(buffered.data()), take));
      buffer.consume(take);
      length -= take;
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
        return fail("reading the body (" + std::to_string(length) + " bytes short)", ec);
      }
      FLOTILLA_RETURN_IF_ERROR(on_body(chunk.data(), got));
      length -= got;
    }
    return Status::ok();
  }

  Status fail(const std::string& what, const beast::error_code& ec) {
    disconnect();
    const std::string reason = ec == beast::error::timeout
                                   ? "no progress for " + std::to_string(timeout.count()) + " ms"
                                   : ec.message();
    return unavailable(origin.text() + ": " + what + ": " + reason);
  }

  Status connect() {
    disconnect();
    tcp::resolver resolver(io);
    beast::error_code ec;
    const auto addresses = resolver.resolve(origin.host, std::to_string(origin.port), ec);
    if (ec) {
      return unavailable(origin.text() + ": cannot resolve '" + origin.host + "': " + ec.message());
    }
    if (origin.tls) {
      secure.emplace(io, tls);
    } else {
      plain.emplace(io);
    }
    ec = run([&](auto handler) { lowest().async_connect(addresses, handler); });
    if (ec) {
      return fail("cannot connect", ec);
    }
    lowest().socket().set_option(tcp::no_delay(true), ec);
    if (secure) {
      if (SSL_set_tlsext_host_name(secure->native_handle(), origin.host.c_str()) != 1) {
        disconnect();
        return unavailable(origin.text() + ": cannot set the TLS server name");
      }
      secure->set_verify_callback(asio::ssl::host_name_verification(origin.host));
      ec = run(
          [&](auto handler) { secure->async_handshake(asio::ssl::stream_base::client, handler); });
      if (ec) {
        return fail("TLS handshake failed", ec);
      }
    }
    return Status::ok();
  }
};

HttpConnection::HttpConnection(const Url& origin, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>(origin, timeout)) {}

HttpConnection::~HttpConnection() = default;

Status HttpConnection::get(const std::string& target, std::optional<ByteRange> range,
                           const std::function<Status(const ResponseHead&)>& on_head,
                           const std::function<Status(const char* data, size_t size)>& on_body) {
  Impl& c = *impl_;
  if (!c.connected()) {
    FLOTILLA_RETURN_IF_ERROR(c.connect());
  }
  bhttp::request<bhttp::empty_body> request{bhttp::verb::get, target, 11};
  const bool default_port = c.origin.port == (c.origin.tls ? 443 : 80);
  request.set(bhttp::field::host,
              default_port ? c.origin.host : c.origin.host + ":" + std::to_string(c.origin.port));
  request.set(bhttp::field::user_agent, "flotilla");
  if (range) {
    request.set(bhttp::field::range,
                "bytes=" + std::to_string(range->first) + "-" + std::to_string(range->last));
  }
  request.keep_alive(true);
  beast::error_code ec = c.on_stream(
      [&](auto& stream, auto handler) { bhttp::async_write(stream, request, handler); });
  if (ec) {
    return c.fail("sending the request", ec);
  }

  bhttp::response_parser<bhttp::buffer_body> parser;
  parser.body_limit(std::numeric_limits<uint64_t>::max());
  ec = c.on_stream([&](auto& stream, auto handler) {
    bhttp::async_read_header(stream, c.buffer, parser, handler);
  });
  if (ec) {
    return c.fail("reading the response", ec);
  }
  ResponseHead head;
  head.status = parser.get().result_int();
  if (parser.content_length()) {
    head.content_length = *parser.content_length();
  }
  head.content_range = std::string(parser.get()[bhttp::field::content_range]);
  if (Status accepted = on_head(head); !accepted.is_ok()) {
    c.disconnect();  // the body is not read: the connection cannot be reused
    return accepted;
  }
  if (!parser.is_done() && !parser.chunked() && head.content_length) {
    Status read = c.read_sized_body(*head.content_length, [&](const char* data, size_t size) {
      Status taken = on_body(data, size);
      if (!taken.is_ok()) {
        c.disconnect();
      }
      return taken;
    });
    if (read.is_ok() && !parser.keep_alive()) {
      c.disconnect();
    }
    return read;
  }
  while (!parser.is_done()) {
    parser.get().body().data = c.chunk.data();
    parser.get().body().size = c.chunk.size();
    ec = c.on_stream(
        [&](auto& stream, auto handler) { bhttp::async_read(stream, c.buffer, parser, handler); });
    if (ec == bhttp::error::need_buffer) {
      ec = {};
    }
    if (ec) {
      return c.fail("reading the body", ec);  // a truncated body ends here (partial_message)
    }
    const size_t got = c.chunk.size() - parser.get().body().size;
    if (got > 0) {
      if (Status taken = on_body(c.chunk.data(), got); !taken.is_ok()) {
        c.disconnect();
        return taken;
      }
    }
  }
  if (!parser.keep_alive()) {
    c.disconnect();
  }
  return Status::ok();
}

}  // namespace flotilla::store

// Blocking GETs on Boost.Beast: every step is an async operation with a deadline, run to
// completion on the connection's own io_context (Beast's synchronous calls have no timeouts).
#include "store/http_get.h"

#include <limits>
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
  beast::error_code run(Start start) {
    beast::error_code result;
    lowest().expires_after(timeout);
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    io.restart();
    io.run();
    return result;
  }

  template <typename Operation>
  beast::error_code on_stream(Operation operation) {
    if (secure) {
      return run([&](auto handler) { operation(*secure, handler); });
    }
    return run([&](auto handler) { operation(*plain, handler); });
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

// A blocking HTTP/1.x test client on a raw socket, for the http module's tests over real
// sockets on 127.0.0.1: every read has a receive timeout, so that no test can hang.
#pragma once

#include <array>
#include <cerrno>
#include <chrono>
#include <string>
#include <string_view>

#include <arpa/inet.h>
#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace flotilla::http {

namespace bhttp = boost::beast::http;
using namespace std::chrono_literals;

// Every wait in these tests is bounded by this; a pass never comes near it.
constexpr auto kWait = 10s;

struct Reply {
  bool complete = false;  // the whole message was parsed
  bool closed = false;    // the connection ended (FIN or RST) while reading it
  std::string error;      // a parse error, or a timeout
  int status = 0;
  std::string content_type;
  std::string transfer_encoding;
  std::string connection;
  std::string body;  // as much as arrived, chunk framing removed
};

// A blocking HTTP/1.x client on a raw socket, with a receive timeout so that no test can hang.
class RawClient {
 public:
  // `connect_now` false: the socket is made now and connected by connect() later (a test that
  // runs the server out of descriptors makes its clients' sockets first).
  explicit RawClient(uint16_t port, bool connect_now = true) : port_(port) {
    descriptor_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval timeout{static_cast<time_t>(kWait / 1s), 0};
    ::setsockopt(descriptor_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    ::setsockopt(descriptor_, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    if (connect_now) {
      connect();
    }
  }

  bool connect() {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port_);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ =
        ::connect(descriptor_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    return connected_;
  }
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return connected_; }
  int descriptor() const { return descriptor_; }

  bool send(std::string_view data) {
    while (!data.empty()) {
      const ssize_t sent = ::send(descriptor_, data.data(), data.size(), MSG_NOSIGNAL);
      if (sent <= 0) {
        return false;
      }
      data.remove_prefix(static_cast<size_t>(sent));
    }
    return true;
  }

  void close() {
    if (descriptor_ >= 0) {
      ::close(descriptor_);
      descriptor_ = -1;
    }
  }

  // Reads the next response on the connection: whole, or what came before the connection ended.
  Reply read_response(bool head_request = false) {
    Reply reply;
    bhttp::response_parser<bhttp::string_body> parser;
    parser.body_limit(1ull << 32);
    parser.skip(head_request);
    boost::beast::error_code ec;
    while (!parser.is_done()) {
      if (!buffered_.empty()) {
        const size_t used = parser.put(boost::asio::buffer(buffered_), ec);
        buffered_.erase(0, used);
        if (!ec && used > 0) {
          continue;
        }
        if (ec && ec != bhttp::error::need_more) {
          reply.error = ec.message();
          break;
        }
        ec = {};
      }
      std::array<char, 65536> data;
      const ssize_t got = ::recv(descriptor_, data.data(), data.size(), 0);
      if (got == 0 || (got < 0 && errno == ECONNRESET)) {
        reply.closed = true;
        parser.put_eof(ec);  // completes a body that runs to the close (HTTP/1.0)
        break;
      }
      if (got < 0) {
        reply.error = "receive timed out";
        break;
      }
      buffered_.append(data.data(), static_cast<size_t>(got));
    }
    reply.complete = parser.is_done();
    if (parser.is_header_done()) {
      const auto& message = parser.get();
      reply.status = static_cast<int>(message.result_int());
      reply.content_type = std::string(message[bhttp::field::content_type]);
      reply.transfer_encoding = std::string(message[bhttp::field::transfer_encoding]);
      reply.connection = std::string(message[bhttp::field::connection]);
      reply.body = message.body();
    }
    return reply;
  }

  // Reads raw bytes until `needle` has arrived; false on a timeout or a close before it.
  bool read_until(std::string_view needle) {
    while (buffered_.find(needle) == std::string::npos) {
      std::array<char, 65536> data;
      const ssize_t got = ::recv(descriptor_, data.data(), data.size(), 0);
      if (got <= 0) {
        return false;
      }
      buffered_.append(data.data(), static_cast<size_t>(got));
    }
    return true;
  }

  // Reads and drops bytes until the server closes the connection (true) or the receive
  // timeout passes (false).
  bool read_until_closed() {
    std::array<char, 65536> data;
    while (true) {
      const ssize_t got = ::recv(descriptor_, data.data(), data.size(), 0);
      if (got == 0 || (got < 0 && errno == ECONNRESET)) {
        return true;
      }
      if (got < 0) {
        return false;
      }
    }
  }

 private:
  uint16_t port_;
  int descriptor_ = -1;
  bool connected_ = false;
  std::string buffered_;  // received, not yet parsed (the start of the next response)
};

}  // namespace flotilla::http

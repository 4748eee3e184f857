// Boost.Asio/Beast names and socket helpers shared by the server and the client. Private to the
// http module.
#pragma once

#include <array>
#include <cerrno>
#include <chrono>
#include <string_view>
#include <utility>  // Boost 1.74 asio uses std::exchange without including it

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <sys/socket.h>
#include <sys/uio.h>

#include "http/body_recycler.h"

namespace flotilla::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
// Concrete executor types: no type-erased executor to copy on every operation.
using Socket = asio::basic_stream_socket<tcp, asio::io_context::executor_type>;
using Resolver = asio::ip::basic_resolver<tcp, asio::io_context::executor_type>;
using SteadyTimer = asio::basic_waitable_timer<std::chrono::steady_clock,
                                               asio::wait_traits<std::chrono::steady_clock>,
                                               asio::io_context::executor_type>;

// A Beast parse error: the bytes are not HTTP (as opposed to the stream ending early).
inline bool is_malformed_http(const beast::error_code& ec) {
  return ec.category() == bhttp::make_error_code(bhttp::error::end_of_stream).category() &&
         ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message;
}

// A failure of this process's own resources rather than of the peer: out of descriptors
// (per process or system-wide), socket buffers, memory or local ports.
inline bool is_local_resource_error(int error) {
  return error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM ||
         error == EADDRNOTAVAIL;
}
inline bool is_local_resource_error(const beast::error_code& ec) {
  return ec.category() == boost::system::system_category() && is_local_resource_error(ec.value());
}

// Sends `head` then `body` with one non-blocking sendmsg (no SIGPIPE). Returns the bytes sent
// (possibly fewer than both: the socket buffer is full), 0 when nothing could be sent now, or
// -errno on a failure.
inline ssize_t send_head_and_body(int descriptor, std::string_view head, std::string_view body) {
  std::array<iovec, 2> parts{iovec{const_cast<char*>(head.data()), head.size()},
                             iovec{const_cast<char*>(body.data()), body.size()}};
  msghdr message{};
  message.msg_iov = parts.data();
  message.msg_iovlen = body.empty() ? 1 : 2;
  const ssize_t sent = ::sendmsg(descriptor, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (sent >= 0) {
    return sent;
  }
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -errno;
}

// What is left of `head` and `body` after `done` bytes were sent.
inline std::array<asio::const_buffer, 2> unsent_part(std::string_view head, std::string_view body,
                                                     size_t done) {
  const size_t head_done = std::min(done, head.size());
  const size_t body_done = done - head_done;
  return {asio::buffer(head.data() + head_done, head.size() - head_done),
          asio::buffer(body.data() + body_done, body.size() - body_done)};
}

}  // namespace flotilla::http

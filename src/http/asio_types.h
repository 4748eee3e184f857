// Boost.Asio/Beast names shared by the server and the client. Private to the http module.
#pragma once

#include <chrono>
#include <utility>  // Boost 1.74 asio uses std::exchange without including it

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

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

}  // namespace flotilla::http

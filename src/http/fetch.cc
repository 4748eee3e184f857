// http::fetch: one blocking request on its own io_context, for tools and control loops.
#include <optional>

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
    case Method::kOther:
      break;
  }
  return bhttp::verb::get;
}

ClientResponse failed(UpstreamFailure failure, std::string error) {
  ClientResponse response;
  response.failure = failure;
  response.error = std::move(error);
  return response;
}

// fetch() itself, less the exceptions: Asio throws when the io_context it makes here cannot
// get its descriptors (epoll, eventfd, timerfd), or a resolver its thread.
ClientResponse fetch_or_throw(const std::string& host, uint16_t port, ClientRequest& request,
                              std::chrono::milliseconds timeout) {
  asio::io_context context;
  beast::tcp_stream stream(context);
  bhttp::request<bhttp::string_body> message(to_verb(request.method), request.target, 11);
  message.set(bhttp::field::host, host + ":" + std::to_string(port));
  for (const auto& [name, value] : request.headers) {
    message.set(name, value);
  }
  message.body() = std::move(request.body);
  message.prepare_payload();
  message.keep_alive(false);

  beast::flat_buffer buffer;
  bhttp::response_parser<bhttp::string_body> parser;
  parser.body_limit(64 * 1024 * 1024);
  std::optional<ClientResponse> outcome;

  beast::error_code resolve_error;
  tcp::resolver resolver(context);
  const auto addresses = resolver.resolve(host, std::to_string(port), resolve_error);
  if (resolve_error) {
    return failed(UpstreamFailure::kConnect,
                  "cannot resolve '" + host + "': " + resolve_error.message());
  }
  stream.expires_after(timeout);
  stream.async_connect(addresses, [&](beast::error_code ec, const tcp::endpoint&) {
    if (ec) {
      outcome = failed(
          ec == beast::error::timeout ? UpstreamFailure::kTimeout : UpstreamFailure::kConnect,
          "connect to " + host + ":" + std::to_string(port) + ": " +
              (is_local_resource_error(ec) ? "local: " : "") + ec.message());
      outcome->local_failure = is_local_resource_error(ec);
      return;
    }
    stream.socket().set_option(tcp::no_delay(true), ec);
    bhttp::async_write(stream, message, [&](beast::error_code write_ec, size_t) {
      if (write_ec) {
        outcome = failed(write_ec == beast::error::timeout ? UpstreamFailure::kTimeout
                                                           : UpstreamFailure::kClosedBeforeResponse,
                         "send: " + write_ec.message());
        return;
      }
      bhttp::async_read(stream, buffer, parser, [&](beast::error_code read_ec, size_t) {
        if (read_ec) {
          const UpstreamFailure failure =
              read_ec == beast::error::timeout ? UpstreamFailure::kTimeout
              : is_malformed_http(read_ec)     ? UpstreamFailure::kBadResponse
              : parser.got_some()              ? UpstreamFailure::kClosedDuringResponse
                                               : UpstreamFailure::kClosedBeforeResponse;
          outcome = failed(failure, "receive: " + read_ec.message());
          return;
        }
        ClientResponse response;
        auto& reply = parser.get();
        response.status = static_cast<int>(reply.result_int());
        for (const auto& field : reply) {
          if (field.name() == bhttp::field::content_type) {
            response.content_type = std::string(field.value());
          } else {
            response.headers.emplace_back(std::string(field.name_string()),
                                          std::string(field.value()));
          }
        }
        response.body = std::move(reply.body());
        outcome = std::move(response);
      });
    });
  });
  context.run();
  if (!outcome) {
    return failed(UpstreamFailure::kTimeout, "no response");
  }
  return std::move(*outcome);
}

}  // namespace

ClientResponse fetch(const std::string& host, uint16_t port, ClientRequest request,
                     std::chrono::milliseconds timeout) {
  // A probe must not take the process down when descriptors run out (a throw here used to
  // abort `flotilla up`): it fails like a connect that could not be made, marked as ours.
  try {
    return fetch_or_throw(host, port, request, timeout);
  } catch (const boost::system::system_error& e) {
    ClientResponse response =
        failed(UpstreamFailure::kConnect, "connect to " + host + ":" + std::to_string(port) +
                                              ": local: " + e.code().message());
    response.local_failure = is_local_resource_error(e.code()) || e.code().value() == EAGAIN;
    return response;
  } catch (const std::exception& e) {
    ClientResponse response =
        failed(UpstreamFailure::kConnect,
               "connect to " + host + ":" + std::to_string(port) + ": local: " + e.what());
    response.local_failure = true;
    return response;
  }
}

}  // namespace flotilla::http

// Beast parsers that write a message straight into our own Request or ClientResponse. Beast's
// stock parser first builds a `basic_fields` list (a heap block per header, a lookup per known
// field) that the server and the client then copied into `Headers` anyway: these readers keep
// Beast's parsing, limits and keep-alive rules and skip that list, which was about 3% of a
// proxied request's CPU. Private to the http module.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "http/asio_types.h"
#include "http/http.h"

namespace flotilla::http {

namespace detail {

// RFC 9112 §6.1 and §6.3: a body's length is known only when chunked is the final transfer
// coding, and chunked being the only one supported here, it must be the only one. Sets `ec`
// (bad_transfer_encoding, read as malformed HTTP) for any other Transfer-Encoding (identity,
// gzip, "chunked, identity", ...), for a second Transfer-Encoding field, and for one in an
// HTTP/1.0 message; with Content-Length, Beast has already refused the message.
inline void check_transfer_encoding(std::string_view value, int version, bool& seen,
                                    beast::error_code& ec) {
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) {
    value.remove_prefix(1);
  }
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) {
    value.remove_suffix(1);
  }
  if (seen || version < 11 || !equals_ignore_case(value, "chunked")) {
    ec = bhttp::error::bad_transfer_encoding;
  }
  seen = true;
}

}  // namespace detail

// Reads one request. Header, body and keep-alive limits are basic_parser's own.
class RequestReader final : public bhttp::basic_parser<true> {
 public:
  // `capture_headers`: keep every header in request().headers (else only the content type).
  explicit RequestReader(bool capture_headers) : capture_headers_(capture_headers) {
    request_.body = BodyRecycler::take();
  }

  Request& request() { return request_; }
  int version() const { return version_; }
  bool expects_continue() const { return expects_continue_; }

 private:
  static Method to_method(bhttp::verb verb) {
    switch (verb) {
      case bhttp::verb::get:
        return Method::kGet;
      case bhttp::verb::head:
        return Method::kHead;
      case bhttp::verb::post:
        return Method::kPost;
      case bhttp::verb::put:
        return Method::kPut;
      case bhttp::verb::delete_:
        return Method::kDelete;
      default:
        return Method::kOther;
    }
  }

  void on_request_impl(bhttp::verb method, beast::string_view, beast::string_view target,
                       int version, beast::error_code&) override {
    version_ = version;
    request_.method = to_method(method);
    request_.target.assign(target.data(), target.size());
  }
  void on_response_impl(int, beast::string_view, int, beast::error_code&) override {}

  void on_field_impl(bhttp::field name, beast::string_view name_string, beast::string_view value,
                     beast::error_code& ec) override {
    const std::string_view text(value.data(), value.size());
    if (name == bhttp::field::content_type && !content_type_seen_) {
      content_type_seen_ = true;
      request_.content_type.assign(text);
    } else if (name == bhttp::field::expect && equals_ignore_case(text, "100-continue")) {
      expects_continue_ = true;
    } else if (name == bhttp::field::transfer_encoding) {
      detail::check_transfer_encoding(text, version_, transfer_encoding_seen_, ec);
      if (ec) {
        return;
      }
    } else if (name == bhttp::field::unknown &&
               equals_ignore_case(std::string_view(name_string.data(), name_string.size()),
                                  "inference-header-content-length")) {
      request_.inference_header_length.assign(text);
    }
    if (capture_headers_) {
      request_.headers.emplace_back(std::string(name_string.data(), name_string.size()),
                                    std::string(text));
    }
  }

  void on_header_impl(beast::error_code&) override {}
  void on_body_init_impl(const boost::optional<uint64_t>& length, beast::error_code&) override {
    if (length) {
      // basic_parser has already refused a length over the body limit.
      request_.body.reserve(static_cast<size_t>(*length));
    }
  }
  size_t on_body_impl(beast::string_view body, beast::error_code&) override {
    request_.body.append(body.data(), body.size());
    return body.size();
  }
  void on_chunk_header_impl(uint64_t, beast::string_view, beast::error_code&) override {}
  size_t on_chunk_body_impl(uint64_t, beast::string_view body, beast::error_code& ec) override {
    return on_body_impl(body, ec);
  }
  void on_finish_impl(beast::error_code&) override {}

  const bool capture_headers_;
  Request request_;
  int version_ = 11;
  bool content_type_seen_ = false;
  bool expects_continue_ = false;
  bool transfer_encoding_seen_ = false;
};

// Reads one response into a ClientResponse: end-to-end headers only (hop-by-hop ones describe
// this connection, not the message), Content-Type apart. The body accumulates whole unless
// stream_pieces() was called once the head was read: from then on each piece of it is kept
// apart for take_piece(), and nothing accumulates.
class ResponseReader final : public bhttp::basic_parser<false> {
 public:
  ResponseReader() { response_.body = BodyRecycler::take(); }

  ClientResponse& response() { return response_; }
  void stream_pieces() { streaming_ = true; }
  // The body bytes parsed since the last call (streaming only).
  std::string take_piece() { return std::exchange(piece_, std::string()); }

 private:
  static bool is_hop_by_hop(bhttp::field name) {
    switch (name) {
      case bhttp::field::connection:
      case bhttp::field::keep_alive:
      case bhttp::field::proxy_connection:
      case bhttp::field::transfer_encoding:
      case bhttp::field::te:
      case bhttp::field::trailer:
      case bhttp::field::upgrade:
      case bhttp::field::content_length:
      case bhttp::field::host:
        return true;
      default:
        return false;
    }
  }

  void on_request_impl(bhttp::verb, beast::string_view, beast::string_view, int,
                       beast::error_code&) override {}
  void on_response_impl(int code, beast::string_view, int version, beast::error_code&) override {
    response_.status = code;
    version_ = version;
  }

  void on_field_impl(bhttp::field name, beast::string_view name_string, beast::string_view value,
                     beast::error_code& ec) override {
    if (name == bhttp::field::content_type) {
      response_.content_type.assign(value.data(), value.size());
    } else if (name == bhttp::field::transfer_encoding) {
      detail::check_transfer_encoding(std::string_view(value.data(), value.size()), version_,
                                      transfer_encoding_seen_, ec);
    } else if (!is_hop_by_hop(name)) {
      response_.headers.emplace_back(std::string(name_string.data(), name_string.size()),
                                     std::string(value.data(), value.size()));
    }
  }

  void on_header_impl(beast::error_code&) override {}
  void on_body_init_impl(const boost::optional<uint64_t>& length, beast::error_code&) override {
    if (length && !streaming_) {
      // basic_parser has already refused a length over the body limit.
      response_.body.reserve(static_cast<size_t>(*length));
    }
  }
  size_t on_body_impl(beast::string_view body, beast::error_code&) override {
    (streaming_ ? piece_ : response_.body).append(body.data(), body.size());
    return body.size();
  }
  void on_chunk_header_impl(uint64_t, beast::string_view, beast::error_code&) override {}
  size_t on_chunk_body_impl(uint64_t, beast::string_view body, beast::error_code& ec) override {
    return on_body_impl(body, ec);
  }
  void on_finish_impl(beast::error_code&) override {}

  ClientResponse response_;
  int version_ = 11;
  bool transfer_encoding_seen_ = false;
  bool streaming_ = false;
  std::string piece_;
};

}  // namespace flotilla::http

// One blocking HTTP/1.1 keep-alive connection (plain TCP or TLS) for the downloader, with an
// I/O timeout on every step. Private to the store module.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/common.h"
#include "store/store.h"

namespace flotilla::store {

struct ResponseHead {
  unsigned status = 0;
  std::optional<uint64_t> content_length;
  std::string content_range;  // "" when absent
};

// Byte range [first, last], both included (as in the Range header).
struct ByteRange {
  uint64_t first = 0;
  uint64_t last = 0;
};

class HttpConnection {
 public:
  // Connects lazily, on the first get(); reconnects after a failure or a server close.
  HttpConnection(const Url& origin, std::chrono::milliseconds timeout);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // GET `target` (optionally a byte range): `on_head` sees the status line and headers and may
  // refuse the response (its error is returned); `on_body` receives the body in chunks, in
  // order. kUnavailable for connection-level failures (refused, reset, timeout, truncated),
  // naming the URL.
  Status get(const std::string& target, std::optional<ByteRange> range,
             const std::function<Status(const ResponseHead&)>& on_head,
             const std::function<Status(const char* data, size_t size)>& on_body);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flotilla::store

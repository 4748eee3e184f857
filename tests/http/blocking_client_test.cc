// The blocking client (BlockingConnection, fetch) against real servers on 127.0.0.1: byte
// ranges, a body streamed in pieces (chunked and sized), the per-step timeout against the
// whole-exchange deadline on a server that stalls or drips, and keep-alive reuse.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fakes/http/running_server.h"
#include "http/http.h"

namespace flotilla::http {
namespace {

using namespace std::chrono_literals;

// A listener whose one connection reads the request head, then writes `pieces` one after the
// other with `gap` between them, then holds the connection until the test ends: a server that
// stalls (one piece) or drips (many).
class ScriptedPeer {
 public:
  ScriptedPeer(std::vector<std::string> pieces, std::chrono::milliseconds gap)
      : pieces_(std::move(pieces)), gap_(gap) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    ::listen(listener_, 4);
    socklen_t length = sizeof(address);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~ScriptedPeer() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
  }
  uint16_t port() const { return port_; }

 private:
  // Waits up to 20 ms for `descriptor` to be readable; false when the test is ending.
  bool wait_readable(int descriptor) {
    while (!stop_) {
      pollfd polled{descriptor, POLLIN, 0};
      if (::poll(&polled, 1, 20) == 1) {
        return true;
      }
    }
    return false;
  }

  void serve() {
    if (!wait_readable(listener_)) {
      return;
    }
    const int descriptor = ::accept(listener_, nullptr, nullptr);
    std::string received;
    while (received.find("\r\n\r\n") == std::string::npos && wait_readable(descriptor)) {
      char data[1024];
      const ssize_t got = ::recv(descriptor, data, sizeof(data), 0);
      if (got <= 0) {
        break;
      }
      received.append(data, static_cast<size_t>(got));
    }
    for (const std::string& piece : pieces_) {
      if (stop_) {
        break;
      }
      ::send(descriptor, piece.data(), piece.size(), MSG_NOSIGNAL);
      // The peer's pace, not a wait of the test's: what the client's timeouts are measured on.
      std::this_thread::sleep_for(gap_);
    }
    while (wait_readable(descriptor)) {
      char data[1024];
      if (::recv(descriptor, data, sizeof(data), 0) <= 0) {
        break;
      }
    }
    ::close(descriptor);
  }

  std::vector<std::string> pieces_;
  std::chrono::milliseconds gap_;
  int listener_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

Status accept_any(const ResponseHead&) {
  return Status::ok();
}

const std::string kContent = [] {
  std::string content;
  for (int i = 0; i < 3'000'000; ++i) {
    content.push_back(static_cast<char>('a' + i % 26));
  }
  return content;
}();

// Serves kContent at any path, honouring "Range: bytes=A-B" with a 206.
void serve_content(Request&& request, Responder&& responder) {
  const std::string_view range = find_header(request.headers, "Range");
  if (range.empty()) {
    responder.send(Response{200, "application/octet-stream", kContent, {}});
    return;
  }
  unsigned long long first = 0, last = 0;
  if (std::sscanf(std::string(range).c_str(), "bytes=%llu-%llu", &first, &last) != 2) {
    responder.send(Response{400, "text/plain", "bad range", {}});
    return;
  }
  Response response{206, "application/octet-stream", kContent.substr(first, last - first + 1), {}};
  response.headers.emplace_back("Content-Range", "bytes " + std::to_string(first) + "-" +
                                                     std::to_string(last) + "/" +
                                                     std::to_string(kContent.size()));
  responder.send(std::move(response));
}

TEST(BlockingConnectionTest, GetsAByteRangeAndTheWholeBodyInPiecesOnOneConnection) {
  RunningServer server(serve_content);
  BlockingConnection connection(Origin{"127.0.0.1", server.port(), false}, 5s);

  ResponseHead seen;
  std::string body;
  const auto collect = [&body](const char* data, size_t size) {
    body.append(data, size);
    return Status::ok();
  };
  const auto keep_head = [&seen](const ResponseHead& head) {
    seen = head;
    return Status::ok();
  };
  ASSERT_TRUE(connection.get("/blob", ByteRange{10, 19}, keep_head, collect).is_ok());
  EXPECT_EQ(seen.status, 206);
  EXPECT_EQ(seen.content_type, "application/octet-stream");
  EXPECT_EQ(find_header(seen.headers, "Content-Range"), "bytes 10-19/3000000");
  EXPECT_EQ(body, kContent.substr(10, 10));

  // The whole body, larger than the client's read buffer: several pieces, in order.
  body.clear();
  int pieces = 0;
  ASSERT_TRUE(connection
                  .get("/blob", std::nullopt, keep_head,
                       [&](const char* data, size_t size) {
                         ++pieces;
                         return collect(data, size);
                       })
                  .is_ok());
  EXPECT_EQ(seen.status, 200);
  ASSERT_EQ(seen.content_length, kContent.size());
  EXPECT_TRUE(body == kContent) << "the pieces came out of order or short";
  EXPECT_GT(pieces, 1);
  EXPECT_EQ(server.open_connections(), 1u) << "keep-alive: both GETs on one connection";
  EXPECT_EQ(connection.failure(), UpstreamFailure::kNone);
}

TEST(BlockingConnectionTest, StreamsAChunkedBodyAsItArrives) {
  RunningServer server([](Request&&, Responder&& responder) {
    responder.start_stream(200, "text/event-stream");
    for (int i = 0; i < 50; ++i) {
      responder.write("data: " + std::to_string(i) + "\n\n");
    }
    responder.finish();
  });
  BlockingConnection connection(Origin{"127.0.0.1", server.port(), false}, 5s);
  std::string body;
  std::optional<uint64_t> length = 1;
  ASSERT_TRUE(connection
                  .get(
                      "/events", std::nullopt,
                      [&](const ResponseHead& head) {
                        length = head.content_length;
                        return Status::ok();
                      },
                      [&](const char* data, size_t size) {
                        body.append(data, size);
                        return Status::ok();
                      })
                  .is_ok());
  EXPECT_FALSE(length.has_value()) << "chunked: no Content-Length";
  std::string expected;
  for (int i = 0; i < 50; ++i) {
    expected += "data: " + std::to_string(i) + "\n\n";
  }
  EXPECT_EQ(body, expected);
}

// A watch stream: the first event comes through while the server holds the stream open, and
// cancel() from another thread ends the blocked read at once, not at the io timeout.
TEST(BlockingConnectionTest, PassesOnEachPieceAsItArrivesAndCancelEndsABlockedRead) {
  ScriptedPeer peer({"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "11\r\n{\"type\":\"ADDED\"}\n\r\n"},
                    0ms);
  BlockingConnection connection(Origin{"127.0.0.1", peer.port(), false}, 30s);
  std::string body;
  std::thread canceller;
  const auto start = std::chrono::steady_clock::now();
  const Status status =
      connection.get("/watch", std::nullopt, accept_any, [&](const char* data, size_t size) {
        body.append(data, size);
        if (!canceller.joinable()) {
          canceller = std::thread([&connection] { connection.cancel(); });
        }
        return Status::ok();
      });
  canceller.join();
  EXPECT_EQ(body, "{\"type\":\"ADDED\"}\n");
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);  // far below the 30 s io timeout
  EXPECT_FALSE(
      connection
          .get("/again", std::nullopt, accept_any, [](const char*, size_t) { return Status::ok(); })
          .is_ok())
      << "a cancelled connection stays cancelled";
}

TEST(BlockingConnectionTest, ACallbackStopsTheBodyAndTheNextSendReconnects) {
  RunningServer server(serve_content);
  BlockingConnection connection(Origin{"127.0.0.1", server.port(), false}, 5s);
  size_t got = 0;
  const Status stopped =
      connection.get("/blob", std::nullopt, accept_any, [&](const char*, size_t size) {
        got += size;
        return invalid_argument("enough");
      });
  EXPECT_EQ(stopped.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(stopped.message(), "enough");
  EXPECT_EQ(connection.failure(), UpstreamFailure::kNone) << "the caller's choice, no transport";
  EXPECT_LT(got, kContent.size());

  std::string body;
  ASSERT_TRUE(connection
                  .get("/blob", ByteRange{0, 2}, accept_any,
                       [&](const char* data, size_t size) {
                         body.append(data, size);
                         return Status::ok();
                       })
                  .is_ok());
  EXPECT_EQ(body, "abc");
}

TEST(BlockingConnectionTest, SendsMethodHeadersAndBody) {
  RunningServer server([](Request&& request, Responder&& responder) {
    responder.send(Response{200,
                            "text/plain",
                            std::string(method_name(request.method)) + " " + request.target + " " +
                                std::string(find_header(request.headers, "X-Test")) + " " +
                                request.body,
                            {}});
  });
  BlockingConnection connection(Origin{"127.0.0.1", server.port(), false}, 5s);
  ClientRequest request;
  request.method = Method::kPut;
  request.target = "/thing?x=1";
  request.headers.emplace_back("X-Test", "yes");
  request.body = "payload";
  std::string body;
  ASSERT_TRUE(connection
                  .send(std::move(request), accept_any,
                        [&](const char* data, size_t size) {
                          body.append(data, size);
                          return Status::ok();
                        })
                  .is_ok());
  EXPECT_EQ(body, "PUT /thing?x=1 yes payload");

  // A HEAD response has a Content-Length and no body: nothing is waited for.
  ClientRequest head;
  head.method = Method::kHead;
  head.target = "/";
  bool body_seen = false;
  ASSERT_TRUE(connection
                  .send(std::move(head), accept_any,
                        [&](const char*, size_t) {
                          body_seen = true;
                          return Status::ok();
                        })
                  .is_ok());
  EXPECT_FALSE(body_seen);
}

TEST(BlockingConnectionTest, AStalledServerFailsTheStepAfterTheIoTimeout) {
  // The head, then nothing: the body read makes no progress.
  ScriptedPeer peer({"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"}, 0ms);
  BlockingConnection connection(Origin{"127.0.0.1", peer.port(), false}, 150ms);
  std::string body;
  const auto start = std::chrono::steady_clock::now();
  const Status status =
      connection.get("/slow", std::nullopt, accept_any, [&](const char* data, size_t size) {
        body.append(data, size);
        return Status::ok();
      });
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("no progress for 150 ms"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("http://127.0.0.1:" + std::to_string(peer.port()) + "/slow"),
            std::string::npos)
      << status.message();
  EXPECT_EQ(connection.failure(), UpstreamFailure::kTimeout);
  EXPECT_EQ(body, "abc");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(BlockingConnectionTest, ADripFeedingServerKeepsTheIoTimeoutButNotTheDeadline) {
  std::vector<std::string> pieces = {"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n"};
  for (int i = 0; i < 8; ++i) {
    pieces.emplace_back("x");
  }
  // Each byte comes 60 ms after the last: within a 400 ms io_timeout, so it completes...
  {
    ScriptedPeer peer(pieces, 60ms);
    BlockingConnection connection(Origin{"127.0.0.1", peer.port(), false}, 400ms);
    std::string body;
    const Status status =
        connection.get("/drip", std::nullopt, accept_any, [&](const char* data, size_t size) {
          body.append(data, size);
          return Status::ok();
        });
    EXPECT_TRUE(status.is_ok()) << status.message();
    EXPECT_EQ(body, "xxxxxxxx");
  }
  // ...but a deadline for the whole exchange (about 480 ms of bytes) cuts it.
  {
    ScriptedPeer peer(pieces, 60ms);
    BlockingConnection connection(Origin{"127.0.0.1", peer.port(), false}, 400ms);
    ClientRequest request;
    request.method = Method::kGet;
    request.target = "/drip";
    std::string body;
    const Status status = connection.send(
        std::move(request), accept_any,
        [&](const char* data, size_t size) {
          body.append(data, size);
          return Status::ok();
        },
        real_clock().now() + 200ms);
    EXPECT_EQ(status.code(), StatusCode::kUnavailable);
    EXPECT_NE(status.message().find("past the request's deadline"), std::string::npos)
        << status.message();
    EXPECT_EQ(connection.failure(), UpstreamFailure::kTimeout);
    EXPECT_LT(body.size(), 8u);
  }
}

// A port just freed: nothing listens there.
uint16_t free_port() {
  const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(probe, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(probe, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(probe);
  return ntohs(address.sin_port);
}

TEST(BlockingConnectionTest, ConnectAndResolveFailuresSayWhere) {
  const uint16_t port = free_port();
  BlockingConnection refused(Origin{"127.0.0.1", port, false}, 2s);
  const Status status =
      refused.get("/x", std::nullopt, accept_any, [](const char*, size_t) { return Status::ok(); });
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("127.0.0.1:" + std::to_string(port) + "/x: cannot connect"),
            std::string::npos)
      << status.message();
  EXPECT_EQ(refused.failure(), UpstreamFailure::kConnect);
  EXPECT_FALSE(refused.local_failure());

  BlockingConnection unknown(Origin{"no-such-host.invalid", 80, false}, 2s);
  const Status unresolved =
      unknown.get("/x", std::nullopt, accept_any, [](const char*, size_t) { return Status::ok(); });
  EXPECT_NE(unresolved.message().find("cannot resolve 'no-such-host.invalid'"), std::string::npos)
      << unresolved.message();
  EXPECT_EQ(unknown.failure(), UpstreamFailure::kConnect);
}

TEST(FetchTest, ReturnsTheWholeResponseAndClassifiesATimeout) {
  RunningServer server(serve_content);
  ClientRequest request;
  request.method = Method::kGet;
  request.target = "/blob";
  const ClientResponse whole = fetch("127.0.0.1", server.port(), std::move(request), 5s);
  EXPECT_EQ(whole.failure, UpstreamFailure::kNone) << whole.error;
  EXPECT_EQ(whole.status, 200);
  EXPECT_EQ(whole.content_type, "application/octet-stream");
  EXPECT_TRUE(whole.body == kContent);

  ScriptedPeer silent({}, 0ms);
  ClientRequest probe;
  probe.method = Method::kGet;
  probe.target = "/ready";
  const auto start = std::chrono::steady_clock::now();
  const ClientResponse timed_out = fetch("127.0.0.1", silent.port(), std::move(probe), 150ms);
  EXPECT_EQ(timed_out.failure, UpstreamFailure::kTimeout) << timed_out.error;
  EXPECT_EQ(timed_out.status, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// fetch_each: every origin's answer in the origins' order, and one deadline for the whole call.
TEST(FetchEachTest, AnswersInOrderAndAHungOriginCostsTheDeadlineOnce) {
  auto named = [](std::string name) {
    return [name](Request&& request, Responder&& responder) {
      responder.send(Response{200, "text/plain", name + request.target, {}});
    };
  };
  RunningServer first(named("first"));
  RunningServer second(named("second"));
  ScriptedPeer hung({}, 0ms);  // takes the connection, never answers
  ScriptedPeer also_hung({}, 0ms);
  const std::vector<std::pair<std::string, uint16_t>> origins = {{"127.0.0.1", first.port()},
                                                                 {"127.0.0.1", hung.port()},
                                                                 {"127.0.0.1", free_port()},
                                                                 {"127.0.0.1", second.port()},
                                                                 {"127.0.0.1", also_hung.port()}};

  const std::vector<ClientResponse> together = fetch_each(origins, "/metrics", 500ms);
  ASSERT_EQ(together.size(), origins.size());
  EXPECT_EQ(together[0].body, "first/metrics");
  EXPECT_EQ(together[1].failure, UpstreamFailure::kTimeout) << together[1].error;
  EXPECT_EQ(together[2].failure, UpstreamFailure::kConnect) << together[2].error;
  EXPECT_EQ(together[3].body, "second/metrics");
  EXPECT_EQ(together[4].failure, UpstreamFailure::kTimeout) << together[4].error;

  // One at a time: the first hung origin spends the deadline, and every origin after it is
  // answered at once as past it (not each given a deadline of its own).
  const std::vector<ClientResponse> in_turn = fetch_each(origins, "/metrics", 500ms, 1);
  ASSERT_EQ(in_turn.size(), origins.size());
  EXPECT_EQ(in_turn[0].body, "first/metrics");
  EXPECT_EQ(in_turn[1].failure, UpstreamFailure::kTimeout);
  for (size_t i = 2; i < in_turn.size(); ++i) {
    EXPECT_EQ(in_turn[i].failure, UpstreamFailure::kTimeout) << i;
    EXPECT_NE(in_turn[i].error.find("the deadline passed before this fetch's turn"),
              std::string::npos)
        << i << ": " << in_turn[i].error;
  }
  EXPECT_TRUE(fetch_each({}, "/metrics", 500ms).empty());
}

}  // namespace
}  // namespace flotilla::http

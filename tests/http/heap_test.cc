// Heap allocations of the server's request path on a warm keep-alive connection (issue #3: no
// per-request heap churn): counted on the server's worker thread by replacing the global
// operator new, which is why this test is a binary of its own. The bound is what the path costs
// now (the exchange, and the content type strings past std::string's own buffer); a change that
// allocates per request again (a parser, a header list, a body) goes over it.
#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http/http.h"

namespace {

std::atomic<bool> counting{false};
std::atomic<uint64_t> allocations{0};
thread_local bool on_server_worker = false;

void* allocate(std::size_t size) {
  if (counting.load(std::memory_order_relaxed) && on_server_worker) {
    allocations.fetch_add(1, std::memory_order_relaxed);
  }
  if (void* block = std::malloc(size == 0 ? 1 : size)) {
    return block;
  }
  throw std::bad_alloc();
}

}  // namespace

void* operator new(std::size_t size) {
  return allocate(size);
}
void* operator new[](std::size_t size) {
  return allocate(size);
}
void operator delete(void* block) noexcept {
  std::free(block);
}
void operator delete[](void* block) noexcept {
  std::free(block);
}
void operator delete(void* block, std::size_t) noexcept {
  std::free(block);
}
void operator delete[](void* block, std::size_t) noexcept {
  std::free(block);
}

namespace flotilla::http {
namespace {

// A keep-alive client on a blocking socket: sends a request, reads until the response's end.
class KeepAliveClient {
 public:
  explicit KeepAliveClient(uint16_t port) {
    descriptor_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval timeout{10, 0};  // no test can hang on a read
    ::setsockopt(descriptor_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ =
        ::connect(descriptor_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~KeepAliveClient() { ::close(descriptor_); }
  bool connected() const { return connected_; }

  // The response's body ends the exchange: it is the request body echoed, ending with '}'.
  bool exchange(const std::string& request) {
    if (::send(descriptor_, request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size())) {
      return false;
    }
    std::string received;
    char data[4096];
    while (received.empty() || received.back() != '}') {
      const ssize_t got = ::recv(descriptor_, data, sizeof(data), 0);
      if (got <= 0) {
        return false;
      }
      received.append(data, static_cast<size_t>(got));
    }
    return received.starts_with("HTTP/1.1 200");
  }

 private:
  int descriptor_ = -1;
  bool connected_ = false;
};

TEST(ServerHeapTest, AWarmKeepAliveRequestCostsAtMostThreeAllocations) {
  ServerOptions options;
  options.workers = 1;
  auto server = Server::create(options, [](Request&& request, Responder&& responder) {
    on_server_worker = true;  // the handler runs on the (only) worker thread
    responder.send(Response{200, "application/json", std::move(request.body), {}});
  });
  ASSERT_TRUE(server.is_ok()) << server.status().message();
  std::unique_ptr<Server> running = std::move(server).value();
  std::thread runner([&running] { running->run(); });
  struct StopOnExit {
    Server& server;
    std::thread& runner;
    ~StopOnExit() {
      server.drain(std::chrono::seconds(5));
      runner.join();
    }
  } stop{*running, runner};
  KeepAliveClient client(running->port());
  ASSERT_TRUE(client.connected());
  const std::string body = R"({"instances": [[0.1, 0.2, 0.3, 0.4]], "padding": "past the SSO"})";
  const std::string request =
      "POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  for (int i = 0; i < 50; ++i) {  // warm: buffers, caches, the event loop's recycled handlers
    ASSERT_TRUE(client.exchange(request));
  }
  constexpr int kRequests = 500;
  counting = true;
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(client.exchange(request));
  }
  counting = false;
  const double per_request = static_cast<double>(allocations.load()) / kRequests;
  // The exchange (make_shared), the request's content type and the response's: 3. A body
  // string or a parser's fields allocated per request would each add one.
  EXPECT_LE(per_request, 3.05);
  EXPECT_GT(per_request, 0.5);  // the counting sees the worker at all
  RecordProperty("allocations_per_request", std::to_string(per_request));
}

}  // namespace
}  // namespace flotilla::http

// Streamed responses (Responder::start_stream / write / finish) over real sockets on 127.0.0.1:
// chunk order across threads, keep-alive and pipelining after a stream, a client leaving
// mid-stream, a Responder dropped mid-stream, a slow reader over the cap, a stalled one at the
// body timeout, drain with an open stream, HTTP/1.0 and HEAD.
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http/http.h"
#include "http/raw_client.h"

namespace flotilla::http {
namespace {

namespace bhttp = boost::beast::http;
using namespace std::chrono_literals;

// A one-shot event another thread sets.
class Flag {
 public:
  void set() {
    std::lock_guard lock(mutex_);
    set_ = true;
    changed_.notify_all();
  }
  bool is_set() {
    std::lock_guard lock(mutex_);
    return set_;
  }
  bool wait(std::chrono::milliseconds timeout = kWait) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [this] { return set_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool set_ = false;
};

// Hands a Responder from the handler (a worker thread) to the test's thread.
class ResponderSlot {
 public:
  void put(Responder&& responder) {
    std::lock_guard lock(mutex_);
    responder_.emplace(std::move(responder));
    changed_.notify_all();
  }
  std::optional<Responder> take() {
    std::unique_lock lock(mutex_);
    if (!changed_.wait_for(lock, kWait, [this] { return responder_.has_value(); })) {
      return std::nullopt;
    }
    std::optional<Responder> taken(std::move(*responder_));
    responder_.reset();
    return taken;
  }
  void clear() {
    std::lock_guard lock(mutex_);
    responder_.reset();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<Responder> responder_;
};

std::string event(int index) {
  return "data: {\"index\":" + std::to_string(index) + "}\n\n";
}

std::string events(int count) {
  std::string all;
  for (int i = 0; i < count; ++i) {
    all += event(i);
  }
  return all + "data: [DONE]\n\n";
}

constexpr std::string_view kGet = "GET /v1/completions HTTP/1.1\r\nHost: test\r\n\r\n";

class StreamingTest : public ::testing::Test {
 protected:
  void start(ServerOptions options = {}) {
    options.workers = 2;
    auto server = Server::create(options, [this](Request&& request, Responder&& responder) {
      handler_(std::move(request), std::move(responder));
    });
    ASSERT_TRUE(server.is_ok()) << server.status().message();
    server_ = std::move(server).value();
    runner_ = std::thread([this] { run_result_.set_value(server_->run()); });
  }

  // Stops the server unless the test did, after the producers are done and the Responders the
  // test held are gone (a Responder must not outlive its server).
  void TearDown() override {
    join_producers();
    slot_.clear();
    if (server_) {
      server_->drain(5s);
      runner_.join();
    }
  }

  // Waits for the producers spawned so far (a test whose producers use its locals calls it).
  void join_producers() {
    std::lock_guard lock(producers_mutex_);
    for (auto& producer : producers_) {
      if (producer.joinable()) {
        producer.join();
      }
    }
  }

  // Runs `produce` on a thread of its own, joined by TearDown.
  void spawn(std::function<void()> produce) {
    std::lock_guard lock(producers_mutex_);
    producers_.emplace_back(std::move(produce));
  }

  // A handler that streams `count` events and [DONE] from another thread.
  void stream_events_from_another_thread(int count) {
    handler_ = [this, count](Request&& request, Responder&& responder) {
      if (request.target == "/plain") {
        responder.send(Response{200, "text/plain", "plain", {}});
        return;
      }
      responder.start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
      auto shared = std::make_shared<Responder>(std::move(responder));
      spawn([shared, count] {
        for (int i = 0; i < count; ++i) {
          shared->write(event(i));
        }
        shared->write("data: [DONE]\n\n");
        shared->finish();
      });
    };
  }

  bool wait_for_no_connections() {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (server_->open_connections() != 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        return false;
      }
      std::this_thread::sleep_for(5ms);
    }
    return true;
  }

  Handler handler_;
  std::unique_ptr<Server> server_;
  std::thread runner_;
  std::promise<bool> run_result_;
  std::mutex producers_mutex_;
  std::vector<std::thread> producers_;
  ResponderSlot slot_;
};

TEST_F(StreamingTest, ChunksWrittenFromAnotherThreadArriveCompleteAndInOrder) {
  stream_events_from_another_thread(2000);
  start();
  RawClient client(server_->port());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.send(kGet));
  const Reply reply = client.read_response();
  ASSERT_TRUE(reply.complete) << reply.error;
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.content_type, "text/event-stream");
  EXPECT_EQ(reply.transfer_encoding, "chunked");
  EXPECT_EQ(reply.connection, "");
  EXPECT_EQ(reply.body, events(2000));
}

TEST_F(StreamingTest, TwoStreamsInARowOnOneKeepAliveConnection) {
  stream_events_from_another_thread(50);
  start();
  RawClient client(server_->port());
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(client.send(kGet));
    const Reply reply = client.read_response();
    ASSERT_TRUE(reply.complete) << "round " << round << ": " << reply.error;
    EXPECT_FALSE(reply.closed);
    EXPECT_EQ(reply.body, events(50));
  }
  EXPECT_EQ(server_->open_connections(), 1u);
}

TEST_F(StreamingTest, PlainResponseAfterAStreamOnTheSameConnection) {
  stream_events_from_another_thread(10);
  start();
  RawClient client(server_->port());
  ASSERT_TRUE(client.send(kGet));
  const Reply streamed = client.read_response();
  ASSERT_TRUE(streamed.complete) << streamed.error;
  EXPECT_EQ(streamed.body, events(10));
  ASSERT_TRUE(client.send("GET /plain HTTP/1.1\r\nHost: test\r\n\r\n"));
  const Reply plain = client.read_response();
  ASSERT_TRUE(plain.complete) << plain.error;
  EXPECT_EQ(plain.body, "plain");
  EXPECT_EQ(plain.transfer_encoding, "");
}

TEST_F(StreamingTest, PipelinedRequestBehindAStreamIsServedAfterIt) {
  stream_events_from_another_thread(20);
  start();
  RawClient client(server_->port());
  ASSERT_TRUE(client.send(std::string(kGet) + "GET /plain HTTP/1.1\r\nHost: test\r\n\r\n"));
  const Reply streamed = client.read_response();
  ASSERT_TRUE(streamed.complete) << streamed.error;
  EXPECT_EQ(streamed.body, events(20));
  const Reply plain = client.read_response();
  ASSERT_TRUE(plain.complete) << plain.error;
  EXPECT_EQ(plain.body, "plain");
}

TEST_F(StreamingTest, ClientLeavingMidStreamRunsOnClientGoneAndLaterWritesAreDropped) {
  Flag gone;
  handler_ = [&](Request&& request, Responder&& responder) {
    if (request.target == "/plain") {
      responder.send(Response{200, "text/plain", "still here", {}});
      return;
    }
    responder.on_client_gone([&gone] { gone.set(); });
    responder.start_stream(200, "text/event-stream");
    responder.write("data: first\n\n");
    slot_.put(std::move(responder));
  };
  start();
  {
    RawClient client(server_->port());
    ASSERT_TRUE(client.send(kGet));
    ASSERT_TRUE(client.read_until("data: first\n\n"));
  }
  ASSERT_TRUE(gone.wait());
  std::optional<Responder> responder = slot_.take();
  ASSERT_TRUE(responder.has_value());
  for (int i = 0; i < 10'000; ++i) {
    responder->write(event(i));
  }
  responder->finish();
  responder.reset();
  EXPECT_TRUE(wait_for_no_connections());

  // The server still serves.
  RawClient client(server_->port());
  ASSERT_TRUE(client.send("GET /plain HTTP/1.1\r\nHost: test\r\n\r\n"));
  EXPECT_EQ(client.read_response().body, "still here");
}

TEST_F(StreamingTest, ResponderDroppedMidStreamClosesTheConnection) {
  handler_ = [this](Request&&, Responder&& responder) {
    responder.start_stream(200, "text/event-stream");
    responder.write("data: partial\n\n");
    auto shared = std::make_shared<Responder>(std::move(responder));
    // Dropped on another thread, without finish().
    spawn([shared = std::move(shared)]() mutable { shared.reset(); });
  };
  start();
  RawClient client(server_->port());
  ASSERT_TRUE(client.send(kGet));
  const Reply reply = client.read_response();
  EXPECT_FALSE(reply.complete);
  EXPECT_TRUE(reply.closed) << reply.error;
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, "data: partial\n\n");
}

TEST_F(StreamingTest, SlowReaderOverTheCapIsDisconnected) {
  Flag gone;
  std::atomic<size_t> offered{0};
  handler_ = [&](Request&&, Responder&& responder) {
    responder.on_client_gone([&gone] { gone.set(); });
    responder.start_stream(200, "application/octet-stream");
    auto shared = std::make_shared<Responder>(std::move(responder));
    spawn([shared, &gone, &offered] {
      const std::string chunk(64 * 1024, 'x');
      // Far more than the socket buffers and the cap hold; stops once the server gives up.
      constexpr size_t kMaxBytes = size_t{1} << 30;
      while (!gone.is_set() && offered.load() < kMaxBytes) {
        shared->write(chunk);
        offered += chunk.size();
      }
      shared->finish();
    });
  };
  ServerOptions options;
  options.max_stream_buffer_bytes = 256 * 1024;
  start(options);
  RawClient client(server_->port());
  ASSERT_TRUE(client.send(kGet));
  // The client reads nothing until the server has given up on it.
  ASSERT_TRUE(gone.wait());
  EXPECT_LT(offered.load(), size_t{1} << 30);
  EXPECT_TRUE(client.read_until_closed());
  EXPECT_TRUE(wait_for_no_connections());
  join_producers();  // it uses this test's locals
}

TEST_F(StreamingTest, StalledReaderIsCutAtTheBodyTimeout) {
  Flag gone;
  handler_ = [&](Request&&, Responder&& responder) {
    responder.on_client_gone([&gone] { gone.set(); });
    responder.start_stream(200, "application/octet-stream");
    // More than the loopback socket buffers hold, less than the cap: the write stalls.
    const std::string chunk(1024 * 1024, 'x');
    for (int i = 0; i < 32; ++i) {
      responder.write(chunk);
    }
    slot_.put(std::move(responder));
  };
  ServerOptions options;
  options.max_stream_buffer_bytes = 64 * 1024 * 1024;
  options.body_timeout = std::chrono::milliseconds(200);
  start(options);
  RawClient client(server_->port());
  ASSERT_TRUE(client.send(kGet));
  ASSERT_TRUE(gone.wait());
  EXPECT_TRUE(client.read_until_closed());
  EXPECT_TRUE(wait_for_no_connections());
}

TEST_F(StreamingTest, DrainWithAnOpenStreamEndsAtTheDrainTimeout) {
  handler_ = [this](Request&&, Responder&& responder) {
    responder.start_stream(200, "text/event-stream");
    responder.write("data: first\n\n");
    slot_.put(std::move(responder));
  };
  start();
  RawClient client(server_->port());
  ASSERT_TRUE(client.send(kGet));
  ASSERT_TRUE(client.read_until("data: first\n\n"));
  std::optional<Responder> responder = slot_.take();
  ASSERT_TRUE(responder.has_value());

  const auto drain_start = std::chrono::steady_clock::now();
  server_->drain(300ms);
  auto result = run_result_.get_future();
  ASSERT_EQ(result.wait_for(kWait), std::future_status::ready);
  EXPECT_FALSE(result.get());  // the stream never finished
  EXPECT_GE(std::chrono::steady_clock::now() - drain_start, 250ms);
  // After the stop, the producer's calls are dropped.
  responder->write("data: late\n\n");
  responder->finish();
  responder.reset();
  runner_.join();
  server_.reset();
  EXPECT_TRUE(client.read_until_closed());
}

TEST_F(StreamingTest, DrainWaitsForAnOpenStreamToFinish) {
  handler_ = [this](Request&&, Responder&& responder) {
    responder.start_stream(200, "text/event-stream");
    responder.write(event(0));
    slot_.put(std::move(responder));
  };
  start();
  RawClient client(server_->port());
  ASSERT_TRUE(client.send(kGet));
  ASSERT_TRUE(client.read_until(event(0)));
  std::optional<Responder> responder = slot_.take();
  ASSERT_TRUE(responder.has_value());

  server_->drain(kWait);
  auto result = run_result_.get_future();
  // The stream keeps the server running: still serving, not stopped.
  EXPECT_EQ(result.wait_for(50ms), std::future_status::timeout);
  responder->write(event(1));
  responder->write("data: [DONE]\n\n");
  responder->finish();
  const Reply reply = client.read_response();
  ASSERT_TRUE(reply.complete) << reply.error;
  EXPECT_EQ(reply.body, event(0) + event(1) + "data: [DONE]\n\n");
  EXPECT_TRUE(client.read_until_closed());  // draining: no next request on this connection
  ASSERT_EQ(result.wait_for(kWait), std::future_status::ready);
  EXPECT_TRUE(result.get());
  responder.reset();
  runner_.join();
  server_.reset();
}

TEST_F(StreamingTest, Http10ClientGetsAnUnchunkedBodyEndedByClose) {
  stream_events_from_another_thread(30);
  start();
  RawClient client(server_->port());
  ASSERT_TRUE(client.send("GET /v1/completions HTTP/1.0\r\n\r\n"));
  const Reply reply = client.read_response();
  ASSERT_TRUE(reply.complete) << reply.error;
  EXPECT_TRUE(reply.closed);
  EXPECT_EQ(reply.transfer_encoding, "");
  EXPECT_EQ(reply.connection, "close");
  EXPECT_EQ(reply.body, events(30));
}

TEST_F(StreamingTest, HeadRequestGetsTheHeadAndNoBody) {
  stream_events_from_another_thread(5);
  start();
  RawClient client(server_->port());
  ASSERT_TRUE(client.send("HEAD /v1/completions HTTP/1.1\r\nHost: test\r\n\r\n"));
  const Reply head = client.read_response(/*head_request=*/true);
  ASSERT_TRUE(head.complete) << head.error;
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
  // The connection is still in step: the next response parses.
  ASSERT_TRUE(client.send("GET /plain HTTP/1.1\r\nHost: test\r\n\r\n"));
  EXPECT_EQ(client.read_response().body, "plain");
}

}  // namespace
}  // namespace flotilla::http

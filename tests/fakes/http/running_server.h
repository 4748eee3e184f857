// Not a fake, but shared by the tests of two modules: a real flotilla http::Server on a thread
// of its own, on 127.0.0.1 at a port the kernel picks, for tests that need a server to talk to
// (the blocking client's, the trace exporter's collector). Headers are captured; the server is
// drained and joined when it goes.
#pragma once

#include <chrono>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "http/http.h"

namespace flotilla::http {

class RunningServer {
 public:
  explicit RunningServer(Handler handler) {
    ServerOptions options;
    options.workers = 1;
    options.capture_headers = true;
    auto server = Server::create(options, std::move(handler));
    EXPECT_TRUE(server.is_ok()) << server.status().message();
    server_ = std::move(server).value();
    runner_ = std::thread([this] { server_->run(); });
  }
  ~RunningServer() {
    server_->drain(std::chrono::seconds(5));
    runner_.join();
  }
  RunningServer(const RunningServer&) = delete;
  RunningServer& operator=(const RunningServer&) = delete;

  uint16_t port() const { return server_->port(); }
  size_t open_connections() const { return server_->open_connections(); }

 private:
  std::unique_ptr<Server> server_;
  std::thread runner_;
};

}  // namespace flotilla::http

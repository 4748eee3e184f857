// The REST client against the fake API server (tests/fakes/kubernetes/fake_apiserver.py, a FAKE
// of the Kubernetes API server that speaks its wire protocol), run as a process over TLS with a
// self-signed certificate (made by the openssl CLI) and a bearer token, as a kubeconfig for a
// real cluster would describe it.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fakes/common/fake_clock.h"
#include "kube/kube.h"

extern char** environ;

namespace flotilla::kube {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

constexpr const char* kToken = "test-token";

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A self-signed certificate for 127.0.0.1 and its key, in `dir` as <name>.crt and <name>.key.
void make_certificate(const std::filesystem::path& dir, const std::string& name) {
  const std::string command =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=" + name +
      " -addext subjectAltName=IP:127.0.0.1 -keyout " + (dir / (name + ".key")).string() +
      " -out " + (dir / (name + ".crt")).string() + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

class KubeClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() /
           ("flotilla-kube-client-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    make_certificate(dir_, "server");
    make_certificate(dir_, "stranger");
    const std::string port_file = (dir_ / "port").string();
    const std::string script =
        std::string(FLOTILLA_SOURCE_DIR) + "/tests/fakes/kubernetes/fake_apiserver.py";
    const std::string cert = (dir_ / "server.crt").string();
    const std::string key = (dir_ / "server.key").string();
    std::vector<std::string> args = {"/usr/bin/python3", script,    "--port",    "0",
                                     "--port-file",      port_file, "--token",   kToken,
                                     "--tls-cert",       cert,      "--tls-key", key,
                                     "--die-with-parent"};
    std::vector<char*> argv;
    for (std::string& arg : args) {
      argv.push_back(arg.data());
    }
    argv.push_back(nullptr);
    ASSERT_EQ(::posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ), 0);
    // A bound on the server's start, not a timed expectation.
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (!std::filesystem::exists(port_file) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(10ms);
    }
    ASSERT_TRUE(std::filesystem::exists(port_file)) << "the fake API server did not start";
    port_ = static_cast<uint16_t>(std::stoi(read_file(port_file)));
  }
  static void TearDownTestSuite() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }

  // The settings a kubeconfig for this server gives: https, its CA, the token.
  static Config config(const std::string& ca = "server", const std::string& token = kToken) {
    Config config;
    config.server = http::Origin("127.0.0.1", port_, true);
    config.server.tls_options.ca_pem = read_file(dir_ / (ca + ".crt"));
    config.token = token;
    config.namespace_name = "serving";
    return config;
  }

  static json deployment(const std::string& name) {
    json object = json::parse(R"({
      "apiVersion": "apps/v1", "kind": "Deployment",
      "metadata": {"labels": {"flotilla.dev/endpoint": "fraud"}},
      "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "x"}},
               "template": {"metadata": {"labels": {"app": "x"}},
                            "spec": {"containers": [{"name": "replica", "image": "flotilla"}]}}}
    })");
    object["metadata"]["name"] = name;
    return object;
  }

  static inline std::filesystem::path dir_;
  static inline pid_t pid_ = 0;
  static inline uint16_t port_ = 0;
};

TEST_F(KubeClientTest, CreatesReadsUpdatesPatchesScalesAndDeletesOverTls) {
  Client client(config());
  const std::string collection = collection_path(kDeployments, "serving");
  const std::string path = object_path(kDeployments, "serving", "fraud-v1");

  Result<Reply> created = client.create(collection, deployment("fraud-v1"));
  ASSERT_TRUE(created.is_ok()) << created.status().message();
  ASSERT_EQ(created->status, 201) << created->body.dump();
  const std::string version = created->body["metadata"]["resourceVersion"];

  Result<Reply> again = client.create(collection, deployment("fraud-v1"));
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->status, 409);
  EXPECT_EQ(again->reason(), "AlreadyExists");

  Result<Reply> patched = client.patch(path, {{"metadata", {{"labels", {{"tier", "a"}}}}}});
  ASSERT_TRUE(patched.is_ok());
  ASSERT_EQ(patched->status, 200) << patched->body.dump();
  EXPECT_EQ(patched->body["metadata"]["labels"]["tier"], "a");

  // A replace from the first read's resourceVersion: the patch made it stale.
  json stale = created->body;
  stale["spec"]["replicas"] = 5;
  Result<Reply> conflict = client.replace(path, stale);
  ASSERT_TRUE(conflict.is_ok());
  EXPECT_EQ(conflict->status, 409);
  EXPECT_EQ(conflict->reason(), "Conflict");
  EXPECT_EQ(reply_status(*conflict).code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(patched->body["metadata"]["resourceVersion"], version);

  // The scale subresource, as the autoscaler writes it.
  Result<Reply> scaled = client.patch(object_path(kDeployments, "serving", "fraud-v1", "scale"),
                                      {{"spec", {{"replicas", 3}}}});
  ASSERT_TRUE(scaled.is_ok());
  ASSERT_EQ(scaled->status, 200) << scaled->body.dump();
  EXPECT_EQ(scaled->body["kind"], "Scale");
  Result<Reply> read = client.get(path);
  ASSERT_TRUE(read.is_ok());
  EXPECT_EQ(read->body["spec"]["replicas"], 3);

  Result<Reply> listed = client.get(collection, "labelSelector=" + query_escape("tier=a"));
  ASSERT_TRUE(listed.is_ok());
  ASSERT_EQ(listed->body["items"].size(), 1u);

  ASSERT_TRUE(client.remove(path).is_ok());
  Result<Reply> gone = client.get(path);
  ASSERT_TRUE(gone.is_ok());
  EXPECT_EQ(gone->status, 404);
  EXPECT_EQ(reply_status(*gone).code(), StatusCode::kNotFound);
}

TEST_F(KubeClientTest, RefusesAServerItsCaDidNotSignAndTheServerRefusesAWrongToken) {
  Client stranger(config("stranger"));
  Result<Reply> untrusted = stranger.get(collection_path(kDeployments, "serving"));
  ASSERT_FALSE(untrusted.is_ok());
  EXPECT_EQ(untrusted.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(untrusted.status().message().find("TLS handshake failed"), std::string::npos)
      << untrusted.status().message();

  Client wrong_token(config("server", "nope"));
  Result<Reply> refused = wrong_token.get(collection_path(kDeployments, "serving"));
  ASSERT_TRUE(refused.is_ok()) << refused.status().message();
  EXPECT_EQ(refused->status, 401);

  Config bad_ca = config();
  bad_ca.server.tls_options.ca_pem = "not a certificate";
  Result<Reply> unloadable = Client(bad_ca).get("/api");
  EXPECT_EQ(unloadable.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(unloadable.status().message().find("CA certificates do not load"), std::string::npos)
      << unloadable.status().message();
}

TEST_F(KubeClientTest, AWatchSeesChangesInOrderAndCancelEndsIt) {
  Client client(config());
  const std::string collection = collection_path(kLeases, "serving");
  Result<Reply> list = client.get(collection);
  ASSERT_TRUE(list.is_ok() && list->ok());
  const std::string from = list->body["metadata"]["resourceVersion"];

  std::vector<std::string> seen;  // "TYPE name", bookmarks left out
  Mutex mu;
  CondVar changed;
  Status watched;
  std::thread watcher([&] {
    watched = client.watch(
        collection, "resourceVersion=" + from + "&allowWatchBookmarks=true",
        [&](const WatchEvent& event) {
          if (event.type != "BOOKMARK") {
            MutexLock lock(mu);
            seen.push_back(event.type + " " + event.object["metadata"]["name"].get<std::string>());
            changed.notify_all();
          }
          return true;
        });
  });
  const json lease = {{"apiVersion", "coordination.k8s.io/v1"},
                      {"kind", "Lease"},
                      {"metadata", {{"name", "flotilla-controller"}}},
                      {"spec", {{"holderIdentity", "a"}}}};
  ASSERT_EQ(client.create(collection, lease)->status, 201);
  ASSERT_EQ(
      client.patch(collection + "/flotilla-controller", {{"spec", {{"holderIdentity", "b"}}}})
          ->status,
      200);
  ASSERT_EQ(client.remove(collection + "/flotilla-controller")->status, 200);
  {
    MutexLock lock(mu);
    const auto deadline = std::chrono::steady_clock::now() + 20s;  // a bound on the wait
    while (seen.size() < 3 && changed.wait_until(mu, deadline)) {
    }
    EXPECT_EQ(seen,
              (std::vector<std::string>{"ADDED flotilla-controller", "MODIFIED flotilla-controller",
                                        "DELETED flotilla-controller"}));
  }
  client.cancel_watches();
  watcher.join();
  EXPECT_EQ(watched.code(), StatusCode::kUnavailable) << watched.message();
}

TEST_F(KubeClientTest, AWatchFromAnExpiredVersionGetsTheErrorEvent) {
  Client client(config());
  Result<Reply> created =
      client.create(collection_path(kLeases, "serving"), {{"apiVersion", "coordination.k8s.io/v1"},
                                                          {"kind", "Lease"},
                                                          {"metadata", {{"name", "old"}}}});
  ASSERT_TRUE(created.is_ok() && created->ok());
  http::ClientRequest compact;
  compact.method = http::Method::kPost;
  compact.target = "/fake/compact";
  http::BlockingConnection hooks(config().server, 10s);
  ASSERT_TRUE(hooks
                  .send(
                      compact, [](const http::ResponseHead&) { return Status::ok(); },
                      [](const char*, size_t) { return Status::ok(); })
                  .is_ok());
  std::vector<WatchEvent> events;
  const Status watched = client.watch(collection_path(kLeases, "serving"), "resourceVersion=1",
                                      [&](const WatchEvent& event) {
                                        events.push_back(event);
                                        return event.type != "ERROR";
                                      });
  EXPECT_TRUE(watched.is_ok()) << watched.message();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().type, "ERROR");
  EXPECT_EQ(events.back().object["code"], 410);
}

// Sends one of the fake's test hooks (POST /fake/...).
void fake_hook(const http::Origin& server, const std::string& target) {
  http::ClientRequest request;
  request.method = http::Method::kPost;
  request.target = target;
  http::BlockingConnection hooks(server, 10s);
  ASSERT_TRUE(hooks
                  .send(
                      request, [](const http::ResponseHead&) { return Status::ok(); },
                      [](const char*, size_t) { return Status::ok(); })
                  .is_ok());
}

// Two candidates on one Lease, their clocks moved by the test: one leads; the other takes over
// only after seeing the Lease unchanged for a lease duration; a leader that cannot renew for the
// renew deadline stops leading; a released Lease is taken at once.
TEST_F(KubeClientTest, LeaderElectionOnALeaseHasOneLeaderAndHandsOver) {
  Client client_a(config());
  Client client_b(config());
  testing::FakeClock clock;
  auto options = [](std::string identity) {
    LeaderElector::Options options;
    options.lease_name = "flotilla-controller-test";
    options.identity = std::move(identity);
    return options;  // 15 s lease, 10 s renew deadline
  };
  LeaderElector a(client_a, options("controller-a"), clock);
  LeaderElector b(client_b, options("controller-b"), clock);

  EXPECT_TRUE(a.step());  // creates the Lease
  EXPECT_FALSE(b.step());
  for (int i = 0; i < 5; ++i) {  // a renews every 5 s: b never sees the Lease stand still
    clock.advance(5s);
    EXPECT_TRUE(a.step());
    EXPECT_FALSE(b.step());
  }
  Result<Reply> lease = client_a.get(object_path(kLeases, "serving", "flotilla-controller-test"));
  ASSERT_TRUE(lease.is_ok() && lease->ok());
  EXPECT_EQ(lease->body["spec"]["holderIdentity"], "controller-a");
  EXPECT_EQ(lease->body["spec"]["leaseDurationSeconds"], 15);

  // a stops renewing: b waits out a whole lease duration from when it last saw a change.
  clock.advance(14s);
  EXPECT_FALSE(b.step());
  clock.advance(2s);
  EXPECT_TRUE(b.step());
  EXPECT_FALSE(a.step());  // a sees b's name on the Lease
  lease = client_a.get(object_path(kLeases, "serving", "flotilla-controller-test"));
  EXPECT_EQ(lease->body["spec"]["holderIdentity"], "controller-b");
  EXPECT_EQ(lease->body["spec"]["leaseTransitions"], 1);

  // b cannot reach the server (its next two reads of the Lease fail): it keeps leading until
  // the renew deadline, then stops.
  fake_hook(config().server, "/fake/fail?count=2&code=503&match=leases");
  clock.advance(5s);
  EXPECT_TRUE(b.step());
  clock.advance(6s);
  EXPECT_FALSE(b.step());
  EXPECT_FALSE(b.leading());

  // Released: a takes it at its next step, without waiting for the lease to run out.
  ASSERT_TRUE(b.step());
  b.release();
  EXPECT_FALSE(b.leading());
  EXPECT_TRUE(a.step());
}

}  // namespace
}  // namespace flotilla::kube

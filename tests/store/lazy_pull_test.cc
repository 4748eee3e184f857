// Lazy pulls (issue #6, item 4): an artifact's bytes are readable range by range while it
// downloads, awaited ranges are fetched before the background fill, nothing unverified is
// published, and a held artifact is pinned against eviction. Against a real HTTP server of ours
// on 127.0.0.1 that honours Range (or not) and answers each range after a set delay.
#include <algorithm>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "http/http.h"
#include "store/store.h"

namespace flotilla::store {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr uint64_t kRange = 64 << 10;

std::string random_bytes(size_t size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string data(size, '\0');
  for (char& c : data) {
    c = static_cast<char>(rng());
  }
  return data;
}

// Serves named byte strings at /NAME and /norange/NAME; every ranged answer after `delay`.
// Records the first byte of each range asked for, in arrival order.
class RangeServer {
 public:
  explicit RangeServer(std::map<std::string, std::string> files,
                       std::chrono::milliseconds delay = std::chrono::milliseconds(0))
      : files_(std::move(files)), delay_(delay) {
    http::ServerOptions options;
    options.workers = 1;
    options.capture_headers = true;
    auto server =
        http::Server::create(options, [this](http::Request&& request, http::Responder&& responder) {
          handle(std::move(request), std::move(responder));
        });
    EXPECT_TRUE(server.is_ok());
    server_ = std::move(server).value();
    thread_ = std::thread([this] { server_->run(); });
  }
  ~RangeServer() {
    server_->drain(std::chrono::milliseconds(0));
    thread_.join();
  }

  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(server_->port()) + "/" + path;
  }
  std::vector<uint64_t> ranges_asked() {
    std::lock_guard lock(mu_);
    return ranges_;
  }
  // The most ranged requests the server held unanswered at once.
  int most_in_flight() {
    std::lock_guard lock(mu_);
    return most_in_flight_;
  }

  // Requests for /NAME of any kind (probes, ranges, whole), counted as they arrive.
  int requests(const std::string& name) {
    std::lock_guard lock(mu_);
    return requests_[name];
  }
  // Serves `data` as /NAME from now on.
  void replace(const std::string& name, std::string data) {
    std::lock_guard lock(mu_);
    files_[name] = std::move(data);
  }

 private:
  void handle(http::Request&& request, http::Responder&& responder) {
    std::string path = request.target.substr(1);
    const bool honour_range = !path.starts_with("norange/");
    if (!honour_range) {
      path = path.substr(8);
    }
    std::string data;
    {
      std::lock_guard lock(mu_);
      ++requests_[path];
      auto file = files_.find(path);
      if (file == files_.end()) {
        responder.send(http::Response{404, "text/plain", "not found", {}});
        return;
      }
      data = file->second;
    }
    std::optional<std::pair<uint64_t, uint64_t>> range;
    for (const auto& [name, value] : request.headers) {
      unsigned long long first = 0, last = 0;
      if (name == "Range" && std::sscanf(value.c_str(), "bytes=%llu-%llu", &first, &last) == 2) {
        range = {first, std::min<uint64_t>(last, data.size() - 1)};
      }
    }
    if (!honour_range || !range) {
      responder.send(http::Response{200, "application/octet-stream", data, {}});
      return;
    }
    const bool probe = range->first == 0 && range->second == 0;
    if (!probe) {
      std::lock_guard lock(mu_);
      ranges_.push_back(range->first);
      most_in_flight_ = std::max(most_in_flight_, ++in_flight_);
    }
    http::Response response{
        206,
        "application/octet-stream",
        data.substr(range->first, range->second - range->first + 1),
        {{"Content-Range", "bytes " + std::to_string(range->first) + "-" +
                               std::to_string(range->second) + "/" + std::to_string(data.size())}}};
    if (probe) {
      responder.send(std::move(response));
      return;
    }
    auto held = std::make_shared<http::Responder>(std::move(responder));
    http::defer_on_current_loop(
        [this, held, response = std::move(response)]() mutable {
          {
            std::lock_guard lock(mu_);
            --in_flight_;
          }
          held->send(std::move(response));
        },
        delay_);
  }

  std::map<std::string, std::string> files_;  // guarded by mu_
  std::chrono::milliseconds delay_;
  std::mutex mu_;
  std::map<std::string, int> requests_;
  std::vector<uint64_t> ranges_;
  int in_flight_ = 0;
  int most_in_flight_ = 0;
  std::unique_ptr<http::Server> server_;
  std::thread thread_;
};

class LazyPullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("flotilla-lazy-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<ArtifactCache> open_cache(uint64_t max_bytes = 0) {
    auto cache = ArtifactCache::open(dir_.string(), max_bytes);
    EXPECT_TRUE(cache.is_ok()) << cache.status().message();
    return std::move(cache).value();
  }
  static PullOptions options(int connections) {
    PullOptions options;
    options.connections = connections;
    options.range_bytes = kRange;
    return options;
  }
  static std::string read_at(const std::string& path, uint64_t offset, size_t size) {
    std::string bytes(size, '\0');
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_GE(fd, 0) << path;
    EXPECT_EQ(::pread(fd, bytes.data(), size, static_cast<off_t>(offset)),
              static_cast<ssize_t>(size));
    ::close(fd);
    return bytes;
  }
  size_t entries(const std::string& sub) const {
    size_t count = 0;
    for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir_ / sub)) {
      ++count;
    }
    return count;
  }

  fs::path dir_;
};

TEST_F(LazyPullTest, AnAwaitedRangeIsFetchedBeforeTheBackgroundFill) {
  // 32 ranges over one connection, each answered after 100 ms: about 3.2 s in file order.
  const std::string data = random_bytes(32 * kRange, 1);
  RangeServer server({{"model.bin", data}}, std::chrono::milliseconds(100));
  auto cache = open_cache();
  auto pull = cache->pull_lazy(server.url("model.bin"), options(1));
  ASSERT_TRUE(pull.is_ok()) << pull.status().message();
  LazyArtifact& artifact = **pull;

  const uint64_t last = 31 * kRange + 100;
  ASSERT_TRUE(artifact.await(artifact.path(), last, 1000).is_ok());
  // The fill had reached range 1 or 2 when the await came; the last range went next. A fill
  // in file order would have asked for all 31 others first.
  const std::vector<uint64_t> asked = server.ranges_asked();
  const auto at = std::find(asked.begin(), asked.end(), 31 * kRange);
  ASSERT_NE(at, asked.end());
  EXPECT_LT(at - asked.begin(), 16) << "the awaited range waited behind the fill";
  EXPECT_EQ(read_at(artifact.path(), last, 1000), data.substr(last, 1000));

  Result<std::string> path = artifact.finish();
  ASSERT_TRUE(path.is_ok()) << path.status().message();
  EXPECT_THAT(*path, HasSubstr("/artifacts/f-"));
  EXPECT_EQ(read_at(*path, 0, data.size()), data);
  EXPECT_EQ(server.ranges_asked().size(), 32u) << "each range fetched once";
  EXPECT_FALSE(fs::exists(artifact.path())) << "the staging directory became the artifact";
}

TEST_F(LazyPullTest, ADirectoryIsReadableFileByFileBeforeItIsComplete) {
  const std::string config = "{\"hidden_size\": 8}";
  const std::string weights = random_bytes(8 * kRange + 5, 2);
  Manifest manifest;
  manifest.files = {{"config.json", config.size(), sha256_hex(config)},
                    {"model.safetensors", weights.size(), sha256_hex(weights)}};
  RangeServer server({{kManifestName.data(), manifest_json(manifest)},
                      {"config.json", config},
                      {"model.safetensors", weights}},
                     std::chrono::milliseconds(20));
  auto cache = open_cache();
  auto pull = cache->pull_lazy(server.url(std::string(kManifestName)), options(2));
  ASSERT_TRUE(pull.is_ok()) << pull.status().message();
  LazyArtifact& artifact = **pull;
  const std::string config_path = artifact.path() + "/config.json";
  const std::string weights_path = artifact.path() + "/model.safetensors";
  ASSERT_TRUE(artifact.await(config_path, 0, UINT64_MAX).is_ok());
  EXPECT_EQ(read_at(config_path, 0, config.size()), config);
  ASSERT_TRUE(artifact.await(weights_path, 3 * kRange, 2 * kRange).is_ok());
  EXPECT_EQ(fs::file_size(weights_path), weights.size()) << "sized once any range is awaited";
  EXPECT_EQ(read_at(weights_path, 3 * kRange, 2 * kRange), weights.substr(3 * kRange, 2 * kRange));
  EXPECT_EQ(artifact.await(artifact.path() + "/absent.bin", 0, 1).code(), StatusCode::kNotFound);

  Result<std::string> path = artifact.finish();
  ASSERT_TRUE(path.is_ok()) << path.status().message();
  EXPECT_EQ(read_at(*path + "/model.safetensors", 0, weights.size()), weights);
  EXPECT_EQ(entries("blobs"), 2u);

  // Cached now: complete at once, under the artifact's own path.
  auto again = cache->pull_lazy(server.url(std::string(kManifestName)), options(2));
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ((*again)->path(), *path);
  EXPECT_TRUE((*again)->await(*path + "/model.safetensors", 0, 10).is_ok());
  EXPECT_EQ((*again)->finish().value(), *path);
}

TEST_F(LazyPullTest, TheFilesOfAPullShareItsConnections) {
  // Three files of 6 ranges each, downloading at the same time, over 2 connections in all.
  std::map<std::string, std::string> files;
  Manifest manifest;
  for (const char* name : {"a.bin", "b.bin", "c.bin"}) {
    files[name] = random_bytes(6 * kRange, static_cast<uint32_t>(name[0]));
    manifest.files.push_back({name, files[name].size(), sha256_hex(files[name])});
  }
  files[std::string(kManifestName)] = manifest_json(manifest);
  RangeServer server(files, std::chrono::milliseconds(20));
  auto cache = open_cache();
  Result<std::string> path = cache->pull(server.url(std::string(kManifestName)), options(2));
  ASSERT_TRUE(path.is_ok()) << path.status().message();
  EXPECT_EQ(read_at(*path + "/c.bin", 0, 6 * kRange), files["c.bin"]);
  EXPECT_EQ(server.ranges_asked().size(), 18u);
  EXPECT_LE(server.most_in_flight(), 2);
}

TEST_F(LazyPullTest, ContentThatFailsItsDigestIsReadableButNeverPublished) {
  const std::string data = random_bytes(4 * kRange, 3);
  RangeServer server({{"model.bin", data}});
  auto cache = open_cache();
  auto pull = cache->pull_lazy(server.url("model.bin#sha256=" + std::string(64, 'a')), options(2));
  ASSERT_TRUE(pull.is_ok());
  const std::string staged = (*pull)->path();
  ASSERT_TRUE((*pull)->await(staged, 0, 10).is_ok());
  Result<std::string> path = (*pull)->finish();
  ASSERT_FALSE(path.is_ok());
  EXPECT_EQ(path.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(path.status().message(), HasSubstr("does not match its digest"));
  EXPECT_EQ(entries("blobs"), 0u);
  EXPECT_EQ(entries("artifacts"), 0u) << "neither the artifact nor its staging directory";
}

TEST_F(LazyPullTest, OverOneStreamAReadWaitsForTheWholeFile) {
  const std::string data = random_bytes(3 * kRange + 7, 4);
  RangeServer server({{"model.bin", data}});
  auto cache = open_cache();
  auto pull = cache->pull_lazy(server.url("norange/model.bin"), options(4));
  ASSERT_TRUE(pull.is_ok());
  ASSERT_TRUE((*pull)->await((*pull)->path(), 0, 1).is_ok());
  EXPECT_EQ(read_at((*pull)->path(), 0, data.size()), data);
  EXPECT_TRUE((*pull)->finish().is_ok());
}

TEST_F(LazyPullTest, AnAbandonedPullStopsAndKeepsWhatArrivedForAResume) {
  const std::string data = random_bytes(64 * kRange, 5);
  RangeServer server({{"model.bin", data}}, std::chrono::milliseconds(50));
  auto cache = open_cache();
  {
    auto pull = cache->pull_lazy(server.url("model.bin"), options(2));
    ASSERT_TRUE(pull.is_ok());
    ASSERT_TRUE((*pull)->await((*pull)->path(), 0, 2 * kRange).is_ok());
  }  // destroyed unfinished: cancels within a range, not after 64 of them
  const size_t fetched = server.ranges_asked().size();
  EXPECT_LT(fetched, 64u);
  EXPECT_EQ(entries("artifacts"), 0u);
  EXPECT_EQ(entries("blobs"), 0u);

  Result<std::string> path = cache->pull(server.url("model.bin"), options(8));
  ASSERT_TRUE(path.is_ok()) << path.status().message();
  EXPECT_EQ(read_at(*path, 0, data.size()), data);
  EXPECT_LE(server.ranges_asked().size(), 64u + 2) << "the resume fetched only what was missing";
}

TEST_F(LazyPullTest, AHeldArtifactIsPinnedAgainstEviction) {
  const std::string first = random_bytes(4 * kRange, 6);
  const std::string second = random_bytes(4 * kRange, 7);
  const std::string third = random_bytes(4 * kRange, 8);
  RangeServer server({{"first.bin", first}, {"second.bin", second}, {"third.bin", third}});
  auto cache = open_cache(/*max_bytes=*/5 * kRange);  // room for one at a time
  auto held = cache->pull_lazy(server.url("first.bin"), options(2));
  ASSERT_TRUE(held.is_ok());
  Result<std::string> first_path = (*held)->finish();
  ASSERT_TRUE(first_path.is_ok());

  Result<std::string> second_path = cache->pull(server.url("second.bin"), options(2));
  ASSERT_TRUE(second_path.is_ok());
  EXPECT_TRUE(fs::exists(*first_path)) << "evicted while held";

  held->reset();  // no longer served: the next trim takes it, least recently used first
  Result<std::string> third_path = cache->pull(server.url("third.bin"), options(2));
  ASSERT_TRUE(third_path.is_ok());
  EXPECT_FALSE(fs::exists(*first_path));
  EXPECT_FALSE(fs::exists(*second_path));
  EXPECT_TRUE(fs::exists(*third_path));
  EXPECT_EQ(cache->size_bytes(), 4 * kRange);
}

// Issue 18, item 11: a "#sha256=" pin on a manifest URL pins the manifest, and so, through its
// digests, every file. A manifest that does not match is refused before any file is asked for.
class ManifestPinTest : public LazyPullTest {
 protected:
  void SetUp() override {
    LazyPullTest::SetUp();
    weights_ = random_bytes(3 * kRange + 1, 9);
    Manifest manifest;
    manifest.files = {{"weights.bin", weights_.size(), sha256_hex(weights_)}};
    manifest_ = manifest_json(manifest);
  }
  std::string weights_;
  std::string manifest_;
};

TEST_F(ManifestPinTest, AManifestThatDoesNotMatchItsPinIsRefusedBeforeAnyFile) {
  // What the pin promised, and what a server (or someone between) sends instead: another
  // manifest, itself consistent, whose file digests match the other content it serves.
  const std::string pin = sha256_hex(manifest_);
  const std::string tampered_weights = random_bytes(weights_.size(), 10);
  Manifest tampered;
  tampered.files = {{"weights.bin", tampered_weights.size(), sha256_hex(tampered_weights)}};
  const std::string tampered_manifest = manifest_json(tampered);
  RangeServer server(
      {{std::string(kManifestName), tampered_manifest}, {"weights.bin", tampered_weights}});
  auto cache = open_cache();
  const std::string url = server.url(std::string(kManifestName));

  Result<std::string> path = cache->pull(url + "#sha256=" + pin, options(2));
  ASSERT_FALSE(path.is_ok()) << "a manifest that is not the pinned one was trusted";
  EXPECT_EQ(path.status().code(), StatusCode::kFailedPrecondition);
  const std::string& message = path.status().message();
  EXPECT_THAT(message, HasSubstr(url));
  EXPECT_THAT(message, HasSubstr("expected sha256 " + pin));
  EXPECT_THAT(message, HasSubstr("got " + sha256_hex(tampered_manifest)));
  EXPECT_EQ(server.requests("weights.bin"), 0) << "a file of the unverified manifest was fetched";
  EXPECT_EQ(entries("blobs"), 0u);
  EXPECT_EQ(entries("artifacts"), 0u);
  EXPECT_EQ(entries("partial"), 0u);

  // The lazy path refuses it the same way, before returning.
  auto lazy = cache->pull_lazy(url + "#sha256=" + pin, options(2));
  ASSERT_FALSE(lazy.is_ok());
  EXPECT_EQ(lazy.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(server.requests("weights.bin"), 0);
}

TEST_F(ManifestPinTest, APinnedManifestIsPulledAndThenServedFromTheCacheWithoutAsking) {
  RangeServer server({{std::string(kManifestName), manifest_}, {"weights.bin", weights_}});
  auto cache = open_cache();
  const std::string pinned =
      server.url(std::string(kManifestName)) + "#sha256=" + sha256_hex(manifest_);
  Result<std::string> path = cache->pull(pinned, options(2));
  ASSERT_TRUE(path.is_ok()) << path.status().message();
  EXPECT_THAT(*path, HasSubstr("/artifacts/m-" + sha256_hex(manifest_)));
  EXPECT_EQ(read_at(*path + "/weights.bin", 0, weights_.size()), weights_);
  EXPECT_EQ(server.requests(std::string(kManifestName)), 1);

  // The pinned content is what the cache holds, so the server is not asked again, even once
  // it serves something else under that URL.
  server.replace(std::string(kManifestName), "{\"files\": []}");
  Result<std::string> again = cache->pull(pinned, options(2));
  ASSERT_TRUE(again.is_ok()) << again.status().message();
  EXPECT_EQ(*again, *path);
  EXPECT_EQ(server.requests(std::string(kManifestName)), 1);
  // Unpinned, the URL is fetched and its new content is what the pull returns.
  Result<std::string> unpinned = cache->pull(server.url(std::string(kManifestName)), options(2));
  ASSERT_TRUE(unpinned.is_ok()) << unpinned.status().message();
  EXPECT_NE(*unpinned, *path);
  EXPECT_EQ(server.requests(std::string(kManifestName)), 2);
}

TEST_F(LazyPullTest, AManifestWithNoFilesIsAnEmptyDirectory) {
  RangeServer server({{std::string(kManifestName), "{\"files\": []}"}});
  auto cache = open_cache();
  Result<std::string> path = cache->pull(server.url(std::string(kManifestName)), options(2));
  ASSERT_TRUE(path.is_ok()) << path.status().message();
  EXPECT_TRUE(fs::is_directory(*path));
  EXPECT_TRUE(fs::is_empty(*path));
}

}  // namespace
}  // namespace flotilla::store

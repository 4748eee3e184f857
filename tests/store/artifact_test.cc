// URLs, manifests and digests of the artifact store (the downloads are tested against real
// servers in tests/integration/store_test.py).
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "store/store.h"

namespace flotilla::store {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kDigest(64, 'a');

TEST(UrlTest, ParsesHostPortTargetAndDigest) {
  Result<Url> url = parse_url("https://models.example.com:8443/a/b.bin?x=1#sha256=" + kDigest);
  ASSERT_TRUE(url.is_ok()) << url.status().message();
  EXPECT_TRUE(url->tls);
  EXPECT_EQ(url->host, "models.example.com");
  EXPECT_EQ(url->port, 8443);
  EXPECT_EQ(url->target, "/a/b.bin?x=1");
  EXPECT_EQ(url->sha256, kDigest);
  EXPECT_EQ(url->text(), "https://models.example.com:8443/a/b.bin?x=1");

  Result<Url> plain = parse_url("http://127.0.0.1");
  ASSERT_TRUE(plain.is_ok());
  EXPECT_EQ(plain->port, 80);
  EXPECT_EQ(plain->target, "/");
  EXPECT_FALSE(plain->sha256.has_value());
}

TEST(UrlTest, RefusesWhatItCannotFetch) {
  for (const char* bad : {"ftp://host/x", "http://", "http://:80/x", "http://host:0/x",
                          "http://host:99999/x", "http://host:8x/x", "http://user:pw@host/x",
                          "http://host/x#md5=abc", "http://host/x#sha256=ABC"}) {
    Result<Url> url = parse_url(bad);
    EXPECT_FALSE(url.is_ok()) << bad;
    if (!url.is_ok()) {
      EXPECT_EQ(url.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
  EXPECT_TRUE(is_url("https://x"));
  EXPECT_FALSE(is_url("/models/x"));
}

TEST(ManifestTest, RoundTripsSortedByPath) {
  Manifest manifest;
  manifest.files = {{"b/c.bin", 7, kDigest}, {"a.json", 0, std::string(64, '0')}};
  Result<Manifest> parsed = parse_manifest(manifest_json(manifest));
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
  ASSERT_EQ(parsed->files.size(), 2u);
  EXPECT_EQ(parsed->files[0].path, "a.json");
  EXPECT_EQ(parsed->files[1], (ManifestFile{"b/c.bin", 7, kDigest}));
}

TEST(ManifestTest, RefusesUnsafePathsAndBadEntries) {
  const std::string d = "\"" + kDigest + "\"";
  const std::pair<std::string, std::string> cases[] = {
      {R"({"files": [{"path": "../x", "size": 1, "sha256": )" + d + "}]}", "'../x'"},
      {R"({"files": [{"path": "a/../../x", "size": 1, "sha256": )" + d + "}]}", "'a/../../x'"},
      {R"({"files": [{"path": "/etc/passwd", "size": 1, "sha256": )" + d + "}]}", "relative"},
      {R"({"files": [{"path": "a//b", "size": 1, "sha256": )" + d + "}]}", "'a//b'"},
      {R"({"files": [{"path": "./a", "size": 1, "sha256": )" + d + "}]}", "'./a'"},
      {R"({"files": [{"path": "a", "size": 1, "sha256": "abc"}]})", "sha256"},
      {R"({"files": [{"path": "a", "size": -1, "sha256": )" + d + "}]}", "files[0]"},
      {R"({"files": [{"path": "a", "size": 1, "sha256": )" + d +
           R"(}, {"path": "a", "size": 1, "sha256": )" + d + "}]}",
       "twice"},
      {R"({"files": [{"path": "a", "size": 1, "sha256": )" + d +
           R"(}, {"path": "a/b", "size": 1, "sha256": )" + d + "}]}",
       "both a file and a directory"},
      {R"({"file": []})", "\"files\""},
      {"not json", "\"files\""},
  };
  for (const auto& [json, needle] : cases) {
    Result<Manifest> parsed = parse_manifest(json);
    ASSERT_FALSE(parsed.is_ok()) << json;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << json;
    EXPECT_THAT(parsed.status().message(), HasSubstr(needle)) << json;
  }
}

class PackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("pack-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "sub");
    std::ofstream(dir_ / "abc.txt") << "abc";
    std::ofstream(dir_ / "sub" / "empty.bin");
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(PackTest, ListsEveryFileWithItsDigestAndWritesTheManifest) {
  Result<Manifest> packed = pack_directory(dir_.string());
  ASSERT_TRUE(packed.is_ok()) << packed.status().message();
  // sha256("abc") and sha256("").
  EXPECT_EQ(packed->files,
            (std::vector<ManifestFile>{
                {"abc.txt", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
                {"sub/empty.bin", 0,
                 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}}));
  std::ifstream written(dir_ / kManifestName);
  std::string text((std::istreambuf_iterator<char>(written)), std::istreambuf_iterator<char>());
  Result<Manifest> reread = parse_manifest(text);
  ASSERT_TRUE(reread.is_ok());
  EXPECT_EQ(*reread, *packed);
  // Packing again does not list the manifest itself.
  Result<Manifest> again = pack_directory(dir_.string());
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(*again, *packed);
}

TEST_F(PackTest, RefusesSymlinksAndMissingDirectories) {
  fs::create_symlink("/etc/hostname", dir_ / "link");
  Result<Manifest> packed = pack_directory(dir_.string());
  ASSERT_FALSE(packed.is_ok());
  EXPECT_THAT(packed.status().message(), HasSubstr("symbolic link"));
  EXPECT_FALSE(fs::exists(dir_ / kManifestName));
  EXPECT_FALSE(pack_directory((dir_ / "missing").string()).is_ok());
}

TEST_F(PackTest, LocalPathsArePulledAsTheyAre) {
  Result<std::unique_ptr<ArtifactCache>> cache = ArtifactCache::open((dir_ / "cache").string(), 0);
  ASSERT_TRUE(cache.is_ok()) << cache.status().message();
  Result<std::string> path = cache.value()->pull((dir_ / "abc.txt").string(), PullOptions{});
  ASSERT_TRUE(path.is_ok());
  EXPECT_EQ(*path, (dir_ / "abc.txt").string());
  Result<std::string> missing = cache.value()->pull((dir_ / "nope").string(), PullOptions{});
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cache.value()->size_bytes(), 0u);
}

}  // namespace
}  // namespace flotilla::store

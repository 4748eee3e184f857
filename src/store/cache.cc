// The content-addressed cache: layout, sharing of downloads, assembly of artifacts, eviction.
//
//   DIR/blobs/<sha256>            verified file contents, named by digest
//   DIR/artifacts/<id>/...        what pull() returns: the files under their names, hard links
//                                 to blobs (id: "f-" + digest or URL hash for one file,
//                                 "m-" + the manifest's digest for a directory)
//   DIR/partial/<key>[.state]     downloads in progress (resumable)
//   DIR/locks/<id>.fetch|.pin     flock(2) files: one fetch at a time per content; a shared
//                                 .pin while an artifact is used (eviction skips it)
//   DIR/locks/pulls               shared by every pull; eviction runs only when it gets it alone
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/download.h"
#include "store/http_get.h"
#include "store/store.h"

namespace flotilla::store {
namespace {

namespace fs = std::filesystem;

// An flock(2) held for the object's lifetime.
class FileLock {
 public:
  static Result<FileLock> take(const std::string& path, bool exclusive, bool wait) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return unavailable("cannot open lock '" + path + "': " + std::strerror(errno));
    }
    int rc;
    do {
      rc = ::flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | (wait ? 0 : LOCK_NB));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int error = errno;
      ::close(fd);
      return error == EWOULDBLOCK
                 ? Status(StatusCode::kFailedPrecondition, "locked")
                 : unavailable("cannot lock '" + path + "': " + std::strerror(error));
    }
    return FileLock(fd);
  }
  FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileLock& operator=(FileLock&&) = delete;
  ~FileLock() {
    if (fd_ >= 0) {
      ::close(fd_);  // releases the lock
    }
  }

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

// The last path part of a URL's target, without its query: the name a file artifact keeps.
std::string file_name(const Url& url) {
  std::string path = url.target.substr(0, url.target.find('?'));
  std::string name = path.substr(path.rfind('/') + 1);
  if (name.empty() || name == "." || name == "..") {
    return "artifact";
  }
  return name;
}

// Percent-encodes what may not appear in a URL path as it is.
std::string url_path(std::string_view path) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : path) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') {
      out += c;
    } else {
      out += '%';
      out += kHex[u >> 4];
      out += kHex[u & 0xf];
    }
  }
  return out;
}

void touch(const std::string& path) {
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // best effort: only orders eviction
}

class Cache final : public ArtifactCache {
 public:
  Cache(std::string dir, uint64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {}

  Result<std::string> pull(const std::string& uri, const PullOptions& options) override {
    if (!is_url(uri)) {
      std::error_code ec;
      if (!fs::exists(uri, ec)) {
        return not_found("no such file or directory: '" + uri + "'");
      }
      return fs::absolute(uri).lexically_normal().string();
    }
    FLOTILLA_ASSIGN_OR_RETURN(Url url, parse_url(uri));
    Result<std::string> path = Status::ok();
    {
      // Pulls share this lock; eviction takes it alone, so it never races a pull.
      FLOTILLA_ASSIGN_OR_RETURN(FileLock pulling,
                                FileLock::take(dir_ + "/locks/pulls", false, true));
      path =
          file_name(url) == kManifestName ? pull_manifest(url, options) : pull_file(url, options);
    }
    if (path.is_ok()) {
      trim();
    }
    return path;
  }

  uint64_t size_bytes() override {
    uint64_t total = 0;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir_ + "/blobs", ec)) {
      total += entry.file_size(ec);
    }
    return total;
  }

  Status make_layout() {
    for (const char* sub : {"blobs", "artifacts", "partial", "locks"}) {
      std::error_code ec;
      fs::create_directories(dir_ + "/" + sub, ec);
      if (ec) {
        return unavailable("cannot create '" + dir_ + "/" + sub + "': " + ec.message());
      }
    }
    return Status::ok();
  }

 private:
  std::string lock_path(const std::string& id, const char* kind) const {
    return dir_ + "/locks/" + id + "." + kind;
  }

  // The blob with this content: downloaded from `url` unless the cache has it. `key` names the
  // download (and its lock) when the digest is not known in advance.
  Result<std::string> ensure_blob(const Url& url, const std::optional<std::string>& expected,
                                  const std::string& key, const PullOptions& options) {
    if (expected && fs::exists(dir_ + "/blobs/" + *expected)) {
      return *expected;
    }
    FLOTILLA_ASSIGN_OR_RETURN(FileLock fetching,
                              FileLock::take(lock_path("blob-" + key, "fetch"), true, true));
    if (expected && fs::exists(dir_ + "/blobs/" + *expected)) {
      return *expected;  // another pull fetched it while this one waited
    }
    const std::string partial = dir_ + "/partial/" + key;
    FLOTILLA_ASSIGN_OR_RETURN(Downloaded got, download(url, partial, options));
    if (expected && got.sha256 != *expected) {
      ::unlink(partial.c_str());
      return Status(StatusCode::kFailedPrecondition,
                    url.text() + ": content does not match its digest: expected sha256 " +
                        *expected + ", got " + got.sha256 + " (" + std::to_string(got.size) +
                        " bytes); nothing was cached");
    }
    const std::string blob = dir_ + "/blobs/" + got.sha256;
    if (::rename(partial.c_str(), blob.c_str()) != 0) {
      const int error = errno;
      ::unlink(partial.c_str());
      return unavailable("cannot move '" + partial + "' to '" + blob +
                         "': " + std::strerror(error));
    }
    return got.sha256;
  }

  // Publishes a directory of hard links to blobs as artifacts/<id>, atomically.
  Result<std::string> publish(const std::string& id,
                              const std::vector<std::pair<std::string, std::string>>& files) {
    const std::string final_dir = dir_ + "/artifacts/" + id;
    const std::string staging = final_dir + ".tmp-" + std::to_string(::getpid());
    std::error_code ec;
    fs::remove_all(staging, ec);
    for (const auto& [relative, digest] : files) {
      const fs::path target = fs::path(staging) / relative;
      fs::create_directories(target.parent_path(), ec);
      fs::create_hard_link(dir_ + "/blobs/" + digest, target, ec);
      if (ec) {
        fs::remove_all(staging, ec);
        return unavailable("cannot link '" + target.string() + "': " + ec.message());
      }
    }
    if (::rename(staging.c_str(), final_dir.c_str()) != 0) {
      const int error = errno;
      fs::remove_all(staging, ec);
      if (!fs::exists(final_dir)) {
        return unavailable("cannot publish '" + final_dir + "': " + std::strerror(error));
      }
    }
    return final_dir;
  }

  Result<std::string> pull_file(const Url& url, const PullOptions& options) {
    const std::string key = url.sha256 ? *url.sha256 : sha256_hex(url.text());
    const std::string id = "f-" + key;
    const std::string name = file_name(url);
    const std::string path = dir_ + "/artifacts/" + id + "/" + name;
    FLOTILLA_ASSIGN_OR_RETURN(FileLock pinned, FileLock::take(lock_path(id, "pin"), false, true));
    FLOTILLA_ASSIGN_OR_RETURN(FileLock fetching,
                              FileLock::take(lock_path(id, "fetch"), true, true));
    if (fs::exists(path)) {
      touch(dir_ + "/artifacts/" + id);
      return path;
    }
    FLOTILLA_ASSIGN_OR_RETURN(std::string digest, ensure_blob(url, url.sha256, key, options));
    FLOTILLA_ASSIGN_OR_RETURN(std::string dir, publish(id, {{name, digest}}));
    return dir + "/" + name;
  }

  Result<std::string> pull_manifest(const Url& url, const PullOptions& options) {
    std::string body;
    HttpConnection connection(url, options.io_timeout);
    constexpr size_t kMaxManifest = 16 << 20;
    FLOTILLA_RETURN_IF_ERROR(connection.get(
        url.target, std::nullopt,
        [&](const ResponseHead& head) -> Status {
          if (head.status != 200) {
            const std::string message =
                url.text() + ": HTTP " + std::to_string(head.status) + " for the manifest";
            return head.status == 404 ? not_found(message) : unavailable(message);
          }
          return Status::ok();
        },
        [&](const char* data, size_t size) -> Status {
          if (body.size() + size > kMaxManifest) {
            return invalid_argument(url.text() + ": the manifest is over 16 MiB");
          }
          body.append(data, size);
          return Status::ok();
        }));
    Result<Manifest> manifest = parse_manifest(body);
    if (!manifest.is_ok()) {
      return manifest.status().with_context(url.text());
    }
    const std::string id = "m-" + sha256_hex(body);
    const std::string dir = dir_ + "/artifacts/" + id;
    FLOTILLA_ASSIGN_OR_RETURN(FileLock pinned, FileLock::take(lock_path(id, "pin"), false, true));
    FLOTILLA_ASSIGN_OR_RETURN(FileLock fetching,
                              FileLock::take(lock_path(id, "fetch"), true, true));
    if (fs::exists(dir)) {
      touch(dir);
      return dir;
    }
    const std::string base = url.target.substr(0, url.target.rfind('/') + 1);
    std::vector<std::pair<std::string, std::string>> files;
    for (const ManifestFile& file : manifest->files) {
      Url file_url = url;
      file_url.target = base + url_path(file.path);
      file_url.sha256 = file.sha256;
      FLOTILLA_ASSIGN_OR_RETURN(std::string digest,
                                ensure_blob(file_url, file.sha256, file.sha256, options));
      files.emplace_back(file.path, digest);
    }
    return publish(id, files);
  }

  // Down to max_bytes: least recently used artifacts first (skipping any being pulled), then
  // the blobs no artifact links to any more.
  void trim() {
    if (max_bytes_ == 0 || size_bytes() <= max_bytes_) {
      return;
    }
    Result<FileLock> alone = FileLock::take(dir_ + "/locks/pulls", true, false);
    if (!alone.is_ok()) {
      return;  // another pull runs: the last one to finish trims
    }
    std::error_code ec;
    std::vector<std::pair<fs::file_time_type, std::string>> artifacts;
    for (const auto& entry : fs::directory_iterator(dir_ + "/artifacts", ec)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_directory(ec) && name.find(".tmp-") == std::string::npos) {
        artifacts.emplace_back(entry.last_write_time(ec), name);
      }
    }
    std::sort(artifacts.begin(), artifacts.end());
    remove_unlinked_blobs();
    for (const auto& [time, id] : artifacts) {
      if (size_bytes() <= max_bytes_) {
        break;
      }
      Result<FileLock> unused = FileLock::take(lock_path(id, "pin"), true, false);
      if (!unused.is_ok()) {
        continue;  // being pulled (or in use) right now
      }
      fs::remove_all(dir_ + "/artifacts/" + id, ec);
      spdlog::info("store: evicted {} (cache over {} bytes)", id, max_bytes_);
      remove_unlinked_blobs();
    }
  }

  void remove_unlinked_blobs() {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir_ + "/blobs", ec)) {
      struct stat info {};
      if (::stat(entry.path().c_str(), &info) != 0 || info.st_nlink > 1) {
        continue;
      }
      const std::string digest = entry.path().filename().string();
      Result<FileLock> unused = FileLock::take(lock_path("blob-" + digest, "fetch"), true, false);
      if (unused.is_ok()) {
        fs::remove(entry.path(), ec);
      }
    }
  }

  std::string dir_;
  uint64_t max_bytes_;
};

}  // namespace

Result<std::unique_ptr<ArtifactCache>> ArtifactCache::open(const std::string& dir,
                                                           uint64_t max_bytes) {
  auto cache = std::make_unique<Cache>(dir, max_bytes);
  FLOTILLA_RETURN_IF_ERROR(cache->make_layout());
  return std::unique_ptr<ArtifactCache>(std::move(cache));
}

}  // namespace flotilla::store

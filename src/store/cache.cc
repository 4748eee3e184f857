// The content-addressed cache: layout, sharing of downloads, assembly of artifacts, eviction.
//
//   DIR/blobs/<sha256>            verified file contents, named by digest
//   DIR/artifacts/<id>/...        what pull() returns: the files under their names, hard links
//                                 to blobs (id: "f-" + digest or URL hash for one file,
//                                 "m-" + the manifest's digest for a directory)
//   DIR/artifacts/<id>.tmp-<pid>-<n>/  a pull's staging directory: hard links to the partial
//                                 files while they download (what lazy readers open)
//   DIR/partial/<key>[.state]     downloads in progress (resumable)
//   DIR/locks/<id>.fetch|.pin     flock(2) files: one fetch at a time per content; a shared
//                                 .pin while an artifact is used (eviction skips it)
//   DIR/locks/pulls               shared by every pull; eviction runs only when it gets it alone
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/download.h"
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

class Cache;

// A pull in progress (or done): the artifact's files staged in artifacts/<id>.tmp-<pid>-<n>/ as
// hard links to the partial files the downloads write, which become blobs, and the staging
// directory the artifact, in finish(). Holds the artifact's pin for its whole life.
class LazyPull final : public LazyArtifact {
 public:
  // A complete artifact (cached, or a local path): nothing to fetch.
  LazyPull(std::string path, std::optional<FileLock> pin)
      : path_(std::move(path)), pin_(std::move(pin)) {}
  // One to assemble in `staging`, published as `final_dir` (`name`: the file a single-file
  // artifact returns, "" for a directory).
  LazyPull(Cache& cache, std::string staging, std::string final_dir, std::string name, FileLock pin,
           FileLock pulling, FileLock fetching)
      : cache_(&cache),
        path_(name.empty() ? staging : staging + "/" + name),
        staging_(std::move(staging)),
        final_dir_(std::move(final_dir)),
        name_(std::move(name)),
        pin_(std::move(pin)),
        pulling_(std::move(pulling)),
        fetching_(std::move(fetching)) {}
  ~LazyPull() override;

  const std::string& path() const override { return path_; }
  Status await(const std::string& file, uint64_t offset, uint64_t length) override;
  Result<std::string> finish() override;

  // Stages `relative` from the blob if the cache has it, else starts downloading it.
  Status stage(const std::string& relative, const Url& url,
               const std::optional<std::string>& expected, const std::string& key,
               const PullOptions& options);

 private:
  // One file being downloaded.
  struct Fetch {
    std::string path;  // where it is staged, lexically normal: what await() is asked for
    Url url;
    std::optional<std::string> expected;
    std::string partial;
    FileLock lock;  // locks/blob-<key>.fetch
    std::unique_ptr<Download> download;
    std::optional<Result<Downloaded>> result;
    std::thread thread;
  };

  Status link(const std::string& from, const std::string& relative);
  // Sums one file's progress with the others' for the caller's on_progress.
  void report(size_t index, const Progress& progress);
  Status publish_blobs();
  void abandon();

  Cache* cache_ = nullptr;
  std::string path_;
  std::string staging_;
  std::string final_dir_;
  std::string name_;
  std::optional<FileLock> pin_;
  std::optional<FileLock> pulling_;
  std::optional<FileLock> fetching_;
  // Ranged requests in flight across the files, options.connections at most.
  std::unique_ptr<std::counting_semaphore<>> slots_;
  std::vector<std::unique_ptr<Fetch>> fetches_;
  std::map<std::string, std::string> staged_;  // digest → the first relative path with it
  std::function<void(const Progress&)> on_progress_;
  Mutex progress_mu_;
  std::vector<Progress> progress_ FLOTILLA_GUARDED_BY(progress_mu_);  // [fetch]
  bool finished_ = false;
};

class Cache final : public ArtifactCache {
 public:
  Cache(std::string dir, uint64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {}

  Result<std::string> pull(const std::string& uri, const PullOptions& options) override {
    FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<LazyArtifact> artifact, pull_lazy(uri, options));
    return artifact->finish();
  }

  Result<std::unique_ptr<LazyArtifact>> pull_lazy(const std::string& uri,
                                                  const PullOptions& options) override {
    if (!is_url(uri)) {
      std::error_code ec;
      if (!fs::exists(uri, ec)) {
        return not_found("no such file or directory: '" + uri + "'");
      }
      return std::unique_ptr<LazyArtifact>(
          std::make_unique<LazyPull>(fs::absolute(uri).lexically_normal().string(), std::nullopt));
    }
    FLOTILLA_ASSIGN_OR_RETURN(Url url, parse_url(uri));
    return file_name(url) == kManifestName ? pull_manifest(url, options) : pull_file(url, options);
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

  const std::string& dir() const { return dir_; }

  std::string lock_path(const std::string& id, const char* kind) const {
    return dir_ + "/locks/" + id + "." + kind;
  }

  // Down to max_bytes: least recently used artifacts first (skipping any pinned or being
  // pulled), then the blobs no artifact links to. Also removes the staging directories that
  // pulls of dead processes left.
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
      if (name.find(".tmp-") != std::string::npos) {
        fs::remove_all(entry.path(), ec);  // no pull runs, so no staging directory is in use
      } else if (entry.is_directory(ec)) {
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
        continue;  // being pulled or in use right now
      }
      fs::remove_all(dir_ + "/artifacts/" + id, ec);
      spdlog::info("store: evicted {} (cache over {} bytes)", id, max_bytes_);
      remove_unlinked_blobs();
    }
  }

 private:
  // Takes the locks a pull of artifact `id` holds, in this order (every pull takes them so, so
  // none waits on another in a cycle): the shared pulls lock, the artifact's pin, its fetch lock.
  struct PullLocks {
    FileLock pulling;
    FileLock pin;
    FileLock fetching;
  };
  Result<PullLocks> lock_artifact(const std::string& id) {
    FLOTILLA_ASSIGN_OR_RETURN(FileLock pulling, FileLock::take(dir_ + "/locks/pulls", false, true));
    FLOTILLA_ASSIGN_OR_RETURN(FileLock pin, FileLock::take(lock_path(id, "pin"), false, true));
    FLOTILLA_ASSIGN_OR_RETURN(FileLock fetching,
                              FileLock::take(lock_path(id, "fetch"), true, true));
    return PullLocks{std::move(pulling), std::move(pin), std::move(fetching)};
  }

  std::string staging_dir(const std::string& id) {
    static std::atomic<uint64_t> counter{0};
    return dir_ + "/artifacts/" + id + ".tmp-" + std::to_string(::getpid()) + "-" +
           std::to_string(counter++);
  }

  Result<std::unique_ptr<LazyArtifact>> pull_file(const Url& url, const PullOptions& options) {
    const std::string key = url.sha256 ? *url.sha256 : sha256_hex(url.text());
    const std::string id = "f-" + key;
    const std::string name = file_name(url);
    const std::string final_dir = dir_ + "/artifacts/" + id;
    FLOTILLA_ASSIGN_OR_RETURN(PullLocks locks, lock_artifact(id));
    if (fs::exists(final_dir + "/" + name)) {
      touch(final_dir);
      return std::unique_ptr<LazyArtifact>(
          std::make_unique<LazyPull>(final_dir + "/" + name, std::move(locks.pin)));
    }
    auto pull =
        std::make_unique<LazyPull>(*this, staging_dir(id), final_dir, name, std::move(locks.pin),
                                   std::move(locks.pulling), std::move(locks.fetching));
    FLOTILLA_RETURN_IF_ERROR(pull->stage(name, url, url.sha256, key, options));
    return std::unique_ptr<LazyArtifact>(std::move(pull));
  }

  // A directory artifact already in the cache, pinned by the pull's locks; nullptr when absent
  // (the locks are released then).
  Result<std::unique_ptr<LazyArtifact>> cached_directory(const std::string& id) {
    FLOTILLA_ASSIGN_OR_RETURN(PullLocks locks, lock_artifact(id));
    const std::string final_dir = dir_ + "/artifacts/" + id;
    if (!fs::exists(final_dir)) {
      return std::unique_ptr<LazyArtifact>();
    }
    touch(final_dir);
    return std::unique_ptr<LazyArtifact>(
        std::make_unique<LazyPull>(final_dir, std::move(locks.pin)));
  }

  Result<std::unique_ptr<LazyArtifact>> pull_manifest(const Url& url, const PullOptions& options) {
    if (url.sha256) {
      // A pinned manifest names its artifact (m-<its digest>): a cached one needs no request.
      FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<LazyArtifact> cached,
                                cached_directory("m-" + *url.sha256));
      if (cached) {
        return cached;
      }
    }
    std::string body;
    http::BlockingConnection connection(origin_of(url), options.io_timeout);
    constexpr size_t kMaxManifest = 16 << 20;
    FLOTILLA_RETURN_IF_ERROR(connection.get(
        url.target, std::nullopt,
        [&](const http::ResponseHead& head) -> Status {
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
    // The pin vouches for the manifest, and the manifest for every file's digest: checked
    // before any of them is trusted.
    const std::string digest = sha256_hex(body);
    if (url.sha256 && digest != *url.sha256) {
      return Status(StatusCode::kFailedPrecondition,
                    url.text() + ": the manifest does not match its pin: expected sha256 " +
                        *url.sha256 + ", got " + digest + " (" + std::to_string(body.size()) +
                        " bytes); nothing was cached");
    }
    Result<Manifest> manifest = parse_manifest(body);
    if (!manifest.is_ok()) {
      return manifest.status().with_context(url.text());
    }
    const std::string id = "m-" + digest;
    const std::string final_dir = dir_ + "/artifacts/" + id;
    FLOTILLA_ASSIGN_OR_RETURN(PullLocks locks, lock_artifact(id));
    if (fs::exists(final_dir)) {
      touch(final_dir);
      return std::unique_ptr<LazyArtifact>(
          std::make_unique<LazyPull>(final_dir, std::move(locks.pin)));
    }
    auto pull =
        std::make_unique<LazyPull>(*this, staging_dir(id), final_dir, "", std::move(locks.pin),
                                   std::move(locks.pulling), std::move(locks.fetching));
    // Blob locks in digest order, so that two pulls sharing blobs never wait on each other in a
    // cycle.
    std::vector<const ManifestFile*> files;
    for (const ManifestFile& file : manifest->files) {
      files.push_back(&file);
    }
    std::sort(files.begin(), files.end(),
              [](const ManifestFile* a, const ManifestFile* b) { return a->sha256 < b->sha256; });
    const std::string base = url.target.substr(0, url.target.rfind('/') + 1);
    for (const ManifestFile* file : files) {
      Url file_url = url;
      file_url.target = base + url_path(file->path);
      file_url.sha256 = file->sha256;
      FLOTILLA_RETURN_IF_ERROR(
          pull->stage(file->path, file_url, file->sha256, file->sha256, options));
    }
    return std::unique_ptr<LazyArtifact>(std::move(pull));
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

Status LazyPull::link(const std::string& from, const std::string& relative) {
  const fs::path target = fs::path(staging_) / relative;
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  fs::create_hard_link(from, target, ec);
  if (ec) {
    return unavailable("cannot link '" + target.string() + "': " + ec.message());
  }
  return Status::ok();
}

Status LazyPull::stage(const std::string& relative, const Url& url,
                       const std::optional<std::string>& expected, const std::string& key,
                       const PullOptions& options) {
  const std::string& cache_dir = cache_->dir();
  if (expected) {
    if (auto same = staged_.find(*expected); same != staged_.end()) {
      // The same content twice in one manifest: one download (its blob lock is ours already).
      return link(staging_ + "/" + same->second, relative);
    }
    staged_[*expected] = relative;
  }
  auto have_blob = [&] {
    return expected && fs::exists(cache_dir + "/blobs/" + *expected);
  };
  if (have_blob()) {
    return link(cache_dir + "/blobs/" + *expected, relative);
  }
  FLOTILLA_ASSIGN_OR_RETURN(FileLock lock,
                            FileLock::take(cache_->lock_path("blob-" + key, "fetch"), true, true));
  if (have_blob()) {
    return link(cache_dir + "/blobs/" + *expected, relative);  // fetched while this one waited
  }
  const std::string partial = cache_dir + "/partial/" + key;
  // Created here (a resume keeps what it has) so that the staged link and the download share
  // one inode from the start.
  const int fd = ::open(partial.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return unavailable("cannot create '" + partial + "': " + std::strerror(errno));
  }
  ::close(fd);
  FLOTILLA_RETURN_IF_ERROR(link(partial, relative));
  auto fetch =
      std::unique_ptr<Fetch>(new Fetch{(fs::path(staging_) / relative).lexically_normal().string(),
                                       url,
                                       expected,
                                       partial,
                                       std::move(lock),
                                       nullptr,
                                       std::nullopt,
                                       {}});
  PullOptions file_options = options;
  if (options.on_progress) {
    on_progress_ = options.on_progress;
    const size_t index = fetches_.size();
    {
      MutexLock lock(progress_mu_);
      progress_.emplace_back();
    }
    file_options.on_progress = [this, index](const Progress& progress) {
      report(index, progress);
    };
  }
  if (!slots_) {
    slots_ = std::make_unique<std::counting_semaphore<>>(std::max(options.connections, 1));
  }
  fetch->download = std::make_unique<Download>(url, partial, file_options, slots_.get());
  Fetch* raw = fetch.get();
  fetch->thread = std::thread([raw] { raw->result = raw->download->run(); });
  fetches_.push_back(std::move(fetch));
  return Status::ok();
}

void LazyPull::report(size_t index, const Progress& progress) {
  MutexLock lock(progress_mu_);
  progress_[index] = progress;
  Progress total;
  for (const Progress& file : progress_) {
    total.done_bytes += file.done_bytes;
    total.total_bytes += file.total_bytes;
    total.bytes_per_second += file.bytes_per_second;
  }
  on_progress_(total);
}

Status LazyPull::await(const std::string& file, uint64_t offset, uint64_t length) {
  const std::string wanted = fs::path(file).lexically_normal().string();
  for (const auto& fetch : fetches_) {
    if (fetch->path == wanted) {
      return fetch->download->await(offset, length);
    }
  }
  std::error_code ec;
  if (!fs::is_regular_file(wanted, ec)) {
    return not_found("'" + file + "' is not a file of the artifact");
  }
  return Status::ok();  // complete from the start
}

// Renames each verified download to its blob. Every download has ended.
Status LazyPull::publish_blobs() {
  for (const auto& fetch : fetches_) {
    if (!fetch->result->is_ok()) {
      return fetch->result->status();
    }
    const Downloaded& got = fetch->result->value();
    if (fetch->expected && got.sha256 != *fetch->expected) {
      ::unlink(fetch->partial.c_str());
      return Status(StatusCode::kFailedPrecondition,
                    fetch->url.text() + ": content does not match its digest: expected sha256 " +
                        *fetch->expected + ", got " + got.sha256 + " (" + std::to_string(got.size) +
                        " bytes); nothing was cached");
    }
    const std::string blob = cache_->dir() + "/blobs/" + got.sha256;
    if (::rename(fetch->partial.c_str(), blob.c_str()) != 0) {
      const int error = errno;
      ::unlink(fetch->partial.c_str());
      return unavailable("cannot move '" + fetch->partial + "' to '" + blob +
                         "': " + std::strerror(error));
    }
  }
  return Status::ok();
}

Result<std::string> LazyPull::finish() {
  FLOTILLA_CHECK(!finished_);
  finished_ = true;
  if (!cache_) {
    return path_;
  }
  for (const auto& fetch : fetches_) {
    fetch->thread.join();
  }
  if (Status status = publish_blobs(); !status.is_ok()) {
    abandon();
    return status;
  }
  std::error_code ec;
  fs::create_directories(staging_, ec);  // a manifest with no files stages nothing
  if (::rename(staging_.c_str(), final_dir_.c_str()) != 0) {
    const int error = errno;
    fs::remove_all(staging_, ec);
    if (!fs::exists(final_dir_)) {
      return unavailable("cannot publish '" + final_dir_ + "': " + std::strerror(error));
    }
  }
  fetches_.clear();  // releases the blob locks
  fetching_.reset();
  pulling_.reset();
  cache_->trim();  // the pin stays: this artifact is not evicted
  return name_.empty() ? final_dir_ : final_dir_ + "/" + name_;
}

// Stops what still runs and removes the staging directory; partial files stay for a resume.
void LazyPull::abandon() {
  for (const auto& fetch : fetches_) {
    fetch->download->cancel();
  }
  for (const auto& fetch : fetches_) {
    if (fetch->thread.joinable()) {
      fetch->thread.join();
    }
  }
  fetches_.clear();
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

LazyPull::~LazyPull() {
  if (cache_ && !finished_) {
    abandon();
  }
}

}  // namespace

Result<std::unique_ptr<ArtifactCache>> ArtifactCache::open(const std::string& dir,
                                                           uint64_t max_bytes) {
  auto cache = std::make_unique<Cache>(dir, max_bytes);
  FLOTILLA_RETURN_IF_ERROR(cache->make_layout());
  return std::unique_ptr<ArtifactCache>(std::move(cache));
}

}  // namespace flotilla::store

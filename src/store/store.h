// The store module's contract (DESIGN.md §1 "Cold start", §3; issue #6; docs/store.md): model
// artifacts from local paths and http(s):// URLs, fetched in parallel byte ranges into a
// content-addressed cache in the data directory, verified by SHA-256 before use.
//
// A directory artifact over HTTP is described by a manifest (`flotilla artifact pack DIR` writes
// one): JSON {"files": [{"path", "size", "sha256"}]}, paths relative to the manifest's URL.
//
// Thread-safety: an ArtifactCache may be used from any number of threads and processes at once
// (coordination is by file locks in the cache directory); pull() blocks on network and disk.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/common.h"
#include "common/common_sha256.h"
#include "http/http.h"

namespace flotilla::store {

// ---- URLs ------------------------------------------------------------------------------------

struct Url : http::Url {
  std::optional<std::string> sha256;  // from a "#sha256=<64 hex>" fragment: the expected digest
};

// http:// or https:// URLs only, with an optional "#sha256=" fragment; kInvalidArgument naming
// what is wrong.
Result<Url> parse_url(std::string_view text);
bool is_url(std::string_view text);

// ---- Manifests -------------------------------------------------------------------------------

struct ManifestFile {
  std::string path;  // relative, '/'-separated, no "." or ".." parts
  uint64_t size = 0;
  std::string sha256;  // 64 lowercase hex digits
  bool operator==(const ManifestFile&) const = default;
};

struct Manifest {
  std::vector<ManifestFile> files;  // sorted by path
  bool operator==(const Manifest&) const = default;
};

inline constexpr std::string_view kManifestName = "flotilla-manifest.json";

// Refuses absolute paths, "..", ".", empty parts, duplicates, bad digests, with the entry named.
Result<Manifest> parse_manifest(std::string_view json);
std::string manifest_json(const Manifest& manifest);

// Lists every regular file under `dir` (except an existing manifest) with its size and digest,
// and writes DIR/flotilla-manifest.json. Symbolic links and special files are refused.
Result<Manifest> pack_directory(const std::string& dir);

// SHA-256 of a file's contents as 64 lowercase hex digits (of bytes: flotilla::sha256_hex in
// common/common_sha256.h).
Result<std::string> sha256_file(const std::string& path);

// ---- The cache ---------------------------------------------------------------------------------

struct Progress {
  uint64_t done_bytes = 0;   // of the artifact, including what an earlier attempt left
  uint64_t total_bytes = 0;  // 0 while unknown
  double bytes_per_second = 0;
};

struct PullOptions {
  int connections = 8;                           // parallel ranged requests per pull
  uint64_t range_bytes = 4 << 20;                // 4 MiB
  int attempts_per_range = 4;                    // then the download fails
  std::chrono::milliseconds io_timeout{30'000};  // a request that makes no progress this long
  // The artifact's progress (every file being downloaded, summed), called from download
  // threads at most every 200 ms per file and once at the end of each.
  std::function<void(const Progress&)> on_progress;
};

// An artifact being pulled whose files can be read before the pull ends (lazy loading), and a
// pin on it: eviction skips it while this object lives.
class LazyArtifact {
 public:
  virtual ~LazyArtifact() = default;

  // Where the files are, complete or not: a file, or a directory of them. Every file has its
  // final size as soon as await() has returned ok for any part of it. Until finish() the
  // contents are unverified: read them to prepare, not to serve.
  virtual const std::string& path() const = 0;

  // Blocks until bytes [offset, offset + length) of `file` (path() or a file under it; a length
  // past the end means up to the end) are present, fetching them ahead of the background fill.
  // kNotFound for a file the artifact does not have; the download's error if it fails first.
  virtual Status await(const std::string& file, uint64_t offset, uint64_t length) = 0;

  // Waits for every byte, verifies every digest and publishes the artifact in the cache;
  // returns the path pull() would. The files keep their inodes, so open descriptors and
  // mappings of path() stay valid; path() itself may be gone. On failure nothing is published.
  // Call once.
  virtual Result<std::string> finish() = 0;
};

class ArtifactCache {
 public:
  // The cache under `dir` (created if needed): blobs/<sha256> (verified files), artifacts/<id>/
  // (a manifest's files as hard links to blobs), partial/ (downloads in progress, resumable).
  // `max_bytes`: the cache is trimmed to it after each pull, least recently used first, never
  // removing what a pull is using (0: no limit).
  static Result<std::unique_ptr<ArtifactCache>> open(const std::string& dir, uint64_t max_bytes);
  virtual ~ArtifactCache() = default;

  // The local path of the artifact `uri`: a local file or directory as it is; a URL's file (a
  // blob) or, for a manifest URL (".../flotilla-manifest.json"), a directory of its files.
  // Downloads what the cache lacks; concurrent pulls of the same content share one download.
  // Errors name the URL and what failed (unreachable host, HTTP status, digest mismatch,
  // truncated response, a full disk, a bad manifest); nothing partial or unverified is ever
  // placed in blobs/ or artifacts/.
  virtual Result<std::string> pull(const std::string& uri, const PullOptions& options) = 0;

  // The same pull, returned while it runs: what is cached (or local) is complete at once, what
  // is not is fetched in the background, every file of a directory at the same time, with at
  // most options.connections ranged requests in flight across them. Blocks only for the
  // manifest, and while another process downloads the same content.
  virtual Result<std::unique_ptr<LazyArtifact>> pull_lazy(const std::string& uri,
                                                          const PullOptions& options) = 0;

  // Bytes held in blobs/ (artifacts/ only links to them).
  virtual uint64_t size_bytes() = 0;
};

}  // namespace flotilla::store

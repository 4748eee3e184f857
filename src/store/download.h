// One URL into one file: parallel ranged GETs when the server honours Range, else one stream;
// resumable; readable range by range while it runs (lazy loading). Private to the store module.
#pragma once

#include <cstdint>
#include <memory>
#include <semaphore>
#include <string>

#include "common/common.h"
#include "http/http.h"
#include "store/store.h"

namespace flotilla::store {

// The origin a URL's requests go to.
inline http::Origin origin_of(const Url& url) {
  return {url.host, url.port, url.tls};
}

struct Downloaded {
  uint64_t size = 0;
  std::string sha256;
};

class Download {
 public:
  // Downloads `url` into `partial`, resuming the ranges that `partial`.state records as done by
  // an earlier attempt of the same size. With `slots`, each ranged request holds one of them
  // while it runs: downloads that share it (the files of one pull) have at most that many
  // requests in flight together.
  Download(const Url& url, std::string partial, const PullOptions& options,
           std::counting_semaphore<>* slots = nullptr);
  ~Download();
  Download(const Download&) = delete;
  Download& operator=(const Download&) = delete;

  // Fetches the whole file and returns its size and digest; call once. On a network failure the
  // partial file and its state stay, for a later resume; on a local failure (a full disk) or a
  // server that misbehaves (wrong range, size change) they are removed.
  Result<Downloaded> run();

  // From other threads while run() runs: blocks until bytes [offset, offset + length) (clipped
  // to the file's end) are in the partial file, fetching their ranges before any other, and
  // returns the download's error if it fails first. The partial file has its final size once
  // this has returned ok for any range. Over a single stream (a server that ignores Range) it
  // waits for the whole file.
  Status await(uint64_t offset, uint64_t length);

  // Makes run() return soon (within a range), failing with kUnavailable and keeping what arrived
  // for a resume.
  void cancel();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Download(url, partial, options).run().
Result<Downloaded> download(const Url& url, const std::string& partial, const PullOptions& options);

}  // namespace flotilla::store

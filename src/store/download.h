// One URL into one file: parallel ranged GETs when the server honours Range, else one stream;
// resumable. Private to the store module.
#pragma once

#include <cstdint>
#include <string>

#include "common/common.h"
#include "store/store.h"

namespace flotilla::store {

struct Downloaded {
  uint64_t size = 0;
  std::string sha256;
};

// Downloads `url` into `partial`, resuming the ranges that `partial`.state records as done by
// an earlier attempt of the same size, and returns the size and digest of what it wrote. On a
// network failure the partial file and its state stay, for a later resume; on a local failure
// (a full disk) or a server that misbehaves (wrong range, size change) they are removed.
Result<Downloaded> download(const Url& url, const std::string& partial, const PullOptions& options);

}  // namespace flotilla::store

#include <cstddef>
#include <cstdint>
#include <string>

#include "protocol/protocol.h"

// The first byte picks the route: completions or chat completions.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) {
    return 0;
  }
  std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto result = flotilla::protocol::decode_completion_request(body, data[0] & 1);
  if (!result.is_ok() && result.status().code() != flotilla::StatusCode::kInvalidArgument) {
    __builtin_trap();  // decoders only ever reject input as invalid
  }
  return 0;
}

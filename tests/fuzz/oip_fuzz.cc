#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "protocol/protocol.h"

// Each input is decoded twice: as a JSON body, and with its first byte as the length of a JSON
// header followed by binary tensor data (Triton's extension, Inference-Header-Content-Length).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string body(reinterpret_cast<const char*>(data), size);
  auto result = flotilla::protocol::decode_oip_infer_request(body);
  if (!result.is_ok() && result.status().code() != flotilla::StatusCode::kInvalidArgument) {
    __builtin_trap();  // decoders only ever reject input as invalid
  }
  if (size > 0) {
    std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
    auto binary =
        flotilla::protocol::decode_oip_infer_request(rest, std::optional<size_t>(data[0]));
    if (!binary.is_ok() && binary.status().code() != flotilla::StatusCode::kInvalidArgument) {
      __builtin_trap();
    }
  }
  return 0;
}

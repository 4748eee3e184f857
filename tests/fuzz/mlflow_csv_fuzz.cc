#include <cstddef>
#include <cstdint>
#include <string>

#include "protocol/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string body(reinterpret_cast<const char*>(data), size);
  auto result = flotilla::protocol::decode_mlflow_csv(body);
  if (!result.is_ok() && result.status().code() != flotilla::StatusCode::kInvalidArgument) {
    __builtin_trap();  // decoders only ever reject input as invalid
  }
  return 0;
}

// The endpoint spec parser (src/control/spec.cc): YAML or JSON, every field validated. A spec
// that parses must survive its canonical JSON form unchanged (spec.h's promise).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "control/control_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // Half of the inputs with a name from the URL, as PUT .../{name}/config passes it.
  const std::string_view name_from_path = size > 0 && (data[0] & 1) != 0 ? "from-path" : "";
  auto spec = flotilla::control::parse_endpoint_spec(text, name_from_path);
  if (!spec.is_ok()) {
    if (spec.status().code() != flotilla::StatusCode::kInvalidArgument ||
        spec.status().message().empty()) {
      __builtin_trap();  // a bad spec is refused as invalid, saying why
    }
    return 0;
  }
  const std::string canonical = flotilla::control::to_json(*spec).dump();
  auto again = flotilla::control::parse_endpoint_spec(canonical);
  if (!again.is_ok() || !(*again == *spec)) {
    __builtin_trap();
  }
  return 0;
}

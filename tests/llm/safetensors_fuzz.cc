// The safetensors reader (src/llm/safetensors.cc): the 8-byte header length, the JSON header
// and every tensor's dtype, shape and data offsets, checked against the file. The input is the
// whole model.safetensors file.
#include <cstddef>
#include <cstdint>

#include "fuzz_files.h"
#include "llm/safetensors.h"

namespace {

flotilla::fuzz::RemoveAtExit cleanup;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flotilla::fuzz::write_input("model.safetensors", data, size);
  auto set = flotilla::llm::SafetensorsSet::open_directory(flotilla::fuzz::fuzz_dir());
  if (!set.is_ok()) {
    return 0;
  }
  // A tensor the seeds have: when it parsed, its bytes are inside the mapping.
  auto tensor = set->get("w", {2, 2});
  if (tensor.is_ok()) {
    const flotilla::llm::TensorView& view = **tensor;
    volatile float sum = 0;
    for (int64_t i = 0; i < view.elements(); ++i) {
      sum = sum + view.at(i);
    }
  }
  return 0;
}

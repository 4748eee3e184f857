// Loading a Hugging Face tokenizer.json (src/llm/tokenizer_loader.cc): the model, normalizer,
// pre-tokenizer, decoder, post-processor and added tokens. The input is tokenizer.json; what
// loads then encodes and decodes a short text, so that a loaded tokenizer is one that works.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_files.h"
#include "llm/tokenizer.h"

namespace {

flotilla::fuzz::RemoveAtExit cleanup;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flotilla::fuzz::write_input("tokenizer.json", data, size);
  auto tokenizer = flotilla::llm::Tokenizer::load(flotilla::fuzz::fuzz_dir());
  if (!tokenizer.is_ok()) {
    return 0;
  }
  static constexpr std::string_view kText = "Hello wörld!  12 345\n<s> \xff naïve 你好";
  const std::vector<int32_t> ids = (*tokenizer)->encode(kText, /*add_special_tokens=*/true);
  const std::string text = (*tokenizer)->decode(ids, /*skip_special_tokens=*/false);
  (void)(*tokenizer)->decode(ids, /*skip_special_tokens=*/true);
  (void)text;
  return 0;
}

// Unicode Normalization Form C for the tokenizer's "NFC" normalizer. Private to src/llm.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace flotilla::llm::detail {

// Canonical decomposition, canonical ordering and canonical composition (UAX #15) over tables
// generated from Unicode 14.0. The constructor unpacks the tables into hash maps, so a tokenizer
// builds one at load, and only when its tokenizer.json asks for NFC. Immutable afterwards:
// apply() may be called from any number of threads at once.
class NfcNormalizer {
 public:
  NfcNormalizer();
  // The NFC form of `text`, which is valid UTF-8.
  std::string apply(std::string_view text) const;

 private:
  struct CombiningRun {
    char32_t first;
    char32_t last;
    uint8_t combining_class;
  };
  uint8_t combining_class(char32_t cp) const;
  void decompose(char32_t cp, std::vector<char32_t>& out) const;
  std::optional<char32_t> compose(char32_t first, char32_t second) const;

  std::unordered_map<char32_t, std::pair<char32_t, char32_t>> decompositions_;
  std::unordered_map<uint64_t, char32_t> compositions_;
  std::vector<CombiningRun> combining_runs_;
};

}  // namespace flotilla::llm::detail

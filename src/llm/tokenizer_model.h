// The loaded form of a tokenizer.json: the added-token matchers, the normalizer, pre-tokenizer
// and decoder steps, and the BPE model. tokenizer_loader.cc builds it, tokenizer.cc runs it.
// Private to src/llm. Nothing here changes after Tokenizer::load() returns, so concurrent
// encode()/decode() calls share it without locks.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/common.h"
#include "llm/unicode_nfc.h"
#include "llm/utf8.h"

namespace flotilla::llm::detail {

// Heterogeneous lookup, so string_view keys find std::string entries without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// ---------------------------------------------------------------------------------------------
// PCRE2

struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

// A compiled pattern matched in UTF + UCP mode, so \p{L}, \s and \w are Unicode-aware as in the
// Oniguruma engine Hugging Face uses. Immutable; each match call allocates its own match data,
// so concurrent use is safe.
class Regex {
 public:
  static Result<Regex> compile(std::string_view pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      return invalid_argument("regex '" + std::string(pattern) + "' does not compile at offset " +
                              std::to_string(offset) + ": " +
                              reinterpret_cast<const char*>(message.data()));
    }
    // JIT makes pre-tokenization several times faster; where it is unavailable pcre2_match()
    // falls back to the interpreter by itself.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    Regex regex;
    regex.code_.reset(code);
    return regex;
  }

  // Calls on_match(begin, end) for each match in `text` (valid UTF-8), left to right, skipping
  // an empty match right where the previous one ended, as Oniguruma's find_iter does.
  template <typename OnMatch>
  void for_each_match(std::string_view text, OnMatch&& on_match) const {
    std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(pcre2_match_data_create(1, nullptr));
    if (data == nullptr) {
      return;
    }
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t offset = 0;
    std::optional<size_t> last_end;
    while (offset <= text.size()) {
      // Callers pass valid UTF-8 only, so PCRE2 need not re-check the subject on every call
      // (which would make a long text quadratic).
      int rc = pcre2_match(code_.get(), subject, text.size(), offset, PCRE2_NO_UTF_CHECK,
                           data.get(), nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        // The JIT's fixed stack is too small for this subject; the interpreter keeps its
        // backtracking state on the heap.
        rc = pcre2_match(code_.get(), subject, text.size(), offset,
                         PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data.get(), nullptr);
      }
      // No further match, or a resource limit: the rest of the text stays one piece.
      if (rc < 0) {
        return;
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
      const size_t begin = ovector[0];
      const size_t end = ovector[1];
      if (begin == end && last_end == end) {
        if (end >= text.size()) {
          return;
        }
        offset = end + next_code_point(text, end).length;
        continue;
      }
      on_match(begin, end);
      last_end = end;
      offset = end;
    }
  }

  // Whether the pattern matches at exactly `offset`.
  bool matches_at(std::string_view text, size_t offset) const {
    std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(pcre2_match_data_create(1, nullptr));
    return data != nullptr &&
           pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), offset,
                       PCRE2_NO_UTF_CHECK | PCRE2_ANCHORED, data.get(), nullptr) >= 0;
  }

 private:
  Regex() = default;
  std::unique_ptr<pcre2_code, CodeDeleter> code_;
};

// ---------------------------------------------------------------------------------------------
// Pipeline components

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// A run of text: an added token (id >= 0) or text still to tokenize (id < 0).
struct Segment {
  size_t begin;
  size_t end;
  int32_t id;
};

// Finds added tokens the way Hugging Face's AddedVocabulary does: leftmost-longest matches;
// a single_word token only where no word character touches it; lstrip/rstrip widen a match
// over adjacent whitespace. Built at load by add() for each token, then finish(); split() is
// the const part that encoding calls (tokenizer.cc).
class AddedTokenMatcher {
 public:
  void add(std::string text, const AddedToken& token) {
    patterns_.push_back(
        {std::move(text), token.id, token.special, token.single_word, token.lstrip, token.rstrip});
  }

  void finish() {
    for (uint32_t i = 0; i < patterns_.size(); ++i) {
      if (!patterns_[i].text.empty()) {
        by_first_byte_[static_cast<unsigned char>(patterns_[i].text[0])].push_back(i);
      }
    }
    // Longest first, so the first candidate that matches is the longest match.
    for (auto& candidates : by_first_byte_) {
      std::stable_sort(candidates.begin(), candidates.end(), [&](uint32_t a, uint32_t b) {
        return patterns_[a].text.size() > patterns_[b].text.size();
      });
    }
  }

  // Replaces `out` with the segments of `text` (valid UTF-8); only non-empty ones. With
  // `skip_special`, matches of special tokens are dropped and their text stays text.
  void split(std::string_view text, const Regex* word_char, bool skip_special,
             std::vector<Segment>& out) const;

 private:
  struct Pattern {
    std::string text;
    int32_t id;
    bool special;
    bool single_word;
    bool lstrip;
    bool rstrip;
  };
  std::vector<Pattern> patterns_;
  std::array<std::vector<uint32_t>, 256> by_first_byte_;
};

enum class NormalizerKind { kPrepend, kReplace, kNfc, kStrip };

struct NormalizerStep {
  NormalizerKind kind;
  std::string text;            // Prepend: the prefix; Replace: the replacement
  std::string literal;         // Replace with a String pattern
  std::optional<Regex> regex;  // Replace with a Regex pattern
  bool strip_left = false;     // Strip
  bool strip_right = false;    // Strip
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PrependScheme { kAlways, kFirst, kNever };
enum class PreTokenizerKind { kSplit, kByteLevel, kMetaspace };

struct PreTokenizerStep {
  PreTokenizerKind kind;
  std::optional<Regex> regex;  // Split with a Regex pattern, Digits; ByteLevel with use_regex
  std::string literal;         // Split with a String pattern; Metaspace's replacement
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;                          // ByteLevel
  PrependScheme prepend_scheme = PrependScheme::kAlways;  // Metaspace
  bool split = true;                                      // Metaspace
};

struct MergeRule {
  int32_t rank;
  int32_t merged_id;
};

inline uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct BpeModel {
  StringMap vocab;
  std::unordered_map<uint64_t, MergeRule> merges;
  int32_t unk_id = -1;  // -1: no unk_token
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::array<int32_t, 256> byte_ids{};  // ids of <0x00>..<0xFF>; -1 where absent
};

enum class DecoderKind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };

struct DecoderStep {
  DecoderKind kind;
  std::string pattern;  // Replace: the text replaced; Strip: the character; Metaspace: replacement
  std::string content;  // Replace: the replacement
  size_t strip_start = 0;
  size_t strip_stop = 0;
  bool drop_first_replacement = true;  // Metaspace with a prepend scheme other than "never"
};

// ---------------------------------------------------------------------------------------------
// The loaded tokenizer

struct TokenizerModel {
  enum Flag : uint8_t { kKnown = 1, kSpecial = 2 };

  std::vector<NormalizerStep> normalizers;
  std::unique_ptr<const NfcNormalizer> nfc;  // set when a normalizer step is NFC
  std::vector<PreTokenizerStep> pre_tokenizers;
  BpeModel bpe;
  // Absent: no decoder, tokens are joined with spaces (Hugging Face's behaviour).
  std::optional<std::vector<DecoderStep>> decoders;

  std::vector<AddedToken> added_tokens;
  StringMap added_ids;                   // content -> id
  AddedTokenMatcher raw_matcher;         // added tokens with normalized: false
  AddedTokenMatcher normalized_matcher;  // normalized: true, matched in normalized text
  std::optional<Regex> word_char;        // \w, for single_word added tokens
  bool split_special_tokens = false;     // special tokens in text are read as text

  std::vector<std::string> id_to_token;  // by id; added tokens win over the vocabulary
  std::vector<uint8_t> flags;            // Flag bits by id

  std::vector<int32_t> prefix_ids;  // what add_special_tokens puts before the text
  std::vector<int32_t> suffix_ids;  // and after it
  std::optional<int32_t> bos_id;
  std::vector<int32_t> eos_ids;

  std::optional<int32_t> find(std::string_view token) const {
    if (auto it = added_ids.find(token); it != added_ids.end()) {
      return it->second;
    }
    if (auto it = bpe.vocab.find(token); it != bpe.vocab.end()) {
      return it->second;
    }
    return std::nullopt;
  }
};

// The text after the normalizer steps (tokenizer.cc); `text` is valid UTF-8. The loader uses it
// too: normalized added tokens are matched in normalized text, so they are stored normalized.
std::string normalize(const TokenizerModel& model, std::string_view text);

}  // namespace flotilla::llm::detail

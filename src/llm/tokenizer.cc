// Hugging Face tokenizer.json, read into a fixed pipeline that mirrors the `tokenizers` crate:
// added-token split -> normalizer -> pre-tokenizer -> BPE -> post-processor, and ids ->
// tokens -> decoder chain. Everything is built at load and read-only afterwards, so concurrent
// encode()/decode() calls share it without locks; each call owns its working buffers.
#include "llm/tokenizer.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace flotilla::llm {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";  // U+FFFD
// Ids above this are refused at load: a corrupt file must not make us allocate gigabytes.
constexpr int64_t kMaxTokenId = 1 << 24;

// Heterogeneous lookup, so string_view keys find std::string entries without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// ---------------------------------------------------------------------------------------------
// UTF-8

struct CodePoint {
  char32_t value;
  uint32_t length;  // bytes consumed
  bool valid;
};

// Decodes the code point at s[i] (i < s.size()). An invalid or truncated sequence yields U+FFFD
// with the length of its longest valid prefix: the rule of Rust's from_utf8_lossy and Python's
// "replace", so one broken character becomes one U+FFFD as in Hugging Face.
CodePoint next_code_point(std::string_view s, size_t i) {
  const auto lead = static_cast<unsigned char>(s[i]);
  if (lead < 0x80) {
    return {lead, 1, true};
  }
  uint32_t needed = 0;
  char32_t value = 0;
  unsigned char low = 0x80;
  unsigned char high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    needed = 1;
    value = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    needed = 2;
    value = lead & 0x0F;
    low = lead == 0xE0 ? 0xA0 : 0x80;   // no overlong forms
    high = lead == 0xED ? 0x9F : 0xBF;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    needed = 3;
    value = lead & 0x07;
    low = lead == 0xF0 ? 0x90 : 0x80;
    high = lead == 0xF4 ? 0x8F : 0xBF;  // nothing above U+10FFFF
  } else {
    return {0xFFFD, 1, false};
  }
  uint32_t length = 1;
  for (uint32_t k = 0; k < needed; ++k) {
    if (i + length >= s.size()) {
      return {0xFFFD, length, false};
    }
    const auto byte = static_cast<unsigned char>(s[i + length]);
    if (byte < low || byte > high) {
      return {0xFFFD, length, false};
    }
    low = 0x80;
    high = 0xBF;
    value = (value << 6) | (byte & 0x3F);
    ++length;
  }
  return {value, length, true};
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const CodePoint cp = next_code_point(s, i);
    if (!cp.valid) {
      return false;
    }
    i += cp.length;
  }
  return true;
}

// `s` with every invalid sequence replaced by U+FFFD.
std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      out += s[i++];
      continue;
    }
    const CodePoint cp = next_code_point(s, i);
    if (cp.valid) {
      out.append(s.substr(i, cp.length));
    } else {
      out.append(kReplacementUtf8);
    }
    i += cp.length;
  }
  return out;
}

// Start of the character that ends at `end` (> 0) in valid UTF-8.
size_t previous_char_start(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) {
    --i;
  }
  return i;
}

// Rust's char::is_whitespace (Unicode White_Space), which Hugging Face uses for lstrip/rstrip
// and the Strip normalizer.
bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  if (from.empty()) {
    return std::string(s);
  }
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit = s.find(from); hit != std::string_view::npos; hit = s.find(from, pos)) {
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

// GPT-2's reversible map from bytes to printable characters, which byte-level vocabularies are
// written in. A constant table, built once.
struct ByteLevelAlphabet {
  std::array<std::string, 256> byte_to_char;  // UTF-8 of the character standing for each byte
  std::array<int16_t, 324> char_to_byte;      // by code point (all are below U+0144); -1: none
};

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet = [] {
    ByteLevelAlphabet a;
    a.char_to_byte.fill(-1);
    char32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t c = printable ? static_cast<char32_t>(b) : next_extra++;
      append_utf8(a.byte_to_char[b], c);
      a.char_to_byte[c] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return alphabet;
}

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

using Matches = std::vector<std::pair<size_t, size_t>>;

void find_literal(std::string_view text, std::string_view literal, Matches& out) {
  if (literal.empty()) {
    return;
  }
  for (size_t hit = text.find(literal); hit != std::string_view::npos;
       hit = text.find(literal, hit + literal.size())) {
    out.emplace_back(hit, hit + literal.size());
  }
}

// ---------------------------------------------------------------------------------------------
// NFC (the tables and the algorithm are at the end of this file)

class NfcNormalizer {
 public:
  NfcNormalizer();
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
// over adjacent whitespace.
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
             std::vector<Segment>& out) const {
    out.clear();
    size_t done = 0;
    size_t i = 0;
    while (!patterns_.empty() && i < text.size()) {
      const Pattern* hit = nullptr;
      for (uint32_t index : by_first_byte_[static_cast<unsigned char>(text[i])]) {
        if (text.compare(i, patterns_[index].text.size(), patterns_[index].text) == 0) {
          hit = &patterns_[index];
          break;
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      size_t start = i;
      size_t stop = i + hit->text.size();
      const size_t match_end = stop;
      if (hit->special && skip_special) {
        i = match_end;
        continue;
      }
      if (hit->single_word && word_char != nullptr) {
        const bool word_before =
            start > 0 && word_char->matches_at(text, previous_char_start(text, start));
        const bool word_after = stop < text.size() && word_char->matches_at(text, stop);
        if (word_before || word_after) {
          i = match_end;
          continue;
        }
      }
      if (hit->lstrip) {
        while (start > done) {
          const size_t previous = previous_char_start(text, start);
          if (!is_whitespace(next_code_point(text, previous).value)) {
            break;
          }
          start = previous;
        }
      }
      if (hit->rstrip) {
        while (stop < text.size()) {
          const CodePoint cp = next_code_point(text, stop);
          if (!is_whitespace(cp.value)) {
            break;
          }
          stop += cp.length;
        }
      }
      if (start > done) {
        out.push_back({done, start, -1});
      }
      out.push_back({start, stop, hit->id});
      done = stop;
      i = std::max(match_end, stop);
    }
    if (done < text.size()) {
      out.push_back({done, text.size(), -1});
    }
  }

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

// A piece of normalized text; at_start says it begins at offset 0 of the original text, which
// Metaspace's prepend_scheme "first" looks at.
struct Piece {
  std::string text;
  bool at_start;
};

// Cuts `piece` around `matches` (sorted, non-overlapping) as Hugging Face's
// NormalizedString::split does for `behavior`, appending the non-empty parts to `out`.
void split_piece(const Piece& piece, const Matches& matches, SplitBehavior behavior, bool invert,
                 std::vector<Piece>& out) {
  struct Part {
    size_t begin;
    size_t end;
    bool flag;  // "is a match" on the way in, "remove" on the way out
  };
  std::vector<Part> parts;
  size_t pos = 0;
  for (const auto& [begin, end] : matches) {
    if (begin > pos) {
      parts.push_back({pos, begin, invert});
    }
    parts.push_back({begin, end, !invert});
    pos = end;
  }
  if (pos < piece.text.size()) {
    parts.push_back({pos, piece.text.size(), invert});
  }
  std::vector<Part> kept;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      kept = parts;
      break;
    case SplitBehavior::kIsolated:
      for (const Part& p : parts) {
        kept.push_back({p.begin, p.end, false});
      }
      break;
    case SplitBehavior::kContiguous:
      for (const Part& p : parts) {
        if (p.flag == previous_match && !kept.empty()) {
          kept.back().end = p.end;
        } else {
          kept.push_back({p.begin, p.end, false});
        }
        previous_match = p.flag;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.flag && !previous_match && !kept.empty()) {
          kept.back().end = p.end;
        } else {
          kept.push_back({p.begin, p.end, false});
        }
        previous_match = p.flag;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->flag && !previous_match && !kept.empty()) {
          kept.back().begin = it->begin;
        } else {
          kept.push_back({it->begin, it->end, false});
        }
        previous_match = it->flag;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  for (const Part& p : kept) {
    if (!p.flag && p.end > p.begin) {
      out.push_back({piece.text.substr(p.begin, p.end - p.begin), piece.at_start && p.begin == 0});
    }
  }
}

struct MergeRule {
  int32_t rank;
  int32_t merged_id;
};

uint64_t pair_key(int32_t left, int32_t right) {
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

// Per-call working memory of the BPE merge loop.
struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev;  // index of the previous live symbol, -1 at the start
    int32_t next;  // index of the next live symbol, -1 at the end
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged_id;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

// Appends the ids of one pre-tokenized word. Symbols form a linked list and candidate merges
// sit in a heap ordered by (rank, position), so a word of n symbols costs O(n log n); stale
// candidates are recognised when popped, as in Hugging Face's Word::merge_all.
void bpe_encode_word(const BpeModel& model, std::string_view word, BpeScratch& scratch,
                     std::vector<int32_t>& out) {
  if (model.ignore_merges) {
    if (auto it = model.vocab.find(word); it != model.vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  auto& symbols = scratch.symbols;
  symbols.clear();
  auto add = [&](int32_t id) {
    const auto pos = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, pos - 1, pos + 1, true});
  };
  // One symbol per character; a character outside the vocabulary becomes its byte tokens or
  // <unk> (consecutive ones fused when fuse_unk), or is dropped when there is neither, all as
  // BPE::merge_word does.
  int32_t pending_unk = -1;
  for (size_t i = 0; i < word.size();) {
    const size_t length = next_code_point(word, i).length;
    const std::string_view ch = word.substr(i, length);
    i += length;
    if (auto it = model.vocab.find(ch); it != model.vocab.end()) {
      if (pending_unk >= 0) {
        add(pending_unk);
        pending_unk = -1;
      }
      add(it->second);
      continue;
    }
    if (model.byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char b) {
          return model.byte_ids[static_cast<unsigned char>(b)] >= 0;
        })) {
      for (char b : ch) {
        add(model.byte_ids[static_cast<unsigned char>(b)]);
      }
      continue;
    }
    if (model.unk_id >= 0) {
      if (pending_unk >= 0 && !model.fuse_unk) {
        add(pending_unk);
      }
      pending_unk = model.unk_id;
    }
  }
  if (pending_unk >= 0) {
    add(pending_unk);
  }
  if (symbols.empty()) {
    return;
  }
  symbols.back().next = -1;

  auto& heap = scratch.heap;
  heap.clear();
  // std::push_heap keeps the largest on top, so "less" means a worse candidate.
  const auto worse = [](const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  const auto queue = [&](int32_t pos) {
    const auto& left = symbols[pos];
    if (left.next < 0) {
      return;
    }
    auto it = model.merges.find(pair_key(left.id, symbols[left.next].id));
    if (it != model.merges.end()) {
      heap.push_back({it->second.rank, pos, it->second.merged_id});
      std::push_heap(heap.begin(), heap.end(), worse);
    }
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) {
    queue(pos);
  }
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const BpeScratch::Candidate top = heap.back();
    heap.pop_back();
    auto& left = symbols[top.pos];
    if (!left.alive || left.next < 0) {
      continue;
    }
    auto& right = symbols[left.next];
    // The pair at this position may have changed since it was queued.
    auto it = model.merges.find(pair_key(left.id, right.id));
    if (it == model.merges.end() || it->second.merged_id != top.merged_id) {
      continue;
    }
    left.id = top.merged_id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) {
      symbols[left.next].prev = top.pos;
    }
    if (left.prev >= 0) {
      queue(left.prev);
    }
    queue(top.pos);
  }
  for (const auto& symbol : symbols) {
    if (symbol.alive) {
      out.push_back(symbol.id);
    }
  }
}

enum class DecoderKind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };

struct DecoderStep {
  DecoderKind kind;
  std::string pattern;  // Replace: the text replaced; Strip: the character; Metaspace: replacement
  std::string content;  // Replace: the replacement
  size_t strip_start = 0;
  size_t strip_stop = 0;
  bool drop_first_replacement = true;  // Metaspace with a prepend scheme other than "never"
};

// The byte of a "<0xNN>" token.
std::optional<uint8_t> byte_token_value(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') {
    return std::nullopt;
  }
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') {
      return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
      return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
      return c - 'A' + 10;
    }
    return -1;
  };
  const int high = hex(token[3]);
  const int low = hex(token[4]);
  if (high < 0 || low < 0) {
    return std::nullopt;
  }
  return static_cast<uint8_t>(high * 16 + low);
}

// One step of Hugging Face's decode_chain, which maps the list of token strings to a new list.
void run_decoder(const DecoderStep& step, std::vector<std::string>& tokens) {
  switch (step.kind) {
    case DecoderKind::kByteLevel: {
      const ByteLevelAlphabet& alphabet = byte_level_alphabet();
      std::string bytes;
      for (const std::string& token : tokens) {
        // A token with a character outside the alphabet (an added token such as "<｜end｜>")
        // is taken as it is.
        const size_t mark = bytes.size();
        bool mapped = true;
        for (size_t i = 0; i < token.size() && mapped;) {
          const CodePoint cp = next_code_point(token, i);
          i += cp.length;
          const int byte =
              cp.value < alphabet.char_to_byte.size() ? alphabet.char_to_byte[cp.value] : -1;
          mapped = byte >= 0;
          bytes += static_cast<char>(byte);
        }
        if (!mapped) {
          bytes.resize(mark);
          bytes += token;
        }
      }
      tokens.assign(1, to_valid_utf8(bytes));
      break;
    }
    case DecoderKind::kReplace:
      for (std::string& token : tokens) {
        token = replace_all(token, step.pattern, step.content);
      }
      break;
    case DecoderKind::kByteFallback: {
      // Consecutive byte tokens form one string when valid UTF-8, else one U+FFFD per byte.
      std::vector<std::string> out;
      std::string bytes;
      auto flush = [&] {
        if (bytes.empty()) {
          return;
        }
        if (is_valid_utf8(bytes)) {
          out.push_back(bytes);
        } else {
          out.insert(out.end(), bytes.size(), std::string(kReplacementUtf8));
        }
        bytes.clear();
      };
      for (std::string& token : tokens) {
        if (auto byte = byte_token_value(token)) {
          bytes += static_cast<char>(*byte);
          continue;
        }
        flush();
        out.push_back(std::move(token));
      }
      flush();
      tokens = std::move(out);
      break;
    }
    case DecoderKind::kFuse: {
      std::string all;
      for (const std::string& token : tokens) {
        all += token;
      }
      tokens.assign(1, std::move(all));
      break;
    }
    case DecoderKind::kStrip:
      for (std::string& token : tokens) {
        const std::string_view c = step.pattern;
        size_t begin = 0;
        size_t end = token.size();
        for (size_t k = 0; k < step.strip_start && token.compare(begin, c.size(), c) == 0; ++k) {
          begin += c.size();
        }
        for (size_t k = 0; k < step.strip_stop && end >= begin + c.size() &&
                           token.compare(end - c.size(), c.size(), c) == 0;
             ++k) {
          end -= c.size();
        }
        token = token.substr(begin, end - begin);
      }
      break;
    case DecoderKind::kMetaspace:
      // As Hugging Face: in the first token every replacement character goes, not just one.
      for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] =
            replace_all(tokens[i], step.pattern, i == 0 && step.drop_first_replacement ? "" : " ");
      }
      break;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The loaded tokenizer

namespace detail {

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

}  // namespace detail

namespace {

using detail::TokenizerModel;

// ---------------------------------------------------------------------------------------------
// Encoding

struct EncodeScratch {
  std::vector<Segment> segments;
  std::vector<Piece> pieces;
  std::vector<Piece> next_pieces;
  Matches matches;
  BpeScratch bpe;
};

std::string normalize(const TokenizerModel& model, std::string_view text) {
  std::string out(text);
  for (const NormalizerStep& step : model.normalizers) {
    switch (step.kind) {
      case NormalizerKind::kPrepend:
        if (!out.empty()) {
          out.insert(0, step.text);
        }
        break;
      case NormalizerKind::kReplace:
        if (step.regex) {
          std::string replaced;
          size_t pos = 0;
          step.regex->for_each_match(out, [&](size_t begin, size_t end) {
            replaced.append(out, pos, begin - pos);
            replaced += step.text;
            pos = end;
          });
          replaced.append(out, pos);
          out = std::move(replaced);
        } else {
          out = replace_all(out, step.literal, step.text);
        }
        break;
      case NormalizerKind::kNfc:
        out = model.nfc->apply(out);
        break;
      case NormalizerKind::kStrip: {
        size_t begin = 0;
        size_t end = out.size();
        while (step.strip_left && begin < end) {
          const CodePoint cp = next_code_point(out, begin);
          if (!is_whitespace(cp.value)) {
            break;
          }
          begin += cp.length;
        }
        while (step.strip_right && end > begin) {
          const size_t previous = previous_char_start(out, end);
          if (!is_whitespace(next_code_point(out, previous).value)) {
            break;
          }
          end = previous;
        }
        out = out.substr(begin, end - begin);
        break;
      }
    }
  }
  return out;
}

void pre_tokenize(const PreTokenizerStep& step, const Piece& piece, EncodeScratch& scratch,
                  std::vector<Piece>& out) {
  Matches& matches = scratch.matches;
  matches.clear();
  switch (step.kind) {
    case PreTokenizerKind::kSplit:
      if (step.regex) {
        step.regex->for_each_match(
            piece.text, [&](size_t begin, size_t end) { matches.emplace_back(begin, end); });
      } else {
        find_literal(piece.text, step.literal, matches);
      }
      split_piece(piece, matches, step.behavior, step.invert, out);
      break;
    case PreTokenizerKind::kByteLevel: {
      Piece spaced{piece.text, piece.at_start};
      if (step.add_prefix_space && (spaced.text.empty() || spaced.text[0] != ' ')) {
        spaced.text.insert(0, " ");
      }
      const size_t first = out.size();
      if (step.regex) {
        step.regex->for_each_match(
            spaced.text, [&](size_t begin, size_t end) { matches.emplace_back(begin, end); });
        split_piece(spaced, matches, SplitBehavior::kIsolated, false, out);
      } else if (!spaced.text.empty()) {
        out.push_back(std::move(spaced));
      }
      // Then every byte becomes its printable stand-in, the alphabet of the vocabulary.
      const ByteLevelAlphabet& alphabet = byte_level_alphabet();
      for (size_t i = first; i < out.size(); ++i) {
        std::string mapped;
        mapped.reserve(out[i].text.size() * 2);
        for (char b : out[i].text) {
          mapped += alphabet.byte_to_char[static_cast<unsigned char>(b)];
        }
        out[i].text = std::move(mapped);
      }
      break;
    }
    case PreTokenizerKind::kMetaspace: {
      Piece replaced{replace_all(piece.text, " ", step.literal), piece.at_start};
      const bool prepend = step.prepend_scheme == PrependScheme::kAlways ||
                           (step.prepend_scheme == PrependScheme::kFirst && piece.at_start);
      if (prepend && replaced.text.compare(0, step.literal.size(), step.literal) != 0) {
        replaced.text.insert(0, step.literal);
      }
      if (step.split) {
        find_literal(replaced.text, step.literal, matches);
        split_piece(replaced, matches, SplitBehavior::kMergedWithNext, false, out);
      } else if (!replaced.text.empty()) {
        out.push_back(std::move(replaced));
      }
      break;
    }
  }
}

// Tokenizes text that holds no raw added token: normalize, find normalized added tokens, then
// pre-tokenize and BPE each part.
void encode_text(const TokenizerModel& model, std::string_view text, bool at_start,
                 EncodeScratch& scratch, std::vector<int32_t>& ids) {
  const std::string normalized = normalize(model, text);
  model.normalized_matcher.split(normalized, model.word_char ? &*model.word_char : nullptr,
                                 model.split_special_tokens, scratch.segments);
  for (const Segment& segment : scratch.segments) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    scratch.pieces.clear();
    scratch.pieces.push_back({normalized.substr(segment.begin, segment.end - segment.begin),
                              at_start && segment.begin == 0});
    for (const PreTokenizerStep& step : model.pre_tokenizers) {
      scratch.next_pieces.clear();
      for (const Piece& piece : scratch.pieces) {
        pre_tokenize(step, piece, scratch, scratch.next_pieces);
      }
      std::swap(scratch.pieces, scratch.next_pieces);
    }
    for (const Piece& piece : scratch.pieces) {
      bpe_encode_word(model.bpe, piece.text, scratch.bpe, ids);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Loading tokenizer.json

// A nullable string field: nullopt when absent or null. Other types throw json::type_error,
// which load() turns into a Status.
std::optional<std::string> optional_string(const Json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) {
    return std::nullopt;
  }
  return it->get<std::string>();
}

bool bool_or(const Json& object, const char* key, bool fallback) {
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? fallback : it->get<bool>();
}

std::string type_of(const Json& component) {
  auto it = component.find("type");
  return it != component.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// {"String": "..."} or {"Regex": "..."}, the pattern of Split and Replace.
Status load_pattern(const Json& pattern, std::string& literal, std::optional<Regex>& regex,
                    std::string_view where) {
  if (auto text = optional_string(pattern, "String")) {
    literal = *text;
    return Status::ok();
  }
  if (auto text = optional_string(pattern, "Regex")) {
    FLOTILLA_ASSIGN_OR_RETURN(regex, Regex::compile(*text));
    return Status::ok();
  }
  return invalid_argument(std::string(where) + " pattern is neither {\"String\": ...} nor " +
                          "{\"Regex\": ...}");
}

Status load_normalizer(const Json& json, TokenizerModel& model) {
  if (json.is_null()) {
    return Status::ok();
  }
  const std::string type = type_of(json);
  if (type == "Sequence") {
    for (const Json& item : json.at("normalizers")) {
      FLOTILLA_RETURN_IF_ERROR(load_normalizer(item, model));
    }
    return Status::ok();
  }
  NormalizerStep step;
  if (type == "Prepend") {
    step.kind = NormalizerKind::kPrepend;
    step.text = json.at("prepend").get<std::string>();
  } else if (type == "Replace") {
    step.kind = NormalizerKind::kReplace;
    step.text = json.at("content").get<std::string>();
    FLOTILLA_RETURN_IF_ERROR(
        load_pattern(json.at("pattern"), step.literal, step.regex, "normalizer Replace"));
  } else if (type == "NFC") {
    step.kind = NormalizerKind::kNfc;
    if (model.nfc == nullptr) {
      model.nfc = std::make_unique<const NfcNormalizer>();
    }
  } else if (type == "Strip") {
    step.kind = NormalizerKind::kStrip;
    step.strip_left = bool_or(json, "strip_left", true);
    step.strip_right = bool_or(json, "strip_right", true);
  } else {
    return invalid_argument("normalizer '" + type +
                            "' is not supported (supported: Sequence, Prepend, Replace, NFC, "
                            "Strip)");
  }
  model.normalizers.push_back(std::move(step));
  return Status::ok();
}

Result<PrependScheme> load_prepend_scheme(const Json& json) {
  if (auto scheme = optional_string(json, "prepend_scheme")) {
    if (*scheme == "always") {
      return PrependScheme::kAlways;
    }
    if (*scheme == "first") {
      return PrependScheme::kFirst;
    }
    if (*scheme == "never") {
      return PrependScheme::kNever;
    }
    return invalid_argument("Metaspace prepend_scheme '" + *scheme + "' is unknown");
  }
  // Files written before prepend_scheme existed say add_prefix_space.
  return bool_or(json, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

Status load_pre_tokenizer(const Json& json, TokenizerModel& model) {
  if (json.is_null()) {
    return Status::ok();
  }
  const std::string type = type_of(json);
  if (type == "Sequence") {
    for (const Json& item : json.at("pretokenizers")) {
      FLOTILLA_RETURN_IF_ERROR(load_pre_tokenizer(item, model));
    }
    return Status::ok();
  }
  PreTokenizerStep step;
  if (type == "Split") {
    step.kind = PreTokenizerKind::kSplit;
    FLOTILLA_RETURN_IF_ERROR(
        load_pattern(json.at("pattern"), step.literal, step.regex, "pre-tokenizer Split"));
    const std::string behavior = json.at("behavior").get<std::string>();
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    auto it = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                           [&](const auto& known) { return behavior == known.first; });
    if (it == std::end(kBehaviors)) {
      return invalid_argument("pre-tokenizer Split behavior '" + behavior + "' is unknown");
    }
    step.behavior = it->second;
    step.invert = bool_or(json, "invert", false);
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerKind::kByteLevel;
    step.add_prefix_space = bool_or(json, "add_prefix_space", true);
    if (bool_or(json, "use_regex", true)) {
      FLOTILLA_ASSIGN_OR_RETURN(step.regex,
                                Regex::compile("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| "
                                               "?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"));
    }
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerKind::kMetaspace;
    step.literal = optional_string(json, "replacement").value_or("\xE2\x96\x81");
    FLOTILLA_ASSIGN_OR_RETURN(step.prepend_scheme, load_prepend_scheme(json));
    step.split = bool_or(json, "split", true);
  } else if (type == "Digits") {
    // Rust's char::is_numeric is \p{N}; runs of digits stay together unless individual_digits.
    step.kind = PreTokenizerKind::kSplit;
    const bool individual = bool_or(json, "individual_digits", false);
    FLOTILLA_ASSIGN_OR_RETURN(step.regex, Regex::compile(individual ? "\\p{N}" : "\\p{N}+"));
  } else {
    return invalid_argument("pre-tokenizer '" + type +
                            "' is not supported (supported: Sequence, Split, ByteLevel, "
                            "Metaspace, Digits)");
  }
  model.pre_tokenizers.push_back(std::move(step));
  return Status::ok();
}

Status load_decoder(const Json& json, std::vector<DecoderStep>& steps) {
  const std::string type = type_of(json);
  if (type == "Sequence") {
    for (const Json& item : json.at("decoders")) {
      FLOTILLA_RETURN_IF_ERROR(load_decoder(item, steps));
    }
    return Status::ok();
  }
  DecoderStep step;
  if (type == "ByteLevel") {
    step.kind = DecoderKind::kByteLevel;
  } else if (type == "Replace") {
    step.kind = DecoderKind::kReplace;
    std::optional<Regex> regex;
    FLOTILLA_RETURN_IF_ERROR(
        load_pattern(json.at("pattern"), step.pattern, regex, "decoder Replace"));
    if (regex) {
      return invalid_argument("decoder Replace with a Regex pattern is not supported");
    }
    step.content = json.at("content").get<std::string>();
  } else if (type == "ByteFallback") {
    step.kind = DecoderKind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderKind::kFuse;
  } else if (type == "Strip") {
    step.kind = DecoderKind::kStrip;
    step.pattern = json.at("content").get<std::string>();
    step.strip_start = json.value("start", size_t{0});
    step.strip_stop = json.value("stop", size_t{0});
  } else if (type == "Metaspace") {
    step.kind = DecoderKind::kMetaspace;
    step.pattern = optional_string(json, "replacement").value_or("\xE2\x96\x81");
    FLOTILLA_ASSIGN_OR_RETURN(PrependScheme scheme, load_prepend_scheme(json));
    step.drop_first_replacement = scheme != PrependScheme::kNever;
  } else {
    return invalid_argument("decoder '" + type +
                            "' is not supported (supported: Sequence, ByteLevel, Replace, "
                            "ByteFallback, Fuse, Strip, Metaspace)");
  }
  steps.push_back(std::move(step));
  return Status::ok();
}

// The special tokens add_special_tokens puts around a single sequence.
Status load_post_processor(const Json& json, std::vector<int32_t>& prefix,
                           std::vector<int32_t>& suffix) {
  if (json.is_null()) {
    return Status::ok();
  }
  const std::string type = type_of(json);
  if (type == "Sequence") {
    for (const Json& item : json.at("processors")) {
      FLOTILLA_RETURN_IF_ERROR(load_post_processor(item, prefix, suffix));
    }
    return Status::ok();
  }
  if (type == "ByteLevel") {
    return Status::ok();  // it only trims offsets
  }
  if (type == "TemplateProcessing") {
    bool seen_sequence = false;
    for (const Json& item : json.at("single")) {
      if (item.contains("Sequence")) {
        if (seen_sequence) {
          return invalid_argument("TemplateProcessing single template has two sequences");
        }
        seen_sequence = true;
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      const Json& special = json.at("special_tokens");
      if (!special.contains(name)) {
        return invalid_argument("TemplateProcessing names special token '" + name +
                                "' that its special_tokens do not define");
      }
      for (const Json& id : special.at(name).at("ids")) {
        (seen_sequence ? suffix : prefix).push_back(id.get<int32_t>());
      }
    }
    if (!seen_sequence) {
      return invalid_argument("TemplateProcessing single template has no sequence ($A)");
    }
    return Status::ok();
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    prefix.push_back(json.at("cls").at(1).get<int32_t>());
    suffix.push_back(json.at("sep").at(1).get<int32_t>());
    return Status::ok();
  }
  return invalid_argument("post_processor '" + type +
                          "' is not supported (supported: Sequence, ByteLevel, "
                          "TemplateProcessing, RobertaProcessing, BertProcessing)");
}

Status load_bpe(const Json& json, TokenizerModel& model) {
  if (!json.is_object()) {
    return invalid_argument("\"model\" is missing or not an object");
  }
  const std::string type = type_of(json);
  if (!type.empty() && type != "BPE") {
    return invalid_argument("model type '" + type + "' is not supported (only BPE)");
  }
  if (auto dropout = json.find("dropout");
      dropout != json.end() && !dropout->is_null() && dropout->get<double>() > 0) {
    return invalid_argument("BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!optional_string(json, key).value_or("").empty()) {
      return invalid_argument(std::string("BPE ") + key + " is not supported");
    }
  }
  BpeModel& bpe = model.bpe;
  auto vocab = json.find("vocab");
  if (vocab == json.end() || !vocab->is_object()) {
    return invalid_argument("model.vocab is missing or not an object");
  }
  bpe.vocab.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    const int64_t value = id.get<int64_t>();
    if (value < 0 || value >= kMaxTokenId) {
      return invalid_argument("vocab token '" + token + "' has id " + std::to_string(value) +
                              ", out of range");
    }
    bpe.vocab.emplace(token, static_cast<int32_t>(value));
  }
  auto merges = json.find("merges");
  if (merges == json.end() || !merges->is_array()) {
    return invalid_argument("model.merges is missing or not an array");
  }
  bpe.merges.reserve(merges->size());
  int32_t rank = 0;
  for (const Json& merge : *merges) {
    // "a b" in older files, ["a", "b"] since tokens may hold spaces.
    std::string left;
    std::string right;
    if (merge.is_string()) {
      const std::string& text = merge.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        return invalid_argument("merge #" + std::to_string(rank) + " '" + text +
                                "' is not two tokens separated by one space");
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return invalid_argument("merge #" + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
    }
    for (const std::string* token : {&left, &right}) {
      if (!bpe.vocab.contains(*token)) {
        return invalid_argument("merge #" + std::to_string(rank) + " names token '" + *token +
                                "', which is not in the vocabulary");
      }
    }
    auto merged = bpe.vocab.find(left + right);
    if (merged == bpe.vocab.end()) {
      return invalid_argument("merge #" + std::to_string(rank) + " makes '" + left + right +
                              "', which is not in the vocabulary");
    }
    // A repeated pair takes its last rank, as Hugging Face's map does.
    bpe.merges.insert_or_assign(pair_key(bpe.vocab.at(left), bpe.vocab.at(right)),
                                MergeRule{rank, merged->second});
    ++rank;
  }
  bpe.fuse_unk = bool_or(json, "fuse_unk", false);
  bpe.byte_fallback = bool_or(json, "byte_fallback", false);
  bpe.ignore_merges = bool_or(json, "ignore_merges", false);
  for (int b = 0; b < 256; ++b) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    const std::string name = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
    auto it = bpe.vocab.find(name);
    bpe.byte_ids[b] = it == bpe.vocab.end() ? -1 : it->second;
  }
  return Status::ok();
}

Status load_added_tokens(const Json& json, TokenizerModel& model) {
  if (json.is_null()) {
    return Status::ok();
  }
  for (const Json& item : json) {
    AddedToken token;
    token.content = item.at("content").get<std::string>();
    const int64_t id = item.at("id").get<int64_t>();
    if (id < 0 || id >= kMaxTokenId) {
      return invalid_argument("added token '" + token.content + "' has id " + std::to_string(id) +
                              ", out of range");
    }
    token.id = static_cast<int32_t>(id);
    token.special = bool_or(item, "special", false);
    token.single_word = bool_or(item, "single_word", false);
    token.lstrip = bool_or(item, "lstrip", false);
    token.rstrip = bool_or(item, "rstrip", false);
    token.normalized = bool_or(item, "normalized", !token.special);
    if (token.content.empty()) {
      continue;  // Hugging Face ignores these too
    }
    model.added_ids.insert_or_assign(token.content, token.id);
    model.added_tokens.push_back(std::move(token));
  }
  bool single_word = false;
  for (const AddedToken& token : model.added_tokens) {
    single_word = single_word || token.single_word;
    if (token.normalized) {
      // Normalized tokens are looked for in normalized text, so in their normalized form.
      model.normalized_matcher.add(normalize(model, token.content), token);
    } else {
      model.raw_matcher.add(token.content, token);
    }
  }
  model.raw_matcher.finish();
  model.normalized_matcher.finish();
  if (single_word) {
    FLOTILLA_ASSIGN_OR_RETURN(model.word_char, Regex::compile("\\w"));
  }
  return Status::ok();
}

void build_id_table(TokenizerModel& model) {
  size_t size = 0;
  for (const auto& [token, id] : model.bpe.vocab) {
    size = std::max(size, static_cast<size_t>(id) + 1);
  }
  for (const AddedToken& token : model.added_tokens) {
    size = std::max(size, static_cast<size_t>(token.id) + 1);
  }
  model.id_to_token.assign(size, std::string());
  model.flags.assign(size, 0);
  for (const auto& [token, id] : model.bpe.vocab) {
    model.id_to_token[id] = token;
    model.flags[id] = TokenizerModel::kKnown;
  }
  for (const AddedToken& token : model.added_tokens) {
    model.id_to_token[token.id] = token.content;
    model.flags[token.id] = static_cast<uint8_t>(TokenizerModel::kKnown |
                                                 (token.special ? TokenizerModel::kSpecial : 0));
  }
}

Status load_tokenizer_json(const Json& root, TokenizerModel& model) {
  if (!root.is_object()) {
    return invalid_argument("the top level is not a JSON object");
  }
  // The normalizer comes first: normalized added tokens are stored in normalized form.
  FLOTILLA_RETURN_IF_ERROR(load_normalizer(root.value("normalizer", Json()), model));
  FLOTILLA_RETURN_IF_ERROR(load_pre_tokenizer(root.value("pre_tokenizer", Json()), model));
  FLOTILLA_RETURN_IF_ERROR(load_bpe(root.value("model", Json()), model));
  if (auto unk = optional_string(root.at("model"), "unk_token")) {
    auto it = model.bpe.vocab.find(*unk);
    if (it == model.bpe.vocab.end()) {
      return invalid_argument("unk_token '" + *unk + "' is not in the vocabulary");
    }
    model.bpe.unk_id = it->second;
  }
  FLOTILLA_RETURN_IF_ERROR(load_added_tokens(root.value("added_tokens", Json()), model));
  const Json decoder = root.value("decoder", Json());
  if (!decoder.is_null()) {
    model.decoders.emplace();
    FLOTILLA_RETURN_IF_ERROR(load_decoder(decoder, *model.decoders));
  }
  FLOTILLA_RETURN_IF_ERROR(load_post_processor(root.value("post_processor", Json()),
                                               model.prefix_ids, model.suffix_ids));
  build_id_table(model);
  if (!model.prefix_ids.empty()) {
    model.bos_id = model.prefix_ids.front();
  }
  for (const std::vector<int32_t>* ids : {&model.prefix_ids, &model.suffix_ids}) {
    for (int32_t id : *ids) {
      if (id < 0 || static_cast<size_t>(id) >= model.id_to_token.size()) {
        return invalid_argument("post_processor adds id " + std::to_string(id) +
                                ", which is not in the vocabulary");
      }
    }
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Loading the optional configuration files

Result<Json> read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return invalid_argument("cannot read '" + path.string() + "'");
  }
  const std::string data{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  try {
    return Json::parse(data);
  } catch (const Json::exception& e) {
    return invalid_argument("'" + path.string() + "' is not valid JSON: " + e.what());
  }
}

// bos_token / eos_token: a string, an AddedToken object {"content": ...}, or null.
std::optional<std::string> config_token(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    return std::nullopt;
  }
  if (it->is_object()) {
    return it->at("content").get<std::string>();
  }
  return it->get<std::string>();
}

Result<int32_t> config_token_id(const TokenizerModel& model, const std::string& token,
                                const char* key) {
  if (auto id = model.find(token)) {
    return *id;
  }
  return invalid_argument(std::string(key) + " '" + token + "' is not in the vocabulary");
}

// tokenizer_config.json: special tokens and the chat template. A missing file is fine.
Status load_tokenizer_config(const Json& config, TokenizerModel& model,
                             std::string& template_source, detail::ChatTemplate& chat) {
  if (!config.is_object()) {
    return invalid_argument("the top level is not a JSON object");
  }
  const std::optional<std::string> bos = config_token(config, "bos_token");
  const std::optional<std::string> eos = config_token(config, "eos_token");
  if (config.contains("bos_token")) {
    model.bos_id.reset();
    if (bos) {
      FLOTILLA_ASSIGN_OR_RETURN(model.bos_id, config_token_id(model, *bos, "bos_token"));
    }
  }
  if (eos) {
    FLOTILLA_ASSIGN_OR_RETURN(int32_t eos_id, config_token_id(model, *eos, "eos_token"));
    model.eos_ids.push_back(eos_id);
  }
  // As transformers' LlamaTokenizerFast: these flags, where present, replace what the
  // post_processor adds (defaults: BOS yes, EOS no).
  if (config.contains("add_bos_token") || config.contains("add_eos_token")) {
    model.prefix_ids.clear();
    model.suffix_ids.clear();
    if (bool_or(config, "add_bos_token", true)) {
      if (!model.bos_id) {
        return invalid_argument("add_bos_token is true but there is no bos_token");
      }
      model.prefix_ids.push_back(*model.bos_id);
    }
    if (bool_or(config, "add_eos_token", false)) {
      if (model.eos_ids.empty()) {
        return invalid_argument("add_eos_token is true but there is no eos_token");
      }
      model.suffix_ids.push_back(model.eos_ids.front());
    }
  }
  // transformers' split_special_tokens: special tokens typed by a user stay plain text.
  model.split_special_tokens = bool_or(config, "split_special_tokens", false);
  auto source = config.find("chat_template");
  if (source != config.end() && source->is_string()) {
    template_source = source->get<std::string>();
  } else if (source != config.end() && source->is_array()) {
    // Named templates: [{"name": "default", "template": ...}, {"name": "tool_use", ...}].
    for (const Json& named : *source) {
      if (template_source.empty() || named.value("name", "") == "default") {
        template_source = named.at("template").get<std::string>();
      }
    }
  }
  chat.bos_token = bos.value_or("");
  chat.eos_token = eos.value_or("");
  return Status::ok();
}

// generation_config.json's eos_token_id: one id or a list (Llama 3.1 lists three).
Status load_generation_config(const Json& config, TokenizerModel& model) {
  auto eos = config.find("eos_token_id");
  if (eos == config.end() || eos->is_null()) {
    return Status::ok();
  }
  std::vector<int64_t> ids;
  if (eos->is_array()) {
    ids = eos->get<std::vector<int64_t>>();
  } else {
    ids.push_back(eos->get<int64_t>());
  }
  for (int64_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= model.id_to_token.size()) {
      return invalid_argument("eos_token_id " + std::to_string(id) + " is not in the vocabulary");
    }
    model.eos_ids.push_back(static_cast<int32_t>(id));
  }
  return Status::ok();
}

// Completes eos_ids: the chat family's end-of-turn token ends a reply even where the config
// names another EOS (a base model's config with an instruct template); with no EOS named at all,
// the conventional names, so generation can still stop. Duplicates go.
void settle_eos_ids(ChatTemplateFamily family, TokenizerModel& model) {
  const char* end_of_turn = family == ChatTemplateFamily::kChatMl   ? "<|im_end|>"
                            : family == ChatTemplateFamily::kLlama3 ? "<|eot_id|>"
                                                                    : nullptr;
  if (end_of_turn != nullptr) {
    if (auto id = model.find(end_of_turn)) {
      model.eos_ids.push_back(*id);
    }
  }
  if (model.eos_ids.empty()) {
    for (const char* name : {"</s>", "<|end_of_text|>", "<|endoftext|>"}) {
      if (auto it = model.added_ids.find(name); it != model.added_ids.end()) {
        model.eos_ids.push_back(it->second);
        break;
      }
    }
  }
  std::vector<int32_t> unique;
  for (int32_t id : model.eos_ids) {
    if (std::find(unique.begin(), unique.end(), id) == unique.end()) {
      unique.push_back(id);
    }
  }
  model.eos_ids = std::move(unique);
}

// Loads a JSON file through `load` if it exists, naming the file in any error.
template <typename Load>
Status load_json_if_present(const std::filesystem::path& path, Load&& load) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    return Status::ok();
  }
  FLOTILLA_ASSIGN_OR_RETURN(Json json, read_json_file(path));
  try {
    return load(json).with_context("'" + path.string() + "'");
  } catch (const Json::exception& e) {
    return invalid_argument("'" + path.string() + "': " + e.what());
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Tokenizer

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  const fs::path tokenizer_path = dir / "tokenizer.json";
  std::error_code error;
  if (!fs::is_regular_file(tokenizer_path, error)) {
    return not_found("no tokenizer.json in '" + model_dir + "'");
  }
  auto model = std::make_unique<detail::TokenizerModel>();
  std::string template_source;
  detail::ChatTemplate chat;
  FLOTILLA_RETURN_IF_ERROR(load_json_if_present(
      tokenizer_path, [&](const Json& json) { return load_tokenizer_json(json, *model); }));
  FLOTILLA_RETURN_IF_ERROR(
      load_json_if_present(dir / "tokenizer_config.json", [&](const Json& json) {
        return load_tokenizer_config(json, *model, template_source, chat);
      }));
  FLOTILLA_RETURN_IF_ERROR(
      load_json_if_present(dir / "generation_config.json",
                           [&](const Json& json) { return load_generation_config(json, *model); }));
  if (template_source.empty()) {
    // transformers 4.43+ saves the template beside the config.
    std::ifstream in(dir / "chat_template.jinja", std::ios::binary);
    template_source.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  if (!template_source.empty()) {
    const std::string bos = chat.bos_token;
    const std::string eos = chat.eos_token;
    chat = detail::detect_chat_template(template_source);
    chat.bos_token = bos;
    chat.eos_token = eos;
  }
  settle_eos_ids(chat.family, *model);
  // Templates write BOS/EOS by name; fill in the family's usual ones if the config has none.
  if (chat.bos_token.empty() && chat.family == ChatTemplateFamily::kLlama3) {
    chat.bos_token = "<|begin_of_text|>";
  }
  if (chat.family == ChatTemplateFamily::kLlama2 || chat.family == ChatTemplateFamily::kMistral) {
    chat.bos_token = chat.bos_token.empty() ? "<s>" : chat.bos_token;
    chat.eos_token = chat.eos_token.empty() ? "</s>" : chat.eos_token;
  }

  auto tokenizer = std::unique_ptr<Tokenizer>(new Tokenizer());
  tokenizer->model_ = std::move(model);
  tokenizer->chat_ = std::move(chat);
  return tokenizer;
}

std::vector<int32_t> Tokenizer::encode(std::string_view input, bool add_special_tokens) const {
  const detail::TokenizerModel& model = *model_;
  std::string repaired;
  std::string_view text = input;
  if (!is_valid_utf8(input)) {
    repaired = to_valid_utf8(input);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) {
    ids = model.prefix_ids;
  }
  EncodeScratch scratch;
  std::vector<Segment> segments;
  model.raw_matcher.split(text, model.word_char ? &*model.word_char : nullptr,
                          model.split_special_tokens, segments);
  for (const Segment& segment : segments) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
    } else {
      encode_text(model, text.substr(segment.begin, segment.end - segment.begin),
                  segment.begin == 0, scratch, ids);
    }
  }
  if (add_special_tokens) {
    ids.insert(ids.end(), model.suffix_ids.begin(), model.suffix_ids.end());
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const detail::TokenizerModel& model = *model_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= model.flags.size()) {
      continue;
    }
    const uint8_t flags = model.flags[id];
    if ((flags & detail::TokenizerModel::kKnown) == 0 ||
        (skip_special_tokens && (flags & detail::TokenizerModel::kSpecial) != 0)) {
      continue;
    }
    tokens.push_back(model.id_to_token[id]);
  }
  std::string text;
  if (!model.decoders) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      text += i == 0 ? "" : " ";
      text += tokens[i];
    }
  } else {
    for (const DecoderStep& step : *model.decoders) {
      run_decoder(step, tokens);
    }
    for (const std::string& token : tokens) {
      text += token;
    }
  }
  return is_valid_utf8(text) ? text : to_valid_utf8(text);
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(model_->id_to_token.size());
}

std::optional<int32_t> Tokenizer::bos_id() const {
  return model_->bos_id;
}

std::vector<int32_t> Tokenizer::eos_ids() const {
  return model_->eos_ids;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  return model_->find(token);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < model_->flags.size() &&
         (model_->flags[id] & detail::TokenizerModel::kSpecial) != 0;
}

// ---------------------------------------------------------------------------------------------
// StreamDecoder
//
// Invariant: window_ = context tokens (the last emitted piece, or everything since the start)
// followed by pending_ tokens whose text has not been returned yet, and prefix_ is decode() of
// the context alone. Because the context ends where the text was complete, and holds a token
// that produced text, decode(window_) == prefix_ + (the pending tokens' text as it appears in
// the full decode), whichever start-of-text rule (Strip, Metaspace) the decoder applies.

namespace {
// An incomplete UTF-8 character spans at most 3 tokens, so after this many pushes in a row that
// leave a trailing U+FFFD, it is a real one (the model wrote invalid bytes or U+FFFD itself).
constexpr size_t kMaxHeldPushes = 8;
}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  // decode() drops these anyway; keeping them out keeps the window small.
  if (id < 0 || id >= tokenizer_.vocab_size() ||
      (skip_special_tokens_ && tokenizer_.is_special(id))) {
    return {};
  }
  window_.push_back(id);
  ++pending_;
  const std::string text = tokenizer_.decode(window_, skip_special_tokens_);
  // A trailing U+FFFD is usually a character whose remaining bytes are still to come.
  if (!std::string_view(text).ends_with(kReplacementUtf8)) {
    held_pushes_ = 0;
  } else if (++held_pushes_ < kMaxHeldPushes) {
    return {};
  }
  std::string piece = text_after_prefix(text);
  if (piece.empty()) {
    // Nothing to show yet (a token with empty text): keep the old context, which has text.
    return piece;
  }
  window_.erase(window_.begin(), window_.end() - static_cast<std::ptrdiff_t>(pending_));
  pending_ = 0;
  prefix_ = tokenizer_.decode(window_, skip_special_tokens_);
  return piece;
}

std::string StreamDecoder::finish() {
  std::string piece;
  if (pending_ > 0) {
    piece = text_after_prefix(tokenizer_.decode(window_, skip_special_tokens_));
  }
  window_.clear();
  pending_ = 0;
  held_pushes_ = 0;
  prefix_.clear();
  return piece;
}

std::string StreamDecoder::text_after_prefix(const std::string& text) const {
  if (text.compare(0, prefix_.size(), prefix_) == 0) {
    return text.substr(prefix_.size());
  }
  // The context reads differently now, which happens only when the model produced invalid
  // UTF-8 (a byte group that was valid became invalid). Text already returned cannot be taken
  // back, so continue after the same number of bytes, at a character boundary.
  size_t start = std::min(prefix_.size(), text.size());
  while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
    ++start;
  }
  return text.substr(start);
}

// ---------------------------------------------------------------------------------------------
// NFC: canonical decomposition, canonical ordering, canonical composition (UAX #15), with
// Hangul syllables computed rather than tabled.

namespace {

// Generated from Python 3.11's unicodedata (Unicode 14.0):
//   kNfcComposing: (composite, first, second) for every primary composite;
//   kNfcDecomposingOnly: canonical decompositions that NFC never recomposes (singletons,
//     composition exclusions), second = 0 for a singleton;
//   kNfcCombiningClasses: (first, last, class) runs of non-zero canonical combining class.
// Each number is written in base 64 with the digits below, code points in 3 digits and classes
// in 2. To regenerate, for cp in 0..0x10FFFF take unicodedata.decomposition(chr(cp)) without a
// <tag>; a 2-code-point one composes iff unicodedata.normalize("NFC", chr(cp)) == chr(cp).
constexpr std::string_view kBase64Digits =
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz+/";

constexpr std::string_view kNfcComposing =
    "0300110C00310110C10320110C20330110C30340110C80350110CA0370130Cd0380150C00390150C1"
    "03A0150C203B0150C803C0190C003D0190C103E0190C203F0190C803H01E0C303I01F0C003J01F0C1"
    "03K01F0C203L01F0C303M01F0C803P01L0C003Q01L0C103R01L0C203S01L0C803T01P0C103W01X0C0"
    "03X01X0C103Y01X0C203Z01X0C303a01X0C803b01X0CA03d01Z0Cd03e01b0C003f01b0C103g01b0C2"
    "03h01b0C803i01f0C003j01f0C103k01f0C203l01f0C803n01k0C303o01l0C003p01l0C103q01l0C2"
    "03r01l0C303s01l0C803v01r0C003w01r0C103x01r0C203y01r0C803z01v0C103/01v0C80400110C4"
    "04101X0C40420110C604301X0C60440110Ce04501X0Ce0460130C104701Z0C10480130C204901Z0C2"
    "04A0130C704B01Z0C704C0130CC04D01Z0CC04E0140CC04F01a0CC04I0150C404J01b0C404K0150C6"
    "04L01b0C604M0150C704N01b0C704O0150Ce04P01b0Ce04Q0150CC04R01b0CC04S0170C204T01d0C2"
    "04U0170C604V01d0C604W0170C704X01d0C704Y0170Cd04Z01d0Cd04a0180C204b01e0C204e0190C3"
    "04f01f0C304g0190C404h01f0C404i0190C604j01f0C604k0190Ce04l01f0Ce04m0190C704q01A0C2"
    "04r01g0C204s01B0Cd04t01h0Cd04v01C0C104w01i0C104x01C0Cd04y01i0Cd04z01C0CC04+01i0CC"
    "05301E0C105401k0C105501E0Cd05601k0Cd05701E0CC05801k0CC05C01F0C405D01l0C405E01F0C6"
    "05F01l0C605G01F0CB05H01l0CB05K01I0C105L01o0C105M01I0Cd05N01o0Cd05O01I0CC05P01o0CC"
    "05Q01J0C105R01p0C105S01J0C205T01p0C205U01J0Cd05V01p0Cd05W01J0CC05X01p0CC05Y01K0Cd"
    "05Z01q0Cd05a01K0CC05b01q0CC05e01L0C305f01r0C305g01L0C405h01r0C405i01L0C605j01r0C6"
    "05k01L0CA05l01r0CA05m01L0CB05n01r0CB05o01L0Ce05p01r0Ce05q01N0C205r01t0C205s01P0C2"
    "05t01v0C205u01P0C805v01Q0C105w01w0C105x01Q0C705y01w0C705z01Q0CC05+01w0CC06W01F0CR"
    "06X01l0CR06l01L0CR06m01r0CR07D0110CC07E01X0CC07F0190CC07G01f0CC07H01F0CC07I01l0CC"
    "07J01L0CC07K01r0CC07L03S0C407M03y0C407N03S0C107O03y0C107P03S0CC07Q03y0CC07R03S0C0"
    "07S03y0C007U0340C407V03a0C407W08c0C407X08d0C407Y0360C407Z03c0C407c0170CC07d01d0CC"
    "07e01B0CC07f01h0CC07g01F0Ce07h01l0Ce07i07g0C407j07h0C407k06t0CC07l0AI0CC07m01g0CC"
    "07q0170C107r01d0C107u01E0C007v01k0C007w0350C107x03b0C107y0360C107z03c0C107+03O0C1"
    "07/03u0C10800110CF08101X0CF0820110CH08301X0CH0840150CF08501b0CF0860150CH08701b0CH"
    "0880190CF08901f0CF08A0190CH08B01f0CH08C01F0CF08D01l0CF08E01F0CH08F01l0CH08G01I0CF"
    "08H01o0CF08I01I0CH08J01o0CH08K01L0CF08L01r0CF08M01L0CH08N01r0CH08O01J0Cc08P01p0Cc"
    "08Q01K0Cc08R01q0Cc08U0180CC08V01e0CC08c0110C708d01X0C708e0150Cd08f01b0Cd08g03M0C4"
    "08h03s0C408i03L0C408j03r0C408k01F0C708l01l0C708m08k0C408n08l0C408o01P0C408p01v0C4"
    "0E502e0C10E60EH0C10E80EL0C10E90EN0C10EA0EP0C10EC0EV0C10EE0Eb0C10EF0Ef0C10EG0FA0C1"
    "0Eg0EP0C80Eh0Eb0C80Ei0En0C10Ej0Er0C10Ek0Et0C10El0Ev0C10Em0FB0C10FA0Ev0C80FB0F50C8"
    "0FC0E/0C10FD0F50C10FE0F90C10FJ0FI0C10FK0FI0C80G00GL0C00G10GL0C80G30GJ0C10G70G60C8"
    "0GC0GQ0C10GD0GO0C00GE0GZ0C60GP0GO0C60Gv0Gu0C60HG0Gr0C00HH0Gr0C80HJ0Gp0C10HN0HM0C8"
    "0HS0Gw0C10HT0Gu0C00HU0H30C60Hs0Hq0CF0Ht0Hr0CF0J10GM0C60J20Gs0C60JG0GG0C60JH0Gm0C6"
    "0JI0GG0C80JJ0Gm0C80JM0GL0C60JN0Gr0C60JQ0JO0C80JR0JP0C80JS0GM0C80JT0Gs0C80JU0GN0C8"
    "0JV0Gt0C80JY0GO0C40JZ0Gu0C40Ja0GO0C80Jb0Gu0C80Jc0GU0C80Jd0G+0C80Jg0Je0C80Jh0Jf0C8"
    "0Ji0Gj0C80Jj0HD0C80Jk0GZ0C40Jl0H30C40Jm0GZ0C80Jn0H30C80Jo0GZ0CB0Jp0H30CB0Jq0Gd0C8"
    "0Jr0H70C80Ju0Gh0C80Jv0HB0C80OY0Od0PJ0OZ0Od0PK0Oa0P80PK0Ob0Od0PL0Oc0PA0PK0R00RL0PK"
    "0R20R10PK0RJ0RI0PK0af0ae0ay0an0am0ay0aq0ap0ay0dB0d70c+0dC0d70dN0j80j70jM0jB0j70i+"
    "0jC0j70jN0kK0kI0lN0lA0l60k+0lB0l70k+0lC0l60lN0n80n60nM0p00o/0pL0p70p60pL0p80p60pM"
    "0pA0p60p20pB0pA0pL0rA0r60q+0rB0r70q+0rC0r60rN0tQ0tP0tA0tS0tP0tF0tT0tS0tA0tU0tP0tV"
    "10c10b10k1i61i51ir1i81i71ir1iA1i91ir1iC1iB1ir1iE1iD1ir1iI1iH1ir1ix1iw1ir1iz1iy1ir"
    "1j01i+1ir1j11i/1ir1j31j21ir1u00110Cb1u101X0Cb1u20120C71u301Y0C71u40120CZ1u501Y0CZ"
    "1u60120Cn1u701Y0Cn1u80370C11u903d0C11uA0140C71uB01a0C71uC0140CZ1uD01a0CZ1uE0140Cn"
    "1uF01a0Cn1uG0140Cd1uH01a0Cd1uI0140Cj1uJ01a0Cj1uK04I0C01uL04J0C01uM04I0C11uN04J0C1"
    "1uO0150Cj1uP01b0Cj1uQ0150Cm1uR01b0Cm1uS08e0C61uT08f0C61uU0160C71uV01c0C71uW0170C4"
    "1uX01d0C41uY0180C71uZ01e0C71ua0180CZ1ub01e0CZ1uc0180C81ud01e0C81ue0180Cd1uf01e0Cd"
    "1ug0180Ck1uh01e0Ck1ui0190Cm1uj01f0Cm1uk03F0C11ul03l0C11um01B0C11un01h0C11uo01B0CZ"
    "1up01h0CZ1uq01B0Cn1ur01h0Cn1us01C0CZ1ut01i0CZ1uu1us0C41uv1ut0C41uw01C0Cn1ux01i0Cn"
    "1uy01C0Cj1uz01i0Cj1u+01D0C11u/01j0C11v001D0C71v101j0C71v201D0CZ1v301j0CZ1v401E0C7"
    "1v501k0C71v601E0CZ1v701k0CZ1v801E0Cn1v901k0Cn1vA01E0Cj1vB01k0Cj1vC03L0C11vD03r0C1"
    "1vE03L0C81vF03r0C81vG05C0C01vH05D0C01vI05C0C11vJ05D0C11vK01G0C11vL01m0C11vM01G0C7"
    "1vN01m0C71vO01I0C71vP01o0C71vQ01I0CZ1vR01o0CZ1vS1vQ0C41vT1vR0C41vU01I0Cn1vV01o0Cn"
    "1vW01J0C71vX01p0C71vY01J0CZ1vZ01p0CZ1va05Q0C71vb05R0C71vc05W0C71vd05X0C71ve1vY0C7"
    "1vf1vZ0C71vg01K0C71vh01q0C71vi01K0CZ1vj01q0CZ1vk01K0Cn1vl01q0Cn1vm01K0Cj1vn01q0Cj"
    "1vo01L0Ca1vp01r0Ca1vq01L0Cm1vr01r0Cm1vs01L0Cj1vt01r0Cj1vu05e0C11vv05f0C11vw05g0C8"
    "1vx05h0C81vy01M0C31vz01s0C31v+01M0CZ1v/01s0CZ1w001N0C01w101t0C01w201N0C11w301t0C1"
    "1w401N0C81w501t0C81w601N0C71w701t0C71w801N0CZ1w901t0CZ1wA01O0C71wB01u0C71wC01O0C8"
    "1wD01u0C81wE01P0C71wF01v0C71wG01Q0C21wH01w0C21wI01Q0CZ1wJ01w0CZ1wK01Q0Cn1wL01w0Cn"
    "1wM01e0Cn1wN01q0C81wO01t0CA1wP01v0CA1wR05/0C71wW0110CZ1wX01X0CZ1wY0110C91wZ01X0C9"
    "1wa0320C11wb03Y0C11wc0320C01wd03Y0C01we0320C91wf03Y0C91wg0320C31wh03Y0C31wi1wW0C2"
    "1wj1wX0C21wk0420C11wl0430C11wm0420C01wn0430C01wo0420C91wp0430C91wq0420C31wr0430C3"
    "1ws1wW0C61wt1wX0C61wu0150CZ1wv01b0CZ1ww0150C91wx01b0C91wy0150C31wz01b0C31w+03A0C1"
    "1w/03g0C11x003A0C01x103g0C01x203A0C91x303g0C91x403A0C31x503g0C31x61wu0C21x71wv0C2"
    "1x80190C91x901f0C91xA0190CZ1xB01f0CZ1xC01F0CZ1xD01l0CZ1xE01F0C91xF01l0C91xG03K0C1"
    "1xH03q0C11xI03K0C01xJ03q0C01xK03K0C91xL03q0C91xM03K0C31xN03q0C31xO1xC0C21xP1xD0C2"
    "1xQ06W0C11xR06X0C11xS06W0C01xT06X0C01xU06W0C91xV06X0C91xW06W0C31xX06X0C31xY06W0CZ"
    "1xZ06X0CZ1xa01L0CZ1xb01r0CZ1xc01L0C91xd01r0C91xe06l0C11xf06m0C11xg06l0C01xh06m0C0"
    "1xi06l0C91xj06m0C91xk06l0C31xl06m0C31xm06l0CZ1xn06m0CZ1xo01P0C01xp01v0C01xq01P0CZ"
    "1xr01v0CZ1xs01P0C91xt01v0C91xu01P0C31xv01v0C31y00En0CJ1y10En0CK1y21y00C01y31y10C0"
    "1y41y00C11y51y10C11y61y00D21y71y10D21y80EH0CJ1y90EH0CK1yA1y80C01yB1y90C01yC1y80C1"
    "1yD1y90C11yE1y80D21yF1y90D21yG0Er0CJ1yH0Er0CK1yI1yG0C01yJ1yH0C01yK1yG0C11yL1yH0C1"
    "1yO0EL0CJ1yP0EL0CK1yQ1yO0C01yR1yP0C01yS1yO0C11yT1yP0C11yW0Et0CJ1yX0Et0CK1yY1yW0C0"
    "1yZ1yX0C01ya1yW0C11yb1yX0C11yc1yW0D21yd1yX0D21ye0EN0CJ1yf0EN0CK1yg1ye0C01yh1yf0C0"
    "1yi1ye0C11yj1yf0C11yk1ye0D21yl1yf0D21ym0Ev0CJ1yn0Ev0CK1yo1ym0C01yp1yn0C01yq1ym0C1"
    "1yr1yn0C11ys1ym0D21yt1yn0D21yu0EP0CJ1yv0EP0CK1yw1yu0C01yx1yv0C01yy1yu0C11yz1yv0C1"
    "1y+1yu0D21y/1yv0D21z00E/0CJ1z10E/0CK1z21z00C01z31z10C01z41z00C11z51z10C11z80EV0CJ"
    "1z90EV0CK1zA1z80C01zB1z90C01zC1z80C11zD1z90C11zG0F50CJ1zH0F50CK1zI1zG0C01zJ1zH0C0"
    "1zK1zG0C11zL1zH0C11zM1zG0D21zN1zH0D21zP0Eb0CK1zR1zP0C01zT1zP0C11zV1zP0D21zW0F90CJ"
    "1zX0F90CK1zY1zW0C01zZ1zX0C01za1zW0C11zb1zX0C11zc1zW0D21zd1zX0D21ze0Ef0CJ1zf0Ef0CK"
    "1zg1ze0C01zh1zf0C01zi1ze0C11zj1zf0C11zk1ze0D21zl1zf0D21zm0En0C01zo0Er0C01zq0Et0C0"
    "1zs0Ev0C01zu0E/0C01zw0F50C01zy0F90C01+01y00D51+11y10D51+21y20D51+31y30D51+41y40D5"
    "1+51y50D51+61y60D51+71y70D51+81y80D51+91y90D51+A1yA0D51+B1yB0D51+C1yC0D51+D1yD0D5"
    "1+E1yE0D51+F1yF0D51+G1yW0D51+H1yX0D51+I1yY0D51+J1yZ0D51+K1ya0D51+L1yb0D51+M1yc0D5"
    "1+N1yd0D51+O1ye0D51+P1yf0D51+Q1yg0D51+R1yh0D51+S1yi0D51+T1yj0D51+U1yk0D51+V1yl0D5"
    "1+W1zW0D51+X1zX0D51+Y1zY0D51+Z1zZ0D51+a1za0D51+b1zb0D51+c1zc0D51+d1zd0D51+e1ze0D5"
    "1+f1zf0D51+g1zg0D51+h1zh0D51+i1zi0D51+j1zj0D51+k1zk0D51+l1zl0D51+m0En0C61+n0En0C4"
    "1+o1zm0D51+p0En0D51+q0Ei0D51+s0En0D21+t1+s0D51+u0EH0C61+v0EH0C41+w0EH0C01+y0EH0D5"
    "1/102e0D21/21zq0D51/30Et0D51/40Ek0D51/60Et0D21/71/60D51/80EL0C01/A0EN0C01/C0EN0D5"
    "1/D1+/0C01/E1+/0C11/F1+/0D21/G0Ev0C61/H0Ev0C41/I0FA0C01/M0Ev0D21/N0FA0D21/O0EP0C6"
    "1/P0EP0C41/Q0EP0C01/T1/+0C01/U1/+0C11/V1/+0D21/W0F50C61/X0F50C41/Y0FB0C01/a0F10CJ"
    "1/b0F10CK1/c0F50D21/d0FB0D21/e0Eb0C61/f0Eb0C41/g0Eb0C01/i0EX0CK1/j02e0C01/o1zy0D5"
    "1/p0F90D51/q0FE0D51/s0F90D21/t1/s0D51/u0EV0C01/w0Ef0C01/y0Ef0D526Q26G0Cu26R26I0Cu"
    "26k26K0Cu27D27G0Cu27E27K0Cu27F27I0Cu2842830Cu2892880Cu28C28B0Cu28a28Z0Cu28c28b0Cu"
    "29128y0Cu2942930Cu2972950Cu2992980Cu29W00z0Cu29Y29X0Cu29j29D0Cu29k00y0Cu29l00+0Cu"
    "29m29a0Cu29n29b0Cu29q29o0Cu29r29p0Cu29u29s0Cu29v29t0Cu2A029w0Cu2A129x0Cu2A42A20Cu"
    "2A52A30Cu2A82A60Cu2A92A70Cu2Ai2AY0Cu2Aj2Ae0Cu2Ak2Af0Cu2Al2Ah0Cu2BW29y0Cu2BX29z0Cu"
    "2BY2AH0Cu2BZ2AI0Cu2Bg2Ao0Cu2Bh2Ap0Cu2Bi2Aq0Cu2Bj2Ar0Cu31C31B32P31E31D32P31G31F32P"
    "31I31H32P31K31J32P31M31L32P31O31N32P31Q31P32P31S31R32P31U31T32P31W31V32P31Y31X32P"
    "31b31a32P31d31c32P31f31e32P31m31l32P31n31l32Q31p31o32P31q31o32Q31s31r32P31t31r32Q"
    "31v31u32P31w31u32Q31y31x32P31z31x32Q32K31632P32U32T32P32i32h32P32k32j32P32m32l32P"
    "32o32n32P32q32p32P32s32r32P32u32t32P32w32v32P32y32x32P32+32z32P33032/32P33233132P"
    "33533432P33733632P33933832P33G33F32P33H33F32Q33J33I32P33K33I32Q33M33L32P33N33L32Q"
    "33P33O32P33Q33O32Q33S33R32P33T33R32Q33q32c32P33t33l32P33u33m32P33v33n32P33w33o32P"
    "33+33z32PH2QH2PH2wH2SH2RH2wH2hH2bH2wH4kH4nH4dH4lH4oH4dHDBHD7HC+HDCHD7HDNHIxHIvHIw"
    "HIyHIvHImHI+HIvHIzHMwHMuHMlHMxHMvHMlHauHarHam";

constexpr std::string_view kNfcDecomposingOnly =
    "0D00C00000D10C10000D30CJ0000D40C80C10Dq0Av0000D+00x0000E702t0000bO0aL0ay0bP0aM0ay"
    "0bQ0aN0ay0bR0aS0ay0bS0aX0ay0bT0aY0ay0bU0ah0ay0bV0al0ay0dS0cX0cy0dT0cY0cy0dV0cl0cy"
    "0ep0eo0ey0es0eu0ey0fP0eM0ey0fQ0eN0ey0fR0eS0ey0fU0eh0ey0jS0iX0iy0jT0iY0iy0z30z20+t"
    "0zD0zC0+t0zI0zH0+t0zN0zM0+t0zS0zR0+t0zf0z00+r0zp0zn0zo0zr0zn0zq0zs0+o0+00zu0+p0+0"
    "0+10zn0+00+J0+I0+t0+T0+S0+t0+Y0+X0+t0+d0+c0+t0+i0+h0+t0+v0+G0+r1zn0Ei0001zp0Ej000"
    "1zr0Ek0001zt0El0001zv0FC0001zx0FD0001zz0FE0001+x0E60001++0Ev0001/90E80001/B0E9000"
    "1/J0EG0001/R0EA0001/Z0Em0001/h0EE0001/k0E50001/l01W0001/v0EC0001/x0EF0001/z02q000"
    "20020200020120300024c0Ef00024g01B00024h0350002Cf3080002Cg3090002hS2hT0CuFa08n8000"
    "Fa16Rq000Fa28xA000Fa38p8000Fa46xH000Fa54uo000Fa65Fb000Fa79+S000Fa89+S000Fa95bH000"
    "FaA97H000FaB5M7000FaC5b8000FaD67s000FaE7Pf000FaF7+5000FaG8O/000FaH8Uw000FaI8Zu000"
    "FaJ92F000FaK6e2000FaL6qR000FaM73P000FaN7FU000FaO8Gz000FaP95g000FaQ9dn000FaR4w2000"
    "FaS5Dr000FaT6i4000FaU78R000FaV8Oj000FaW9uU000FaX5rG000FaY6/h000FaZ8ND000Faa8ba000"
    "Fab6B9000Fac87O000Fad8WV000Fae5xA000Faf6SN000Fag6rg000Fah7By000Fai93E000Faj4+6000"
    "Fak56t000Fal5BU000Fam6J4000Fan6hJ000Fao78G000Fap7Rd000Faq801000Far8O6000Fas8PS000"
    "Fat8tl000Fau9So000Fav9jl000Faw9tw000Fax7YC000Fay7b/000Faz7sW000Fa+8F9000Fa/9C4000"
    "Fb09v/000Fb18hM000Fb25ZV000Fb35y4000Fb47nW000Fb581+000Fb679Y000Fb77ZA000Fb88p2000"
    "Fb99Rt000FbA5ZO000FbB5nY000FbC6eJ000FbD6tQ000FbE6yF000FbF7ql000FbG7ut000FbH9PB000"
    "FbI5BI000FbJ82B000FbK57S000FbL57C000FbM7eS000FbN7s+000FbO8Fn000FbP9Pr000FbQ8k0000"
    "FbR6BF000FbS6e2000FbT8h+000FbU4uv000FbV5ld000FbW60I000FbX7E7000FbY7Lm000FbZ5CN000"
    "Fba7Zx000Fbb4+/000Fbc5+f000Fbd4uD000Fbe6pC000Fbf6Lu000Fbg7qY000Fbh5F3000Fbi5XU000"
    "Fbj7S1000Fbk8H9000Fbl8gg000Fbm6kw000Fbn8+m000Fbo6o8000Fbp6B+000Fbq8Bb000Fbr6EW000"
    "Fbs7Lb000Fbt4wk000Fbu55f000Fbv579000Fbw6Y1000Fbx7pd000Fby89l000Fbz8hI000Fb+97F000"
    "Fb/5Br000Fc05H2000Fc15bp000Fc25xi000Fc36N5000Fc46/+000Fc57ag000Fc69Mj000Fc79fg000"
    "Fc89wN000Fc99xE000FcA5AR000FcB6R6000FcC6jt000FcD8zY000FcE5vq000FcF66G000FcG680000"
    "FcH6IQ000FcI6yZ000FcJ759000FcK7I9000FcL7dA000FcM7tq000FcN81l000FcO8yc000FcP8Jk000"
    "FcQ90Z000FcR9DA000FcS58N000FcT5AZ000FcU5Iz000FcV738000FcW8Z2000FcX8gg000FcY5x9000"
    "FcZ5/r000Fca6Dx000Fcb6kk000Fcc7m+000Fcd7Dr000Fce4xa000Fcf5Rv000Fcg5ld000Fch5sw000"
    "Fci60S000Fcj7Eo000Fck7Hf000Fcl7+Q000Fcm816000Fcn98q000Fco9Rs000Fcp9T8000Fcq9WO000"
    "Fcr4+B000Fcs7ck000Fct96q000Fcu9Qu000Fcv63X000Fcw4w6000Fcx53Q000Fcy5lk000Fcz5m/000"
    "Fc+6MP000Fc/6e2000Fd077E000Fd17P2000Fd28Jy000Fd391y000Fd49+D000Fd56Q8000Fd69Ok000"
    "Fd75A9000Fd86Tx000Fd96Vp000FdA6r1000FdB6wS000FdC7G9000FdD7LP000FdE7Xh000FdF7qG000"
    "FdG9XU000FdH55j000FdI68k000FdJ9Pu000FdK50h000FdL5qP000FdM6tg000FdN8yg000FdO5+B000"
    "FdP654000FdQ6WN000FdR7E7000FdS9Q6000FdT58f000FdU5GF000FdV5nb000FdW6OJ000FdX6TE000"
    "FdY6Ye000FdZ6pb000Fda7G6000Fdb7NY000Fdc7zv000Fdd8ZF000Fde8ZX000Fdf97C000Fdg9RY000"
    "Fdh5C/000Fdi6ww000Fdj5GT000Fdk77G000Fdl7IO000Fdm8Nw000Fdn9QZ000Fdo9nN000Fdp9wV000"
    "Fdq6UN000Fdr6tB000Fds87e000Fdt7hB000Fdu7iW000Fdv7oI000Fdw7B0000Fdx72P000Fdy8jO000"
    "Fdz4x0000Fd+8Cs000Fd/58w000Fe0587000Fe15wc000Fe26BJ000Fe37pM000Fe45k5000Fe56qU000"
    "Fe66Qq000Fe78yx000Fe88XC000Fe99PD000FeA8cB000FeB5xJ000FeC550000FeD5N0000FeG5XQ000"
    "FeI6Pq000FeL57U000FeM7Cg000FeN7RA000FeO7ay000FeP7bU000FeQ7bb000FeR7cF000FeS9TM000"
    "FeT7o+000FeU7+z000FeW8OI000FeY8hu000Feb90u000Fec93z000Feg9Zl000Feh9Zy000Fei9ae000"
    "Fej9sq000Fek93U000Fel9Qt000Fem4+k000Fen53d000Feo55D000Fep5B9000Feq5Ba000Fer5DH000"
    "Fes5MT000Fet5O6000Feu5Pe000Fev5X0000Few5Ye000Fex5na000Fey5nk000Fez62K000Fe+65e000"
    "Fe/66E000Ff067o000Ff16LF000Ff26NY000Ff36QH000Ff46Y5000Ff56rt000Ff66uQ000Ff76yY000"
    "Ff875k000Ff978h000FfA7GY000FfB7YH000FfC7a+000FfD7b9000FfE7b8000FfF7bG000FfG7bM000"
    "FfH7bT000FfI7cD000FfJ7cE000FfK7f0000FfL7g1000FfM7l0000FfN7tq000FfO7u9000FfP7v1000"
    "FfQ7zo000FfR805000FfS87j000FfT89v000FfU89v000FfV8HN000FfW8aG000FfX8cM000FfY8i1000"
    "FfZ8iv000Ffa8pJ000Ffb8q8000Ffc8+s000Ffd90u000Ffe9RZ000Fff9V/000Ffg9Wx000Ffh61r000"
    "FfiaBk000Ffj88O000Ffm4uc000Ffn56r000Ffo55e000Ffp4+0000Ffq555000Ffr560000Ffs5B7000"
    "Fft5Bw000Ffu5MT000Ffv5LL000Ffw5MP000Ffx5NY000Ffy5XQ000Ffz5Yp000Ff+5b4000Ff/5bK000"
    "Fg05fY000Fg15ie000Fg25xI000Fg35xP000Fg45zf000Fg55+j000Fg663O000Fg765E000Fg8648000"
    "Fg966E000FgA65W000FgB67o000FgC68q000FgD6F4000FgE6GS000FgF6HI000FgG6LM000FgH6Pq000"
    "FgI6SN000FgJ6SR000FgK6TM000FgL6jv000FgM6kw000FgN6r1000FgO6xR000FgP6xB000FgQ6yY000"
    "FgR70U000FgS75k000FgT7Ud000FgU78r000FgV7Al000FgW7Cg000FgX7Hn000FgY7K6000FgZ7Kx000"
    "Fga7OT000Fgb7OV000Fgc7RA000Fgd7RR000Fge7Rq000Fgf7TA000Fgg7T0000Fgh7ZC000Fgi7gn000"
    "Fgj7l0000Fgk7nx000Fgl7rR000Fgm7tq000Fgn7y+000Fgo805000Fgp8DI000Fgq8Fl000Fgr8Tv000"
    "Fgs8b1000Fgt8c6000Fgu8cM000Fgv8g/000Fgw8hu000Fgx8hB000Fgy8i1000Fgz8h+000Fg+8hj000"
    "Fg/8iv000Fh08kA000Fh18q8000Fh28yu000Fh391o000Fh496P000Fh599s000Fh69Py000Fh79RZ000"
    "Fh89TM000Fh99VR000FhA9V/000FhB9WB000FhC9Wx000FhD9iI000FhE9+S000FhFYXA000FhGYX4000"
    "FhHZFL000FhI3kT000FhJ40O000FhK40v000FhLb99000FhMbpG000FhNdxJ000FhO9z3000FhP9+E000"
    "FiT0NP0MqFiV0No0MtFig0Nf0N1Fih0Nf0N2FiiFj90N1FijFj90N2Fik0NG0MtFil0NG0MuFim0NG0My"
    "Fin0NH0MyFio0NI0MyFip0NJ0MyFiq0NK0MyFir0NL0MyFis0NM0MyFiu0NO0MyFiv0NP0MyFiw0NQ0My"
    "Fix0NR0MyFiy0NS0MyFi+0NU0MyFj00NW0MyFj10NX0MyFj30NZ0MyFj40Na0MyFj60Nc0MyFj70Nd0My"
    "Fj80Ne0MyFj90Nf0MyFjA0Ng0MyFjB0NL0MvFjC0NH0M/FjD0NR0M/FjE0Na0M/T5UT5NT5bT5VT5OT5b"
    "T5WT5VT5kT5XT5VT5lT5YT5VT5mT5ZT5VT5nT5aT5VT5oT6xT6vT5bT6yT6wT5bT6zT6xT5kT6+T6yT5k"
    "T6/T6xT5lT70T6yT5llW04uz000lW14uu000lW24v1000lW3W4Y000lW44zW000lW54+k000lW64+x000"
    "lW7502000lW851w000lW952P000lWA53d000lWB53F000lWC3IU000lWDWOw000lWE55D000lWF55K000"
    "lWG55a000lWH55t000lWIWKS000lWJ3Iv000lWK55d000lWL56D000lWMWLB000lWN56N000lWO56a000"
    "lWP4xC000lWQ56i000lWR56r000lWSf7V000lWT57r000lWU583000lWV3JV000lWW58x000lWX596000"
    "lWY59o000lWZ59t000lWa3KL000lWb5B7000lWc5B9000lWd5Ba000lWe5Bw000lWf5C5000lWg5C6000"
    "lWh5CN000lWi5D9000lWj5DH000lWk5DQ000lWl5Dp000lWm5Dz000lWn5D/000lWo5D/000lWp5D/000"
    "lWqWei000lWr71m000lWs5FA000lWt5FV000lWuWjZ000lWv5Fh000lWw5Fn000lWx5G6000lWy5IU000"
    "lWz5Gu000lW+5H8000lW/5He000lX05IY000lX15Js000lX25KG000lX35LJ000lX45LZ000lX55M4000"
    "lX65M4000lX75MP000lX85Mh000lX95Mp000lXA5N2000lXB5SM000lXC5O6000lXD5SN000lXE5PH000"
    "lXF5Pq000lXG587000lXH5Zk000lXI5VE000lXJ5Vq000lXK5WD000lXL5UB000lXM5Wo000lXN5Wn000"
    "lXO5Yi000lXPXJa000lXQ5Zo000lXR5Zt000lXS5a6000lXT5aQ000lXU5aY000lXV5bY000lXWXQe000"
    "lXXXRg000lXY5di000lXZ5eR000lXa5ed000lXb5dO000lXc5fc000lXd3Rk000lXe3Ry000lXf5i8000"
    "lXg5i+000lXh5i+000lXiXd8000lXj5l3000lXk5lO000lXl5ld000lXm5lp000lXnXiO000lXo5l/000"
    "lXp5m6000lXq5zJ000lXr5mY000lXs3U1000lXt5nW000lXu5nk000lXv5p0000lXw5oD000lXxXta000"
    "lXy5r3000lXzXtc000lX+5rk000lX/5rh000lY05ry000lY15tX000lY25tY000lY33Wl000lY45tz000"
    "lY55ue000lY65uz000lY75vf000lY83XY000lY9Y63000lYA3Xy000lYB5wm000lYC5wp000lYD5ws000"
    "lYE5xA000lYFgEI000lYG5x+000lYHYCn000lYIYCn000lYJ881000lYK5yY000lYL5yY000lYM3Z7000"
    "lYNZAu000lYOc7Q000lYP5zY000lYQ5zh000lYR3ZZ000lYS5+Q000lYT5/D000lYU5/N000lYV5/v000"
    "lYW621000lYX3aw000lYY3aS000lYZ62K000lYaYRK000lYb637000lYc658000lYd65C000lYe65E000"
    "lYf65C000lYg65w000lYh66E000lYi66o000lYj66a000lYk66l000lYl67U000lYm67o000lYn67s000"
    "lYo68G000lYp68R000lYq69T000lYr6An000lYs6BK000lYt6DG000lYuYiC000lYv6Cz000lYw6By000"
    "lYx6De000lYy6E3000lYz6Fa000lY+Yln000lY/6GY000lZ06F5000lZ16Ef000lZ23ek000lZ36Hf000"
    "lZ46H+000lZ56IT000lZ66Ht000lZ73fi000lZ86LF000lZ96Li000lZAZ0A000lZB6NZ000lZC6Ru000"
    "lZD6P9000lZE3iP000lZF6QH000lZG3i8000lZH3ha000lZI56I000lZJ56L000lZK6S0000lZL6QS000"
    "lZM82j000lZN4FP000lZO6SN000lZP6SR000lZQ6SX000lZR6TU000lZS6TJ000lZTZF3000lZU3j9000"
    "lZV6Vw000lZW6U5000lZX6XI000lZY6Y5000lZZZHj000lZa6YE000lZb6WV000lZc6aK000lZd3kT000"
    "lZe6b2000lZf6cZ000lZg6dg000lZh6ge000lZiZQZ000lZj6hR000lZk3mO000lZl6iX000lZmZYd000"
    "lZn6jK000lZo3nE000lZp6jo000lZq6kV000lZr6kw000lZs6kx000lZtZgD000lZuXqB000lZvZhw000"
    "lZw6nE000lZxZoy000lZy6o/000lZz6pD000lZ+6nd000lZ/6qM000la06q+000la16rt000la26r1000"
    "la36rf000la46ru000la56s5000la6ZqU000la76qq000la86ul000la96vk000laA3qp000laB6xB000"
    "laC6x7000laDZxH000laE6tv000laF6zk000laGZzU000laHZ+E000laI6/6000laJ70v000laK70U000"
    "laL70R000laM3sM000laN71A000laO71z000laP71t000laQ72j000laRWKb000laS755000laTa9Z000"
    "laU76S000laVaEh000laW78e000laX78r000laY79G000laZaO8000laa7A0000lab7AL000lacaSr000"
    "ladaWK000lae7Dw000laf7EB000lag3wi000lah7Eb000lai3wu000laj3wu000lak7H7000lal7HS000"
    "lam7Hn000lan7I5000lao7JA000lap3yR000laq7Ka000larams000las7K+000lataoI000lau7Lm000"
    "lavY6V000law7OG000laxa+X000laya+u000lazb14000la+3/y000la/408000lb07Rq000lb1b3p000"
    "lb2b3o000lb3b4P000lb4b4p000lb57SU000lb67SV000lb77SV000lb87TA000lb940v000lbA7UB000"
    "lbB416000lbC42M000lbDbGT000lbE7XE000lbF7YC000lbG7ZC000lbH43Z000lbIbOc000lbJ7bM000"
    "lbKbQQ000lbLbR5000lbM7cF000lbN7dh000lbO44l000lbP7f0000lbQ7fA000lbR7fF000lbSbby000"
    "lbTbgd000lbUbgd000lbV7hk000lbW482000lbXbkh000lbY7l6000lbZ7l9000lba48d000lbbbo0000"
    "lbc7pI000lbd4AW000lbe7pe000lbf7pZ000lbg7q0000lbhb+6000lbi7rZ000lbj4C1000lbk7t7000"
    "lbl7u2000lbm7v5000lbn4Cq000lboc8e000lbpc97000lbq4DP000lbrcBP000lbs7zw000lbtcC+000"
    "lbu7+L000lbv7/w000lbw805000lbxcJQ000lbycKZ000lbz81W000lb+cMe000lb/81m000lc0ZDV000"
    "lc14FL000lc282o000lc3843000lc44GB000lc584+000lc65gr000lc7cUd000lc8cUr000lc9ZEJ000"
    "lcAZES000lcB881000lcC884000lcD8+U000lcE4Hh000lcF8AH000lcG8AB000lcH8AT000lcI5Ap000"
    "lcJ8An000lcK8Ap000lcL8Az000lcM8Bc000lcNciy000lcO8Bb000lcP8CT000lcQ8DZ000lcR8Ej000"
    "lcS8CZ000lcT8Ez000lcU8Fd000lcV8HN000lcW8DJ000lcX8FA000lcY8FC000lcZ8FS000lcacms000"
    "lcbcrh000lcccpL000lcd4Kh000lce8Jn000lcf8Jp000lcg8KM000lchdFA000lci8La000lcjcyi000"
    "lck4LT000lcl4LX000lcmc+n000lcnd3I000lco4Lh000lcp8PG000lcq8PS000lcr8Pd000lcs8Pf000"
    "lct8Qf000lcu8Q8000lcv8SE000lcw8RY000lcx8Tv000lcy8Se000lcz8Th000lc+8U6000lc/4NN000"
    "ld08VX000ld18W1000ld24Nv000ld38XW000ld48XZ000ld5dPd000ld68ZN000ld78ZU000ld84Or000"
    "ld98Zw000ldA3Ix000ldBdYk000ldCdbc000ldD4Q+000ldE4R7000ldF8gW000ldG8hj000ldH8kA000"
    "ldI8nL000ldJdoe000ldK8oh000ldL8p1000ldM8qR000ldN8rt000ldOdyl000ldPWW4000ldQ8tB000"
    "ldR8sy000ldS8tm000ldTWZU000ldU8xK000ldV8yu000ldWeNI000ldXeNj000ldY92K000ldZ93n000"
    "lda94H000ldbeSk000ldc94R000ldd98u000lde9BN000ldf9BO000ldg99y000ldh9Fv000ldi9GL000"
    "ldjelw000ldk9MB000ldl4cL000ldm9Mt000ldnert000ldo4dc000ldp9R3000ldq5so000ldr9SZ000"
    "ldsf55000ldtf8Q000ldu4fk000ldv4fs000ldw9VW000ldxfGA000ldy4go000ldzfIM000ld+9WB000"
    "ld/9WB000le09Wf000le1fMs000le29ZY000le34ip000le49af000le59cd000le69d2000le79d+000"
    "le84lE000le9fim000leA9iI000leB9n0000leC9pz000leD4pE000leE4pj000leF9rd000leGg3E000"
    "leH4pu000leIg45000leJg8E000leKgAH000leL9wx000leM4rM000leN9xv000leO9x+000leP9y5000"
    "leQ9yF000leR9yM000leS9yx000leTgO0000";

constexpr std::string_view kNfcCombiningClasses =
    "0C00CK3c0CL0CL3e0CM0CP3S0CQ0CQ3e0CR0CR3O0CS0CW3S0CX0CY3A0CZ0Cc3S0Cd0Ce3A0Cf0Cp3S0Cq0Cu01"
    "0Cv0Cy3S0Cz0D43c0D50D53m0D60D63c0D70D93S0DA0DC3c0DD0DE3S0DG0DI3c0DJ0DM3S0DN0DN3c0DO0DO3e"
    "0DP0DQ3S0DR0DR3c0DS0DS3f0DT0DU3g0DV0DV3f0DW0DX3g0DY0DY3f0DZ0Dl3c0I30I73c0MH0MH3S0MI0ML3c"
    "0MM0MM3S0MN0MP3c0MQ0MQ3U0MR0MR3S0MS0MX3c0MY0Md3S0Me0Mf3c0Mg0Mg3S0Mh0Mi3c0Mj0Mj3U0Mk0Mk3a"
    "0Ml0Ml3c0Mm0Mm0A0Mn0Mn0B0Mo0Mo0C0Mp0Mp0D0Mq0Mq0E0Mr0Mr0F0Ms0Ms0G0Mt0Mt0H0Mu0Mu0I0Mv0Mw0J"
    "0Mx0Mx0K0My0My0L0Mz0Mz0M0M/0M/0N0N10N10O0N20N20P0N40N43c0N50N53S0N70N70I0OG0ON3c0OO0OO0U"
    "0OP0OP0V0OQ0OQ0W0PB0PB0R0PC0PC0S0PD0PD0T0PE0PE0U0PF0PF0V0PG0PG0W0PH0PH0X0PI0PI0Y0PJ0PK3c"
    "0PL0PM3S0PN0PR3c0PS0PS3S0PT0PU3c0PV0PV3S0Pm0Pm0Z0RM0RS3c0RV0RY3c0RZ0RZ3S0Ra0Ra3c0Rd0Re3c"
    "0Rg0Rg3S0Rh0Ri3c0Rj0Rj3S0SH0SH0a0Sm0Sm3c0Sn0Sn3S0So0Sp3c0Sq0Sq3S0Sr0Ss3c0St0Sv3S0Sw0Sw3c"
    "0Sx0Sy3S0Sz0Sz3c0S+0S+3S0S/0T13c0T20T23S0T30T33c0T40T43S0T50T53c0T60T63S0T70T73c0T80T83S"
    "0T90TA3c0Vh0Vn3c0Vo0Vo3S0Vp0Vp3c0Vz0Vz3S0WM0WP3c0WR0WZ3c0Wb0Wd3c0Wf0Wj3c0XP0XR3S0YO0YO3c"
    "0YP0YR3S0YS0YV3c0ZA0ZE3c0ZF0ZJ3S0ZK0ZX3c0ZZ0ZZ3S0Za0Zb3c0Zc0Zc3S0Zd0Ze3c0Zf0Zf3S0Zg0Zi3c"
    "0Zj0Zl3S0Zm0Zm0R0Zn0Zn0S0Zo0Zo0T0Zp0Zr3c0Zs0Zs3S0Zt0Zu3c0Zv0Zw3S0Zx0Z/3c0ay0ay070bD0bD09"
    "0bH0bH3c0bI0bI3S0bJ0bK3c0cy0cy070dD0dD090d+0d+3c0ey0ey070fD0fD090gy0gy070hD0hD090iy0iy07"
    "0jD0jD090lD0lD090my0my070nD0nD090nL0nL1K0nM0nM1R0oy0oy070pD0pD090qx0qy090rD0rD090tA0tA09"
    "0uu0uv1d0uw0uw090v80vB1h0wu0wv1s0ww0ww090x80xB1w0yO0yP3S0yr0yr3S0yt0yt3S0yv0yv3O0zn0zn21"
    "0zo0zo220zq0zq240zw0zz220+00+0220+20+33c0+40+4090+60+73c0/60/63S10t10t0710v10w0912D12D3S"
    "1DT1DV3c1SK1SL091Sq1Sq091VI1VI091VT1VT3c1Yf1Yf3a1av1av3U1aw1aw3c1ax1ax3S1eN1eN3c1eO1eO3S"
    "1fW1fW091fr1fy3c1f/1f/3S1gm1gq3c1gr1gw3S1gx1gy3c1gz1gz3S1g/1h03S1h11h23c1h31h43S1h51h93c"
    "1hA1hA3S1hB1hE3c1iq1iq071j41j4091jh1jh3c1ji1ji3S1jj1jp3c1kg1kh091lc1lc071lo1lp091mt1mt07"
    "1pG1pI3c1pK1pK011pL1pP3S1pQ1pR3c1pS1pV3S1pW1pW3c1pY1pe011pj1pj3S1pq1pq3c1pu1pv3c1t01t13c"
    "1t21t23S1t31t93c1tA1tA3S1tB1tC3c1tD1tD3g1tE1tE3M1tF1tF3S1tG1tG3A1tH1tr3c1ts1ts3e1tt1tu3a"
    "1tv1tv3S1tw1tw3Q1tx1tx3c1ty1ty3f1tz1tz3S1t+1t+3c1t/1t/3S23G23H3c23I23J0123K23N3c23O23Q01"
    "23R23S3c23X23X3c23b23c0123d23d3c23e23e3S23f23f3c23g23h0123i23l3S23m23m3c2pl2pn3c2r/2r/09"
    "2tW2t/3c30g30g3Q30h30h3a30i30i3e30j30j3U30k30l3W32P32Q08APlAPl3cAPqAPz3cAQUAQV3cARmARn3c"
    "AW6AW609AWiAWi09AZ4AZ409AZWAZn3cAahAaj3SAbJAbJ09AcpAcp07Ad0Ad009AgmAgm3cAgoAgp3cAgqAgq3S"
    "AgtAgu3cAg+Ag/3cAh1Ah13cAhsAhs09AljAlj09FiUFiU0QFuWFuc3cFudFuj3SFukFul3cG7zG7z3SGBWGBW3S"
    "GDsGDw3cGeDGeD3SGeFGeF3cGeuGeu3cGevGev01GewGew3SGe/Ge/09GhbGhb3cGhcGhc3SGqaGqd3cGwhGwi3c"
    "Gz6Gz73SGz8GzA3cGzBGzB3SGzCGzC3cGzDGzG3SG+2G+23cG+3G+33SG+4G+43cG+5G+53SH16H1609H1mH1m09"
    "H1/H1/09H2vH2v09H2wH2w07H40H423cH4pH4q09H5pH5p07H70H7009H7AH7A07H8rH8r09H8sH8s07HBfHBf07"
    "HBgHBg09HCxHCy07HDDHDD09HDcHDi3cHDmHDq3cHH2HH209HH6HH607HHUHHU3cHJ2HJ209HJ3HJ307HM/HM/09"
    "HN0HN007HO/HO/09HQsHQs09HQtHQt07HShHSh09HWvHWv09HWwHWw07HazHa+09Hb3Hb307HdWHdW09HeqHeq09"
    "Hf7Hf709HgPHgP09Hm/Hm/09Hr2Hr207Hr4Hr509HsNHsN09MhmMhq01MimMis3cM/mM/n06RoURoU01T5bT5c3O"
    "T5dT5f01T5jT5j3YT5kT5o3OT5xT623ST65T693cT6AT6B3ST6gT6j3cT92T943cU00U063cU08U0O3cU0RU0X3c"
    "U0ZU0a3cU0cU0g3cU4mU4s3cUAkUAk3cUBiUBl3cUZGUZM3SUb4Ub93cUbAUbA07";

constexpr char32_t kHangulSBase = 0xAC00;
constexpr char32_t kHangulLBase = 0x1100;
constexpr char32_t kHangulVBase = 0x1161;
constexpr char32_t kHangulTBase = 0x11A7;
constexpr char32_t kHangulLCount = 19;
constexpr char32_t kHangulVCount = 21;
constexpr char32_t kHangulTCount = 28;
constexpr char32_t kHangulSCount = kHangulLCount * kHangulVCount * kHangulTCount;

// The value of `digits` base-64 digits of `table` from `pos`.
char32_t base64_value(std::string_view table, size_t pos, size_t digits) {
  char32_t value = 0;
  for (size_t k = 0; k < digits; ++k) {
    value = (value << 6) | static_cast<char32_t>(kBase64Digits.find(table[pos + k]));
  }
  return value;
}

}  // namespace

NfcNormalizer::NfcNormalizer() {
  for (std::string_view table : {kNfcComposing, kNfcDecomposingOnly}) {
    const bool composes = table.data() == kNfcComposing.data();
    for (size_t pos = 0; pos + 9 <= table.size(); pos += 9) {
      const char32_t composite = base64_value(table, pos, 3);
      const char32_t first = base64_value(table, pos + 3, 3);
      const char32_t second = base64_value(table, pos + 6, 3);
      decompositions_.emplace(composite, std::make_pair(first, second));
      if (composes) {
        compositions_.emplace((static_cast<uint64_t>(first) << 32) | second, composite);
      }
    }
  }
  for (size_t pos = 0; pos + 8 <= kNfcCombiningClasses.size(); pos += 8) {
    combining_runs_.push_back(
        {base64_value(kNfcCombiningClasses, pos, 3), base64_value(kNfcCombiningClasses, pos + 3, 3),
         static_cast<uint8_t>(base64_value(kNfcCombiningClasses, pos + 6, 2))});
  }
}

uint8_t NfcNormalizer::combining_class(char32_t cp) const {
  auto it = std::upper_bound(combining_runs_.begin(), combining_runs_.end(), cp,
                             [](char32_t c, const CombiningRun& run) { return c < run.first; });
  if (it == combining_runs_.begin()) {
    return 0;
  }
  --it;
  return cp <= it->last ? it->combining_class : 0;
}

void NfcNormalizer::decompose(char32_t cp, std::vector<char32_t>& out) const {
  if (cp >= kHangulSBase && cp < kHangulSBase + kHangulSCount) {
    const char32_t index = cp - kHangulSBase;
    out.push_back(kHangulLBase + index / (kHangulVCount * kHangulTCount));
    out.push_back(kHangulVBase + (index % (kHangulVCount * kHangulTCount)) / kHangulTCount);
    if (index % kHangulTCount != 0) {
      out.push_back(kHangulTBase + index % kHangulTCount);
    }
    return;
  }
  auto it = decompositions_.find(cp);
  if (it == decompositions_.end()) {
    out.push_back(cp);
    return;
  }
  decompose(it->second.first, out);
  if (it->second.second != 0) {
    decompose(it->second.second, out);
  }
}

std::optional<char32_t> NfcNormalizer::compose(char32_t first, char32_t second) const {
  if (first >= kHangulLBase && first < kHangulLBase + kHangulLCount && second >= kHangulVBase &&
      second < kHangulVBase + kHangulVCount) {
    return kHangulSBase +
           ((first - kHangulLBase) * kHangulVCount + (second - kHangulVBase)) * kHangulTCount;
  }
  if (first >= kHangulSBase && first < kHangulSBase + kHangulSCount &&
      (first - kHangulSBase) % kHangulTCount == 0 && second > kHangulTBase &&
      second < kHangulTBase + kHangulTCount) {
    return first + (second - kHangulTBase);
  }
  auto it = compositions_.find((static_cast<uint64_t>(first) << 32) | second);
  return it == compositions_.end() ? std::nullopt : std::optional<char32_t>(it->second);
}

std::string NfcNormalizer::apply(std::string_view text) const {
  // Below U+0300 nothing decomposes, reorders or composes, and lead bytes from 0xCC up are
  // exactly the characters from U+0300 up: most text takes this exit.
  if (std::none_of(text.begin(), text.end(),
                   [](char b) { return static_cast<unsigned char>(b) >= 0xCC; })) {
    return std::string(text);
  }
  std::vector<char32_t> chars;
  chars.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const CodePoint cp = next_code_point(text, i);
    i += cp.length;
    decompose(cp.value, chars);
  }
  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  for (size_t i = 1; i < chars.size(); ++i) {
    const uint8_t cc = combining_class(chars[i]);
    if (cc == 0) {
      continue;
    }
    for (size_t j = i; j > 0 && combining_class(chars[j - 1]) > cc; --j) {
      std::swap(chars[j - 1], chars[j]);
    }
  }
  // Canonical composition: each character joins the last starter unless something between
  // them blocks it (a starter, or a mark of the same or a higher class).
  std::vector<char32_t> out;
  out.reserve(chars.size());
  std::optional<size_t> starter;
  for (char32_t c : chars) {
    const uint8_t cc = combining_class(c);
    if (starter) {
      const bool adjacent = *starter + 1 == out.size();
      const uint8_t last_cc = adjacent ? 0 : combining_class(out.back());
      if (adjacent || (last_cc != 0 && last_cc < cc)) {
        if (auto composite = compose(out[*starter], c)) {
          out[*starter] = *composite;
          continue;
        }
      }
    }
    if (cc == 0) {
      starter = out.size();
    }
    out.push_back(c);
  }
  std::string result;
  result.reserve(text.size());
  for (char32_t c : out) {
    append_utf8(result, c);
  }
  return result;
}

}  // namespace flotilla::llm

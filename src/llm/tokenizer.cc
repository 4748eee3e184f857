// Hugging Face tokenizer.json, read into a fixed pipeline that mirrors the `tokenizers` crate:
// added-token split -> normalizer -> pre-tokenizer -> BPE -> post-processor, and ids ->
// tokens -> decoder chain. Everything is built at load and read-only afterwards, so concurrent
// encode()/decode() calls share it without locks; each call owns its working buffers.
// This file runs the pipeline; its types are in tokenizer_model.h, and tokenizer_loader.cc builds
// it from the files.
#include "llm/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "llm/tokenizer_model.h"
#include "llm/utf8.h"

namespace flotilla::llm {
namespace detail {
namespace {

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
// Pipeline components

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
// `raw`: the bytes as they are, incomplete characters included (no U+FFFD), and none of the
// start-of-text rules (Strip, Metaspace's first token): what a token adds inside a text.
void run_decoder(const DecoderStep& step, bool raw, std::vector<std::string>& tokens) {
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
      tokens.assign(1, raw ? std::move(bytes) : to_valid_utf8(bytes));
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
        if (raw || is_valid_utf8(bytes)) {
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
      if (raw) {
        break;
      }
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
        tokens[i] = replace_all(tokens[i], step.pattern,
                                i == 0 && step.drop_first_replacement && !raw ? "" : " ");
      }
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Encoding

struct EncodeScratch {
  std::vector<Segment> segments;
  std::vector<Piece> pieces;
  std::vector<Piece> next_pieces;
  Matches matches;
  BpeScratch bpe;
};

}  // namespace

void AddedTokenMatcher::split(std::string_view text, const Regex* word_char, bool skip_special,
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

namespace {

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

}  // namespace
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Tokenizer

using detail::DecoderStep;
using detail::encode_text;
using detail::EncodeScratch;
using detail::is_valid_utf8;
using detail::kReplacementUtf8;
using detail::run_decoder;
using detail::Segment;
using detail::to_valid_utf8;

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

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
      run_decoder(step, /*raw=*/false, tokens);
    }
    for (const std::string& token : tokens) {
      text += token;
    }
  }
  return is_valid_utf8(text) ? text : to_valid_utf8(text);
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const detail::TokenizerModel& model = *model_;
  if (id < 0 || static_cast<size_t>(id) >= model.flags.size() ||
      (model.flags[id] & detail::TokenizerModel::kKnown) == 0) {
    return {};
  }
  std::vector<std::string> tokens = {model.id_to_token[id]};
  if (model.decoders) {
    for (const DecoderStep& step : *model.decoders) {
      run_decoder(step, /*raw=*/true, tokens);
    }
  }
  std::string bytes;
  for (const std::string& token : tokens) {
    bytes += token;
  }
  return bytes;
}

std::string Tokenizer::token_piece(int32_t id) const {
  const detail::TokenizerModel& model = *model_;
  if (id < 0 || static_cast<size_t>(id) >= model.flags.size() ||
      (model.flags[id] & detail::TokenizerModel::kKnown) == 0) {
    return {};
  }
  return model.id_to_token[id];
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

}  // namespace flotilla::llm

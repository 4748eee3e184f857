// UTF-8 decoding and encoding for the tokenizer library (tokenizer_model.h, tokenizer.cc,
// unicode_nfc.cc). Private to src/llm. Inline because next_code_point() runs once per character
// on the encode path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace flotilla::llm::detail {

inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";  // U+FFFD

struct CodePoint {
  char32_t value;
  uint32_t length;  // bytes consumed
  bool valid;
};

// Decodes the code point at s[i] (i < s.size()). An invalid or truncated sequence yields U+FFFD
// with the length of its longest valid prefix: the rule of Rust's from_utf8_lossy and Python's
// "replace", so one broken character becomes one U+FFFD as in Hugging Face.
inline CodePoint next_code_point(std::string_view s, size_t i) {
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

inline void append_utf8(std::string& out, char32_t cp) {
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

inline bool is_valid_utf8(std::string_view s) {
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
inline std::string to_valid_utf8(std::string_view s) {
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
inline size_t previous_char_start(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) {
    --i;
  }
  return i;
}

// Rust's char::is_whitespace (Unicode White_Space), which Hugging Face uses for lstrip/rstrip
// and the Strip normalizer.
inline bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

}  // namespace flotilla::llm::detail

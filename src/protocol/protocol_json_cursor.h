// Writing JSON through a cursor, for the writers that run once per request (the gateway's
// inference tables, the trace exporter): the writer first makes room for the most its text
// can take (json_string_bound for each string, the bounds below for numbers), then writes
// every literal as a fixed-size copy and every field with no capacity check, where
// std::string's `+=` checks and may grow on each of dozens of small appends a record.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>

#include "protocol/protocol.h"

namespace flotilla::protocol {

// Bytes appended through a cursor into room made first (std::string::resize would zero-fill
// the room).
class ByteBuffer {
 public:
  // Room for `size` more bytes, at the returned position; valid until the next call.
  char* room(size_t size);
  // The bytes up to `end` (in the last room()) are written.
  void commit(const char* end) { size_ = static_cast<size_t>(end - data_.get()); }
  void append(std::string_view bytes);
  std::string_view view() const { return {data_.get(), size_}; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  void clear() { size_ = 0; }  // keeps the memory
  void swap(ByteBuffer& other) noexcept;

 private:
  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

class JsonCursor {
 public:
  // The most integer() writes.
  static constexpr size_t kIntegerBound = 20;

  explicit JsonCursor(char* at) : at_(at) {}

  template <size_t N>
  void literal(const char (&text)[N]) {
    std::memcpy(at_, text, N - 1);
    at_ += N - 1;
  }
  // Copied as it is (JSON already, or text known to need no escaping).
  void raw(std::string_view text) {
    if (!text.empty()) {  // an empty view may have no data pointer at all
      std::memcpy(at_, text.data(), text.size());
      at_ += text.size();
    }
  }
  // Quoted and escaped: at most json_string_bound(value.size()) bytes.
  void string(std::string_view value) { at_ = write_json_string(value, at_); }
  void integer(int64_t value) { at_ = std::to_chars(at_, at_ + kIntegerBound, value).ptr; }
  // The low `digits` hex digits of `value`, lower case, zero-padded.
  void hex(uint64_t value, int digits) {
    static constexpr char kDigits[] = "0123456789abcdef";
    for (int i = digits - 1; i >= 0; --i, value >>= 4) {
      at_[i] = kDigits[value & 0xf];
    }
    at_ += digits;
  }
  void boolean(bool value) {
    if (value) {
      literal("true");
    } else {
      literal("false");
    }
  }
  char* end() const { return at_; }

 private:
  char* at_;
};

}  // namespace flotilla::protocol

#include "protocol/json_util.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "protocol/protocol.h"
#include "protocol/protocol_json_cursor.h"

namespace flotilla::protocol {
namespace detail {
namespace {

std::string where_text(const char* prefix, int64_t index) {
  return std::string(prefix) + " element " + std::to_string(index);
}

}  // namespace

Result<simdjson::dom::element> parse_json(std::string& body) {
  return parse_json(body, body.size());
}

Result<simdjson::dom::element> parse_json(std::string& body, size_t length) {
  thread_local simdjson::dom::parser parser;
  // simdjson reads up to SIMDJSON_PADDING bytes past the end; reserving them here lets it
  // parse in place instead of copying the body.
  body.reserve(body.size() + simdjson::SIMDJSON_PADDING);
  simdjson::dom::element root;
  auto error = parser.parse(body.data(), std::min(length, body.size()), false).get(root);
  if (error) {
    return invalid_argument(std::string("malformed JSON: ") + simdjson::error_message(error));
  }
  return root;
}

Status append_element(simdjson::dom::element value, Tensor& tensor, const char* where_prefix,
                      int64_t index) {
  using simdjson::dom::element_type;
  const element_type type = value.type();
  switch (tensor.datatype) {
    case DataType::kFp32:
    case DataType::kFp64: {
      double number = 0;
      if (type == element_type::DOUBLE) {
        number = value.get_double().value_unsafe();
      } else if (type == element_type::INT64) {
        number = static_cast<double>(value.get_int64().value_unsafe());
      } else if (type == element_type::UINT64) {
        number = static_cast<double>(value.get_uint64().value_unsafe());
      } else if (type == element_type::NULL_VALUE) {
        number = std::numeric_limits<double>::quiet_NaN();  // a missing value
      } else {
        return invalid_argument(where_text(where_prefix, index) + ": expected a number for " +
                                std::string(datatype_name(tensor.datatype)));
      }
      if (tensor.datatype == DataType::kFp32) {
        tensor.append(static_cast<float>(number));
      } else {
        tensor.append(number);
      }
      return Status::ok();
    }
    case DataType::kInt32:
    case DataType::kInt64: {
      int64_t number = 0;
      if (type == element_type::INT64) {
        number = value.get_int64().value_unsafe();
      } else {
        return invalid_argument(where_text(where_prefix, index) + ": expected an integer for " +
                                std::string(datatype_name(tensor.datatype)));
      }
      if (tensor.datatype == DataType::kInt32) {
        if (number < std::numeric_limits<int32_t>::min() ||
            number > std::numeric_limits<int32_t>::max()) {
          return invalid_argument(where_text(where_prefix, index) + ": out of range for INT32");
        }
        tensor.append(static_cast<int32_t>(number));
      } else {
        tensor.append(number);
      }
      return Status::ok();
    }
    case DataType::kBool: {
      if (type != element_type::BOOL) {
        return invalid_argument(where_text(where_prefix, index) +
                                ": expected true or false for BOOL");
      }
      tensor.append(static_cast<uint8_t>(value.get_bool().value_unsafe() ? 1 : 0));
      return Status::ok();
    }
  }
  return internal_error("unknown datatype");
}

namespace {

// Nested data must follow the shape exactly: dimension `dim` has shape[dim] entries, arrays
// above the last dimension and scalars in it.
Status append_shaped(simdjson::dom::array array, Tensor& tensor, const std::string& where,
                     size_t dim) {
  const bool last = dim + 1 == tensor.shape.size();
  if (dim >= tensor.shape.size() || static_cast<int64_t>(array.size()) != tensor.shape[dim]) {
    return invalid_argument(where + ": nested data does not match shape " +
                            shape_text(tensor.shape));
  }
  for (simdjson::dom::element item : array) {
    const bool is_array = item.type() == simdjson::dom::element_type::ARRAY;
    if (is_array == last) {
      return invalid_argument(where + ": nested data does not match shape " +
                              shape_text(tensor.shape));
    }
    if (is_array) {
      FLOTILLA_RETURN_IF_ERROR(
          append_shaped(item.get_array().value_unsafe(), tensor, where, dim + 1));
    } else {
      int64_t index = static_cast<int64_t>(tensor.data.size() / element_size(tensor.datatype));
      FLOTILLA_RETURN_IF_ERROR(append_element(item, tensor, where.c_str(), index));
    }
  }
  return Status::ok();
}

}  // namespace

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    text += (i ? "," : "") + std::to_string(shape[i]);
  }
  return text + "]";
}

Status append_data(simdjson::dom::element value, Tensor& tensor, const std::string& where) {
  simdjson::dom::array array;
  if (value.get_array().get(array)) {
    return invalid_argument(where + ": data must be an array");
  }
  bool nested = false;
  for (simdjson::dom::element item : array) {
    nested = nested || item.type() == simdjson::dom::element_type::ARRAY;
  }
  if (nested) {
    return append_shaped(array, tensor, where, 0);
  }
  int64_t index = 0;
  for (simdjson::dom::element item : array) {
    FLOTILLA_RETURN_IF_ERROR(append_element(item, tensor, where.c_str(), index++));
  }
  return Status::ok();
}

void append_number(double value, std::string& out) {
  if (!std::isfinite(value)) {
    out += "null";  // JSON has no NaN or infinity
    return;
  }
  char buffer[32];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out.append(buffer, end);
}

void append_int(int64_t value, std::string& out) {
  char buffer[24];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out.append(buffer, end);
}

namespace {

void append_element_json(const Tensor& tensor, int64_t i, std::string& out) {
  switch (tensor.datatype) {
    case DataType::kBool:
      out += tensor.data[i] != 0 ? "true" : "false";
      break;
    case DataType::kInt32:
      append_int(tensor.values<int32_t>()[i], out);
      break;
    case DataType::kInt64:
      append_int(tensor.values<int64_t>()[i], out);
      break;
    case DataType::kFp32: {
      // Shortest representation that reads back to the same float.
      float value = tensor.values<float>()[i];
      if (!std::isfinite(value)) {
        out += "null";
        break;
      }
      char buffer[32];
      auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
      out.append(buffer, end);
      break;
    }
    case DataType::kFp64:
      append_number(tensor.values<double>()[i], out);
      break;
  }
}

// Writes dimension `dim` of `tensor` starting at element `offset`; returns the next offset.
int64_t append_dimension(const Tensor& tensor, size_t dim, int64_t offset, std::string& out) {
  out += '[';
  const int64_t length = tensor.shape[dim];
  for (int64_t i = 0; i < length; ++i) {
    if (i > 0) {
      out += ',';
    }
    if (dim + 1 == tensor.shape.size()) {
      append_element_json(tensor, offset++, out);
    } else {
      offset = append_dimension(tensor, dim + 1, offset, out);
    }
  }
  out += ']';
  return offset;
}

}  // namespace

void append_tensor_data_flat(const Tensor& tensor, std::string& out) {
  out += '[';
  const int64_t count = tensor.element_count();
  for (int64_t i = 0; i < count; ++i) {
    if (i > 0) {
      out += ',';
    }
    append_element_json(tensor, i, out);
  }
  out += ']';
}

void append_tensor_data(const Tensor& tensor, std::string& out) {
  if (tensor.shape.empty()) {  // a scalar
    if (!tensor.data.empty()) {
      append_element_json(tensor, 0, out);
    }
    return;
  }
  append_dimension(tensor, 0, 0, out);
}

size_t utf8_sequence_length(std::string_view text) {
  const auto byte = [&text](size_t i) {
    return static_cast<unsigned char>(text[i]);
  };
  const unsigned char lead = byte(0);
  size_t length = 0;
  unsigned char low = 0x80;
  unsigned char high = 0xBF;  // allowed range of the second byte
  if (lead < 0x80) {
    return 1;
  } else if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    low = lead == 0xE0 ? 0xA0 : 0x80;
    high = lead == 0xED ? 0x9F : 0xBF;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    low = lead == 0xF0 ? 0x90 : 0x80;
    high = lead == 0xF4 ? 0x8F : 0xBF;
  } else {
    return 0;
  }
  if (text.size() < length || byte(1) < low || byte(1) > high) {
    return 0;
  }
  for (size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xBF) {
      return 0;
    }
  }
  return length;
}

}  // namespace detail

namespace {

// How many bytes from `at` on go into a JSON string as they are: printable ASCII but '"' and
// '\\'. SSE2 (every x86-64) looks at 16 bytes a step: the gateway's inference tables write
// every request and response body through here, and a body is mostly such runs.
size_t plain_run(const char* at, const char* end) {
  const char* const start = at;
#ifdef __SSE2__
  // A bit for each of the 16 bytes at `p` that is not plain. The compare is signed: bytes
  // from 0x80 up are negative, so "below ' '" like the control bytes.
  const auto special = [](const char* p) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(bytes, _mm_set1_epi8('"')),
                                                       _mm_cmpeq_epi8(bytes, _mm_set1_epi8('\\'))),
                                          _mm_cmplt_epi8(bytes, _mm_set1_epi8(' '))));
  };
  for (; end - at >= 16; at += 16) {
    if (const int mask = special(at); mask != 0) {
      return static_cast<size_t>(at - start) + static_cast<size_t>(__builtin_ctz(mask));
    }
  }
  if (at < end) {
    // The tail, copied where 16 bytes can be read, padded with plain bytes.
    char tail[16];
    std::memset(tail, 'a', sizeof(tail));
    std::memcpy(tail, at, static_cast<size_t>(end - at));
    const int mask = special(tail);
    at += mask != 0 ? __builtin_ctz(mask) : end - at;
  }
#else
  for (; at < end; ++at) {
    const auto c = static_cast<unsigned char>(*at);
    if (c < 0x20 || c >= 0x80 || c == '"' || c == '\\') {
      break;
    }
  }
#endif
  return static_cast<size_t>(at - start);
}

// Writes what the byte at `at` (not in a plain run) becomes through `put(text, size)`: a valid
// UTF-8 sequence as it is (messages can quote client bytes: the JSON stays valid UTF-8), an
// invalid byte as U+FFFD, anything else escaped. Returns where the next byte is.
template <typename Put>
const char* write_special(const char* at, const char* end, Put&& put) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto c = static_cast<unsigned char>(*at);
  if (c >= 0x80) {
    const size_t length =
        detail::utf8_sequence_length(std::string_view(at, static_cast<size_t>(end - at)));
    if (length > 0) {
      put(at, length);
      return at + length;
    }
    put("\\ufffd", 6);
    return at + 1;
  }
  switch (c) {
    case '"':
      put("\\\"", 2);
      break;
    case '\\':
      put("\\\\", 2);
      break;
    case '\n':
      put("\\n", 2);
      break;
    case '\r':
      put("\\r", 2);
      break;
    case '\t':
      put("\\t", 2);
      break;
    default: {
      const char escaped[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xf]};
      put(escaped, 6);
    }
  }
  return at + 1;
}

// The string's text between its quotes, through `put(text, size)`.
template <typename Put>
void write_escaped(std::string_view value, Put&& put) {
  const char* at = value.data();
  const char* const end = at + value.size();
  while (true) {
    const size_t run = plain_run(at, end);
    if (run > 0) {  // an empty view may have no data pointer at all
      put(at, run);
      at += run;
    }
    if (at == end) {
      return;
    }
    at = write_special(at, end, put);
  }
}

}  // namespace

void append_json_string(std::string_view value, std::string& out) {
  out += '"';
  write_escaped(value, [&out](const char* text, size_t size) { out.append(text, size); });
  out += '"';
}

char* write_json_string(std::string_view value, char* out) {
  *out++ = '"';
  write_escaped(value, [&out](const char* text, size_t size) {
    std::memcpy(out, text, size);
    out += size;
  });
  *out++ = '"';
  return out;
}

char* ByteBuffer::room(size_t size) {
  if (capacity_ - size_ < size) {
    const size_t capacity = std::max({size_ + size, 2 * capacity_, size_t{64 * 1024}});
    auto data = std::make_unique_for_overwrite<char[]>(capacity);
    if (size_ > 0) {
      std::memcpy(data.get(), data_.get(), size_);
    }
    data_ = std::move(data);
    capacity_ = capacity;
  }
  return data_.get() + size_;
}

void ByteBuffer::append(std::string_view bytes) {
  char* at = room(bytes.size());
  if (!bytes.empty()) {
    std::memcpy(at, bytes.data(), bytes.size());
  }
  commit(at + bytes.size());
}

void ByteBuffer::swap(ByteBuffer& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(size_, other.size_);
  std::swap(capacity_, other.capacity_);
}

}  // namespace flotilla::protocol

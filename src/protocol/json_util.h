// Private helpers of the protocol module: JSON parsing with simdjson and fast JSON writing.
#pragma once

#include <string>
#include <string_view>

#include <simdjson.h>

#include "common/common.h"

namespace flotilla::protocol::detail {

// Parses `body` with a parser owned by the calling thread (reused across requests, so the hot
// path does not allocate parser buffers). The element is valid until the next call on the
// same thread.
Result<simdjson::dom::element> parse_json(std::string& body);
// The same over the first `length` bytes of `body` (the JSON before binary data).
Result<simdjson::dom::element> parse_json(std::string& body, size_t length);

// Appends one leaf JSON value to `tensor` converted to its datatype, or explains why it cannot
// be: `where` names the value in messages ("input 'x' element 3").
Status append_element(simdjson::dom::element value, Tensor& tensor, const char* where_prefix,
                      int64_t index);

// "[2,30]": a shape as messages show it.
std::string shape_text(const std::vector<int64_t>& shape);

// Appends a tensor's `data` to `tensor` in row-major order: a flat array of any length (the
// caller checks the count), or arrays nested exactly as tensor.shape says.
Status append_data(simdjson::dom::element value, Tensor& tensor, const std::string& where);

// Appends the elements of `tensor` as a JSON array, nested to match its shape.
void append_tensor_data(const Tensor& tensor, std::string& out);
// Appends the elements of `tensor` as one flat JSON array.
void append_tensor_data_flat(const Tensor& tensor, std::string& out);
void append_number(double value, std::string& out);
void append_int(int64_t value, std::string& out);

// Length of the well-formed UTF-8 sequence at the start of `text` (RFC 3629: no overlong
// forms, no surrogates, nothing past U+10FFFF), or 0 when it is not one. `text` is not empty.
size_t utf8_sequence_length(std::string_view text);

}  // namespace flotilla::protocol::detail

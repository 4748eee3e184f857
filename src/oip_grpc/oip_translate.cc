#include "oip_grpc/oip_translate.h"

#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

#include <simdjson.h>

#include "protocol/protocol.h"

namespace flotilla::oip_grpc {
namespace {

using inference::InferParameter;
using inference::InferTensorContents;
using simdjson::dom::element;
using simdjson::dom::element_type;

static_assert(std::endian::native == std::endian::little,
              "raw tensor contents are little-endian; this build copies them as is");

// ---- Datatypes ----------------------------------------------------------------------------

enum class Kind { kBool, kSigned, kUnsigned, kFloat, kHalf, kBfloat, kBytes };

struct TypeInfo {
  Kind kind;
  size_t size;  // bytes per element; 0 for BYTES
};

std::optional<TypeInfo> type_info(std::string_view datatype) {
  static constexpr std::pair<std::string_view, TypeInfo> kTypes[] = {
      {"BOOL", {Kind::kBool, 1}},       {"INT8", {Kind::kSigned, 1}},
      {"INT16", {Kind::kSigned, 2}},    {"INT32", {Kind::kSigned, 4}},
      {"INT64", {Kind::kSigned, 8}},    {"UINT8", {Kind::kUnsigned, 1}},
      {"UINT16", {Kind::kUnsigned, 2}}, {"UINT32", {Kind::kUnsigned, 4}},
      {"UINT64", {Kind::kUnsigned, 8}}, {"FP16", {Kind::kHalf, 2}},
      {"BF16", {Kind::kBfloat, 2}},     {"FP32", {Kind::kFloat, 4}},
      {"FP64", {Kind::kFloat, 8}},      {"BYTES", {Kind::kBytes, 0}},
  };
  for (const auto& [name, info] : kTypes) {
    if (name == datatype) {
      return info;
    }
  }
  return std::nullopt;
}

float half_to_float(uint16_t half) {
  const uint32_t sign = (half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1f;
  uint32_t mantissa = half & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf, nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    bits = sign | static_cast<uint32_t>(113 - shift) << 23 | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t float_to_half(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const int exponent = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = bits & 0x7fffffu;
  if (((bits >> 23) & 0xff) == 0xff) {
    return sign | 0x7c00u | (mantissa != 0 ? 0x200u : 0);  // inf, nan
  }
  if (exponent >= 0x1f) {
    return sign | 0x7c00u;  // overflow: inf
  }
  if (exponent <= 0) {
    if (exponent < -10) {
      return sign;  // underflow: zero
    }
    mantissa |= 0x800000u;
    const int shift = 14 - exponent;
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) {
      ++half;
    }
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) {
    ++half;  // may carry into the exponent, up to inf: right
  }
  return static_cast<uint16_t>(sign | half);
}

float bfloat_to_float(uint16_t value) {
  return std::bit_cast<float>(uint32_t{value} << 16);
}

uint16_t float_to_bfloat(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);  // to nearest, ties to even
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

template <typename T>
T load(const char* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof(T));
  return value;
}

template <typename T>
void store(T value, std::string& out) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

// An element of an integer datatype of `size` bytes, widened.
int64_t load_signed(const char* at, size_t size) {
  switch (size) {
    case 1:
      return load<int8_t>(at);
    case 2:
      return load<int16_t>(at);
    case 4:
      return load<int32_t>(at);
    default:
      return load<int64_t>(at);
  }
}
uint64_t load_unsigned(const char* at, size_t size) {
  switch (size) {
    case 1:
      return load<uint8_t>(at);
    case 2:
      return load<uint16_t>(at);
    case 4:
      return load<uint32_t>(at);
    default:
      return load<uint64_t>(at);
  }
}

// ---- JSON writing -------------------------------------------------------------------------

template <typename T>
void append_integer(T value, std::string& out) {
  char buffer[24];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out.append(buffer, result.ptr);
}

// Where an element sits, for messages: its text is made only for an error, not per element.
struct ElementAt {
  const std::string& where;
  int64_t index;
};
std::string location_text(const std::string& where) {
  return where;
}
std::string location_text(const ElementAt& at) {
  return at.where + " element " + std::to_string(at.index);
}

// Shortest text that reads back as the same `T`.
template <typename T, typename Where>
Status append_float(T value, std::string& out, const Where& where) {
  if (!std::isfinite(value)) {
    return invalid_argument(location_text(where) + " is not finite; JSON has no form for it");
  }
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  out.append(buffer, result.ptr);
  return Status::ok();
}

template <typename Where>
Status append_text(std::string_view text, std::string& out, const Where& where) {
  if (!simdjson::validate_utf8(text.data(), text.size())) {
    return invalid_argument(location_text(where) +
                            " is not UTF-8 text; JSON strings carry text only");
  }
  protocol::append_json_string(text, out);
  return Status::ok();
}

Status append_parameter(const InferParameter& parameter, std::string& out,
                        const std::string& where) {
  switch (parameter.parameter_choice_case()) {
    case InferParameter::kBoolParam:
      out += parameter.bool_param() ? "true" : "false";
      return Status::ok();
    case InferParameter::kInt64Param:
      append_integer(parameter.int64_param(), out);
      return Status::ok();
    case InferParameter::kUint64Param:
      append_integer(parameter.uint64_param(), out);
      return Status::ok();
    case InferParameter::kDoubleParam:
      return append_float(parameter.double_param(), out, where);
    case InferParameter::kStringParam:
      return append_text(parameter.string_param(), out, where);
    case InferParameter::PARAMETER_CHOICE_NOT_SET:
      break;
  }
  return invalid_argument(where + " has no value");
}

// `"parameters":{...},` when there are any.
Status append_parameters(const google::protobuf::Map<std::string, InferParameter>& parameters,
                         std::string& out, const std::string& where) {
  if (parameters.empty()) {
    return Status::ok();
  }
  out += "\"parameters\":{";
  bool first = true;
  for (const auto& [key, value] : parameters) {
    if (!first) {
      out += ',';
    }
    first = false;
    FLOTILLA_RETURN_IF_ERROR(append_text(key, out, where + " key"));
    out += ':';
    FLOTILLA_RETURN_IF_ERROR(append_parameter(value, out, where + " '" + key + "'"));
  }
  out += "},";
  return Status::ok();
}

// The element count a shape holds, or an error for a negative or overflowing one.
Result<int64_t> element_count(const google::protobuf::RepeatedField<int64_t>& shape,
                              const std::string& where) {
  int64_t count = 1;
  for (int64_t dimension : shape) {
    if (dimension < 0) {
      return invalid_argument(where + " has a negative dimension in its shape");
    }
    if (dimension != 0 && count > std::numeric_limits<int32_t>::max() / dimension) {
      return invalid_argument(where + " has a shape too large");
    }
    count *= dimension;
  }
  return count;
}

// Appends `count` elements read from raw little-endian bytes, as JSON values.
Status append_json_of_raw(const TypeInfo& type, std::string_view raw, int64_t count,
                          std::string& out, const std::string& where) {
  if (type.kind == Kind::kBytes) {
    size_t offset = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (raw.size() - offset < 4) {
        return invalid_argument(where + ": raw contents end inside element " + std::to_string(i));
      }
      const uint32_t length = load<uint32_t>(raw.data() + offset);
      offset += 4;
      if (raw.size() - offset < length) {
        return invalid_argument(where + ": raw contents end inside element " + std::to_string(i));
      }
      if (i > 0) {
        out += ',';
      }
      FLOTILLA_RETURN_IF_ERROR(append_text(raw.substr(offset, length), out, ElementAt{where, i}));
      offset += length;
    }
    if (offset != raw.size()) {
      return invalid_argument(where + ": raw contents hold bytes past element " +
                              std::to_string(count - 1));
    }
    return Status::ok();
  }
  if (raw.size() != static_cast<size_t>(count) * type.size) {
    return invalid_argument(where + ": raw contents hold " + std::to_string(raw.size()) +
                            " bytes; its shape needs " +
                            std::to_string(static_cast<size_t>(count) * type.size));
  }
  for (int64_t i = 0; i < count; ++i) {
    if (i > 0) {
      out += ',';
    }
    const char* at = raw.data() + static_cast<size_t>(i) * type.size;
    const ElementAt element{where, i};
    switch (type.kind) {
      case Kind::kBool:
        out += *at != 0 ? "true" : "false";
        break;
      case Kind::kSigned:
        append_integer(load_signed(at, type.size), out);
        break;
      case Kind::kUnsigned:
        append_integer(load_unsigned(at, type.size), out);
        break;
      case Kind::kHalf:
        FLOTILLA_RETURN_IF_ERROR(append_float(half_to_float(load<uint16_t>(at)), out, element));
        break;
      case Kind::kBfloat:
        FLOTILLA_RETURN_IF_ERROR(append_float(bfloat_to_float(load<uint16_t>(at)), out, element));
        break;
      case Kind::kFloat:
        FLOTILLA_RETURN_IF_ERROR(type.size == 4 ? append_float(load<float>(at), out, element)
                                                : append_float(load<double>(at), out, element));
        break;
      case Kind::kBytes:
        break;  // above
    }
  }
  return Status::ok();
}

// Appends one element of a typed contents field as JSON (append_values' writer).
struct ElementWriter {
  std::string& out;
  Status operator()(bool value, const ElementAt&) const {
    out += value ? "true" : "false";
    return Status::ok();
  }
  template <typename T>
  requires std::is_integral_v<T> Status operator()(T value, const ElementAt&) const {
    append_integer(value, out);
    return Status::ok();
  }
  Status operator()(float value, const ElementAt& element) const {
    return append_float(value, out, element);
  }
  Status operator()(double value, const ElementAt& element) const {
    return append_float(value, out, element);
  }
  Status operator()(const std::string& value, const ElementAt& element) const {
    return append_text(value, out, element);
  }
};

// Appends the elements of one typed contents field, which must hold `count` of them.
// `writer(value, ElementAt)` appends one element to `writer.out`.
template <typename Values, typename Writer>
Status append_values(const Values& values, int64_t count, std::string_view field,
                     const std::string& where, const Writer& writer) {
  if (values.size() != count) {
    return invalid_argument(where + ": contents." + std::string(field) + " holds " +
                            std::to_string(values.size()) + " elements; its shape needs " +
                            std::to_string(count));
  }
  for (int i = 0; i < values.size(); ++i) {
    if (i > 0) {
      writer.out += ',';
    }
    FLOTILLA_RETURN_IF_ERROR(writer(values.Get(i), ElementAt{where, int64_t{i}}));
  }
  return Status::ok();
}

// Appends `count` elements from the typed contents field that `type` reads; every other
// field must be empty.
Status append_typed_data(const TypeInfo& type, const std::string& datatype,
                         const InferTensorContents& contents, int64_t count, std::string& out,
                         const std::string& where) {
  const int used = (contents.bool_contents_size() > 0) + (contents.int_contents_size() > 0) +
                   (contents.int64_contents_size() > 0) + (contents.uint_contents_size() > 0) +
                   (contents.uint64_contents_size() > 0) + (contents.fp32_contents_size() > 0) +
                   (contents.fp64_contents_size() > 0) + (contents.bytes_contents_size() > 0);
  if (used > 1) {
    return invalid_argument(where + ": contents fill more than one field");
  }
  const ElementWriter writer{out};
  switch (type.kind) {
    case Kind::kBool:
      return append_values(contents.bool_contents(), count, "bool_contents", where, writer);
    case Kind::kSigned:
      return type.size == 8
                 ? append_values(contents.int64_contents(), count, "int64_contents", where, writer)
                 : append_values(contents.int_contents(), count, "int_contents", where, writer);
    case Kind::kUnsigned:
      return type.size == 8
                 ? append_values(contents.uint64_contents(), count, "uint64_contents", where,
                                 writer)
                 : append_values(contents.uint_contents(), count, "uint_contents", where, writer);
    case Kind::kFloat:
      return type.size == 4
                 ? append_values(contents.fp32_contents(), count, "fp32_contents", where, writer)
                 : append_values(contents.fp64_contents(), count, "fp64_contents", where, writer);
    case Kind::kBytes:
      return append_values(contents.bytes_contents(), count, "bytes_contents", where, writer);
    case Kind::kHalf:
    case Kind::kBfloat:
      break;
  }
  return invalid_argument(where + ": " + datatype +
                          " has no typed contents field; send it in raw_input_contents");
}

Status check_path_segment(const std::string& value, std::string_view field) {
  for (unsigned char c : value) {
    if (c == '/' || c == '?' || c == '#' || c == '%' || c <= ' ' || c == 0x7f) {
      return invalid_argument(std::string(field) + " '" + value +
                              "' holds a character a model name may not ('/', '?', '#', '%', "
                              "space or control)");
    }
  }
  return Status::ok();
}

Result<std::string> model_path(const std::string& name, const std::string& version) {
  if (name.empty()) {
    return invalid_argument("the model name is empty");
  }
  FLOTILLA_RETURN_IF_ERROR(check_path_segment(name, "model name"));
  FLOTILLA_RETURN_IF_ERROR(check_path_segment(version, "model version"));
  std::string path = "/v2/models/" + name;
  if (!version.empty()) {
    path += "/versions/" + version;
  }
  return path;
}

http::Request make_request(http::Method method, std::string target) {
  http::Request request;
  request.method = method;
  request.target = std::move(target);
  return request;
}

// ---- JSON reading -------------------------------------------------------------------------

Result<element> parse_answer(std::string& body) {
  thread_local simdjson::dom::parser parser;
  element root;
  if (const auto error = parser.parse(body).get(root); error != simdjson::SUCCESS) {
    return internal_error(std::string("the model server's answer is not JSON: ") +
                          simdjson::error_message(error));
  }
  if (!root.is_object()) {
    return internal_error("the model server's answer is not a JSON object");
  }
  return root;
}

Result<std::string_view> string_field(element object, std::string_view key,
                                      const std::string& where, bool required) {
  element value;
  if (object[key].get(value) != simdjson::SUCCESS) {
    if (required) {
      return internal_error(where + " has no \"" + std::string(key) + "\"");
    }
    return std::string_view();
  }
  std::string_view text;
  if (value.get(text) != simdjson::SUCCESS) {
    return internal_error(where + " \"" + std::string(key) + "\" is not a string");
  }
  return text;
}

Status read_shape(element object, const std::string& where,
                  google::protobuf::RepeatedField<int64_t>& shape) {
  simdjson::dom::array dimensions;
  if (object["shape"].get(dimensions) != simdjson::SUCCESS) {
    return internal_error(where + " has no \"shape\" array");
  }
  for (element dimension : dimensions) {
    int64_t value = 0;
    if (dimension.get(value) != simdjson::SUCCESS) {
      return internal_error(where + " \"shape\" holds a value that is not an integer");
    }
    shape.Add(value);
  }
  return Status::ok();
}

void read_parameters(element object, google::protobuf::Map<std::string, InferParameter>& out) {
  simdjson::dom::object parameters;
  if (object["parameters"].get(parameters) != simdjson::SUCCESS) {
    return;
  }
  for (auto [key, value] : parameters) {
    InferParameter& parameter = out[std::string(key)];
    switch (value.type()) {
      case element_type::BOOL:
        parameter.set_bool_param(value.get_bool().value_unsafe());
        break;
      case element_type::INT64:
        parameter.set_int64_param(value.get_int64().value_unsafe());
        break;
      case element_type::UINT64:
        parameter.set_uint64_param(value.get_uint64().value_unsafe());
        break;
      case element_type::DOUBLE:
        parameter.set_double_param(value.get_double().value_unsafe());
        break;
      case element_type::STRING:
        parameter.set_string_param(std::string(value.get_string().value_unsafe()));
        break;
      default:  // arrays, objects, null: as their JSON text
        parameter.set_string_param(simdjson::to_string(value));
        break;
    }
  }
}

// The bit pattern of a JSON integer that fits an integer datatype of `size` bytes (signed or
// not), or nothing. Its low `size` bytes are the element, little-endian.
std::optional<uint64_t> fitting_integer(element value, bool is_signed, size_t size) {
  const unsigned bits = static_cast<unsigned>(size * 8);
  const int64_t low = !is_signed ? 0 : bits == 64 ? INT64_MIN : -(int64_t{1} << (bits - 1));
  const uint64_t high = bits == 64 ? (is_signed ? uint64_t{INT64_MAX} : UINT64_MAX)
                                   : (uint64_t{1} << (is_signed ? bits - 1 : bits)) - 1;
  int64_t as_signed = 0;
  uint64_t as_unsigned = 0;
  if (value.get(as_signed) == simdjson::SUCCESS) {
    if (as_signed < low || (as_signed > 0 && static_cast<uint64_t>(as_signed) > high)) {
      return std::nullopt;
    }
    return static_cast<uint64_t>(as_signed);
  }
  // Past INT64_MAX: simdjson reads it only as unsigned.
  if (value.get(as_unsigned) == simdjson::SUCCESS && as_unsigned <= high) {
    return as_unsigned;
  }
  return std::nullopt;
}

// Appends one JSON leaf as a raw element of `type`.
Status append_raw_element(element value, const TypeInfo& type, std::string& out,
                          const ElementAt& at) {
  switch (type.kind) {
    case Kind::kBool: {
      bool flag = false;
      if (value.get(flag) != simdjson::SUCCESS) {
        return internal_error(location_text(at) + " is not a boolean");
      }
      out += static_cast<char>(flag ? 1 : 0);
      return Status::ok();
    }
    case Kind::kSigned:
    case Kind::kUnsigned: {
      const std::optional<uint64_t> bits =
          fitting_integer(value, type.kind == Kind::kSigned, type.size);
      if (!bits) {
        return internal_error(location_text(at) + " is not an integer of its datatype's range");
      }
      out.append(reinterpret_cast<const char*>(&*bits), type.size);  // the low bytes
      return Status::ok();
    }
    case Kind::kFloat:
    case Kind::kHalf:
    case Kind::kBfloat: {
      double number = 0;
      if (value.get(number) != simdjson::SUCCESS) {
        return internal_error(location_text(at) + " is not a number");
      }
      if (type.kind == Kind::kHalf) {
        store(float_to_half(static_cast<float>(number)), out);
      } else if (type.kind == Kind::kBfloat) {
        store(float_to_bfloat(static_cast<float>(number)), out);
      } else if (type.size == 4) {
        store(static_cast<float>(number), out);
      } else {
        store(number, out);
      }
      return Status::ok();
    }
    case Kind::kBytes: {
      std::string_view text;
      if (value.get(text) != simdjson::SUCCESS) {
        return internal_error(location_text(at) + " is not a string");
      }
      store(static_cast<uint32_t>(text.size()), out);
      out.append(text);
      return Status::ok();
    }
  }
  return Status::ok();
}

// Appends the leaves of `data` (nested arrays, row-major), counting them.
Status append_raw_of_json(element data, const TypeInfo& type, std::string& out, int64_t& count,
                          const std::string& where, int depth = 0) {
  if (depth > 32) {
    return internal_error(where + " is nested too deep");
  }
  simdjson::dom::array array;
  if (data.get(array) != simdjson::SUCCESS) {
    FLOTILLA_RETURN_IF_ERROR(append_raw_element(data, type, out, ElementAt{where, count}));
    ++count;
    return Status::ok();
  }
  for (element item : array) {
    FLOTILLA_RETURN_IF_ERROR(append_raw_of_json(item, type, out, count, where, depth + 1));
  }
  return Status::ok();
}

std::string error_message_of(const http::Response& answer) {
  std::string body = answer.body;
  thread_local simdjson::dom::parser parser;
  element root;
  if (parser.parse(body).get(root) == simdjson::SUCCESS && root.is_object()) {
    std::string_view text;
    if (root["error"].get(text) == simdjson::SUCCESS ||
        root["error"]["message"].get(text) == simdjson::SUCCESS ||
        root["message"].get(text) == simdjson::SUCCESS ||
        root["detail"].get(text) == simdjson::SUCCESS) {
      return std::string(text);
    }
  }
  if (answer.body.empty()) {
    return "HTTP " + std::to_string(answer.status);
  }
  return protocol::valid_utf8(std::string_view(answer.body).substr(0, 256));
}

}  // namespace

Result<http::Request> rest_infer_request(const inference::ModelInferRequest& request) {
  FLOTILLA_ASSIGN_OR_RETURN(std::string path,
                            model_path(request.model_name(), request.model_version()));
  const bool raw = request.raw_input_contents_size() > 0;
  if (raw && request.raw_input_contents_size() != request.inputs_size()) {
    return invalid_argument("raw_input_contents holds " +
                            std::to_string(request.raw_input_contents_size()) + " tensors for " +
                            std::to_string(request.inputs_size()) +
                            " inputs; send all inputs raw or none");
  }
  if (request.inputs_size() == 0) {
    return invalid_argument("the request has no inputs");
  }
  http::Request rest = make_request(http::Method::kPost, path + "/infer");
  rest.content_type = "application/json";
  rest.headers.emplace_back("Content-Type", "application/json");
  std::string& out = rest.body;
  out.reserve(256 + (raw ? request.raw_input_contents(0).size() * 3 : 0));
  out += '{';
  if (!request.id().empty()) {
    out += "\"id\":";
    FLOTILLA_RETURN_IF_ERROR(append_text(request.id(), out, "id"));
    out += ',';
  }
  FLOTILLA_RETURN_IF_ERROR(append_parameters(request.parameters(), out, "parameter"));
  out += "\"inputs\":[";
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& input = request.inputs(i);
    const std::string where = "input '" + input.name() + "'";
    const std::optional<TypeInfo> type = type_info(input.datatype());
    if (!type) {
      return invalid_argument(where + ": unknown datatype '" + input.datatype() + "'");
    }
    FLOTILLA_ASSIGN_OR_RETURN(int64_t count, element_count(input.shape(), where));
    if (i > 0) {
      out += ',';
    }
    out += "{\"name\":";
    FLOTILLA_RETURN_IF_ERROR(append_text(input.name(), out, where + " name"));
    out += ",\"datatype\":\"" + input.datatype() + "\",\"shape\":[";
    for (int d = 0; d < input.shape_size(); ++d) {
      if (d > 0) {
        out += ',';
      }
      append_integer(input.shape(d), out);
    }
    out += "],";
    FLOTILLA_RETURN_IF_ERROR(append_parameters(input.parameters(), out, where + " parameter"));
    out += "\"data\":[";
    if (raw) {
      if (input.has_contents()) {
        return invalid_argument(where + " has contents as well as raw_input_contents");
      }
      FLOTILLA_RETURN_IF_ERROR(
          append_json_of_raw(*type, request.raw_input_contents(i), count, out, where));
    } else {
      FLOTILLA_RETURN_IF_ERROR(
          append_typed_data(*type, input.datatype(), input.contents(), count, out, where));
    }
    out += "]}";
  }
  out += ']';
  if (request.outputs_size() > 0) {
    out += ",\"outputs\":[";
    for (int i = 0; i < request.outputs_size(); ++i) {
      const auto& output = request.outputs(i);
      const std::string where = "requested output '" + output.name() + "'";
      if (i > 0) {
        out += ',';
      }
      out += '{';
      FLOTILLA_RETURN_IF_ERROR(append_parameters(output.parameters(), out, where + " parameter"));
      out += "\"name\":";
      FLOTILLA_RETURN_IF_ERROR(append_text(output.name(), out, where + " name"));
      out += '}';
    }
    out += ']';
  }
  out += '}';
  return rest;
}

Result<http::Request> rest_model_request(const std::string& name, const std::string& version,
                                         std::string_view path) {
  FLOTILLA_ASSIGN_OR_RETURN(std::string model, model_path(name, version));
  return make_request(http::Method::kGet, model + std::string(path));
}

http::Request rest_get(std::string path) {
  return make_request(http::Method::kGet, std::move(path));
}

Status decode_infer_answer(std::string& body, inference::ModelInferResponse& out) {
  FLOTILLA_ASSIGN_OR_RETURN(element root, parse_answer(body));
  const std::string answer = "the model server's answer";
  FLOTILLA_ASSIGN_OR_RETURN(std::string_view name, string_field(root, "model_name", answer, false));
  FLOTILLA_ASSIGN_OR_RETURN(std::string_view version,
                            string_field(root, "model_version", answer, false));
  FLOTILLA_ASSIGN_OR_RETURN(std::string_view id, string_field(root, "id", answer, false));
  out.set_model_name(std::string(name));
  out.set_model_version(std::string(version));
  out.set_id(std::string(id));
  read_parameters(root, *out.mutable_parameters());
  simdjson::dom::array outputs;
  if (root["outputs"].get(outputs) != simdjson::SUCCESS) {
    return internal_error(answer + " has no \"outputs\" array");
  }
  for (element output : outputs) {
    if (!output.is_object()) {
      return internal_error(answer + " has an output that is not an object");
    }
    FLOTILLA_ASSIGN_OR_RETURN(std::string_view output_name,
                              string_field(output, "name", answer + "'s output", true));
    const std::string where = "output '" + std::string(output_name) + "'";
    FLOTILLA_ASSIGN_OR_RETURN(std::string_view datatype,
                              string_field(output, "datatype", where, true));
    const std::optional<TypeInfo> type = type_info(datatype);
    if (!type) {
      return internal_error(where + " has an unknown datatype '" + std::string(datatype) + "'");
    }
    auto* tensor = out.add_outputs();
    tensor->set_name(std::string(output_name));
    tensor->set_datatype(std::string(datatype));
    FLOTILLA_RETURN_IF_ERROR(read_shape(output, where, *tensor->mutable_shape()));
    read_parameters(output, *tensor->mutable_parameters());
    element data;
    if (output["data"].get(data) != simdjson::SUCCESS) {
      return internal_error(where + " has no \"data\" (binary outputs are not asked for)");
    }
    // The model server's shape is at fault here, not the client's: kInternal.
    Result<int64_t> expected = element_count(tensor->shape(), where);
    if (!expected.is_ok()) {
      return internal_error(expected.status().message());
    }
    std::string& raw = *out.add_raw_output_contents();
    int64_t count = 0;
    FLOTILLA_RETURN_IF_ERROR(append_raw_of_json(data, *type, raw, count, where));
    if (*expected != count) {
      return internal_error(where + " holds " + std::to_string(count) +
                            " elements, not what its shape says");
    }
  }
  return Status::ok();
}

Status decode_model_metadata_answer(std::string& body, inference::ModelMetadataResponse& out) {
  FLOTILLA_ASSIGN_OR_RETURN(element root, parse_answer(body));
  const std::string answer = "the model metadata";
  FLOTILLA_ASSIGN_OR_RETURN(std::string_view name, string_field(root, "name", answer, true));
  FLOTILLA_ASSIGN_OR_RETURN(std::string_view platform,
                            string_field(root, "platform", answer, false));
  out.set_name(std::string(name));
  out.set_platform(std::string(platform));
  simdjson::dom::array versions;
  if (root["versions"].get(versions) == simdjson::SUCCESS) {
    for (element version : versions) {
      std::string_view text;
      if (version.get(text) != simdjson::SUCCESS) {
        return internal_error(answer + " \"versions\" holds a value that is not a string");
      }
      out.add_versions(std::string(text));
    }
  }
  for (const bool inputs : {true, false}) {
    simdjson::dom::array tensors;
    if (root[inputs ? "inputs" : "outputs"].get(tensors) != simdjson::SUCCESS) {
      continue;
    }
    for (element tensor : tensors) {
      const std::string where = answer + (inputs ? "'s input" : "'s output");
      if (!tensor.is_object()) {
        return internal_error(where + " is not an object");
      }
      auto* metadata = inputs ? out.add_inputs() : out.add_outputs();
      FLOTILLA_ASSIGN_OR_RETURN(std::string_view tensor_name,
                                string_field(tensor, "name", where, true));
      FLOTILLA_ASSIGN_OR_RETURN(std::string_view datatype,
                                string_field(tensor, "datatype", where, true));
      metadata->set_name(std::string(tensor_name));
      metadata->set_datatype(std::string(datatype));
      FLOTILLA_RETURN_IF_ERROR(read_shape(tensor, where, *metadata->mutable_shape()));
    }
  }
  return Status::ok();
}

Status decode_server_metadata_answer(std::string& body, inference::ServerMetadataResponse& out) {
  FLOTILLA_ASSIGN_OR_RETURN(element root, parse_answer(body));
  const std::string answer = "the server metadata";
  FLOTILLA_ASSIGN_OR_RETURN(std::string_view name, string_field(root, "name", answer, true));
  FLOTILLA_ASSIGN_OR_RETURN(std::string_view version, string_field(root, "version", answer, false));
  out.set_name(std::string(name));
  out.set_version(std::string(version));
  simdjson::dom::array extensions;
  if (root["extensions"].get(extensions) == simdjson::SUCCESS) {
    for (element extension : extensions) {
      std::string_view text;
      if (extension.get(text) == simdjson::SUCCESS) {
        out.add_extensions(std::string(text));
      }
    }
  }
  return Status::ok();
}

grpc::StatusCode grpc_code_for_http(int status) {
  switch (status) {
    case 400:
    case 415:
    case 422:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case 401:
      return grpc::StatusCode::UNAUTHENTICATED;
    case 403:
      return grpc::StatusCode::PERMISSION_DENIED;
    case 404:
      return grpc::StatusCode::NOT_FOUND;
    case 405:
    case 501:
      return grpc::StatusCode::UNIMPLEMENTED;
    case 408:
    case 504:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case 409:
      return grpc::StatusCode::FAILED_PRECONDITION;
    case 413:
    case 429:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case 499:
      return grpc::StatusCode::CANCELLED;
    case 502:
    case 503:
      return grpc::StatusCode::UNAVAILABLE;
    default:
      break;
  }
  if (status >= 400 && status < 500) {
    return grpc::StatusCode::FAILED_PRECONDITION;
  }
  return status >= 500 ? grpc::StatusCode::INTERNAL : grpc::StatusCode::UNKNOWN;
}

grpc::Status status_of_answer(const http::Response& answer) {
  return grpc::Status(grpc_code_for_http(answer.status), error_message_of(answer));
}

grpc::Status to_grpc_status(const Status& status) {
  if (status.is_ok()) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc_code_for_http(http_status_for(status.code())), status.message());
}

}  // namespace flotilla::oip_grpc

// Open Inference Protocol v2 REST codec (PROTOCOLS.md §1.3), with Triton's binary tensor data
// extension for inputs (what tritonclient sends by default).
#include <algorithm>
#include <bit>
#include <limits>
#include <optional>
#include <string_view>

#include "protocol/json_util.h"
#include "protocol/protocol.h"

namespace flotilla::protocol {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

// The largest tensor a request may declare; bounds allocations before any data is read.
constexpr int64_t kMaxElements = int64_t{1} << 31;
// More dimensions than any real tensor; bounds the recursion over nested data.
constexpr size_t kMaxRank = 16;

Result<Parameters> decode_parameters(element value, const std::string& where) {
  simdjson::dom::object object;
  if (value.get_object().get(object)) {
    return invalid_argument(where + ": parameters must be an object");
  }
  Parameters parameters;
  for (auto field : object) {
    std::string key(field.key);
    switch (field.value.type()) {
      case element_type::BOOL:
        parameters.emplace_back(key, field.value.get_bool().value_unsafe());
        break;
      case element_type::INT64:
        parameters.emplace_back(key, field.value.get_int64().value_unsafe());
        break;
      case element_type::UINT64:
        parameters.emplace_back(key, static_cast<double>(field.value.get_uint64().value_unsafe()));
        break;
      case element_type::DOUBLE:
        parameters.emplace_back(key, field.value.get_double().value_unsafe());
        break;
      case element_type::STRING:
        parameters.emplace_back(key, std::string(field.value.get_string().value_unsafe()));
        break;
      default:
        return invalid_argument(where + ": parameter '" + key +
                                "' must be a string, number or boolean");
    }
  }
  return parameters;
}

// Binary tensor data is little-endian, as Tensor::data is on the hosts we build for.
static_assert(std::endian::native == std::endian::little);

// The binary section of a request in Triton's binary tensor data extension: what is left of
// it for the inputs not read yet.
struct BinaryData {
  std::string_view rest;
};

// `tensor`'s data from `binary` (binary_data_size bytes), which must hold exactly its shape's
// elements.
Status read_binary_input(element size_value, BinaryData* binary, int64_t expected, Tensor& tensor,
                         const std::string& named) {
  if (binary == nullptr) {
    return invalid_argument(named +
                            ": binary tensor data needs the Inference-Header-Content-Length "
                            "header; or send 'data' as JSON");
  }
  int64_t size = 0;
  if (size_value.get_int64().get(size) || size < 0) {
    return invalid_argument(named + ": binary_data_size must be a non-negative integer");
  }
  const int64_t needed = expected * static_cast<int64_t>(element_size(tensor.datatype));
  if (size != needed) {
    return invalid_argument(named + ": binary_data_size " + std::to_string(size) + " but shape " +
                            detail::shape_text(tensor.shape) + " of " +
                            std::string(datatype_name(tensor.datatype)) + " needs " +
                            std::to_string(needed) + " bytes");
  }
  if (static_cast<size_t>(size) > binary->rest.size()) {
    return invalid_argument(named + ": binary_data_size " + std::to_string(size) + " but only " +
                            std::to_string(binary->rest.size()) +
                            " bytes of binary data are left in the body");
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(binary->rest.data());
  tensor.data.assign(bytes, bytes + size);
  binary->rest.remove_prefix(static_cast<size_t>(size));
  if (tensor.datatype == DataType::kBool) {
    for (uint8_t& value : tensor.data) {
      value = value != 0;
    }
  }
  return Status::ok();
}

Result<Tensor> decode_input(element value, size_t index, size_t body_size, BinaryData* binary) {
  const std::string where = "inputs[" + std::to_string(index) + "]";
  simdjson::dom::object object;
  if (value.get_object().get(object)) {
    return invalid_argument(where + " must be an object");
  }
  Tensor tensor;
  std::string_view name;
  if (object["name"].get_string().get(name)) {
    return invalid_argument(where + ": 'name' is required and must be a string");
  }
  tensor.name = std::string(name);
  const std::string named = "input '" + tensor.name + "'";

  std::string_view datatype;
  if (object["datatype"].get_string().get(datatype)) {
    return invalid_argument(named + ": 'datatype' is required and must be a string");
  }
  auto parsed_type = parse_datatype(datatype);
  if (!parsed_type) {
    return invalid_argument(named + ": unsupported datatype '" + std::string(datatype) +
                            "' (supported: BOOL, INT32, INT64, FP32, FP64)");
  }
  tensor.datatype = *parsed_type;

  simdjson::dom::array shape;
  if (object["shape"].get_array().get(shape)) {
    return invalid_argument(named + ": 'shape' is required and must be an array of integers");
  }
  int64_t expected = 1;
  for (element dim : shape) {
    int64_t size = 0;
    if (dim.get_int64().get(size) || size < 0) {
      return invalid_argument(named + ": shape dimensions must be non-negative integers");
    }
    tensor.shape.push_back(size);
    if (tensor.shape.size() > kMaxRank) {
      return invalid_argument(named + ": shape has more than " + std::to_string(kMaxRank) +
                              " dimensions");
    }
    if (size != 0 && expected > kMaxElements / size) {
      return invalid_argument(named + ": shape is too large");
    }
    expected *= size;
  }

  element parameters;
  if (!object["parameters"].get(parameters)) {
    simdjson::dom::object parameter_object;
    element size;
    if (!parameters.get_object().get(parameter_object) &&
        !parameter_object["binary_data_size"].get(size)) {
      if (!object["data"].error()) {
        return invalid_argument(named + ": has both 'data' and binary_data_size");
      }
      FLOTILLA_RETURN_IF_ERROR(read_binary_input(size, binary, expected, tensor, named));
      return tensor;
    }
  }

  element data;
  if (object["data"].get(data)) {
    return invalid_argument(named + ": 'data' is required");
  }
  // Reserve by the declared shape, but never more elements than the body can hold (each
  // takes at least one byte of JSON): a tiny body must not allocate gigabytes.
  const int64_t plausible = std::min<int64_t>(expected, static_cast<int64_t>(body_size));
  tensor.data.reserve(static_cast<size_t>(plausible) * element_size(tensor.datatype));
  FLOTILLA_RETURN_IF_ERROR(detail::append_data(data, tensor, named));
  const int64_t got = static_cast<int64_t>(tensor.data.size() / element_size(tensor.datatype));
  if (got != expected) {
    return invalid_argument(named + ": shape " + detail::shape_text(tensor.shape) + " needs " +
                            std::to_string(expected) + " elements but data has " +
                            std::to_string(got));
  }
  return tensor;
}

}  // namespace

Result<InferRequest> decode_oip_infer_request(std::string& body,
                                              std::optional<size_t> json_length) {
  if (json_length && *json_length > body.size()) {
    return invalid_argument("Inference-Header-Content-Length " + std::to_string(*json_length) +
                            " is past the body's " + std::to_string(body.size()) + " bytes");
  }
  // The binary section is viewed in place: parse_json may grow the string's capacity (padding),
  // so the view is taken after it.
  FLOTILLA_ASSIGN_OR_RETURN(element root,
                            detail::parse_json(body, json_length.value_or(body.size())));
  std::optional<BinaryData> binary;
  if (json_length) {
    binary = BinaryData{std::string_view(body).substr(*json_length)};
  }
  simdjson::dom::object object;
  if (root.get_object().get(object)) {
    return invalid_argument("request body must be a JSON object");
  }
  InferRequest request;
  element id;
  if (!object["id"].get(id)) {
    std::string_view id_text;
    if (id.get_string().get(id_text)) {
      return invalid_argument("'id' must be a string");
    }
    request.id = std::string(id_text);
  }
  element parameters;
  if (!object["parameters"].get(parameters)) {
    FLOTILLA_ASSIGN_OR_RETURN(request.parameters, decode_parameters(parameters, "request"));
  }
  simdjson::dom::array inputs;
  if (object["inputs"].get_array().get(inputs)) {
    return invalid_argument("'inputs' is required and must be an array");
  }
  if (inputs.size() == 0) {
    return invalid_argument("'inputs' is empty");
  }
  size_t index = 0;
  for (element input : inputs) {
    FLOTILLA_ASSIGN_OR_RETURN(
        Tensor tensor, decode_input(input, index++, body.size(), binary ? &*binary : nullptr));
    request.inputs.push_back(std::move(tensor));
  }
  if (binary && !binary->rest.empty()) {
    return invalid_argument(std::to_string(binary->rest.size()) +
                            " bytes of binary data after the last input's");
  }
  element outputs;
  if (!object["outputs"].get(outputs)) {
    simdjson::dom::array output_array;
    if (outputs.get_array().get(output_array)) {
      return invalid_argument("'outputs' must be an array");
    }
    for (element output : output_array) {
      std::string_view name;
      if (output["name"].get_string().get(name)) {
        return invalid_argument("each requested output needs a string 'name'");
      }
      for (const std::string& seen : request.requested_outputs) {
        if (seen == name) {
          return invalid_argument("output '" + std::string(name) + "' is requested twice");
        }
      }
      request.requested_outputs.emplace_back(name);
    }
  }
  return request;
}

void encode_oip_infer_response(const InferResponse& response, std::string& out) {
  out += "{\"model_name\":";
  append_json_string(response.model_name, out);
  if (!response.model_version.empty()) {
    out += ",\"model_version\":";
    append_json_string(response.model_version, out);
  }
  out += ",\"id\":";
  append_json_string(response.id, out);
  out += ",\"outputs\":[";
  for (size_t i = 0; i < response.outputs.size(); ++i) {
    const Tensor& tensor = response.outputs[i];
    if (i > 0) {
      out += ',';
    }
    out += "{\"name\":";
    append_json_string(tensor.name, out);
    out += ",\"datatype\":\"";
    out += datatype_name(tensor.datatype);
    out += "\",\"shape\":[";
    for (size_t d = 0; d < tensor.shape.size(); ++d) {
      if (d > 0) {
        out += ',';
      }
      detail::append_int(tensor.shape[d], out);
    }
    out += "],\"data\":";
    // OIP allows flat or nested data in responses; flat is smaller and what Triton sends.
    detail::append_tensor_data_flat(tensor, out);
    out += "}";
  }
  out += "]}";
}

std::string encode_oip_model_metadata(const ModelMetadata& metadata) {
  std::string out = "{\"name\":";
  append_json_string(metadata.name, out);
  out += ",\"versions\":[";
  for (size_t i = 0; i < metadata.versions.size(); ++i) {
    out += i ? "," : "";
    append_json_string(metadata.versions[i], out);
  }
  out += "],\"platform\":";
  append_json_string(metadata.platform, out);
  auto append_tensors = [&out](const std::vector<TensorMetadata>& tensors) {
    out += '[';
    for (size_t i = 0; i < tensors.size(); ++i) {
      out += i ? ",{\"name\":" : "{\"name\":";
      append_json_string(tensors[i].name, out);
      out += ",\"datatype\":\"";
      out += datatype_name(tensors[i].datatype);
      out += "\",\"shape\":[";
      for (size_t d = 0; d < tensors[i].shape.size(); ++d) {
        out += d ? "," : "";
        detail::append_int(tensors[i].shape[d], out);
      }
      out += "]}";
    }
    out += ']';
  };
  out += ",\"inputs\":";
  append_tensors(metadata.inputs);
  out += ",\"outputs\":";
  append_tensors(metadata.outputs);
  out += '}';
  return out;
}

}  // namespace flotilla::protocol

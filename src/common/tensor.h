// Tensor and inference value types shared by the protocol codecs, the runtimes and the replica.
// Plain values: no I/O, no locking; copy or move them freely. Part of common's contract
// (included by common/common.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace flotilla {

// The Open Inference Protocol datatypes this build supports.
enum class DataType { kBool, kInt32, kInt64, kFp32, kFp64 };

std::optional<DataType> parse_datatype(std::string_view name);
std::string_view datatype_name(DataType type);
size_t element_size(DataType type);

// A dense row-major tensor. `data` holds the elements in native little-endian layout (BOOL is
// one byte, 0 or 1); its size is always element_count() * element_size(datatype).
struct Tensor {
  std::string name;
  DataType datatype = DataType::kFp32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  int64_t element_count() const;

  template <typename T>
  std::span<const T> values() const {
    return {reinterpret_cast<const T*>(data.data()), data.size() / sizeof(T)};
  }
  template <typename T>
  void append(T value) {
    size_t offset = data.size();
    data.resize(offset + sizeof(T));
    std::memcpy(data.data() + offset, &value, sizeof(T));
  }
  // Element `i` converted to double (BOOL as 0 or 1).
  double element_as_double(int64_t i) const;
  // Rows [begin, end) along the first dimension, as a new tensor.
  Tensor slice_rows(int64_t begin, int64_t end) const;
};

using ParameterValue = std::variant<bool, int64_t, double, std::string>;
using Parameters = std::vector<std::pair<std::string, ParameterValue>>;

// A decoded inference request, whatever protocol it came in.
struct InferRequest {
  std::string id;
  std::vector<Tensor> inputs;
  // For a single 2-D input whose columns have names (MLflow data frames, CSV headers): the
  // name of each column, in order. Empty when columns are positional.
  std::vector<std::string> column_names;
  // Names of the outputs to return; empty means all.
  std::vector<std::string> requested_outputs;
  Parameters parameters;
  // MLflow drops columns the model does not know; the Open Inference Protocol rejects them.
  bool ignore_unknown_inputs = false;
};

struct InferResponse {
  std::string model_name;
  std::string model_version;
  std::string id;
  std::vector<Tensor> outputs;
};

struct TensorMetadata {
  std::string name;
  DataType datatype = DataType::kFp32;
  std::vector<int64_t> shape;  // -1 for a variable dimension
};

struct ModelMetadata {
  std::string name;
  std::vector<std::string> versions;
  std::string platform;
  std::vector<TensorMetadata> inputs;
  std::vector<TensorMetadata> outputs;
};

}  // namespace flotilla

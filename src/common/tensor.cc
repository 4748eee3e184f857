#include "common/common.h"

namespace flotilla {

std::optional<DataType> parse_datatype(std::string_view name) {
  if (name == "BOOL")
    return DataType::kBool;
  if (name == "INT32")
    return DataType::kInt32;
  if (name == "INT64")
    return DataType::kInt64;
  if (name == "FP32")
    return DataType::kFp32;
  if (name == "FP64")
    return DataType::kFp64;
  return std::nullopt;
}

std::string_view datatype_name(DataType type) {
  switch (type) {
    case DataType::kBool:
      return "BOOL";
    case DataType::kInt32:
      return "INT32";
    case DataType::kInt64:
      return "INT64";
    case DataType::kFp32:
      return "FP32";
    case DataType::kFp64:
      return "FP64";
  }
  return "FP32";
}

size_t element_size(DataType type) {
  switch (type) {
    case DataType::kBool:
      return 1;
    case DataType::kInt32:
    case DataType::kFp32:
      return 4;
    case DataType::kInt64:
    case DataType::kFp64:
      return 8;
  }
  return 1;
}

int64_t Tensor::element_count() const {
  int64_t count = 1;
  for (int64_t dim : shape) {
    count *= dim;
  }
  return count;
}

double Tensor::element_as_double(int64_t i) const {
  switch (datatype) {
    case DataType::kBool:
      return data[i] != 0 ? 1.0 : 0.0;
    case DataType::kInt32:
      return values<int32_t>()[i];
    case DataType::kInt64:
      return static_cast<double>(values<int64_t>()[i]);
    case DataType::kFp32:
      return values<float>()[i];
    case DataType::kFp64:
      return values<double>()[i];
  }
  return 0;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  FLOTILLA_DCHECK(!shape.empty() && begin <= end && end <= shape[0]);
  Tensor out;
  out.name = name;
  out.datatype = datatype;
  out.shape = shape;
  out.shape[0] = end - begin;
  size_t row_bytes = shape[0] == 0 ? 0 : data.size() / shape[0];
  out.data.assign(data.begin() + begin * row_bytes, data.begin() + end * row_bytes);
  return out;
}

}  // namespace flotilla

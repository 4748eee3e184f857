// MLflow scoring server formats (PROTOCOLS.md §2): content negotiation, the four JSON input
// layouts, CSV, and the {"predictions": ...} / error responses.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "protocol/json_util.h"
#include "protocol/protocol.h"

namespace flotilla::protocol {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  return text;
}

// Collects a table of doubles, row by row, into one [rows, columns] FP64 tensor.
class TableBuilder {
 public:
  explicit TableBuilder(int64_t columns) : columns_(columns) {
    tensor_.name = "input";
    tensor_.datatype = DataType::kFp64;
  }
  void add(double value) { tensor_.append(value); }
  void add_missing_row() {
    for (int64_t i = 0; i < columns_; ++i) {
      add(kMissing);
    }
  }
  double* row(int64_t index) {
    return reinterpret_cast<double*>(tensor_.data.data()) + index * columns_;
  }
  int64_t columns() const { return columns_; }
  Tensor finish(bool single_row_vector = false) && {
    const int64_t rows =
        columns_ == 0 ? 0 : static_cast<int64_t>(tensor_.data.size() / sizeof(double)) / columns_;
    tensor_.shape =
        single_row_vector ? std::vector<int64_t>{columns_} : std::vector<int64_t>{rows, columns_};
    return std::move(tensor_);
  }

 private:
  int64_t columns_;
  Tensor tensor_;
};

// A JSON scalar as a model input value: numbers and booleans as themselves, null as missing.
Result<double> scalar_value(element value, const std::string& where) {
  switch (value.type()) {
    case element_type::DOUBLE:
      return value.get_double().value_unsafe();
    case element_type::INT64:
      return static_cast<double>(value.get_int64().value_unsafe());
    case element_type::UINT64:
      return static_cast<double>(value.get_uint64().value_unsafe());
    case element_type::BOOL:
      return value.get_bool().value_unsafe() ? 1.0 : 0.0;
    case element_type::NULL_VALUE:
      return kMissing;
    case element_type::STRING:
      return invalid_argument(where + ": strings are not supported by this model's inputs");
    default:
      return invalid_argument(where + ": expected a number, boolean or null");
  }
}

Result<std::string> column_name(element value) {
  if (value.type() == element_type::STRING) {
    return std::string(value.get_string().value_unsafe());
  }
  if (value.type() == element_type::INT64) {
    return std::to_string(value.get_int64().value_unsafe());
  }
  return invalid_argument("column names must be strings or integers");
}

Status check_rows(int64_t rows) {
  if (rows == 0) {
    return invalid_argument("the input has no rows");
  }
  return Status::ok();
}

// [[v, ...], ...] → rows; [v, ...] → one rank-1 tensor (the runtime decides how to read it).
Result<InferRequest> decode_rows(simdjson::dom::array rows, const char* field) {
  InferRequest request;
  FLOTILLA_RETURN_IF_ERROR(check_rows(static_cast<int64_t>(rows.size())));
  element first = rows.at(0).value_unsafe();
  if (first.type() != element_type::ARRAY) {
    TableBuilder table(static_cast<int64_t>(rows.size()));
    int64_t index = 0;
    for (element value : rows) {
      FLOTILLA_ASSIGN_OR_RETURN(
          double number,
          scalar_value(value, std::string(field) + "[" + std::to_string(index++) + "]"));
      table.add(number);
    }
    request.inputs.push_back(std::move(table).finish(true));
    return request;
  }
  simdjson::dom::array first_row = first.get_array().value_unsafe();
  TableBuilder table(static_cast<int64_t>(first_row.size()));
  int64_t row_index = 0;
  for (element row : rows) {
    const std::string where = std::string(field) + "[" + std::to_string(row_index) + "]";
    simdjson::dom::array cells;
    if (row.get_array().get(cells)) {
      return invalid_argument(where + ": every row must be an array");
    }
    if (static_cast<int64_t>(cells.size()) != table.columns()) {
      return invalid_argument(where + " has " + std::to_string(cells.size()) +
                              " values but the first row has " + std::to_string(table.columns()));
    }
    int64_t column = 0;
    for (element cell : cells) {
      FLOTILLA_ASSIGN_OR_RETURN(double number,
                                scalar_value(cell, where + "[" + std::to_string(column++) + "]"));
      table.add(number);
    }
    ++row_index;
  }
  request.inputs.push_back(std::move(table).finish());
  return request;
}

// [{"a": 1, "b": 2}, ...] → named columns in order of first appearance; absent keys missing.
Result<InferRequest> decode_records(simdjson::dom::array records, const char* field) {
  InferRequest request;
  FLOTILLA_RETURN_IF_ERROR(check_rows(static_cast<int64_t>(records.size())));
  std::unordered_map<std::string_view, int64_t> column_index;
  for (element record : records) {
    simdjson::dom::object object;
    if (record.get_object().get(object)) {
      return invalid_argument(std::string(field) + ": every record must be an object");
    }
    for (auto cell : object) {
      if (column_index.try_emplace(cell.key, column_index.size()).second) {
        request.column_names.emplace_back(cell.key);
      }
    }
  }
  TableBuilder table(static_cast<int64_t>(request.column_names.size()));
  int64_t row = 0;
  for (element record : records) {
    table.add_missing_row();
    simdjson::dom::object object = record.get_object().value_unsafe();
    for (auto cell : object) {
      FLOTILLA_ASSIGN_OR_RETURN(
          double number, scalar_value(cell.value, std::string(field) + "[" + std::to_string(row) +
                                                      "]['" + std::string(cell.key) + "']"));
      table.row(row)[column_index[cell.key]] = number;
    }
    ++row;
  }
  request.inputs.push_back(std::move(table).finish());
  return request;
}

Result<InferRequest> decode_dataframe_split(element value) {
  simdjson::dom::object object;
  if (value.get_object().get(object)) {
    return invalid_argument("dataframe_split must be an object with 'columns' and 'data'");
  }
  simdjson::dom::array data;
  if (object["data"].get_array().get(data)) {
    return invalid_argument("dataframe_split: 'data' is required and must be an array of rows");
  }
  FLOTILLA_RETURN_IF_ERROR(check_rows(static_cast<int64_t>(data.size())));
  std::vector<std::string> columns;
  simdjson::dom::array column_array;
  if (!object["columns"].get_array().get(column_array)) {
    for (element column : column_array) {
      FLOTILLA_ASSIGN_OR_RETURN(std::string name, column_name(column));
      columns.push_back(std::move(name));
    }
  }
  FLOTILLA_ASSIGN_OR_RETURN(InferRequest request, decode_rows(data, "dataframe_split.data"));
  if (request.inputs[0].shape.size() != 2) {
    return invalid_argument("dataframe_split: 'data' must be an array of rows (arrays)");
  }
  if (!columns.empty()) {
    if (static_cast<int64_t>(columns.size()) != request.inputs[0].shape[1]) {
      return invalid_argument("dataframe_split: " + std::to_string(columns.size()) +
                              " columns but rows have " +
                              std::to_string(request.inputs[0].shape[1]) + " values");
    }
    request.column_names = std::move(columns);
  }
  return request;
}

// {"a": [1, 2], "b": [3, 4]} → named columns.
Result<InferRequest> decode_columns(simdjson::dom::object object) {
  InferRequest request;
  int64_t rows = -1;
  std::vector<std::vector<double>> columns;
  for (auto field : object) {
    const std::string where = "inputs['" + std::string(field.key) + "']";
    std::vector<double> values;
    simdjson::dom::array array;
    if (field.value.get_array().get(array)) {
      FLOTILLA_ASSIGN_OR_RETURN(double number, scalar_value(field.value, where));
      values.push_back(number);
    } else {
      for (element item : array) {
        simdjson::dom::array nested;
        // A column may be sent as [[v], [v], ...]: one value per row.
        if (!item.get_array().get(nested) && nested.size() == 1) {
          item = nested.at(0).value_unsafe();
        }
        FLOTILLA_ASSIGN_OR_RETURN(double number, scalar_value(item, where));
        values.push_back(number);
      }
    }
    if (rows >= 0 && static_cast<int64_t>(values.size()) != rows) {
      return invalid_argument(where + " has " + std::to_string(values.size()) +
                              " values but other columns have " + std::to_string(rows));
    }
    rows = static_cast<int64_t>(values.size());
    request.column_names.emplace_back(field.key);
    columns.push_back(std::move(values));
  }
  FLOTILLA_RETURN_IF_ERROR(check_rows(std::max<int64_t>(rows, 0)));
  TableBuilder table(static_cast<int64_t>(columns.size()));
  for (int64_t row = 0; row < rows; ++row) {
    for (const auto& column : columns) {
      table.add(column[row]);
    }
  }
  request.inputs.push_back(std::move(table).finish());
  return request;
}

Result<InferRequest> decode_instances_or_inputs(element value, const char* field) {
  simdjson::dom::array array;
  if (!value.get_array().get(array)) {
    if (array.size() > 0 && array.at(0).value_unsafe().type() == element_type::OBJECT) {
      return decode_records(array, field);
    }
    return decode_rows(array, field);
  }
  simdjson::dom::object object;
  if (!value.get_object().get(object)) {
    return decode_columns(object);
  }
  return invalid_argument(std::string(field) + " must be an array or an object of columns");
}

Result<double> parse_csv_number(std::string_view cell, int64_t row, const std::string& column) {
  cell = trim(cell);
  if (cell.empty() || cell == "NaN" || cell == "nan" || cell == "NA") {
    return kMissing;
  }
  std::string lowered = lower(cell);
  if (lowered == "true") {
    return 1.0;
  }
  if (lowered == "false") {
    return 0.0;
  }
  double value = 0;
  if (cell.front() == '+') {
    cell.remove_prefix(1);
  }
  auto [end, ec] = std::from_chars(cell.data(), cell.data() + cell.size(), value);
  if (ec != std::errc() || end != cell.data() + cell.size()) {
    return invalid_argument("csv row " + std::to_string(row) + " column '" + column + "': '" +
                            std::string(cell) + "' is not a number");
  }
  return value;
}

// Splits one CSV record (RFC 4180 quoting) starting at `pos`; advances `pos` past its line end.
Result<std::vector<std::string>> next_csv_record(std::string_view text, size_t& pos) {
  std::vector<std::string> cells(1);
  bool quoted = false;
  while (pos < text.size()) {
    char c = text[pos++];
    if (quoted) {
      if (c == '"') {
        if (pos < text.size() && text[pos] == '"') {
          cells.back() += '"';
          ++pos;
        } else {
          quoted = false;
        }
      } else {
        cells.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      cells.emplace_back();
    } else if (c == '\n') {
      break;
    } else if (c != '\r') {
      cells.back() += c;
    }
  }
  if (quoted) {
    return invalid_argument("csv: unterminated quoted field");
  }
  return cells;
}

}  // namespace

Result<MlflowFormat> parse_mlflow_content_type(std::string_view content_type) {
  const std::string unsupported =
      "content type '" + std::string(content_type) +
      "' is not supported; use application/json or text/csv (charset utf-8)";
  size_t semicolon = content_type.find(';');
  std::string mime = lower(trim(content_type.substr(0, semicolon)));
  MlflowFormat format;
  if (mime == "application/json") {
    format = MlflowFormat::kJson;
  } else if (mime == "text/csv") {
    format = MlflowFormat::kCsv;
  } else {
    return Status(StatusCode::kUnimplemented, unsupported);
  }
  while (semicolon != std::string_view::npos) {
    content_type.remove_prefix(semicolon + 1);
    semicolon = content_type.find(';');
    std::string parameter = lower(trim(content_type.substr(0, semicolon)));
    if (parameter.empty()) {
      continue;
    }
    if (parameter != "charset=utf-8" && parameter != "charset=\"utf-8\"") {
      return Status(StatusCode::kUnimplemented, unsupported);
    }
  }
  return format;
}

Result<InferRequest> decode_mlflow_json(std::string& body) {
  FLOTILLA_ASSIGN_OR_RETURN(element root, detail::parse_json(body));
  simdjson::dom::object object;
  if (root.get_object().get(object)) {
    return invalid_argument(
        "the request body must be a JSON object with one of dataframe_split, "
        "dataframe_records, instances or inputs");
  }
  static constexpr const char* kFormats[] = {"dataframe_split", "dataframe_records", "instances",
                                             "inputs"};
  const char* found = nullptr;
  int count = 0;
  for (const char* format : kFormats) {
    if (!object[format].error()) {
      found = format;
      ++count;
    }
  }
  if (count != 1) {
    bool llm_shape =
        !object["messages"].error() || !object["prompt"].error() || !object["input"].error();
    if (count == 0 && llm_shape) {
      return invalid_argument(
          "chat and completion requests (messages, prompt, input) are not supported by this "
          "model; send dataframe_split, dataframe_records, instances or inputs");
    }
    return invalid_argument(
        "the request must have exactly one of dataframe_split, dataframe_records, instances or "
        "inputs (MLflow 2.0 scoring protocol); found " +
        std::to_string(count));
  }
  element params;
  if (!object["params"].get(params) && params.type() != element_type::OBJECT &&
      params.type() != element_type::NULL_VALUE) {
    return invalid_argument("'params' must be an object");
  }
  element value = object[found].value_unsafe();
  Result<InferRequest> request = invalid_argument("unreachable");
  if (found == kFormats[0]) {
    request = decode_dataframe_split(value);
  } else if (found == kFormats[1]) {
    simdjson::dom::array records;
    if (value.get_array().get(records)) {
      return invalid_argument("dataframe_records must be an array of objects");
    }
    request = decode_records(records, "dataframe_records");
  } else {
    request = decode_instances_or_inputs(value, found);
  }
  if (request.is_ok()) {
    request->ignore_unknown_inputs = true;
  }
  return request;
}

Result<InferRequest> decode_mlflow_csv(std::string_view body) {
  size_t pos = 0;
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<std::string> header, next_csv_record(body, pos));
  if (header.size() == 1 && trim(header[0]).empty()) {
    return invalid_argument("csv: the body is empty; expected a header line and rows");
  }
  InferRequest request;
  request.ignore_unknown_inputs = true;
  for (auto& name : header) {
    request.column_names.emplace_back(trim(name));
  }
  TableBuilder table(static_cast<int64_t>(header.size()));
  int64_t row = 0;
  while (pos < body.size()) {
    FLOTILLA_ASSIGN_OR_RETURN(std::vector<std::string> cells, next_csv_record(body, pos));
    if (cells.size() == 1 && trim(cells[0]).empty()) {
      continue;  // blank line
    }
    ++row;
    if (cells.size() != header.size()) {
      return invalid_argument("csv row " + std::to_string(row) + " has " +
                              std::to_string(cells.size()) + " fields but the header has " +
                              std::to_string(header.size()));
    }
    for (size_t column = 0; column < cells.size(); ++column) {
      FLOTILLA_ASSIGN_OR_RETURN(double value,
                                parse_csv_number(cells[column], row, request.column_names[column]));
      table.add(value);
    }
  }
  FLOTILLA_RETURN_IF_ERROR(check_rows(row));
  request.inputs.push_back(std::move(table).finish());
  return request;
}

void encode_mlflow_predictions(const Tensor& output, std::string& out) {
  out += "{\"predictions\":";
  detail::append_tensor_data(output, out);
  out += '}';
}

}  // namespace flotilla::protocol

// The xgboost runtime: XGBoost models through libxgboost's C API (in-place prediction on a
// dense float32 matrix, which is thread-safe). Reads model files (JSON, UBJSON, legacy binary)
// and MLflow model directories with the xgboost flavor (PROTOCOLS.md §4).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <xgboost/c_api.h>
#include <yaml-cpp/yaml.h>

#include "runtime/runtime_internal.h"

namespace flotilla::runtime {
namespace {

namespace fs = std::filesystem;

struct BoosterDeleter {
  void operator()(void* handle) const { XGBoosterFree(handle); }
};
using BoosterPtr = std::unique_ptr<void, BoosterDeleter>;

struct DMatrixDeleter {
  void operator()(void* handle) const { XGDMatrixFree(handle); }
};

// The calling thread's proxy DMatrix for in-place prediction. Without one, XGBoost builds a
// proxy per call, and its set-up (it reads the cgroup CPU quota files) costs 2.8x the whole
// prediction of a small model: 40 µs instead of 14 µs per row (bench/RESULTS.md).
DMatrixHandle thread_proxy_dmatrix() {
  thread_local std::unique_ptr<void, DMatrixDeleter> proxy = [] {
    DMatrixHandle handle = nullptr;
    FLOTILLA_CHECK(XGProxyDMatrixCreate(&handle) == 0);
    return std::unique_ptr<void, DMatrixDeleter>(handle);
  }();
  return proxy.get();
}

Status xgboost_error(const std::string& what) {
  // libxgboost appends a native stack trace to its message: keep the message, on one line.
  std::string message = XGBGetLastError();
  if (const size_t trace = message.find("Stack trace:"); trace != std::string::npos) {
    message.resize(trace);
  }
  std::replace(message.begin(), message.end(), '\n', ' ');
  while (!message.empty() && message.back() == ' ') {
    message.pop_back();
  }
  return invalid_argument(what + ": " + message);
}

// What MLflow's MLmodel file says about an xgboost model.
struct MlflowModel {
  std::string model_file;
  std::string model_class = "xgboost.core.Booster";
  std::vector<TensorMetadata> signature_inputs;
};

std::optional<DataType> signature_type(const std::string& type) {
  if (type == "double")
    return DataType::kFp64;
  if (type == "float")
    return DataType::kFp32;
  if (type == "long")
    return DataType::kInt64;
  if (type == "integer")
    return DataType::kInt32;
  if (type == "boolean")
    return DataType::kBool;
  return std::nullopt;
}

Result<MlflowModel> read_mlmodel(const fs::path& directory) {
  const fs::path mlmodel = directory / "MLmodel";
  if (!fs::exists(mlmodel)) {
    return invalid_argument("'" + directory.string() +
                            "' is a directory but has no MLmodel file (not an MLflow model)");
  }
  MlflowModel model;
  try {
    YAML::Node root = YAML::LoadFile(mlmodel.string());
    YAML::Node flavor = root["flavors"]["xgboost"];
    if (!flavor || !flavor.IsMap()) {
      return invalid_argument("'" + mlmodel.string() + "' has no xgboost flavor");
    }
    std::string data = flavor["data"] ? flavor["data"].as<std::string>() : "model.xgb";
    if (fs::path(data).is_absolute() || data.find("..") != std::string::npos) {
      return invalid_argument("'" + mlmodel.string() +
                              "': flavors.xgboost.data must be a "
                              "relative path inside the model directory");
    }
    model.model_file = (directory / data).string();
    if (flavor["model_class"] && !flavor["model_class"].IsNull()) {
      model.model_class = flavor["model_class"].as<std::string>();
    }
    YAML::Node inputs = root["signature"]["inputs"];
    if (inputs && !inputs.IsNull()) {
      auto columns = nlohmann::json::parse(inputs.as<std::string>());
      for (const auto& column : columns) {
        if (!column.contains("name")) {
          continue;  // a tensor-based signature: no column names to use
        }
        TensorMetadata meta;
        meta.name = column.at("name").get<std::string>();
        meta.datatype = signature_type(column.value("type", "double")).value_or(DataType::kFp64);
        meta.shape = {-1};
        model.signature_inputs.push_back(std::move(meta));
      }
    }
  } catch (const std::exception& e) {
    return invalid_argument("cannot read '" + mlmodel.string() + "': " + e.what());
  }
  return model;
}

bool is_classifier_class(const std::string& model_class) {
  return model_class.ends_with("Classifier");
}

class XgboostRuntime final : public Runtime {
 public:
  static Result<std::unique_ptr<Runtime>> load(const std::string& path,
                                               const RuntimeOptions& options);

  const ModelMetadata& metadata() const override { return metadata_; }
  bool can_batch() const override { return true; }
  Result<ModelInput> prepare(const InferRequest& request) const override;
  void run(ModelInput&& input, RunCallback done) override { done(predict(input)); }

 private:
  Result<std::vector<Tensor>> predict(const ModelInput& input) const;
  Result<Tensor> predict_raw(const ModelInput& input) const;
  Result<ModelInput> prepare_columns(const InferRequest& request) const;
  Result<ModelInput> prepare_matrix(const InferRequest& request) const;
  Result<std::vector<int64_t>> column_order(const std::vector<std::string>& names,
                                            bool ignore_unknown) const;

  BoosterPtr booster_;
  ModelMetadata metadata_;
  int64_t features_ = 0;
  int64_t output_columns_ = 0;  // 0 when predict gives one value per row
  bool sklearn_classifier_ = false;
  std::vector<std::string> feature_names_;
  std::unordered_map<std::string, int64_t> feature_index_;
};

Result<std::unique_ptr<Runtime>> XgboostRuntime::load(const std::string& path,
                                                      const RuntimeOptions& options) {
  auto runtime = std::unique_ptr<XgboostRuntime>(new XgboostRuntime());
  std::string model_file = path;
  MlflowModel mlflow;
  if (fs::is_directory(path)) {
    FLOTILLA_ASSIGN_OR_RETURN(mlflow, read_mlmodel(path));
    model_file = mlflow.model_file;
    runtime->sklearn_classifier_ = is_classifier_class(mlflow.model_class);
  }
  if (!fs::exists(model_file)) {
    return not_found("model file '" + model_file + "' does not exist");
  }

  BoosterHandle handle = nullptr;
  if (XGBoosterCreate(nullptr, 0, &handle) != 0) {
    return xgboost_error("cannot create a booster");
  }
  runtime->booster_.reset(handle);
  // XGBoost picks JSON by the .json extension and otherwise sniffs UBJSON or the legacy binary
  // format from the content, which is what MLflow's model.xgb needs.
  if (XGBoosterLoadModel(handle, model_file.c_str()) != 0) {
    return xgboost_error("cannot load XGBoost model '" + model_file + "'");
  }
  const std::string threads = std::to_string(std::max(1, options.predict_threads));
  if (XGBoosterSetParam(handle, "nthread", threads.c_str()) != 0) {
    return xgboost_error("cannot set nthread");
  }
  bst_ulong features = 0;
  if (XGBoosterGetNumFeature(handle, &features) != 0) {
    return xgboost_error("cannot read the feature count of '" + model_file + "'");
  }
  runtime->features_ = static_cast<int64_t>(features);
  if (runtime->features_ <= 0) {
    return invalid_argument("model '" + model_file + "' has no features");
  }

  bst_ulong name_count = 0;
  const char** names = nullptr;
  if (XGBoosterGetStrFeatureInfo(handle, "feature_name", &name_count, &names) == 0) {
    for (bst_ulong i = 0; i < name_count; ++i) {
      runtime->feature_names_.emplace_back(names[i]);
    }
  }
  if (runtime->feature_names_.empty() &&
      static_cast<int64_t>(mlflow.signature_inputs.size()) == runtime->features_) {
    for (const auto& input : mlflow.signature_inputs) {
      runtime->feature_names_.push_back(input.name);
    }
  }
  for (size_t i = 0; i < runtime->feature_names_.size(); ++i) {
    runtime->feature_index_[runtime->feature_names_[i]] = static_cast<int64_t>(i);
  }

  // One prediction on a row of missing values tells the output width for any objective.
  ModelInput probe{1, runtime->features_,
                   std::vector<float>(runtime->features_, std::numeric_limits<float>::quiet_NaN())};
  FLOTILLA_ASSIGN_OR_RETURN(Tensor probe_output, runtime->predict_raw(probe));
  runtime->output_columns_ = probe_output.shape.size() > 1 ? probe_output.shape[1] : 0;

  ModelMetadata& meta = runtime->metadata_;
  meta.name = options.name;
  meta.platform = "xgboost";
  if (!mlflow.signature_inputs.empty()) {
    meta.inputs = mlflow.signature_inputs;
  } else if (!runtime->feature_names_.empty()) {
    for (const auto& name : runtime->feature_names_) {
      meta.inputs.push_back({name, DataType::kFp32, {-1}});
    }
  } else {
    meta.inputs.push_back({"input", DataType::kFp32, {-1, runtime->features_}});
  }
  const int64_t width = runtime->output_columns_;
  if (runtime->sklearn_classifier_) {
    meta.outputs.push_back({"predict", DataType::kInt64, {-1}});
    meta.outputs.push_back({"predict_proba", DataType::kFp32, {-1, width == 0 ? 2 : width}});
  } else {
    meta.outputs.push_back(
        {"predict", DataType::kFp32,
         width == 0 ? std::vector<int64_t>{-1} : std::vector<int64_t>{-1, width}});
  }
  spdlog::info("loaded XGBoost model '{}' from {}: {} features, {} named, outputs {}", options.name,
               model_file, runtime->features_, runtime->feature_names_.size(),
               width == 0 ? 1 : width);
  return std::unique_ptr<Runtime>(std::move(runtime));
}

Result<std::vector<int64_t>> XgboostRuntime::column_order(const std::vector<std::string>& names,
                                                          bool ignore_unknown) const {
  // order[i] = the request column that holds feature i.
  std::vector<int64_t> order(features_, -1);
  for (size_t column = 0; column < names.size(); ++column) {
    auto it = feature_index_.find(names[column]);
    if (it == feature_index_.end()) {
      if (ignore_unknown) {
        continue;
      }
      return invalid_argument("unknown input '" + names[column] + "'; the model's features are " +
                              std::to_string(features_) + " named columns such as '" +
                              feature_names_[0] + "'");
    }
    order[it->second] = static_cast<int64_t>(column);
  }
  for (int64_t feature = 0; feature < features_; ++feature) {
    if (order[feature] < 0) {
      return invalid_argument("missing input for feature '" + feature_names_[feature] + "'");
    }
  }
  return order;
}

Result<ModelInput> XgboostRuntime::prepare(const InferRequest& request) const {
  if (request.inputs.empty()) {
    return invalid_argument("the request has no inputs");
  }
  if (request.inputs.size() > 1) {
    return prepare_columns(request);
  }
  return prepare_matrix(request);
}

// One tensor: [rows, columns], or [columns] for one row (for a one-feature model, [rows]).
Result<ModelInput> XgboostRuntime::prepare_matrix(const InferRequest& request) const {
  const Tensor& tensor = request.inputs[0];
  int64_t rows = 0;
  int64_t columns = 0;
  if (tensor.shape.size() == 2) {
    rows = tensor.shape[0];
    columns = tensor.shape[1];
  } else if (tensor.shape.size() == 1) {
    rows = features_ == 1 ? tensor.shape[0] : 1;
    columns = features_ == 1 ? 1 : tensor.shape[0];
  } else {
    return invalid_argument("input '" + tensor.name + "' must have shape [rows, " +
                            std::to_string(features_) + "] or [" + std::to_string(features_) +
                            "]; got rank " + std::to_string(tensor.shape.size()));
  }
  if (rows == 0) {
    return invalid_argument("the input has no rows");
  }
  const bool named = !request.column_names.empty() && !feature_names_.empty();
  if (!request.column_names.empty() &&
      static_cast<int64_t>(request.column_names.size()) != columns) {
    return invalid_argument("the input names " + std::to_string(request.column_names.size()) +
                            " columns but has " + std::to_string(columns));
  }
  if (!named && columns != features_) {
    return invalid_argument("the model expects " + std::to_string(features_) +
                            " features per row, got " + std::to_string(columns));
  }
  std::vector<int64_t> order(features_);
  if (named) {
    FLOTILLA_ASSIGN_OR_RETURN(order,
                              column_order(request.column_names, request.ignore_unknown_inputs));
  } else {
    for (int64_t i = 0; i < features_; ++i) {
      order[i] = i;
    }
  }
  // Allocated only now: rows x columns elements exist in the request, and every feature maps
  // to one of the columns, so the size is bounded by what the client sent.
  ModelInput input{rows, features_, std::vector<float>(static_cast<size_t>(rows * features_))};
  if (!named && tensor.datatype == DataType::kFp32) {
    std::copy_n(tensor.values<float>().data(), input.values.size(), input.values.data());
    return input;
  }
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t feature = 0; feature < features_; ++feature) {
      input.values[row * features_ + feature] =
          static_cast<float>(tensor.element_as_double(row * columns + order[feature]));
    }
  }
  return input;
}

// One 1-D tensor per feature, named after the features.
Result<ModelInput> XgboostRuntime::prepare_columns(const InferRequest& request) const {
  if (feature_names_.empty()) {
    return invalid_argument(
        "the model has no feature names, so inputs cannot be matched by "
        "name; send one tensor of shape [rows, " +
        std::to_string(features_) + "]");
  }
  std::vector<std::string> names;
  int64_t rows = -1;
  for (const Tensor& tensor : request.inputs) {
    const bool column_shape =
        tensor.shape.size() == 1 || (tensor.shape.size() == 2 && tensor.shape[1] == 1);
    if (!column_shape) {
      return invalid_argument("input '" + tensor.name +
                              "' must have shape [rows] or [rows, 1] when inputs are sent per "
                              "feature");
    }
    if (rows >= 0 && tensor.shape[0] != rows) {
      return invalid_argument("input '" + tensor.name + "' has " + std::to_string(tensor.shape[0]) +
                              " rows, others have " + std::to_string(rows));
    }
    rows = tensor.shape[0];
    names.push_back(tensor.name);
  }
  if (rows == 0) {
    return invalid_argument("the input has no rows");
  }
  FLOTILLA_ASSIGN_OR_RETURN(auto order, column_order(names, request.ignore_unknown_inputs));
  ModelInput input{rows, features_, std::vector<float>(static_cast<size_t>(rows * features_))};
  for (int64_t feature = 0; feature < features_; ++feature) {
    const Tensor& column = request.inputs[order[feature]];
    for (int64_t row = 0; row < rows; ++row) {
      input.values[row * features_ + feature] = static_cast<float>(column.element_as_double(row));
    }
  }
  return input;
}

Result<Tensor> XgboostRuntime::predict_raw(const ModelInput& input) const {
  // __array_interface__ of the dense float32 matrix, and the predict config; "missing": NaN
  // matches Python's default.
  char array_interface[160];
  std::snprintf(array_interface, sizeof(array_interface),
                "{\"data\":[%llu,true],\"shape\":[%lld,%lld],\"typestr\":\"<f4\",\"version\":3}",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(input.values.data())),
                static_cast<long long>(input.rows), static_cast<long long>(input.columns));
  static constexpr const char* kConfig =
      "{\"type\":0,\"training\":false,\"iteration_begin\":0,\"iteration_end\":0,\"cache_id\":0,"
      "\"strict_shape\":false,\"missing\":NaN}";
  const bst_ulong* shape = nullptr;
  bst_ulong dims = 0;
  const float* result = nullptr;
  if (XGBoosterPredictFromDense(booster_.get(), array_interface, kConfig, thread_proxy_dmatrix(),
                                &shape, &dims, &result) != 0) {
    return internal_error(std::string("prediction failed: ") + XGBGetLastError());
  }
  Tensor output;
  output.name = "predict";
  output.datatype = DataType::kFp32;
  size_t count = 1;
  for (bst_ulong d = 0; d < dims; ++d) {
    output.shape.push_back(static_cast<int64_t>(shape[d]));
    count *= shape[d];
  }
  if (output.shape.empty() || output.shape[0] != input.rows) {
    // XGBoost gives [rows] or [rows, k]; anything else means the buffer cannot be split by row.
    return internal_error("unexpected prediction shape from XGBoost");
  }
  output.data.resize(count * sizeof(float));
  std::memcpy(output.data.data(), result, output.data.size());
  return output;
}

Result<std::vector<Tensor>> XgboostRuntime::predict(const ModelInput& input) const {
  FLOTILLA_ASSIGN_OR_RETURN(Tensor raw, predict_raw(input));
  std::vector<Tensor> outputs;
  if (!sklearn_classifier_) {
    outputs.push_back(std::move(raw));
    return outputs;
  }
  // What XGBClassifier.predict / predict_proba return (xgboost/sklearn.py, 1.7): labels are the
  // argmax of the class probabilities, or p > 0.5 for binary models; binary probabilities are
  // [1 - p, p].
  const int64_t rows = input.rows;
  Tensor labels{"predict", DataType::kInt64, {rows}, {}};
  labels.data.reserve(rows * sizeof(int64_t));
  Tensor proba{"predict_proba", DataType::kFp32, {}, {}};
  const auto values = raw.values<float>();
  if (raw.shape.size() == 2 && raw.shape[1] > 1) {
    const int64_t classes = raw.shape[1];
    for (int64_t row = 0; row < rows; ++row) {
      const float* begin = values.data() + row * classes;
      labels.append(static_cast<int64_t>(std::max_element(begin, begin + classes) - begin));
    }
    proba.shape = raw.shape;
    proba.data = std::move(raw.data);
  } else {
    proba.shape = {rows, 2};
    for (int64_t row = 0; row < rows; ++row) {
      const float p = values[row];
      labels.append(static_cast<int64_t>(p > 0.5f ? 1 : 0));
      proba.append(1.0f - p);
      proba.append(p);
    }
  }
  outputs.push_back(std::move(labels));
  outputs.push_back(std::move(proba));
  return outputs;
}

}  // namespace

Result<std::unique_ptr<Runtime>> load_xgboost_runtime(const std::string& path,
                                                      const RuntimeOptions& options) {
  return XgboostRuntime::load(path, options);
}

Status warm_up_xgboost() {
  // libxgboost's first model load costs ~7 ms more than later ones (lazy initialisation and
  // first-touch of its code); a one-tree model trained on two rows, saved and loaded back,
  // pays that in advance (bench/RESULTS.md, "Control plane").
  const float features[2] = {0, 1};
  const float labels[2] = {0, 1};
  DMatrixHandle matrix_handle = nullptr;
  if (XGDMatrixCreateFromMat(features, 2, 1, std::numeric_limits<float>::quiet_NaN(),
                             &matrix_handle) != 0) {
    return xgboost_error("warm-up: cannot create a matrix");
  }
  std::unique_ptr<void, DMatrixDeleter> matrix(matrix_handle);
  BoosterHandle trained_handle = nullptr;
  if (XGDMatrixSetFloatInfo(matrix_handle, "label", labels, 2) != 0 ||
      XGBoosterCreate(&matrix_handle, 1, &trained_handle) != 0) {
    return xgboost_error("warm-up: cannot create a booster");
  }
  BoosterPtr trained(trained_handle);
  bst_ulong length = 0;
  const char* buffer = nullptr;
  if (XGBoosterSetParam(trained_handle, "nthread", "1") != 0 ||
      XGBoosterUpdateOneIter(trained_handle, 0, matrix_handle) != 0 ||
      XGBoosterSaveModelToBuffer(trained_handle, R"({"format": "ubj"})", &length, &buffer) != 0) {
    return xgboost_error("warm-up: cannot train");
  }
  BoosterHandle loaded_handle = nullptr;
  if (XGBoosterCreate(nullptr, 0, &loaded_handle) != 0) {
    return xgboost_error("warm-up: cannot create a booster");
  }
  BoosterPtr loaded(loaded_handle);
  const float* predictions = nullptr;
  if (XGBoosterLoadModelFromBuffer(loaded_handle, buffer, length) != 0 ||
      XGBoosterPredict(loaded_handle, matrix_handle, 0, 0, 0, &length, &predictions) != 0) {
    return xgboost_error("warm-up: cannot load and predict");
  }
  return Status::ok();
}

}  // namespace flotilla::runtime

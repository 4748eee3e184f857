#include <cmath>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/model_fixtures.h"
#include "runtime/runtime.h"

namespace flotilla::runtime {
namespace {

using flotilla::testing::model_fixtures_dir;
using ::testing::HasSubstr;

std::unique_ptr<Runtime> load(const std::string& file, RuntimeKind kind = RuntimeKind::kAuto) {
  RuntimeOptions options;
  options.name = "m";
  auto runtime = load_runtime(kind, model_fixtures_dir() + "/" + file, options);
  EXPECT_TRUE(runtime.is_ok()) << runtime.status().message();
  return runtime.is_ok() ? std::move(runtime).value() : nullptr;
}

Result<std::vector<Tensor>> run_sync(Runtime& runtime, ModelInput input) {
  Result<std::vector<Tensor>> out = internal_error("not called");
  runtime.run(std::move(input),
              [&out](Result<std::vector<Tensor>> result) { out = std::move(result); });
  return out;
}

InferRequest matrix_request(int64_t rows, int64_t columns, float value = 1.0f) {
  InferRequest request;
  Tensor tensor{"input", DataType::kFp32, {rows, columns}, {}};
  for (int64_t i = 0; i < rows * columns; ++i) {
    tensor.append(value);
  }
  request.inputs.push_back(std::move(tensor));
  return request;
}

TEST(XgboostRuntimeTest, DescribesBinaryModel) {
  auto runtime = load("binary.json");
  ASSERT_NE(runtime, nullptr);
  const ModelMetadata& meta = runtime->metadata();
  EXPECT_EQ(meta.platform, "xgboost");
  ASSERT_EQ(meta.inputs.size(), 1u);
  EXPECT_EQ(meta.inputs[0].shape, (std::vector<int64_t>{-1, 30}));
  ASSERT_EQ(meta.outputs.size(), 1u);
  EXPECT_EQ(meta.outputs[0].shape, (std::vector<int64_t>{-1}));
  EXPECT_TRUE(runtime->can_batch());
}

TEST(XgboostRuntimeTest, PredictsProbabilitiesPerRow) {
  auto runtime = load("multiclass.ubj");
  ASSERT_NE(runtime, nullptr);
  auto input = runtime->prepare(matrix_request(3, 4));
  ASSERT_TRUE(input.is_ok()) << input.status().message();
  auto outputs = run_sync(*runtime, std::move(input).value());
  ASSERT_TRUE(outputs.is_ok()) << outputs.status().message();
  const Tensor& predict = outputs->at(0);
  EXPECT_EQ(predict.shape, (std::vector<int64_t>{3, 3}));
  auto values = predict.values<float>();
  EXPECT_NEAR(values[0] + values[1] + values[2], 1.0, 1e-5);  // softprob rows sum to 1
  EXPECT_EQ(values[0], values[3]);                            // same input, same output
}

TEST(XgboostRuntimeTest, RejectsWrongFeatureCountAndEmptyInput) {
  auto runtime = load("binary.json");
  ASSERT_NE(runtime, nullptr);
  EXPECT_THAT(runtime->prepare(matrix_request(1, 29)).status().message(),
              HasSubstr("expects 30 features per row, got 29"));
  EXPECT_THAT(runtime->prepare(matrix_request(0, 30)).status().message(), HasSubstr("no rows"));
  InferRequest scalar;
  scalar.inputs.push_back(Tensor{"x", DataType::kFp32, {1, 1, 30}, std::vector<uint8_t>(120)});
  EXPECT_THAT(runtime->prepare(scalar).status().message(), HasSubstr("rank 3"));
}

TEST(XgboostRuntimeTest, MatchesNamedColumnsInAnyOrder) {
  auto runtime = load("multiclass.ubj");
  ASSERT_NE(runtime, nullptr);
  InferRequest ordered = matrix_request(1, 4);
  auto values = reinterpret_cast<float*>(ordered.inputs[0].data.data());
  values[0] = 5.1f, values[1] = 3.5f, values[2] = 1.4f, values[3] = 0.2f;
  InferRequest named;
  named.column_names = {"petal_width", "extra", "sepal_length", "petal_length", "sepal_width"};
  named.ignore_unknown_inputs = true;
  Tensor table{"input", DataType::kFp64, {1, 5}, {}};
  for (double v : {0.2, 99.0, 5.1, 1.4, 3.5}) {
    table.append(v);
  }
  named.inputs.push_back(table);
  auto a = runtime->prepare(ordered);
  auto b = runtime->prepare(named);
  ASSERT_TRUE(b.is_ok()) << b.status().message();
  EXPECT_EQ(a->values, b->values);

  named.ignore_unknown_inputs = false;
  EXPECT_THAT(runtime->prepare(named).status().message(), HasSubstr("unknown input 'extra'"));
  named.column_names = {"petal_width", "extra", "sepal_length", "petal_length", "nope"};
  named.ignore_unknown_inputs = true;
  EXPECT_THAT(runtime->prepare(named).status().message(),
              HasSubstr("missing input for feature 'sepal_width'"));
}

TEST(XgboostRuntimeTest, AcceptsOneTensorPerFeature) {
  auto runtime = load("multiclass.ubj");
  ASSERT_NE(runtime, nullptr);
  InferRequest request;
  for (const char* name : {"petal_width", "sepal_width", "sepal_length", "petal_length"}) {
    Tensor column{name, DataType::kFp64, {2}, {}};
    column.append(1.0);
    column.append(2.0);
    request.inputs.push_back(column);
  }
  auto input = runtime->prepare(request);
  ASSERT_TRUE(input.is_ok()) << input.status().message();
  EXPECT_EQ(input->rows, 2);
  request.inputs[1].shape = {3};
  request.inputs[1].append(3.0);
  EXPECT_THAT(runtime->prepare(request).status().message(), HasSubstr("has 3 rows"));
}

TEST(XgboostRuntimeTest, ColumnsNeedFeatureNames) {
  auto runtime = load("binary.json");
  ASSERT_NE(runtime, nullptr);
  InferRequest request;
  request.inputs.push_back(Tensor{"a", DataType::kFp32, {1}, std::vector<uint8_t>(4)});
  request.inputs.push_back(Tensor{"b", DataType::kFp32, {1}, std::vector<uint8_t>(4)});
  EXPECT_THAT(runtime->prepare(request).status().message(), HasSubstr("no feature names"));
}

TEST(XgboostRuntimeTest, SklearnClassifierAnswersLabelsAndProbabilities) {
  auto runtime = load("mlflow_classifier");
  ASSERT_NE(runtime, nullptr);
  const ModelMetadata& meta = runtime->metadata();
  ASSERT_EQ(meta.outputs.size(), 2u);
  EXPECT_EQ(meta.outputs[0].name, "predict");
  EXPECT_EQ(meta.outputs[0].datatype, DataType::kInt64);
  EXPECT_EQ(meta.outputs[1].name, "predict_proba");
  ASSERT_EQ(meta.inputs.size(), 4u);  // from the MLmodel signature
  EXPECT_EQ(meta.inputs[0].name, "sepal_length");
  auto input = runtime->prepare(matrix_request(2, 4, 6.0f));
  ASSERT_TRUE(input.is_ok());
  auto outputs = run_sync(*runtime, std::move(input).value());
  ASSERT_TRUE(outputs.is_ok());
  const auto labels = outputs->at(0).values<int64_t>();
  const auto proba = outputs->at(1).values<float>();
  const int64_t argmax = std::max_element(proba.begin(), proba.begin() + 3) - proba.begin();
  EXPECT_EQ(labels[0], argmax);
}

TEST(XgboostRuntimeTest, ReportsMissingAndCorruptFiles) {
  RuntimeOptions options;
  auto missing = load_runtime(RuntimeKind::kXgboost, model_fixtures_dir() + "/nope.json", options);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.json"));
  auto corrupt = load_runtime(RuntimeKind::kAuto, model_fixtures_dir() + "/corrupt.json", options);
  EXPECT_EQ(corrupt.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(corrupt.status().message(), HasSubstr("corrupt.json"));
  const std::string not_mlflow = model_fixtures_dir() + "/empty_dir";
  std::filesystem::create_directories(not_mlflow);
  EXPECT_THAT(load_runtime(RuntimeKind::kXgboost, not_mlflow, options).status().message(),
              HasSubstr("has no MLmodel file"));
}

}  // namespace
}  // namespace flotilla::runtime

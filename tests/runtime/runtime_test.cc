#include "runtime/runtime.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/model_fixtures.h"

namespace flotilla::runtime {
namespace {

using flotilla::testing::model_fixtures_dir;

TEST(RuntimeKindTest, ParsesNames) {
  EXPECT_EQ(parse_runtime_kind("auto").value(), RuntimeKind::kAuto);
  EXPECT_EQ(parse_runtime_kind("synthetic").value(), RuntimeKind::kSynthetic);
  EXPECT_FALSE(parse_runtime_kind("onnx").is_ok());
}

TEST(DetectRuntimeTest, PicksXgboostAndNeverSynthetic) {
  EXPECT_EQ(detect_runtime(model_fixtures_dir() + "/binary.json").value(), RuntimeKind::kXgboost);
  EXPECT_EQ(detect_runtime(model_fixtures_dir() + "/multiclass.ubj").value(),
            RuntimeKind::kXgboost);
  EXPECT_EQ(detect_runtime(model_fixtures_dir() + "/mlflow_booster").value(),
            RuntimeKind::kXgboost);
  auto yaml = detect_runtime(model_fixtures_dir() + "/synthetic.yaml");
  ASSERT_FALSE(yaml.is_ok());
  EXPECT_THAT(yaml.status().message(), ::testing::HasSubstr("--runtime synthetic"));
  EXPECT_EQ(detect_runtime(model_fixtures_dir() + "/absent.json").status().code(),
            StatusCode::kNotFound);
}

TEST(DefaultModelNameTest, UsesStemOrDirectoryName) {
  EXPECT_EQ(default_model_name("models/fraud.json"), "fraud");
  EXPECT_EQ(default_model_name("/tmp/x/model.v2.ubj"), "model.v2");
  EXPECT_EQ(default_model_name(model_fixtures_dir() + "/mlflow_booster/"), "mlflow_booster");
}

}  // namespace
}  // namespace flotilla::runtime

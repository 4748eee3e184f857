#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "protocol/protocol.h"
#include "protocol/test_util.h"

namespace flotilla::protocol {
namespace {

using flotilla::testing::read_test_data;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

Result<InferRequest> decode_json(std::string body) {
  return decode_mlflow_json(body);
}

std::vector<double> values_of(const InferRequest& request) {
  const Tensor& tensor = request.inputs.at(0);
  auto values = tensor.values<double>();
  return {values.begin(), values.end()};
}

std::string json_error(const std::string& body) {
  auto result = decode_json(body);
  EXPECT_FALSE(result.is_ok()) << body;
  return result.is_ok() ? "" : result.status().message();
}

TEST(MlflowContentTypeTest, AcceptsJsonAndCsvWithUtf8Only) {
  EXPECT_EQ(parse_mlflow_content_type("application/json").value(), MlflowFormat::kJson);
  EXPECT_EQ(parse_mlflow_content_type("Application/JSON; charset=UTF-8").value(),
            MlflowFormat::kJson);
  EXPECT_EQ(parse_mlflow_content_type("text/csv").value(), MlflowFormat::kCsv);
  for (const char* bad : {"", "text/plain", "application/json; charset=latin-1",
                          "application/json; format=pandas-split", "application/jsonx"}) {
    auto result = parse_mlflow_content_type(bad);
    ASSERT_FALSE(result.is_ok()) << bad;
    EXPECT_EQ(result.status().code(), StatusCode::kUnimplemented);
  }
}

TEST(MlflowJsonTest, DecodesGoldenDataframeSplit) {
  auto request = decode_json(read_test_data("mlflow/dataframe_split.json"));
  ASSERT_TRUE(request.is_ok()) << request.status().message();
  EXPECT_THAT(request->column_names, ElementsAre("b", "a"));
  EXPECT_EQ(request->inputs[0].shape, (std::vector<int64_t>{2, 2}));
  auto values = values_of(*request);
  EXPECT_EQ(values[0], 1);
  EXPECT_EQ(values[2], 3);
  EXPECT_TRUE(std::isnan(values[3]));
  EXPECT_TRUE(request->ignore_unknown_inputs);
}

TEST(MlflowJsonTest, DecodesRecordsWithMissingKeys) {
  auto request = decode_json(R"({"dataframe_records":[{"a":1,"b":true},{"b":2,"c":3}]})");
  ASSERT_TRUE(request.is_ok()) << request.status().message();
  EXPECT_THAT(request->column_names, ElementsAre("a", "b", "c"));
  auto values = values_of(*request);
  ASSERT_EQ(values.size(), 6u);
  EXPECT_EQ(values[0], 1);
  EXPECT_EQ(values[1], 1);  // true
  EXPECT_TRUE(std::isnan(values[2]));
  EXPECT_TRUE(std::isnan(values[3]));
  EXPECT_EQ(values[5], 3);
}

TEST(MlflowJsonTest, DecodesInstancesAndInputsAsRows) {
  for (const char* body : {R"({"instances":[[1,2],[3,4]]})", R"({"inputs":[[1,2],[3,4]]})"}) {
    auto request = decode_json(body);
    ASSERT_TRUE(request.is_ok()) << body;
    EXPECT_EQ(request->inputs[0].shape, (std::vector<int64_t>{2, 2}));
    EXPECT_THAT(values_of(*request), ElementsAre(1, 2, 3, 4));
    EXPECT_TRUE(request->column_names.empty());
  }
}

TEST(MlflowJsonTest, DecodesFlatListAsVector) {
  auto request = decode_json(R"({"inputs":[1,2,3]})");
  ASSERT_TRUE(request.is_ok());
  EXPECT_EQ(request->inputs[0].shape, (std::vector<int64_t>{3}));
}

TEST(MlflowJsonTest, DecodesColumnarInputsAndInstanceObjects) {
  auto columns = decode_json(R"({"inputs":{"a":[1,2],"b":[[3],[4]]},"params":{"k":1}})");
  ASSERT_TRUE(columns.is_ok()) << columns.status().message();
  EXPECT_THAT(columns->column_names, ElementsAre("a", "b"));
  EXPECT_THAT(values_of(*columns), ElementsAre(1, 3, 2, 4));
  auto objects = decode_json(R"({"instances":[{"a":1,"b":2}]})");
  ASSERT_TRUE(objects.is_ok());
  EXPECT_THAT(objects->column_names, ElementsAre("a", "b"));
}

TEST(MlflowJsonTest, RejectsBadBodies) {
  EXPECT_THAT(json_error("[1,2]"), HasSubstr("must be a JSON object"));
  EXPECT_THAT(json_error("{}"), HasSubstr("exactly one of"));
  EXPECT_THAT(json_error(R"({"instances":[[1]],"inputs":[[1]]})"), HasSubstr("found 2"));
  EXPECT_THAT(json_error(R"({"messages":[]})"), HasSubstr("not supported by this model"));
  EXPECT_THAT(json_error("{\"instances\":"), HasSubstr("malformed JSON"));
  EXPECT_THAT(json_error(R"({"instances":[]})"), HasSubstr("no rows"));
  EXPECT_THAT(json_error(R"({"instances":[[1,2],[3]]})"),
              HasSubstr("has 1 values but the first row has 2"));
  EXPECT_THAT(json_error(R"({"instances":[["x"]]})"), HasSubstr("strings are not supported"));
  EXPECT_THAT(json_error(R"({"dataframe_split":{"columns":["a"],"data":[[1,2]]}})"),
              HasSubstr("1 columns but rows have 2"));
  EXPECT_THAT(json_error(R"({"dataframe_split":{"columns":["a"]}})"),
              HasSubstr("'data' is required"));
  EXPECT_THAT(json_error(R"({"dataframe_records":{"a":1}})"), HasSubstr("array of objects"));
  EXPECT_THAT(json_error(R"({"inputs":{"a":[1,2],"b":[1]}})"), HasSubstr("other columns have 2"));
  EXPECT_THAT(json_error(R"({"inputs":"x"})"), HasSubstr("must be an array or an object"));
  EXPECT_THAT(json_error(R"({"inputs":[[1]],"params":[1]})"),
              HasSubstr("'params' must be an object"));
}

TEST(MlflowCsvTest, DecodesHeaderQuotesAndMissingValues) {
  auto request = decode_mlflow_csv("a,b,\"c, d\"\r\n1,2.5,\n\"3\",-4e2,true\n\n");
  ASSERT_TRUE(request.is_ok()) << request.status().message();
  EXPECT_THAT(request->column_names, ElementsAre("a", "b", "c, d"));
  auto values = values_of(*request);
  ASSERT_EQ(values.size(), 6u);
  EXPECT_EQ(values[1], 2.5);
  EXPECT_TRUE(std::isnan(values[2]));
  EXPECT_EQ(values[3], 3);
  EXPECT_EQ(values[4], -400);
  EXPECT_EQ(values[5], 1);
}

TEST(MlflowCsvTest, RejectsBadCsv) {
  EXPECT_THAT(decode_mlflow_csv("").status().message(), HasSubstr("empty"));
  EXPECT_THAT(decode_mlflow_csv("a,b\n").status().message(), HasSubstr("no rows"));
  EXPECT_THAT(decode_mlflow_csv("a,b\n1\n").status().message(), HasSubstr("has 1 fields"));
  EXPECT_THAT(decode_mlflow_csv("a,b\n1,x\n").status().message(), HasSubstr("'x' is not a number"));
  EXPECT_THAT(decode_mlflow_csv("a\n\"1\n").status().message(), HasSubstr("unterminated"));
}

TEST(MlflowEncodeTest, WritesPredictionsByRank) {
  Tensor vector{"predict", DataType::kFp32, {2}, {}};
  vector.append(0.5f);
  vector.append(1.25f);
  std::string out;
  encode_mlflow_predictions(vector, out);
  EXPECT_EQ(out, R"({"predictions":[0.5,1.25]})");

  Tensor labels{"predict", DataType::kInt64, {2, 2}, {}};
  for (int64_t v : {1, 2, 3, 4}) {
    labels.append(v);
  }
  out.clear();
  encode_mlflow_predictions(labels, out);
  EXPECT_EQ(out, R"({"predictions":[[1,2],[3,4]]})");
}

TEST(MlflowEncodeTest, WritesErrorsInMlflowShape) {
  EXPECT_EQ(encode_mlflow_error(StatusCode::kInvalidArgument, "bad"),
            R"({"error_code":"BAD_REQUEST","message":"bad"})");
  EXPECT_EQ(encode_mlflow_error(StatusCode::kInternal, "x"),
            R"({"error_code":"INTERNAL_ERROR","message":"x"})");
  // MLflow's ErrorCode for 501 (what a language model's /invocations answers).
  EXPECT_EQ(encode_mlflow_error(StatusCode::kUnimplemented, "no"),
            R"({"error_code":"NOT_IMPLEMENTED","message":"no"})");
}

}  // namespace
}  // namespace flotilla::protocol

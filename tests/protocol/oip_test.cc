#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "protocol/protocol.h"
#include "protocol/test_util.h"

namespace flotilla::protocol {
namespace {

using flotilla::testing::compact_json;
using flotilla::testing::read_test_data;
using ::testing::HasSubstr;

Result<InferRequest> decode(std::string body) {
  return decode_oip_infer_request(body);
}

std::string error_of(const std::string& body) {
  auto result = decode(body);
  EXPECT_FALSE(result.is_ok()) << body;
  if (result.is_ok()) {
    return "";
  }
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  return result.status().message();
}

TEST(OipDecodeTest, DecodesGoldenRequest) {
  auto request = decode(read_test_data("oip/infer_request.json"));
  ASSERT_TRUE(request.is_ok()) << request.status().message();
  EXPECT_EQ(request->id, "req-7");
  ASSERT_EQ(request->inputs.size(), 1u);
  const Tensor& input = request->inputs[0];
  EXPECT_EQ(input.name, "input");
  EXPECT_EQ(input.datatype, DataType::kFp32);
  EXPECT_EQ(input.shape, (std::vector<int64_t>{2, 3}));
  auto values = input.values<float>();
  ASSERT_EQ(values.size(), 6u);
  EXPECT_EQ(values[1], 2.5f);
  EXPECT_TRUE(std::isnan(values[2]));  // null is a missing value
  EXPECT_EQ(values[5], 6.0f);
  EXPECT_EQ(request->requested_outputs, std::vector<std::string>{"predict"});
  ASSERT_EQ(request->parameters.size(), 4u);
  EXPECT_EQ(std::get<int64_t>(request->parameters[0].second), 2);
  EXPECT_EQ(std::get<std::string>(request->parameters[1].second), "a");
  EXPECT_EQ(std::get<bool>(request->parameters[2].second), false);
  EXPECT_EQ(std::get<double>(request->parameters[3].second), 0.5);
}

TEST(OipDecodeTest, FlatAndNestedDataAreTheSame) {
  auto flat =
      decode(R"({"inputs":[{"name":"x","datatype":"FP64","shape":[2,2],"data":[1,2,3,4]}]})");
  auto nested =
      decode(R"({"inputs":[{"name":"x","datatype":"FP64","shape":[2,2],"data":[[1,2],[3,4]]}]})");
  ASSERT_TRUE(flat.is_ok());
  ASSERT_TRUE(nested.is_ok());
  EXPECT_EQ(flat->inputs[0].data, nested->inputs[0].data);
}

TEST(OipDecodeTest, DecodesEveryDatatype) {
  auto request = decode(R"({"inputs":[
    {"name":"a","datatype":"BOOL","shape":[2],"data":[true,false]},
    {"name":"b","datatype":"INT32","shape":[2],"data":[-5,2147483647]},
    {"name":"c","datatype":"INT64","shape":[1],"data":[-9007199254740993]},
    {"name":"d","datatype":"FP32","shape":[1],"data":[1e-3]},
    {"name":"e","datatype":"FP64","shape":[1],"data":[0.1]}]})");
  ASSERT_TRUE(request.is_ok()) << request.status().message();
  EXPECT_EQ(request->inputs[0].data, (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(request->inputs[1].values<int32_t>()[1], 2147483647);
  EXPECT_EQ(request->inputs[2].values<int64_t>()[0], -9007199254740993LL);
  EXPECT_EQ(request->inputs[3].values<float>()[0], 1e-3f);
  EXPECT_EQ(request->inputs[4].values<double>()[0], 0.1);
}

TEST(OipDecodeTest, RejectsBadInput) {
  EXPECT_THAT(error_of("{"), HasSubstr("malformed JSON"));
  EXPECT_THAT(error_of("[]"), HasSubstr("must be a JSON object"));
  EXPECT_THAT(error_of(R"({"inputs":[]})"), HasSubstr("'inputs' is empty"));
  EXPECT_THAT(error_of(R"({"id":1,"inputs":[]})"), HasSubstr("'id' must be a string"));
  EXPECT_THAT(error_of(R"({"inputs":{}})"), HasSubstr("'inputs' is required"));
  EXPECT_THAT(error_of(R"({"inputs":[{"name":"x","datatype":"FP33","shape":[1],"data":[1]}]})"),
              HasSubstr("unsupported datatype 'FP33'"));
  EXPECT_THAT(error_of(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":["1"]}]})"),
              HasSubstr("expected a number for FP32"));
  EXPECT_THAT(error_of(R"({"inputs":[{"name":"x","datatype":"INT32","shape":[1],"data":[1.5]}]})"),
              HasSubstr("expected an integer"));
  EXPECT_THAT(
      error_of(R"({"inputs":[{"name":"x","datatype":"INT32","shape":[1],"data":[4294967296]}]})"),
      HasSubstr("out of range for INT32"));
  EXPECT_THAT(error_of(R"({"inputs":[{"name":"x","datatype":"BOOL","shape":[1],"data":[1]}]})"),
              HasSubstr("expected true or false"));
  EXPECT_THAT(
      error_of(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[1,2,3]}]})"),
      HasSubstr("needs 4 elements but data has 3"));
  EXPECT_THAT(error_of(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[-1],"data":[1]}]})"),
              HasSubstr("non-negative"));
  EXPECT_THAT(error_of(R"({"inputs":[{"datatype":"FP32","shape":[1],"data":[1]}]})"),
              HasSubstr("'name' is required"));
  EXPECT_THAT(error_of(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1]}]})"),
              HasSubstr("'data' is required"));
  EXPECT_THAT(error_of(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":1}]})"),
              HasSubstr("data must be an array"));
  EXPECT_THAT(
      error_of(
          R"({"parameters":{"a":[1]},"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}]})"),
      HasSubstr("parameter 'a' must be"));
  EXPECT_THAT(
      error_of(
          R"({"inputs":[{"name":"x","datatype":"FP32","shape":[4294967296,4294967296],"data":[1]}]})"),
      HasSubstr("shape is too large"));
  EXPECT_THAT(
      error_of(
          R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"parameters":{"binary_data_size":4}}]})"),
      HasSubstr("binary tensor data needs the Inference-Header-Content-Length header"));
  EXPECT_THAT(
      error_of(
          R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}],"outputs":[{}]})"),
      HasSubstr("needs a string 'name'"));
}

// Triton's binary tensor data extension, as tritonclient sends it by default: the JSON, then
// each binary input's little-endian bytes in input order.
std::string binary_request(const std::string& json, const std::string& bytes) {
  return json + bytes;
}

template <typename T>
std::string bytes_of(std::initializer_list<T> values) {
  std::string out;
  for (T value : values) {
    out.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  return out;
}

TEST(OipDecodeTest, DecodesBinaryTensorData) {
  const std::string json =
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"parameters":{"binary_data_size":16}},)"
      R"({"name":"n","datatype":"INT64","shape":[2],"data":[7,8]},)"
      R"({"name":"b","datatype":"BOOL","shape":[3],"parameters":{"binary_data_size":3}}],)"
      R"("parameters":{"binary_data_output":true}})";
  std::string body = binary_request(
      json, bytes_of<float>({1.5f, -2.0f, 3.25f, 0.0f}) + std::string("\x01\x00\x05", 3));
  auto request = decode_oip_infer_request(body, json.size());
  ASSERT_TRUE(request.is_ok()) << request.status().message();
  ASSERT_EQ(request->inputs.size(), 3u);
  const auto x = request->inputs[0].values<float>();
  EXPECT_EQ(std::vector<float>(x.begin(), x.end()), (std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f}));
  const auto n = request->inputs[1].values<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(n.begin(), n.end()), (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(request->inputs[2].data, (std::vector<uint8_t>{1, 0, 1}));  // any non-zero is true

  auto refused = [](const std::string& json_part, const std::string& bytes,
                    std::optional<size_t> length = std::nullopt) {
    std::string whole = json_part + bytes;
    auto result = decode_oip_infer_request(whole, length.value_or(json_part.size()));
    EXPECT_FALSE(result.is_ok()) << json_part;
    return result.is_ok() ? std::string() : result.status().message();
  };
  const std::string one =
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[2],"parameters":{"binary_data_size":8}}]})";
  EXPECT_EQ(refused(one, bytes_of<float>({1.0f})),
            "input 'x': binary_data_size 8 but only 4 bytes of binary data are left in the body");
  EXPECT_EQ(refused(one, bytes_of<float>({1.0f, 2.0f, 3.0f})),
            "4 bytes of binary data after the last input's");
  const std::string wrong_size =
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[2],"parameters":{"binary_data_size":4}}]})";
  EXPECT_EQ(refused(wrong_size, bytes_of<float>({1.0f})),
            "input 'x': binary_data_size 4 but shape [2] of FP32 needs 8 bytes");
  const std::string both =
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1],"parameters":{"binary_data_size":4}}]})";
  EXPECT_EQ(refused(both, bytes_of<float>({1.0f})),
            "input 'x': has both 'data' and binary_data_size");
  const std::string negative =
      R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"parameters":{"binary_data_size":-4}}]})";
  EXPECT_EQ(refused(negative, ""), "input 'x': binary_data_size must be a non-negative integer");
  EXPECT_EQ(refused(one, bytes_of<float>({1.0f, 2.0f}), one.size() + 100),
            "Inference-Header-Content-Length " + std::to_string(one.size() + 100) +
                " is past the body's " + std::to_string(one.size() + 8) + " bytes");
  // A header length that cuts the JSON short: malformed JSON.
  EXPECT_THAT(refused(one, bytes_of<float>({1.0f, 2.0f}), one.size() - 2),
              HasSubstr("malformed JSON"));
  // A JSON-only request still decodes with the header (no binary inputs, nothing after).
  std::string plain = R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[2]}]})";
  EXPECT_TRUE(decode_oip_infer_request(plain, plain.size()).is_ok());
}

TEST(OipDecodeTest, RejectsNestingThatDoesNotMatchShape) {
  std::string deep(100, '[');
  deep += std::string(100, ']');
  EXPECT_THAT(
      error_of(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[0],"data":)" + deep + "}]}"),
      HasSubstr("nested data does not match shape [0]"));
  // Ragged rows whose total still matches the shape must not shift values between rows.
  EXPECT_THAT(
      error_of(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[[1,2,3],[4]]}]})"),
      HasSubstr("nested data does not match shape [2,2]"));
  EXPECT_THAT(
      error_of(R"({"inputs":[{"name":"x","datatype":"FP32","shape":[2,2],"data":[[1,2],3,4]}]})"),
      HasSubstr("does not match shape"));
  EXPECT_THAT(
      error_of(
          R"({"inputs":[{"name":"x","datatype":"FP32","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data":[1]}]})"),
      HasSubstr("more than 16 dimensions"));
}

TEST(OipEncodeTest, MatchesGoldenResponse) {
  InferResponse response;
  response.model_name = "fraud";
  response.id = "req-7";
  Tensor predict{"predict", DataType::kFp32, {2}, {}};
  predict.append(0.25f);
  predict.append(0.75f);
  Tensor label{"label", DataType::kInt64, {2, 1}, {}};
  label.append(int64_t{0});
  label.append(int64_t{1});
  response.outputs = {predict, label};
  std::string out;
  encode_oip_infer_response(response, out);
  EXPECT_EQ(out, compact_json(read_test_data("oip/infer_response.json")));
}

TEST(OipEncodeTest, FloatsRoundTripExactly) {
  InferResponse response;
  Tensor tensor{"p", DataType::kFp32, {2}, {}};
  tensor.append(0.024643792f);
  tensor.append(std::nanf(""));
  response.outputs = {tensor};
  std::string out;
  encode_oip_infer_response(response, out);
  EXPECT_THAT(out, HasSubstr("\"data\":[0.024643792,null]"));
}

TEST(OipEncodeTest, MatchesGoldenMetadata) {
  ModelMetadata metadata{"fraud",
                         {"1"},
                         "xgboost",
                         {{"input", DataType::kFp32, {-1, 30}}},
                         {{"predict", DataType::kFp32, {-1}}}};
  EXPECT_EQ(encode_oip_model_metadata(metadata),
            compact_json(read_test_data("oip/model_metadata.json")));
}

TEST(OipEncodeTest, ReplacesInvalidUtf8InMessages) {
  // Valid 2-, 3- and 4-byte sequences pass; a lone continuation byte, a truncated sequence,
  // an overlong form and a surrogate become U+FFFD.
  EXPECT_EQ(encode_oip_error("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"),
            "{\"error\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}");
  EXPECT_EQ(encode_oip_error("a\x80"
                             "b\xe2\x82"),
            R"({"error":"a\ufffdb\ufffd\ufffd"})");
  EXPECT_EQ(encode_oip_error("\xc0\xaf\xed\xa0\x80"),
            R"({"error":"\ufffd\ufffd\ufffd\ufffd\ufffd"})");
}

TEST(OipEncodeTest, EscapesErrorMessages) {
  EXPECT_EQ(encode_oip_error("bad \"x\"\n\x01"), R"({"error":"bad \"x\"\n\u0001"})");
}

}  // namespace
}  // namespace flotilla::protocol

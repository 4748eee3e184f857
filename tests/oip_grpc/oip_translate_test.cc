#include "oip_grpc/oip_translate.h"

#include <cstring>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace flotilla::oip_grpc {
namespace {

using nlohmann::json;

template <typename T>
std::string raw_of(std::initializer_list<T> values) {
  std::string raw;
  for (T value : values) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    raw.append(bytes, sizeof(T));
  }
  return raw;
}

std::string bytes_element(std::string_view text) {
  const auto length = static_cast<uint32_t>(text.size());
  return raw_of<uint32_t>({length}) + std::string(text);
}

inference::ModelInferRequest::InferInputTensor* add_input(inference::ModelInferRequest& request,
                                                          const std::string& name,
                                                          const std::string& datatype,
                                                          std::initializer_list<int64_t> shape) {
  auto* input = request.add_inputs();
  input->set_name(name);
  input->set_datatype(datatype);
  for (int64_t dimension : shape) {
    input->add_shape(dimension);
  }
  return input;
}

json body_of(const http::Request& request) {
  return json::parse(request.body);
}

TEST(RestInferRequest, RawInputsBecomeOipJsonWithTheirShapeAndParameters) {
  inference::ModelInferRequest request;
  request.set_model_name("iris");
  request.set_id("req-1");
  (*request.mutable_parameters())["priority"].set_int64_param(3);
  auto* x = add_input(request, "x", "FP32", {2, 2});
  (*x->mutable_parameters())["note"].set_string_param("a");
  request.add_raw_input_contents(raw_of<float>({1.5F, -2.0F, 0.1F, 3.0F}));
  add_input(request, "mask", "BOOL", {2});
  request.add_raw_input_contents(std::string("\x01\x00", 2));
  add_input(request, "ids", "INT64", {1});
  request.add_raw_input_contents(raw_of<int64_t>({-9'000'000'000LL}));
  add_input(request, "tags", "BYTES", {2});
  request.add_raw_input_contents(bytes_element("héllo") + bytes_element(""));
  add_input(request, "half", "FP16", {2});
  request.add_raw_input_contents(raw_of<uint16_t>({0x3c00, 0xc000}));  // 1.0, -2.0
  add_input(request, "small", "UINT8", {1});
  request.add_raw_input_contents(std::string("\xff", 1));
  request.add_outputs()->set_name("predict");

  Result<http::Request> rest = rest_infer_request(request);
  ASSERT_TRUE(rest.is_ok()) << rest.status().to_string();
  EXPECT_EQ(rest->method, http::Method::kPost);
  EXPECT_EQ(rest->target, "/v2/models/iris/infer");
  EXPECT_EQ(http::find_header(rest->headers, "content-type"), "application/json");
  const json body = body_of(*rest);
  EXPECT_EQ(body["id"], "req-1");
  EXPECT_EQ(body["parameters"]["priority"], 3);
  ASSERT_EQ(body["inputs"].size(), 6U);
  EXPECT_EQ(body["inputs"][0]["shape"], json::array({2, 2}));
  EXPECT_EQ(body["inputs"][0]["datatype"], "FP32");
  EXPECT_EQ(body["inputs"][0]["parameters"]["note"], "a");
  // Shortest text that reads back as the same float: 0.1F stays 0.1.
  EXPECT_EQ(body["inputs"][0]["data"], json::parse("[1.5,-2,0.1,3]"));
  EXPECT_EQ(body["inputs"][1]["data"], json::array({true, false}));
  EXPECT_EQ(body["inputs"][2]["data"][0].get<int64_t>(), -9'000'000'000LL);
  EXPECT_EQ(body["inputs"][3]["data"], json::array({"héllo", ""}));
  EXPECT_EQ(body["inputs"][4]["data"], json::array({1.0, -2.0}));
  EXPECT_EQ(body["inputs"][5]["data"], json::array({255}));
  EXPECT_EQ(body["outputs"], json::parse(R"([{"name":"predict"}])"));
}

TEST(RestInferRequest, TypedContentsAndAVersionedPath) {
  inference::ModelInferRequest request;
  request.set_model_name("iris");
  request.set_model_version("v2");
  auto* x = add_input(request, "x", "FP64", {1, 2});
  x->mutable_contents()->add_fp64_contents(0.25);
  x->mutable_contents()->add_fp64_contents(1e300);
  auto* n = add_input(request, "n", "INT16", {1});
  n->mutable_contents()->add_int_contents(-7);
  auto* s = add_input(request, "s", "BYTES", {1});
  s->mutable_contents()->add_bytes_contents("text \"quoted\"");
  Result<http::Request> rest = rest_infer_request(request);
  ASSERT_TRUE(rest.is_ok()) << rest.status().to_string();
  EXPECT_EQ(rest->target, "/v2/models/iris/versions/v2/infer");
  const json body = body_of(*rest);
  EXPECT_EQ(body["inputs"][0]["data"], json::array({0.25, 1e300}));
  EXPECT_EQ(body["inputs"][1]["data"], json::array({-7}));
  EXPECT_EQ(body["inputs"][2]["data"], json::array({"text \"quoted\""}));
  EXPECT_FALSE(body.contains("outputs"));
  EXPECT_FALSE(body.contains("id"));
}

// Each bad request is refused with kInvalidArgument and a message naming what is wrong.
TEST(RestInferRequest, RefusesBadRequestsNamingTheFault) {
  struct Case {
    const char* what;
    std::function<void(inference::ModelInferRequest&)> make;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"no model name", [](auto&) {}, "model name is empty"},
      {"a slash in the name", [](auto& r) { r.set_model_name("a/b"); }, "holds a character"},
      {"no inputs", [](auto& r) { r.set_model_name("m"); }, "no inputs"},
      {"unknown datatype",
       [](auto& r) {
         r.set_model_name("m");
         add_input(r, "x", "FP8", {1});
       },
       "unknown datatype 'FP8'"},
      {"raw bytes short of the shape",
       [](auto& r) {
         r.set_model_name("m");
         add_input(r, "x", "FP32", {2, 2});
         r.add_raw_input_contents(raw_of<float>({1, 2, 3}));
       },
       "raw contents hold 12 bytes; its shape needs 16"},
      {"raw for some inputs only",
       [](auto& r) {
         r.set_model_name("m");
         add_input(r, "x", "FP32", {1});
         add_input(r, "y", "FP32", {1});
         r.add_raw_input_contents(raw_of<float>({1}));
       },
       "send all inputs raw or none"},
      {"typed contents of the wrong count",
       [](auto& r) {
         r.set_model_name("m");
         add_input(r, "x", "FP32", {3})->mutable_contents()->add_fp32_contents(1);
       },
       "contents.fp32_contents holds 1 elements; its shape needs 3"},
      {"typed contents of the wrong field",
       [](auto& r) {
         r.set_model_name("m");
         add_input(r, "x", "FP32", {1})->mutable_contents()->add_int_contents(1);
       },
       "fp32_contents holds 0 elements"},
      {"FP16 in typed contents",
       [](auto& r) {
         r.set_model_name("m");
         add_input(r, "x", "FP16", {1});
       },
       "send it in raw_input_contents"},
      {"a NaN",
       [](auto& r) {
         r.set_model_name("m");
         add_input(r, "x", "FP32", {1});
         r.add_raw_input_contents(raw_of<float>({std::numeric_limits<float>::quiet_NaN()}));
       },
       "input 'x' element 0 is not finite"},
      {"BYTES that are not UTF-8",
       [](auto& r) {
         r.set_model_name("m");
         add_input(r, "x", "BYTES", {1});
         r.add_raw_input_contents(bytes_element("\xff\xfe"));
       },
       "not UTF-8 text"},
      {"a BYTES length past the end",
       [](auto& r) {
         r.set_model_name("m");
         add_input(r, "x", "BYTES", {1});
         r.add_raw_input_contents(raw_of<uint32_t>({10}) + "abc");
       },
       "raw contents end inside element 0"},
      {"a negative dimension",
       [](auto& r) {
         r.set_model_name("m");
         add_input(r, "x", "FP32", {-1});
       },
       "negative dimension"},
  };
  for (const Case& c : cases) {
    inference::ModelInferRequest request;
    c.make(request);
    Result<http::Request> rest = rest_infer_request(request);
    ASSERT_FALSE(rest.is_ok()) << c.what;
    EXPECT_EQ(rest.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(rest.status().message().find(c.message), std::string::npos)
        << c.what << ": " << rest.status().message();
  }
}

TEST(DecodeInferAnswer, OutputsBecomeRawContentsOfTheirDatatype) {
  std::string body = R"({"model_name":"iris","model_version":"1","id":"req-1",
    "parameters":{"cached":true},
    "outputs":[
      {"name":"predict","datatype":"FP32","shape":[2,2],"data":[[0.5,0.25],[1,2]]},
      {"name":"label","datatype":"INT64","shape":[2],"data":[3,-4]},
      {"name":"ok","datatype":"BOOL","shape":[1],"data":[true]},
      {"name":"text","datatype":"BYTES","shape":[2],"data":["ab",""],"parameters":{"p":1.5}},
      {"name":"half","datatype":"FP16","shape":[1],"data":[1.0]},
      {"name":"brain","datatype":"BF16","shape":[1],"data":[-2.0]},
      {"name":"big","datatype":"UINT64","shape":[1],"data":[18446744073709551615]},
      {"name":"edges","datatype":"INT8","shape":[2],"data":[-128,127]}]})";
  inference::ModelInferResponse response;
  const Status status = decode_infer_answer(body, response);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(response.model_name(), "iris");
  EXPECT_EQ(response.model_version(), "1");
  EXPECT_EQ(response.id(), "req-1");
  EXPECT_TRUE(response.parameters().at("cached").bool_param());
  ASSERT_EQ(response.outputs_size(), 8);
  ASSERT_EQ(response.raw_output_contents_size(), 8);
  EXPECT_EQ(response.outputs(0).shape_size(), 2);
  EXPECT_EQ(response.raw_output_contents(0), raw_of<float>({0.5F, 0.25F, 1.0F, 2.0F}));
  EXPECT_EQ(response.raw_output_contents(1), raw_of<int64_t>({3, -4}));
  EXPECT_EQ(response.raw_output_contents(2), std::string("\x01", 1));
  EXPECT_EQ(response.raw_output_contents(3), bytes_element("ab") + bytes_element(""));
  EXPECT_DOUBLE_EQ(response.outputs(3).parameters().at("p").double_param(), 1.5);
  EXPECT_EQ(response.raw_output_contents(4), raw_of<uint16_t>({0x3c00}));
  EXPECT_EQ(response.raw_output_contents(5), raw_of<uint16_t>({0xc000}));
  EXPECT_EQ(response.raw_output_contents(6), raw_of<uint64_t>({UINT64_MAX}));
  EXPECT_EQ(response.raw_output_contents(7), raw_of<int8_t>({-128, 127}));
}

TEST(DecodeInferAnswer, RefusesAnswersThatDoNotFit) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "not JSON"},
      {"[]", "not a JSON object"},
      {R"({"model_name":"m"})", "no \"outputs\""},
      {R"({"outputs":[{"name":"y","datatype":"FP32","shape":[2],"data":[1]}]})",
       "holds 1 elements"},
      {R"({"outputs":[{"name":"y","datatype":"INT8","shape":[1],"data":[300]}]})",
       "datatype's range"},
      {R"({"outputs":[{"name":"y","datatype":"UINT8","shape":[1],"data":[-1]}]})",
       "datatype's range"},
      {R"({"outputs":[{"name":"y","datatype":"INT64","shape":[1],"data":[9223372036854775808]}]})",
       "datatype's range"},
      {R"({"outputs":[{"name":"y","datatype":"INT16","shape":[1],"data":[1.5]}]})",
       "datatype's range"},
      {R"({"outputs":[{"name":"y","datatype":"FP32","shape":[1],"data":["x"]}]})", "not a number"},
      {R"({"outputs":[{"name":"y","datatype":"NOPE","shape":[1],"data":[1]}]})",
       "unknown datatype"},
      {R"({"outputs":[{"name":"y","datatype":"FP32","shape":[1]}]})", "no \"data\""},
      {R"({"outputs":[{"name":"y","datatype":"FP32","shape":[-1],"data":[1]}]})",
       "negative dimension"},
  };
  for (const auto& [text, message] : cases) {
    std::string body = text;
    inference::ModelInferResponse response;
    const Status status = decode_infer_answer(body, response);
    ASSERT_FALSE(status.is_ok()) << text;
    EXPECT_EQ(status.code(), StatusCode::kInternal) << text;
    EXPECT_NE(status.message().find(message), std::string::npos)
        << text << ": " << status.message();
  }
}

TEST(DecodeMetadata, ModelAndServer) {
  std::string model = R"({"name":"iris","versions":["1","2"],"platform":"xgboost",
    "inputs":[{"name":"x","datatype":"FP32","shape":[-1,4]}],
    "outputs":[{"name":"predict","datatype":"FP32","shape":[-1,3]}]})";
  inference::ModelMetadataResponse metadata;
  ASSERT_TRUE(decode_model_metadata_answer(model, metadata).is_ok());
  EXPECT_EQ(metadata.name(), "iris");
  EXPECT_EQ(metadata.versions_size(), 2);
  EXPECT_EQ(metadata.platform(), "xgboost");
  ASSERT_EQ(metadata.inputs_size(), 1);
  EXPECT_EQ(metadata.inputs(0).shape(0), -1);
  EXPECT_EQ(metadata.outputs(0).name(), "predict");

  std::string server =
      R"({"name":"flotilla","version":"0.1.0","extensions":["binary_tensor_data"]})";
  inference::ServerMetadataResponse server_metadata;
  ASSERT_TRUE(decode_server_metadata_answer(server, server_metadata).is_ok());
  EXPECT_EQ(server_metadata.name(), "flotilla");
  EXPECT_EQ(server_metadata.extensions(0), "binary_tensor_data");

  std::string nameless = R"({"platform":"x"})";
  EXPECT_EQ(decode_model_metadata_answer(nameless, metadata).code(), StatusCode::kInternal);
}

TEST(StatusOfAnswer, CodesAndMessagesOfEachErrorShape) {
  const auto answer = [](int status, std::string body) {
    http::Response response;
    response.status = status;
    response.body = std::move(body);
    return status_of_answer(response);
  };
  grpc::Status s = answer(400, R"({"error":"input 'x': shape [1,3] does not fit"})");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "input 'x': shape [1,3] does not fit");
  s = answer(401, R"({"error":{"message":"missing bearer token","type":"x"}})");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(s.error_message(), "missing bearer token");
  s = answer(404, R"({"error_code":"RESOURCE_DOES_NOT_EXIST","message":"no such endpoint"})");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "no such endpoint");
  s = answer(503, "upstream gone");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(s.error_message(), "upstream gone");
  EXPECT_EQ(answer(500, "").error_message(), "HTTP 500");

  EXPECT_EQ(grpc_code_for_http(403), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(grpc_code_for_http(413), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(grpc_code_for_http(429), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(grpc_code_for_http(504), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(grpc_code_for_http(501), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(to_grpc_status(invalid_argument("bad")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(to_grpc_status(Status::ok()).ok());
}

}  // namespace
}  // namespace flotilla::oip_grpc

// The error writers of each protocol (protocol/errors.cc), shared by the replica, the gateway
// and the control plane's API.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "protocol/protocol.h"

namespace flotilla::protocol {
namespace {

using nlohmann::json;

TEST(ErrorWriters, MlflowWritesTheCodeItIsGiven) {
  EXPECT_EQ(encode_mlflow_error("ENDPOINT_NOT_FOUND", "no \"x\""),
            R"({"error_code":"ENDPOINT_NOT_FOUND","message":"no \"x\""})");
  // The Status form picks the replica's code and writes the same shape.
  EXPECT_EQ(encode_mlflow_error(StatusCode::kResourceExhausted, "full"),
            encode_mlflow_error("RESOURCE_EXHAUSTED", "full"));
  EXPECT_EQ(mlflow_error_code(429), "REQUEST_LIMIT_EXCEEDED");
  EXPECT_EQ(mlflow_error_code(418), "BAD_REQUEST");
  EXPECT_EQ(mlflow_error_code(599), "INTERNAL_ERROR");
}

TEST(ErrorWriters, OpenAiCodeIsTheStatusOrOpenAisOwn) {
  // The replica's (vLLM's) form: the status as the code, param null.
  EXPECT_EQ(encode_openai_error(404, "gone"),
            R"({"error":{"message":"gone","type":"not_found_error","param":null,"code":404}})");
  // The gateway's (OpenAI's) form: a string code where OpenAI has one, else null.
  EXPECT_EQ(encode_openai_error(404, "no such model", "model", OpenAiErrorCode::kOpenAi),
            R"({"error":{"message":"no such model","type":"not_found_error","param":"model",)"
            R"("code":"model_not_found"}})");
  const json other = json::parse(encode_openai_error(502, "down", "", OpenAiErrorCode::kOpenAi));
  EXPECT_EQ(other["error"]["code"], json(nullptr));
  EXPECT_EQ(other["error"]["param"], json(nullptr));
  EXPECT_EQ(other["error"]["type"], "server_error");
}

TEST(ErrorWriters, ValidUtf8ReplacesEachBadByteWithTheCharacter) {
  EXPECT_EQ(valid_utf8("ok \xc3\xa9"), "ok \xc3\xa9");
  EXPECT_EQ(valid_utf8("a\x80"
                       "b\xe2\x82"),
            "a\xef\xbf\xbd"
            "b\xef\xbf\xbd\xef\xbf\xbd");
  // Once valid, a writer passes the character through instead of escaping it.
  EXPECT_EQ(encode_oip_error(valid_utf8("\xff")), "{\"error\":\"\xef\xbf\xbd\"}");
  EXPECT_EQ(encode_oip_error("\xff"), R"({"error":"\ufffd"})");
}

TEST(AppendJsonStringTest, EscapesWhatJsonNeedsKeepsValidUtf8AndReplacesTheRest) {
  std::string out;
  append_json_string("plain {\"a\": [1, 2]} \\ end\n\t\r\x01", out);
  EXPECT_EQ(out, R"("plain {\"a\": [1, 2]} \\ end\n\t\r\u0001")");
  out.clear();
  append_json_string("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xff x \xc3", out);
  EXPECT_EQ(out, "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \\ufffd x \\ufffd\"");
  out.clear();
  append_json_string("", out);
  EXPECT_EQ(out, "\"\"");
  EXPECT_EQ(nlohmann::json::parse("[" + out + "]")[0], "");
}

TEST(AppendJsonStringTest, AnyBytesAtAnyPlaceDecodeToTheirValidUtf8AndBothWritersAgree) {
  // Special bytes at every offset around the 16-byte steps of the scan, and random bytes:
  // the JSON decodes to the text with each invalid byte replaced, and write_json_string (a
  // buffer of its own) writes exactly what append_json_string appends, within its bound.
  std::vector<std::string> values;
  for (const char* special :
       {"\"", "\\", "\n", "\x01", "\x7f", "\xc3\xa9", "\xff", "\xe2\x82\xac", "\xf0\x9f\x98\x80"}) {
    for (size_t at = 0; at < 40; ++at) {
      values.push_back(std::string(at, 'a') + special + std::string(40 - at, 'b'));
    }
  }
  uint64_t state = 42;
  for (int i = 0; i < 2'000; ++i) {
    std::string value(state % 70, '\0');
    for (char& c : value) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      c = static_cast<char>(state >> 56);
    }
    values.push_back(value);
  }
  for (const std::string& value : values) {
    std::string appended;
    append_json_string(value, appended);
    std::string written(json_string_bound(value.size()), '\0');
    written.resize(static_cast<size_t>(write_json_string(value, written.data()) - written.data()));
    ASSERT_EQ(written, appended);
    ASSERT_EQ(json::parse(appended).get<std::string>(), valid_utf8(value)) << appended;
  }
}

}  // namespace
}  // namespace flotilla::protocol

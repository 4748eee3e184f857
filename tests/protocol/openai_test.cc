#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "protocol/protocol.h"

namespace flotilla::protocol {
namespace {

using ::testing::HasSubstr;

Result<CompletionRequest> decode(std::string body, bool chat = false) {
  return decode_completion_request(body, chat);
}

std::string error_of(const std::string& body, bool chat = false) {
  auto result = decode(body, chat);
  EXPECT_FALSE(result.is_ok()) << body;
  if (result.is_ok()) {
    return "";
  }
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  return result.status().message();
}

TEST(OpenAiDecodeTest, CompletionPromptForms) {
  auto text = decode(R"({"model":"m","prompt":"hello","max_tokens":5,"temperature":0})");
  ASSERT_TRUE(text.is_ok()) << text.status().message();
  EXPECT_EQ(text->model, "m");
  EXPECT_EQ(*text->prompt_text, "hello");
  EXPECT_EQ(*text->max_tokens, 5);
  EXPECT_EQ(*text->temperature, 0.0);
  auto ids = decode(R"({"prompt":[1,2,3]})");
  ASSERT_TRUE(ids.is_ok());
  EXPECT_EQ(ids->prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(ids->max_tokens.has_value());
  auto nested = decode(R"({"prompt":[[4,5]]})");
  ASSERT_TRUE(nested.is_ok());
  EXPECT_EQ(nested->prompt_tokens, (std::vector<int32_t>{4, 5}));
  auto listed = decode(R"({"prompt":["one"]})");
  ASSERT_TRUE(listed.is_ok());
  EXPECT_EQ(*listed->prompt_text, "one");
}

TEST(OpenAiDecodeTest, SamplingFieldsAndExtensions) {
  auto request = decode(R"({"prompt":"x","top_p":0.9,"top_k":-1,"seed":7,"stop":["a","bc"],
      "stop_token_ids":[2],"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true},
      "return_token_ids":true,"logprobs":3,"n":1,"presence_penalty":0,"user":"u","echo":false})");
  ASSERT_TRUE(request.is_ok()) << request.status().message();
  EXPECT_EQ(request->top_p, 0.9);
  EXPECT_EQ(request->top_k, 0);
  EXPECT_EQ(*request->seed, 7u);
  EXPECT_EQ(request->stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(request->stop_token_ids, (std::vector<int32_t>{2}));
  EXPECT_TRUE(request->ignore_eos && request->stream && request->include_usage);
  EXPECT_TRUE(request->return_token_ids && request->want_logprobs);
  EXPECT_EQ(request->logprobs, 3);
  auto single_stop = decode(R"({"prompt":"x","stop":"END"})");
  ASSERT_TRUE(single_stop.is_ok());
  EXPECT_EQ(single_stop->stop, (std::vector<std::string>{"END"}));
}

TEST(OpenAiDecodeTest, ChatMessages) {
  auto request = decode(R"({"model":"m","messages":[{"role":"system","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
      "max_completion_tokens":9,"logprobs":true,"top_logprobs":2})",
                        true);
  ASSERT_TRUE(request.is_ok()) << request.status().message();
  ASSERT_EQ(request->messages.size(), 2u);
  EXPECT_EQ(request->messages[1].role, "user");
  EXPECT_EQ(request->messages[1].content, "hi there");
  EXPECT_EQ(*request->max_tokens, 9);
  EXPECT_TRUE(request->want_logprobs);
  EXPECT_EQ(request->logprobs, 2);
}

TEST(OpenAiDecodeTest, BadInputNamesTheField) {
  EXPECT_THAT(error_of("{"), HasSubstr("JSON"));
  EXPECT_THAT(error_of("[]"), HasSubstr("object"));
  EXPECT_THAT(error_of(R"({"model":"m"})"), HasSubstr("'prompt' is required"));
  EXPECT_THAT(error_of(R"({"prompt":[]})"), HasSubstr("'prompt' is empty"));
  EXPECT_THAT(error_of(R"({"prompt":["a","b"]})"), HasSubstr("several prompts"));
  EXPECT_THAT(error_of(R"({"prompt":[1,-2]})"), HasSubstr("token ids"));
  EXPECT_THAT(error_of(R"({"prompt":{}})"), HasSubstr("'prompt'"));
  EXPECT_THAT(error_of(R"({"prompt":"x","max_tokens":0})"), HasSubstr("'max_tokens'"));
  EXPECT_THAT(error_of(R"({"prompt":"x","max_tokens":"5"})"), HasSubstr("'max_tokens'"));
  EXPECT_THAT(error_of(R"({"prompt":"x","temperature":3})"), HasSubstr("'temperature'"));
  EXPECT_THAT(error_of(R"({"prompt":"x","top_p":0})"), HasSubstr("'top_p'"));
  EXPECT_THAT(error_of(R"({"prompt":"x","top_k":-5})"), HasSubstr("'top_k'"));
  EXPECT_THAT(error_of(R"({"prompt":"x","stop":[""]})"), HasSubstr("'stop'"));
  EXPECT_THAT(error_of(R"({"prompt":"x","stop":5})"), HasSubstr("'stop'"));
  EXPECT_THAT(error_of(R"({"prompt":"x","n":2})"), HasSubstr("'n'"));
  EXPECT_THAT(error_of(R"({"prompt":"x","echo":true})"), HasSubstr("'echo'"));
  EXPECT_THAT(error_of(R"({"prompt":"x","frequency_penalty":0.5})"),
              HasSubstr("'frequency_penalty'"));
  EXPECT_THAT(error_of(R"({"prompt":"x","logit_bias":{"5":1}})"), HasSubstr("'logit_bias'"));
  EXPECT_THAT(error_of(R"({"prompt":"x","logprobs":50})"), HasSubstr("'logprobs'"));
  EXPECT_THAT(error_of(R"({"prompt":"x","stream_options":{"include_usage":true}})"),
              HasSubstr("stream: true"));
  EXPECT_THAT(error_of(R"({"messages":[]})", true), HasSubstr("'messages'"));
  EXPECT_THAT(error_of(R"({"messages":[{"role":"robot","content":"x"}]})", true),
              HasSubstr("role"));
  EXPECT_THAT(error_of(R"({"messages":[{"role":"user"}]})", true), HasSubstr("content"));
  EXPECT_THAT(error_of(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", true),
              HasSubstr("content"));
  EXPECT_THAT(error_of(R"({"prompt":"x"})", true), HasSubstr("'messages' is required"));
  EXPECT_THAT(error_of(R"({"messages":[{"role":"user","content":"x"}],
      "tools":[{"type":"function"}]})",
                       true),
              HasSubstr("'tools'"));
}

CompletionOutput sample_output(bool chat) {
  CompletionOutput output;
  output.chat = chat;
  output.id = chat ? "chatcmpl-1" : "cmpl-1";
  output.model = "tiny";
  output.created = 1700000000;
  output.text = "Hi \"there\"\n";
  output.finish_reason = "length";
  output.prompt_tokens = 3;
  output.completion_tokens = 2;
  return output;
}

TEST(OpenAiEncodeTest, ResponsesHaveTheOpenAiShape) {
  CompletionOutput completion = sample_output(false);
  completion.return_token_ids = true;
  completion.token_ids = {7, 8};
  auto json = nlohmann::json::parse(encode_completion_response(completion));
  EXPECT_EQ(json["object"], "text_completion");
  EXPECT_EQ(json["choices"][0]["text"], "Hi \"there\"\n");
  EXPECT_EQ(json["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(json["choices"][0]["token_ids"], nlohmann::json::array({7, 8}));
  EXPECT_TRUE(json["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(json["usage"]["total_tokens"], 5);

  CompletionOutput chat = sample_output(true);
  chat.want_logprobs = true;
  chat.logprobs = {{{"Hi", -0.5f}, {{"Hi", -0.5f}, {"Yo", -1.5f}}}};
  json = nlohmann::json::parse(encode_completion_response(chat));
  EXPECT_EQ(json["object"], "chat.completion");
  EXPECT_EQ(json["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(json["choices"][0]["message"]["content"], "Hi \"there\"\n");
  EXPECT_EQ(json["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1]["token"], "Yo");
  EXPECT_FALSE(json["choices"][0].contains("token_ids"));
}

TEST(OpenAiEncodeTest, StreamChunksAreSseEvents) {
  CompletionOutput chat = sample_output(true);
  chat.finish_reason = "";
  std::string first = encode_completion_chunk(chat, true);
  ASSERT_TRUE(first.starts_with("data: "));
  ASSERT_TRUE(first.ends_with("\n\n"));
  auto json = nlohmann::json::parse(first.substr(6));
  EXPECT_EQ(json["object"], "chat.completion.chunk");
  EXPECT_EQ(json["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(json["choices"][0]["finish_reason"].is_null());
  json = nlohmann::json::parse(encode_completion_chunk(chat, false).substr(6));
  EXPECT_FALSE(json["choices"][0]["delta"].contains("role"));
  json = nlohmann::json::parse(encode_usage_chunk(chat).substr(6));
  EXPECT_TRUE(json["choices"].empty());
  EXPECT_EQ(json["usage"]["completion_tokens"], 2);
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(OpenAiEncodeTest, ErrorsAndModels) {
  auto error = nlohmann::json::parse(encode_openai_error(400, "bad 'x'"));
  EXPECT_EQ(error["error"]["message"], "bad 'x'");
  EXPECT_EQ(error["error"]["type"], "invalid_request_error");
  EXPECT_EQ(error["error"]["code"], 400);
  EXPECT_EQ(nlohmann::json::parse(encode_openai_error(404, "x"))["error"]["type"],
            "not_found_error");
  auto models = nlohmann::json::parse(encode_openai_models("tiny", 5, 128));
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["max_model_len"], 128);
}

}  // namespace
}  // namespace flotilla::protocol

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
  EXPECT_EQ(*text->generation.prompt_text, "hello");
  EXPECT_EQ(*text->generation.max_tokens, 5);
  EXPECT_EQ(text->generation.sampling.temperature, 0.0);
  auto ids = decode(R"({"prompt":[1,2,3]})");
  ASSERT_TRUE(ids.is_ok());
  EXPECT_EQ(ids->generation.prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(ids->generation.max_tokens.has_value());
  auto nested = decode(R"({"prompt":[[4,5]]})");
  ASSERT_TRUE(nested.is_ok());
  EXPECT_EQ(nested->generation.prompt_tokens, (std::vector<int32_t>{4, 5}));
  auto listed = decode(R"({"prompt":["one"]})");
  ASSERT_TRUE(listed.is_ok());
  EXPECT_EQ(*listed->generation.prompt_text, "one");
}

TEST(OpenAiDecodeTest, SamplingFieldsAndExtensions) {
  auto request = decode(R"({"prompt":"x","top_p":0.9,"top_k":-1,"seed":7,"stop":["a","bc"],
      "stop_token_ids":[2],"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true},
      "return_token_ids":true,"logprobs":3,"n":1,"presence_penalty":0,"user":"u","echo":false})");
  ASSERT_TRUE(request.is_ok()) << request.status().message();
  EXPECT_EQ(request->generation.sampling.top_p, 0.9);
  EXPECT_EQ(request->generation.sampling.top_k, 0);
  EXPECT_EQ(*request->generation.sampling.seed, 7u);
  EXPECT_EQ(request->generation.sampling.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(request->generation.sampling.stop_token_ids, (std::vector<int32_t>{2}));
  EXPECT_TRUE(request->generation.sampling.ignore_eos && request->stream && request->include_usage);
  EXPECT_TRUE(request->return_token_ids && request->want_logprobs);
  EXPECT_EQ(request->top_logprobs, 3);
  auto single_stop = decode(R"({"prompt":"x","stop":"END"})");
  ASSERT_TRUE(single_stop.is_ok());
  EXPECT_EQ(single_stop->generation.sampling.stop, (std::vector<std::string>{"END"}));
}

TEST(OpenAiDecodeTest, ChatMessages) {
  auto request = decode(R"({"model":"m","messages":[{"role":"system","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
      "max_completion_tokens":9,"logprobs":true,"top_logprobs":2})",
                        true);
  ASSERT_TRUE(request.is_ok()) << request.status().message();
  ASSERT_EQ(request->generation.chat.size(), 2u);
  EXPECT_EQ(request->generation.chat[1].role, "user");
  EXPECT_EQ(request->generation.chat[1].content, "hi there");
  EXPECT_EQ(*request->generation.max_tokens, 9);
  EXPECT_TRUE(request->want_logprobs);
  EXPECT_EQ(request->top_logprobs, 2);
}

TEST(OpenAiDecodeTest, SamplingIsDecodedIntoTheGenerationInput) {
  // Omitted fields keep the sampler's defaults; temperature 1.0 in particular.
  auto plain = decode(R"({"prompt":"x"})");
  ASSERT_TRUE(plain.is_ok()) << plain.status().message();
  const SamplingParams& defaults = plain->generation.sampling;
  EXPECT_EQ(defaults.temperature, 1.0);
  EXPECT_EQ(defaults.top_p, 1.0);
  EXPECT_EQ(defaults.top_k, 0);
  EXPECT_FALSE(defaults.seed.has_value());
  EXPECT_EQ(defaults.logprobs, 0);
  EXPECT_FALSE(plain->want_logprobs);
  EXPECT_EQ(decode(R"({"prompt":"x","temperature":null})")->generation.sampling.temperature, 1.0);
  EXPECT_EQ(decode(R"({"prompt":"x","temperature":0.5})")->generation.sampling.temperature, 0.5);

  // What the engine computes: at least one top logprob whenever logprobs are wanted, while the
  // count shown stays what the client asked for.
  auto logprobs_of = [](const std::string& body, bool chat) {
    auto request = decode(body, chat);
    EXPECT_TRUE(request.is_ok()) << body;
    return request.is_ok() ? std::pair(request->generation.sampling.logprobs, request->top_logprobs)
                           : std::pair(-1, -1);
  };
  const std::string hi = R"("messages":[{"role":"user","content":"hi"}])";
  EXPECT_EQ(logprobs_of("{" + hi + R"(,"logprobs":true,"top_logprobs":0})", true), std::pair(1, 0));
  EXPECT_EQ(logprobs_of("{" + hi + R"(,"logprobs":true})", true), std::pair(1, 0));
  EXPECT_EQ(logprobs_of("{" + hi + R"(,"logprobs":true,"top_logprobs":5})", true), std::pair(5, 5));
  EXPECT_EQ(logprobs_of("{" + hi + R"(,"logprobs":false})", true), std::pair(0, 0));
  EXPECT_EQ(logprobs_of("{" + hi + "}", true), std::pair(0, 0));
  EXPECT_EQ(logprobs_of(R"({"prompt":"x","logprobs":0})", false), std::pair(1, 0));
  EXPECT_EQ(logprobs_of(R"({"prompt":"x","logprobs":3})", false), std::pair(3, 3));
  EXPECT_EQ(logprobs_of(R"({"prompt":"x","logprobs":null})", false), std::pair(0, 0));
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
  EXPECT_THAT(error_of(R"({"prompt":"x","frequency_penalty":2.5})"),
              HasSubstr("'frequency_penalty'"));
  EXPECT_THAT(error_of(R"({"prompt":"x","logit_bias":{"5":101}})"), HasSubstr("'logit_bias'"));
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

TEST(OpenAiDecodeTest, PenaltiesAndMinPAreDecodedAndRangeChecked) {
  auto request = decode(R"({"prompt":"x","min_p":0.05,"repetition_penalty":1.2,
      "presence_penalty":-0.5,"frequency_penalty":2})");
  ASSERT_TRUE(request.is_ok()) << request.status().message();
  EXPECT_EQ(request->generation.sampling.min_p, 0.05);
  EXPECT_EQ(request->generation.sampling.repetition_penalty, 1.2);
  EXPECT_EQ(request->generation.sampling.presence_penalty, -0.5);
  EXPECT_EQ(request->generation.sampling.frequency_penalty, 2);
  auto neutral = decode(R"({"prompt":"x","min_p":null,"repetition_penalty":null})");
  ASSERT_TRUE(neutral.is_ok()) << neutral.status().message();
  EXPECT_EQ(neutral->generation.sampling.min_p, 0);
  EXPECT_EQ(neutral->generation.sampling.repetition_penalty, 1);
  const std::pair<const char*, const char*> bad[] = {
      {R"({"prompt":"x","min_p":1.5})", "'min_p' must be in [0, 1]"},
      {R"({"prompt":"x","min_p":-0.1})", "'min_p'"},
      {R"({"prompt":"x","min_p":"a lot"})", "'min_p' must be a number"},
      {R"({"prompt":"x","repetition_penalty":0})", "'repetition_penalty' must be in (0, 100]"},
      {R"({"prompt":"x","repetition_penalty":-1})", "'repetition_penalty'"},
      {R"({"prompt":"x","repetition_penalty":101})", "'repetition_penalty'"},
      {R"({"prompt":"x","presence_penalty":2.01})", "'presence_penalty' must be in [-2, 2]"},
      {R"({"prompt":"x","frequency_penalty":-3})", "'frequency_penalty' must be in [-2, 2]"},
      {R"({"prompt":"x","frequency_penalty":true})", "'frequency_penalty' must be a number"},
  };
  for (const auto& [body, message] : bad) {
    EXPECT_THAT(error_of(body), HasSubstr(message)) << body;
  }
}

TEST(OpenAiDecodeTest, LogitBiasMapsTokenIdsToBiases) {
  auto request = decode(R"({"prompt":"x","logit_bias":{"50256":-100,"7":2.5}})");
  ASSERT_TRUE(request.is_ok()) << request.status().message();
  EXPECT_EQ(request->generation.sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{50256, -100.0f}, {7, 2.5f}}));
  EXPECT_TRUE(
      decode(R"({"prompt":"x","logit_bias":null})")->generation.sampling.logit_bias.empty());
  for (
      const char* bad :
      {R"({"prompt":"x","logit_bias":{"a":1}})", R"({"prompt":"x","logit_bias":{"-1":1}})",
       R"({"prompt":"x","logit_bias":{"":1}})", R"({"prompt":"x","logit_bias":{"99999999999":1}})",
       R"({"prompt":"x","logit_bias":{"5":-100.5}})", R"({"prompt":"x","logit_bias":{"5":"up"}})",
       R"({"prompt":"x","logit_bias":[5]})",
       // Longer than any token id: refused without accumulating (UBSan once caught an overflow).
       R"({"prompt":"x","logit_bias":{"12345678901234567890123":1}})",
       R"({"prompt":"x","logit_bias":{"inbl&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&":1}})"}) {
    EXPECT_THAT(error_of(bad), HasSubstr("'logit_bias'")) << bad;
  }
}

TEST(OpenAiDecodeTest, UnsupportedFieldsAreRefusedByNameUnlessNeutral) {
  // What this server does not implement: a 400 naming the field, never silently ignored.
  const std::pair<const char*, const char*> refused[] = {
      {R"({"prompt":"x","best_of":2})", "'best_of'"},
      {R"({"prompt":"x","n":0})", "'n'"},
      {R"({"prompt":"x","suffix":"tail"})", "'suffix'"},
      {R"({"prompt":"x","min_tokens":4})", "'min_tokens'"},
      {R"({"prompt":"x","prompt_logprobs":1})", "'prompt_logprobs'"},
      {R"({"prompt":"x","use_beam_search":true})", "'use_beam_search'"},
      {R"({"prompt":"x","length_penalty":0.5})", "'length_penalty'"},
      {R"({"prompt":"x","skip_special_tokens":false})", "'skip_special_tokens'"},
      {R"({"prompt":"x","include_stop_str_in_output":true})", "'include_stop_str_in_output'"},
      {R"({"prompt":"x","guided_json":{"type":"object"}})", "'guided_json'"},
      {R"({"prompt":"x","guided_choice":["a","b"]})", "'guided_choice'"},
      {R"({"prompt":"x","bad_words":["no"]})", "'bad_words'"},
      {R"({"prompt":"x","allowed_token_ids":[1,2]})", "'allowed_token_ids'"},
      {R"({"prompt":"x","truncate_prompt_tokens":5})", "'truncate_prompt_tokens'"},
      {R"({"prompt":"x","response_format":{"type":"json_object"}})", "'response_format'"},
  };
  for (const auto& [body, field] : refused) {
    EXPECT_THAT(error_of(body), HasSubstr(field)) << body;
  }
  const std::pair<const char*, const char*> chat_refused[] = {
      {R"({"tools":[{"type":"function","function":{"name":"f"}}]})", "'tools'"},
      {R"({"tool_choice":"required"})", "'tool_choice'"},
      {R"({"tool_choice":{"type":"function","function":{"name":"f"}}})", "'tool_choice'"},
      {R"({"functions":[{"name":"f"}]})", "'functions'"},
      {R"({"function_call":{"name":"f"}})", "'function_call'"},
      {R"({"response_format":{"type":"json_schema","json_schema":{}}})", "'response_format'"},
      {R"({"add_generation_prompt":false})", "'add_generation_prompt'"},
      {R"({"continue_final_message":true})", "'continue_final_message'"},
      {R"({"modalities":["text","audio"]})", "'modalities'"},
      {R"({"audio":{"voice":"alloy"}})", "'audio'"},
      {R"({"prediction":{"type":"content","content":"x"}})", "'prediction'"},
  };
  EXPECT_THAT(error_of(R"({"messages":[{"role":"user","content":"hi"}],"top_logprobs":2})", true),
              HasSubstr("'top_logprobs' needs \"logprobs\": true"));
  for (const auto& [extra, field] : chat_refused) {
    std::string body = R"({"messages":[{"role":"user","content":"hi"}],)" + std::string(extra + 1);
    EXPECT_THAT(error_of(body, true), HasSubstr(field)) << body;
  }
  // The neutral values (and null) are what SDKs send by default: accepted.
  auto completion = decode(R"({"prompt":"x","n":1,"best_of":1,"echo":false,"suffix":"",
      "logit_bias":{},"min_tokens":0,"prompt_logprobs":null,"use_beam_search":false,
      "length_penalty":1,"skip_special_tokens":true,"include_stop_str_in_output":false,
      "guided_json":null,"bad_words":[],"response_format":{"type":"text"},"user":"u",
      "metadata":{"k":"v"},"store":false,"service_tier":"auto"})");
  EXPECT_TRUE(completion.is_ok()) << completion.status().message();
  auto chat = decode(R"({"messages":[{"role":"user","content":"hi"}],"tools":[],
      "tool_choice":"none","functions":null,"function_call":"auto","parallel_tool_calls":true,
      "modalities":["text"],"add_generation_prompt":true,"continue_final_message":false})",
                     true);
  EXPECT_TRUE(chat.is_ok()) << chat.status().message();
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
  chat.logprobs = {{{"Hi", "Hi", -0.5f}, {{"Hi", "Hi", -0.5f}, {"Yo", "Yo", -1.5f}}}};
  json = nlohmann::json::parse(encode_completion_response(chat));
  EXPECT_EQ(json["object"], "chat.completion");
  EXPECT_EQ(json["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(json["choices"][0]["message"]["content"], "Hi \"there\"\n");
  EXPECT_EQ(json["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1]["token"], "Yo");
  EXPECT_FALSE(json["choices"][0].contains("token_ids"));
}

TEST(OpenAiEncodeTest, LogprobTokenTextEscapesPiecesOfCharacters) {
  EXPECT_EQ(logprob_token_text("hello"), "hello");
  EXPECT_EQ(logprob_token_text(" sch\xc3\xb6n"), " sch\xc3\xb6n");  // valid UTF-8 stays
  EXPECT_EQ(logprob_token_text(""), "");
  EXPECT_EQ(logprob_token_text("\xe2\x80"), R"(bytes:\xe2\x80)");
  EXPECT_EQ(logprob_token_text("\xe2"), R"(bytes:\xe2)");
  EXPECT_EQ(logprob_token_text("\x9f"), R"(bytes:\x9f)");
  EXPECT_EQ(logprob_token_text(" \xf0\x9f"), R"(bytes:\x20\xf0\x9f)");
}

TEST(OpenAiEncodeTest, LogprobsCarryRawBytesAndDistinctKeys) {
  CompletionOutput chat = sample_output(true);
  chat.want_logprobs = true;
  TokenChoice piece{R"(bytes:\xe2\x80)", std::string("\xe2\x80"), -0.25f};
  TokenChoice other{R"(bytes:\xe2\x81)", std::string("\xe2\x81"), -2.0f};
  TokenChoice no_bytes{"token_id:7", std::nullopt, -3.0f};
  chat.logprobs = {{piece, {piece, other, no_bytes}}};
  auto json = nlohmann::json::parse(encode_completion_response(chat));
  const auto& content = json["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(content["token"], R"(bytes:\xe2\x80)");
  EXPECT_EQ(content["bytes"], nlohmann::json::array({0xe2, 0x80}));  // not U+FFFD's
  EXPECT_EQ(content["top_logprobs"][1]["bytes"], nlohmann::json::array({0xe2, 0x81}));
  EXPECT_TRUE(content["top_logprobs"][2]["bytes"].is_null());

  CompletionOutput completion = sample_output(false);
  completion.want_logprobs = true;
  completion.logprobs = {{piece, {piece, other, no_bytes}}, {other, {other}}};
  json = nlohmann::json::parse(encode_completion_response(completion));
  const auto& logprobs = json["choices"][0]["logprobs"];
  EXPECT_EQ(logprobs["tokens"], nlohmann::json::array({R"(bytes:\xe2\x80)", R"(bytes:\xe2\x81)"}));
  ASSERT_EQ(logprobs["top_logprobs"][0].size(), 3u);
  EXPECT_EQ(logprobs["top_logprobs"][0][R"(bytes:\xe2\x81)"], -2.0);
  // Offsets count the bytes each token adds to the text.
  EXPECT_EQ(logprobs["text_offset"], nlohmann::json::array({0, 2}));
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
  auto model = nlohmann::json::parse(encode_openai_model("tiny", 5, 128));
  EXPECT_EQ(model, models["data"][0]);
  EXPECT_EQ(model["object"], "model");
}

}  // namespace
}  // namespace flotilla::protocol

// The value types of one text generation that cross module lines: what a caller asks of a
// language model (the request and its sampling), and the events the engine sends back. They
// live in common, below `protocol` (whose OpenAI decoder makes the request), `runtime` (whose
// Generator hands it through) and `llm` (the engine that consumes the request and produces the
// events), so that neither a runtime's user nor the runtime's contract has to include the
// engine's header, and neither a request nor an event is copied into a second shape on its
// way between the client and the engine.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flotilla {

// One turn of a chat, as a chat template renders it.
struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // 0: off
  double top_p = 1.0;        // 1: off
  double min_p = 0.0;        // 0: off; tokens less likely than min_p times the likeliest go
  // vLLM/HF: the logits of tokens in the prompt or the output are divided by it when positive,
  // multiplied when not. 1: off.
  double repetition_penalty = 1.0;
  // OpenAI: subtracted from the logits of tokens already generated, once (presence) or per
  // occurrence (frequency). 0: off.
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  // OpenAI: added to the logits of these token ids before anything else, each in [-100, 100].
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<uint64_t> seed;
  int max_tokens = 16;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;  // stop strings; need a tokenizer
  int logprobs = 0;               // top logprobs per token (0: none)
};

// One text generation as its caller asks for it: exactly one of a text prompt, token ids or
// chat messages, and how to sample. The one shape of an LLM request from the protocol decoder
// to the engine: protocol::decode_completion_request fills it (inside its CompletionRequest),
// the replica moves it to runtime::Generator::generate, and the runtime, once it has the
// prompt's token ids, moves `sampling` as it is into the engine's queue (llm::Engine::submit).
struct GenerationInput {
  std::optional<std::string> prompt_text;  // a completion's text prompt
  std::vector<int32_t> prompt_tokens;      // a completion's token-id prompt
  std::vector<ChatMessage> chat;           // a chat's messages, for the chat template
  // Unset: 16 for a prompt, the rest of the context for a chat. The runtime derives
  // sampling.max_tokens from it once the prompt's length is known; the caller leaves that one.
  std::optional<int> max_tokens;
  SamplingParams sampling;
};

enum class FinishReason { kNone, kLength, kStop, kCancelled, kError };

// OpenAI's finish_reason: "" for kNone (the generation goes on), else "length", "stop",
// "cancelled" or "error".
inline std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the `logprobs` most likely tokens
};

// What a request produced since the previous event. Delivered in order, on the engine's output
// thread; the last event of a request has finish != kNone.
struct GenerationEvent {
  std::vector<int32_t> tokens;
  std::string text;  // detokenized, never a broken UTF-8 sequence; empty without a tokenizer
  std::vector<TokenLogprob> logprobs;
  FinishReason finish = FinishReason::kNone;
  std::string error;  // for kError
  int prompt_tokens = 0;
  int completion_tokens = 0;  // so far
  double time_to_first_token_s = 0;
  // The request's path through the engine, for its spans: when the engine took it, when a step
  // first computed it, when its first token came (unset: not yet, or never).
  std::chrono::steady_clock::time_point submitted{};
  std::chrono::steady_clock::time_point scheduled{};
  std::chrono::steady_clock::time_point first_token{};
};

using EventCallback = std::function<void(GenerationEvent&& event)>;

}  // namespace flotilla

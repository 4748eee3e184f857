// OpenAI-compatible completions and chat completions (PROTOCOLS.md §3), as vLLM serves them.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>

#include "protocol/json_util.h"
#include "protocol/protocol.h"

namespace flotilla::protocol {
namespace {

using detail::append_int;
using detail::append_number;
using simdjson::dom::element;
using simdjson::dom::element_type;

// Bounds what a request may make us hold: stop strings are searched in every output.
constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopLength = 256;
constexpr size_t kMaxPromptTokens = 1 << 20;
constexpr size_t kMaxLogitBias = 1024;

Status field_error(std::string_view field, std::string_view what) {
  return invalid_argument("'" + std::string(field) + "' " + std::string(what));
}

Result<double> number(element value, std::string_view field) {
  double out;
  if (value.is<int64_t>()) {
    return static_cast<double>(value.get_int64().value_unsafe());
  }
  if (value.is<uint64_t>()) {
    return static_cast<double>(value.get_uint64().value_unsafe());
  }
  if (value.get_double().get(out)) {
    return field_error(field, "must be a number");
  }
  return out;
}

Result<int64_t> integer(element value, std::string_view field) {
  int64_t out;
  if (value.get_int64().get(out)) {
    return field_error(field, "must be an integer");
  }
  return out;
}

Result<bool> boolean(element value, std::string_view field) {
  bool out;
  if (value.get_bool().get(out)) {
    return field_error(field, "must be true or false");
  }
  return out;
}

Result<std::vector<int32_t>> token_list(simdjson::dom::array array, std::string_view field) {
  std::vector<int32_t> tokens;
  for (element item : array) {
    int64_t id;
    if (item.get_int64().get(id) || id < 0 || id > INT32_MAX) {
      return field_error(field, "must hold non-negative token ids");
    }
    if (tokens.size() >= kMaxPromptTokens) {
      return field_error(field, "has too many tokens");
    }
    tokens.push_back(static_cast<int32_t>(id));
  }
  return tokens;
}

// prompt: str | [str] | [int] | [[int]], one prompt only.
Status decode_prompt(element value, GenerationInput& input) {
  std::string_view text;
  if (!value.get_string().get(text)) {
    input.prompt_text = std::string(text);
    return Status::ok();
  }
  simdjson::dom::array array;
  if (value.get_array().get(array)) {
    return field_error("prompt", "must be a string, a list of token ids, or a list of one of them");
  }
  if (array.size() == 0) {
    return field_error("prompt", "is empty");
  }
  element first = array.at(0).value_unsafe();
  if (first.is<int64_t>()) {
    FLOTILLA_ASSIGN_OR_RETURN(input.prompt_tokens, token_list(array, "prompt"));
    return Status::ok();
  }
  if (array.size() > 1) {
    return field_error("prompt", "holds several prompts; send one prompt per request");
  }
  if (!first.get_string().get(text)) {
    input.prompt_text = std::string(text);
    return Status::ok();
  }
  simdjson::dom::array inner;
  if (first.get_array().get(inner) || inner.size() == 0) {
    return field_error("prompt", "must be a string, a list of token ids, or a list of one of them");
  }
  FLOTILLA_ASSIGN_OR_RETURN(input.prompt_tokens, token_list(inner, "prompt"));
  return Status::ok();
}

// content: str | [{"type": "text", "text": str}, ...]
Result<std::string> message_content(element value, size_t index) {
  const std::string where = "messages[" + std::to_string(index) + "].content";
  std::string_view text;
  if (!value.get_string().get(text)) {
    return std::string(text);
  }
  simdjson::dom::array parts;
  if (value.get_array().get(parts)) {
    return field_error(where, "must be a string or a list of text parts");
  }
  std::string out;
  for (element part : parts) {
    std::string_view type, part_text;
    if (part["type"].get_string().get(type) || type != "text" ||
        part["text"].get_string().get(part_text)) {
      return field_error(where, "parts must be {\"type\": \"text\", \"text\": ...}");
    }
    out += part_text;
  }
  return out;
}

Status decode_messages(element value, std::vector<ChatMessage>& messages) {
  simdjson::dom::array array;
  if (value.get_array().get(array) || array.size() == 0) {
    return field_error("messages", "must be a non-empty list");
  }
  size_t index = 0;
  for (element item : array) {
    std::string_view role;
    element content;
    if (item["role"].get_string().get(role)) {
      return field_error("messages[" + std::to_string(index) + "].role", "must be a string");
    }
    if (role != "system" && role != "user" && role != "assistant" && role != "developer") {
      return field_error("messages[" + std::to_string(index) + "].role",
                         "must be system, user or assistant");
    }
    if (item["content"].get(content)) {
      return field_error("messages[" + std::to_string(index) + "].content", "is required");
    }
    FLOTILLA_ASSIGN_OR_RETURN(std::string text, message_content(content, index));
    messages.push_back({role == "developer" ? "system" : std::string(role), text});
    ++index;
  }
  return Status::ok();
}

// logit_bias: {"token id": bias in [-100, 100], ...}, as OpenAI takes it.
Status decode_logit_bias(element value, SamplingParams& sampling) {
  if (value.is_null()) {
    return Status::ok();
  }
  simdjson::dom::object object;
  if (value.get_object().get(object)) {
    return field_error("logit_bias", "must be an object of token ids to numbers");
  }
  if (object.size() > kMaxLogitBias) {
    return field_error("logit_bias", "holds more than 1024 tokens");
  }
  for (auto entry : object) {
    const std::string_view key = entry.key;
    // Digits only (unsigned from_chars takes no sign), at most 10 of them, within int32.
    uint32_t id = 0;
    const char* end = key.data() + key.size();
    const auto [parsed_to, error] = std::from_chars(key.data(), end, id);
    if (key.size() > 10 || error != std::errc() || parsed_to != end || id > INT32_MAX) {
      return field_error("logit_bias", "keys must be token ids, such as \"50256\"; got '" +
                                           std::string(key.substr(0, 32)) + "'");
    }
    Result<double> bias = number(entry.value, "logit_bias");
    if (!bias.is_ok() || !(*bias >= -100 && *bias <= 100)) {
      return field_error("logit_bias", "values must be numbers in [-100, 100]");
    }
    sampling.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(*bias));
  }
  return Status::ok();
}

Status decode_stop(element value, std::vector<std::string>& stops) {
  if (value.is_null()) {
    return Status::ok();
  }
  std::string_view text;
  if (!value.get_string().get(text)) {
    stops.emplace_back(text);
  } else {
    simdjson::dom::array array;
    if (value.get_array().get(array)) {
      return field_error("stop", "must be a string or a list of strings");
    }
    for (element item : array) {
      if (item.get_string().get(text)) {
        return field_error("stop", "must be a string or a list of strings");
      }
      stops.emplace_back(text);
    }
  }
  if (stops.size() > kMaxStopStrings) {
    return field_error("stop", "holds more than 16 strings");
  }
  for (const std::string& stop : stops) {
    if (stop.empty() || stop.size() > kMaxStopLength) {
      return field_error("stop", "strings must hold 1 to 256 bytes");
    }
  }
  return Status::ok();
}

bool is_empty_list_or_object(element value) {
  simdjson::dom::object object;
  simdjson::dom::array array;
  return (!value.get_object().get(object) && object.size() == 0) ||
         (!value.get_array().get(array) && array.size() == 0);
}

bool is_string_in(element value, std::initializer_list<std::string_view> allowed) {
  std::string_view text;
  if (value.get_string().get(text)) {
    return false;
  }
  return std::find(allowed.begin(), allowed.end(), text) != allowed.end();
}

bool is_integer(element value, int64_t expected) {
  int64_t n;
  return !value.get_int64().get(n) && n == expected;
}

bool is_bool(element value, bool expected) {
  bool b;
  return !value.get_bool().get(b) && b == expected;
}

// Fields of the OpenAI API and of vLLM's extensions that this server does not implement. A
// client may send them with their neutral value (or null); anything else is refused by name,
// never ignored. Fields not named here nor in decode_field are tolerated, as vLLM does: they
// change nothing in the output (user, metadata, store, service_tier, ...).
Status refuse_unsupported(std::string_view key, element value) {
  if (value.is_null()) {
    return Status::ok();
  }
  if (key == "n" || key == "best_of") {
    if (is_integer(value, 1)) {
      return Status::ok();
    }
    return field_error(key, "must be 1: one choice per request is supported");
  }
  if (key == "echo" || key == "use_beam_search" || key == "include_stop_str_in_output" ||
      key == "continue_final_message") {
    if (is_bool(value, false)) {
      return Status::ok();
    }
    return field_error(key, "is not supported (only false)");
  }
  if (key == "skip_special_tokens" || key == "add_generation_prompt") {
    if (is_bool(value, true)) {
      return Status::ok();
    }
    return field_error(key, "is not supported (only true)");
  }
  if (key == "min_tokens") {
    if (is_integer(value, 0)) {
      return Status::ok();
    }
    return field_error(key, "is not supported (only 0)");
  }
  if (key == "length_penalty") {
    Result<double> penalty = number(value, key);
    if (penalty.is_ok() && penalty.value() == 1) {
      return Status::ok();
    }
    return field_error(key, "is not supported (only 1)");
  }
  if (key == "suffix") {
    std::string_view text;
    if (!value.get_string().get(text) && text.empty()) {
      return Status::ok();
    }
    return field_error(key, "is not supported");
  }
  if (key == "tool_choice" || key == "function_call") {
    if (is_string_in(value, {"none", "auto"})) {
      return Status::ok();
    }
    return field_error(key, "is not supported (tool calls are not implemented)");
  }
  if (key == "tools" || key == "functions" || key == "bad_words" || key == "allowed_token_ids") {
    if (is_empty_list_or_object(value)) {
      return Status::ok();
    }
    return field_error(key, "is not supported");
  }
  if (key == "response_format") {
    std::string_view type;
    if (!value["type"].get_string().get(type) && type == "text") {
      return Status::ok();
    }
    return field_error(key, "is not supported (only {\"type\": \"text\"})");
  }
  if (key == "prompt_logprobs" || key == "guided_json" || key == "guided_regex" ||
      key == "guided_choice" || key == "guided_grammar" || key == "structured_outputs" ||
      key == "truncate_prompt_tokens" || key == "prediction" || key == "audio" ||
      key == "web_search_options") {
    return field_error(key, "is not supported");
  }
  if (key == "modalities") {
    simdjson::dom::array array;
    if (!value.get_array().get(array) && array.size() == 1 &&
        is_string_in(array.at(0).value_unsafe(), {"text"})) {
      return Status::ok();
    }
    return field_error(key, "is not supported (only [\"text\"])");
  }
  return Status::ok();  // tolerated
}

// A number field in [low, high] (or (low, high] when `open_low`), into `out`; null keeps it.
// `range` is how messages write the interval.
Status bounded_number(element value, std::string_view key, double low, double high, bool open_low,
                      std::string_view range, double& out) {
  if (value.is_null()) {
    return Status::ok();
  }
  FLOTILLA_ASSIGN_OR_RETURN(double x, number(value, key));
  if (!((open_low ? x > low : x >= low) && x <= high)) {
    return field_error(key, "must be in " + std::string(range));
  }
  out = x;
  return Status::ok();
}

Status decode_field(std::string_view key, element value, CompletionRequest& request) {
  GenerationInput& input = request.generation;
  SamplingParams& sampling = input.sampling;
  if (key == "model") {
    std::string_view model;
    if (value.get_string().get(model)) {
      return field_error(key, "must be a string");
    }
    request.model = std::string(model);
  } else if (key == "prompt" && !request.chat) {
    FLOTILLA_RETURN_IF_ERROR(decode_prompt(value, input));
  } else if (key == "messages" && request.chat) {
    FLOTILLA_RETURN_IF_ERROR(decode_messages(value, input.chat));
  } else if (key == "max_tokens" || key == "max_completion_tokens") {
    if (!value.is_null()) {
      FLOTILLA_ASSIGN_OR_RETURN(int64_t max_tokens, integer(value, key));
      if (max_tokens < 1 || max_tokens > (1 << 24)) {
        return field_error(key, "must be a positive integer");
      }
      input.max_tokens = static_cast<int>(max_tokens);
    }
  } else if (key == "temperature") {
    if (!value.is_null()) {
      FLOTILLA_ASSIGN_OR_RETURN(double t, number(value, key));
      if (!(t >= 0 && t <= 2)) {
        return field_error(key, "must be in [0, 2]");
      }
      sampling.temperature = t;
    }
  } else if (key == "top_p") {
    if (!value.is_null()) {
      FLOTILLA_ASSIGN_OR_RETURN(sampling.top_p, number(value, key));
      if (!(sampling.top_p > 0 && sampling.top_p <= 1)) {
        return field_error(key, "must be in (0, 1]");
      }
    }
  } else if (key == "top_k") {
    if (!value.is_null()) {
      FLOTILLA_ASSIGN_OR_RETURN(int64_t top_k, integer(value, key));
      if (top_k < -1 || top_k > (1 << 24)) {
        return field_error(key, "must be -1 (off) or a non-negative integer");
      }
      sampling.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
    }
  } else if (key == "min_p") {
    FLOTILLA_RETURN_IF_ERROR(bounded_number(value, key, 0, 1, false, "[0, 1]", sampling.min_p));
  } else if (key == "repetition_penalty") {
    FLOTILLA_RETURN_IF_ERROR(bounded_number(value, key, 0, 100, /*open_low=*/true, "(0, 100]",
                                            sampling.repetition_penalty));
  } else if (key == "presence_penalty") {
    FLOTILLA_RETURN_IF_ERROR(
        bounded_number(value, key, -2, 2, false, "[-2, 2]", sampling.presence_penalty));
  } else if (key == "frequency_penalty") {
    FLOTILLA_RETURN_IF_ERROR(
        bounded_number(value, key, -2, 2, false, "[-2, 2]", sampling.frequency_penalty));
  } else if (key == "logit_bias") {
    FLOTILLA_RETURN_IF_ERROR(decode_logit_bias(value, sampling));
  } else if (key == "seed") {
    if (!value.is_null()) {
      FLOTILLA_ASSIGN_OR_RETURN(int64_t seed, integer(value, key));
      sampling.seed = static_cast<uint64_t>(seed);
    }
  } else if (key == "stop") {
    FLOTILLA_RETURN_IF_ERROR(decode_stop(value, sampling.stop));
  } else if (key == "stop_token_ids") {
    simdjson::dom::array array;
    if (!value.is_null()) {
      if (value.get_array().get(array)) {
        return field_error(key, "must be a list of token ids");
      }
      FLOTILLA_ASSIGN_OR_RETURN(sampling.stop_token_ids, token_list(array, key));
    }
  } else if (key == "ignore_eos") {
    FLOTILLA_ASSIGN_OR_RETURN(sampling.ignore_eos, boolean(value, key));
  } else if (key == "stream") {
    if (!value.is_null()) {
      FLOTILLA_ASSIGN_OR_RETURN(request.stream, boolean(value, key));
    }
  } else if (key == "stream_options") {
    if (!value.is_null()) {
      bool include = false;
      element include_value;
      if (!value["include_usage"].get(include_value)) {
        FLOTILLA_ASSIGN_OR_RETURN(include, boolean(include_value, "stream_options.include_usage"));
      }
      request.include_usage = include;
    }
  } else if (key == "return_token_ids") {
    FLOTILLA_ASSIGN_OR_RETURN(request.return_token_ids, boolean(value, key));
  } else if (key == "logprobs") {
    if (value.is_null()) {
      return Status::ok();
    }
    if (request.chat) {
      FLOTILLA_ASSIGN_OR_RETURN(request.want_logprobs, boolean(value, key));
    } else {
      FLOTILLA_ASSIGN_OR_RETURN(int64_t logprobs, integer(value, key));
      if (logprobs < 0 || logprobs > 20) {
        return field_error(key, "must be in [0, 20]");
      }
      request.want_logprobs = true;
      request.top_logprobs = static_cast<int>(logprobs);
    }
  } else if (key == "top_logprobs" && request.chat) {
    if (!value.is_null()) {
      FLOTILLA_ASSIGN_OR_RETURN(int64_t top, integer(value, key));
      if (top < 0 || top > 20) {
        return field_error(key, "must be in [0, 20]");
      }
      request.top_logprobs = static_cast<int>(top);
    }
  } else {
    return refuse_unsupported(key, value);
  }
  return Status::ok();
}

void append_head(const CompletionOutput& output, std::string_view object, std::string& out) {
  out += "{\"id\":";
  append_json_string(output.id, out);
  out += ",\"object\":\"";
  out += object;
  out += "\",\"created\":";
  append_int(output.created, out);
  out += ",\"model\":";
  append_json_string(output.model, out);
}

void append_usage(const CompletionOutput& output, std::string& out) {
  out += "\"usage\":{\"prompt_tokens\":";
  append_int(output.prompt_tokens, out);
  out += ",\"completion_tokens\":";
  append_int(output.completion_tokens, out);
  out += ",\"total_tokens\":";
  append_int(output.prompt_tokens + output.completion_tokens, out);
  out += '}';
}

void append_logprob_value(float logprob, std::string& out) {
  // -inf has no JSON form; vLLM clamps to a large negative number.
  append_number(std::isfinite(logprob) ? logprob : -9999.0, out);
}

// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; chat:
// {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
void append_logprobs(const CompletionOutput& output, std::string& out) {
  if (!output.want_logprobs) {
    out += "null";
    return;
  }
  if (output.chat) {
    auto append_choice = [&](const TokenChoice& choice) {
      out += "{\"token\":";
      append_json_string(choice.token, out);
      out += ",\"logprob\":";
      append_logprob_value(choice.logprob, out);
      if (!choice.bytes) {
        out += ",\"bytes\":null";
        return;
      }
      out += ",\"bytes\":[";
      for (size_t i = 0; i < choice.bytes->size(); ++i) {
        out += i ? "," : "";
        append_int(static_cast<unsigned char>((*choice.bytes)[i]), out);
      }
      out += ']';
    };
    out += "{\"content\":[";
    for (size_t i = 0; i < output.logprobs.size(); ++i) {
      out += i ? "," : "";
      append_choice(output.logprobs[i].chosen);
      out += ",\"top_logprobs\":[";
      for (size_t k = 0; k < output.logprobs[i].top.size(); ++k) {
        out += k ? "," : "";
        append_choice(output.logprobs[i].top[k]);
        out += '}';
      }
      out += "]}";
    }
    out += "]}";
    return;
  }
  out += "{\"tokens\":[";
  for (size_t i = 0; i < output.logprobs.size(); ++i) {
    out += i ? "," : "";
    append_json_string(output.logprobs[i].chosen.token, out);
  }
  out += "],\"token_logprobs\":[";
  for (size_t i = 0; i < output.logprobs.size(); ++i) {
    out += i ? "," : "";
    append_logprob_value(output.logprobs[i].chosen.logprob, out);
  }
  out += "],\"top_logprobs\":[";
  for (size_t i = 0; i < output.logprobs.size(); ++i) {
    out += i ? ",{" : "{";
    for (size_t k = 0; k < output.logprobs[i].top.size(); ++k) {
      out += k ? "," : "";
      append_json_string(output.logprobs[i].top[k].token, out);
      out += ':';
      append_logprob_value(output.logprobs[i].top[k].logprob, out);
    }
    out += '}';
  }
  out += "],\"text_offset\":[";
  size_t offset = 0;
  for (size_t i = 0; i < output.logprobs.size(); ++i) {
    out += i ? "," : "";
    append_int(static_cast<int64_t>(offset), out);
    // Offsets into the text in bytes: what each token adds to it.
    const TokenChoice& chosen = output.logprobs[i].chosen;
    offset += chosen.bytes ? chosen.bytes->size() : chosen.token.size();
  }
  out += "]}";
}

void append_finish_and_ids(const CompletionOutput& output, std::string& out) {
  out += ",\"finish_reason\":";
  if (output.finish_reason.empty()) {
    out += "null";
  } else {
    append_json_string(output.finish_reason, out);
  }
  if (output.return_token_ids) {
    out += ",\"token_ids\":[";
    for (size_t i = 0; i < output.token_ids.size(); ++i) {
      out += i ? "," : "";
      append_int(output.token_ids[i], out);
    }
    out += ']';
  }
}

// ,"choices":[{...}] with the one choice; a chat's text goes in the object `chat_open` opens
// ("message" or "delta"), a completion's in "text".
void append_choice(const CompletionOutput& output, std::string_view chat_open, std::string& out) {
  out += ",\"choices\":[{\"index\":0,";
  if (output.chat) {
    out += chat_open;
    append_json_string(output.text, out);
    out += '}';
  } else {
    out += "\"text\":";
    append_json_string(output.text, out);
  }
  out += ",\"logprobs\":";
  append_logprobs(output, out);
  append_finish_and_ids(output, out);
  out += "}]";
}

}  // namespace

Result<CompletionRequest> decode_completion_request(std::string& body, bool chat) {
  FLOTILLA_ASSIGN_OR_RETURN(element root, detail::parse_json(body));
  simdjson::dom::object object;
  if (root.get_object().get(object)) {
    return invalid_argument("the request body must be a JSON object");
  }
  CompletionRequest request;
  request.chat = chat;
  for (auto field : object) {
    FLOTILLA_RETURN_IF_ERROR(decode_field(field.key, field.value, request));
  }
  const GenerationInput& input = request.generation;
  if (chat && input.chat.empty()) {
    return field_error("messages", "is required");
  }
  if (!chat && !input.prompt_text && input.prompt_tokens.empty()) {
    return field_error("prompt", "is required");
  }
  if (chat && request.top_logprobs > 0 && !request.want_logprobs) {
    return field_error("top_logprobs", "needs \"logprobs\": true");  // as OpenAI and vLLM
  }
  if (request.include_usage && !request.stream) {
    return field_error("stream_options", "is only allowed with stream: true");
  }
  // The engine reports a token's logprob only when asked for at least one top token: ask for
  // one when the client wants the chosen tokens' logprobs alone (top_logprobs 0); the handler
  // shows top_logprobs of them.
  request.generation.sampling.logprobs =
      request.want_logprobs ? std::max(request.top_logprobs, 1) : 0;
  return request;
}

std::string logprob_token_text(std::string_view bytes) {
  if (simdjson::validate_utf8(bytes.data(), bytes.size())) {
    return std::string(bytes);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "bytes:";
  for (char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    out += "\\x";
    out += kHex[byte >> 4];
    out += kHex[byte & 15];
  }
  return out;
}

std::string encode_completion_response(const CompletionOutput& output) {
  std::string out;
  out.reserve(256 + output.text.size() + output.token_ids.size() * 7);
  append_head(output, output.chat ? "chat.completion" : "text_completion", out);
  append_choice(output, "\"message\":{\"role\":\"assistant\",\"content\":", out);
  out += ',';
  append_usage(output, out);
  out += '}';
  return out;
}

std::string encode_completion_chunk(const CompletionOutput& output, bool first) {
  std::string out = "data: ";
  append_head(output, output.chat ? "chat.completion.chunk" : "text_completion", out);
  append_choice(
      output,
      first ? "\"delta\":{\"role\":\"assistant\",\"content\":" : "\"delta\":{\"content\":", out);
  out += "}\n\n";
  return out;
}

std::string encode_usage_chunk(const CompletionOutput& output) {
  std::string out = "data: ";
  append_head(output, output.chat ? "chat.completion.chunk" : "text_completion", out);
  out += ",\"choices\":[],";
  append_usage(output, out);
  out += "}\n\n";
  return out;
}

std::string encode_openai_model(std::string_view name, int64_t created, int max_model_len) {
  std::string out = "{\"id\":";
  append_json_string(name, out);
  out += ",\"object\":\"model\",\"created\":";
  append_int(created, out);
  out += ",\"owned_by\":\"flotilla\",\"max_model_len\":";
  append_int(max_model_len, out);
  out += '}';
  return out;
}

std::string encode_openai_models(std::string_view name, int64_t created, int max_model_len) {
  return "{\"object\":\"list\",\"data\":[" + encode_openai_model(name, created, max_model_len) +
         "]}";
}

}  // namespace flotilla::protocol

// Wire formats of the inference protocols: Open Inference Protocol v2 (KServe, Triton),
// MLflow's scoring server, and OpenAI completions. Pure functions: no I/O, no shared state; every
// function may be called from any thread. Decoders never throw: bad input becomes an
// kInvalidArgument Status whose message names the offending field. See docs/replica.md and
// ../shared/PROTOCOLS.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/common.h"
#include "common/common_generation.h"

namespace flotilla::protocol {

// ---- Open Inference Protocol v2 ---------------------------------------------------------------

// Decodes an inference request body. `body` may be grown by a few bytes of padding that the
// JSON parser needs; its contents are unchanged. `json_length`: Triton's binary tensor data
// extension (the Inference-Header-Content-Length header): the JSON is the body's first
// `json_length` bytes, and the rest holds, in input order, the raw little-endian bytes of each
// input whose parameters give its `binary_data_size` (such an input has no `data`). Without
// it, an input with binary_data_size is refused.
Result<InferRequest> decode_oip_infer_request(std::string& body,
                                              std::optional<size_t> json_length = std::nullopt);

// Appends the JSON inference response to `out`.
void encode_oip_infer_response(const InferResponse& response, std::string& out);

std::string encode_oip_model_metadata(const ModelMetadata& metadata);

// ---- MLflow scoring (/invocations) -----------------------------------------------------------

enum class MlflowFormat { kJson, kCsv };

// Checks the Content-Type of an /invocations request as MLflow does: application/json or
// text/csv, with at most a `charset=utf-8` parameter. Anything else is kUnimplemented (415).
Result<MlflowFormat> parse_mlflow_content_type(std::string_view content_type);

// Decodes a JSON body with exactly one of dataframe_split, dataframe_records, instances or
// inputs. Produces one input tensor named "input" (2-D, or 1-D for a single unnamed row), with
// column_names set when the body names its columns.
Result<InferRequest> decode_mlflow_json(std::string& body);
// Decodes a CSV body whose first line is a header.
Result<InferRequest> decode_mlflow_csv(std::string_view body);

// Appends `{"predictions": [...]}` for one output tensor (1-D → list, 2-D → list of rows).
void encode_mlflow_predictions(const Tensor& output, std::string& out);

// ---- OpenAI completions and chat completions (PROTOCOLS.md §3) ------------------------------

// One /v1/completions or /v1/chat/completions request, decoded and range-checked. Fields this
// server cannot honour (n > 1, best_of, echo, tools, response formats other than
// text, guided decoding, several prompts: docs/llm.md has the list) are refused with a message
// naming them rather than ignored, unless they hold their neutral value.
struct CompletionRequest {
  bool chat = false;
  std::string model;  // empty when omitted
  // What the generation reads, range-checked, in the shape the runtime takes it: the prompt
  // (completions: text or token ids) or the messages (chat), max_tokens (or
  // max_completion_tokens), and the sampling parameters of OpenAI and of vLLM's extensions
  // (top_k -1 becomes 0, off). An omitted field keeps SamplingParams' default (temperature
  // 1.0); sampling.logprobs is what the engine computes: at least 1 when logprobs are wanted,
  // else 0. logit_bias ids are checked against the vocabulary by the engine.
  GenerationInput generation;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool return_token_ids = false;  // each choice also carries the generated token ids
  // Top logprobs shown per token (completions: logprobs; chat: top_logprobs).
  int top_logprobs = 0;
  bool want_logprobs = false;  // completions: logprobs set; chat: logprobs true
};

// `body` may be grown by the JSON parser's padding; its contents are unchanged.
Result<CompletionRequest> decode_completion_request(std::string& body, bool chat);

struct TokenChoice {
  // How the token is shown: logprob_token_text() of its bytes, or another form that keeps the
  // keys of one position's top_logprobs distinct (completions' top_logprobs is a JSON object).
  std::string token;
  // The bytes it stands for (chat's `bytes`, as a list of ints); unset: null (no tokenizer).
  std::optional<std::string> bytes;
  float logprob = 0;
};

// A token's text for logprobs, as OpenAI writes it: its bytes when they are valid UTF-8, else
// "bytes:" and each byte as \xNN (a piece of a character: "bytes:\xe2\x80"), so that such
// tokens stay distinct and readable.
std::string logprob_token_text(std::string_view bytes);

struct LogprobEntry {
  TokenChoice chosen;
  std::vector<TokenChoice> top;
};

// What a response or a stream chunk carries; one choice (index 0).
struct CompletionOutput {
  bool chat = false;
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  std::string model;
  int64_t created = 0;             // unix seconds
  std::string text;                // the text, or a stream chunk's delta
  std::vector<int32_t> token_ids;  // written when return_token_ids
  bool return_token_ids = false;
  std::vector<LogprobEntry> logprobs;  // written when want_logprobs
  bool want_logprobs = false;
  std::string_view finish_reason;  // "" → null
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

std::string encode_completion_response(const CompletionOutput& output);
// One SSE event "data: {...}\n\n" with a chunk; `first` makes a chat chunk carry the role.
std::string encode_completion_chunk(const CompletionOutput& output, bool first);
// The usage chunk of stream_options.include_usage: "choices": [] and usage filled.
std::string encode_usage_chunk(const CompletionOutput& output);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";
// {"object":"list","data":[{"id":name,"object":"model","created":..,"owned_by":"flotilla",
// "max_model_len":context}]}
std::string encode_openai_models(std::string_view name, int64_t created, int max_model_len);
// The one model object of that list: GET /v1/models/{id}.
std::string encode_openai_model(std::string_view name, int64_t created, int max_model_len);

// ---- Error bodies: one writer per protocol (src/protocol/errors.cc) -----------------------------
// For the replica, the gateway and the control plane's API. `message` may hold any bytes (a path
// as sent): invalid UTF-8 is written as \ufffd, so a body is always valid JSON.

// OIP's {"error": message}, also the shape of routes that have none of their own.
std::string encode_oip_error(std::string_view message);

// MLflow's {"error_code": error_code, "message": message}.
std::string encode_mlflow_error(std::string_view error_code, std::string_view message);
// The replica's scoring-server answer for a Status: BAD_REQUEST, RESOURCE_DOES_NOT_EXIST,
// RESOURCE_EXHAUSTED, TEMPORARILY_UNAVAILABLE, NOT_IMPLEMENTED (which MLflow answers with 501),
// else INTERNAL_ERROR.
std::string encode_mlflow_error(StatusCode code, std::string_view message);
// MLflow's ErrorCode name (databricks.proto) for an HTTP status, as its scoring server and
// Databricks Model Serving answer them: what the gateway answers for /serving-endpoints/*.
std::string_view mlflow_error_code(int http_status);

// What the `code` of an OpenAI error holds.
enum class OpenAiErrorCode {
  kStatus,  // the HTTP status as a number, as vLLM writes it (the replica)
  kOpenAi,  // OpenAI's own string code where it has one for the case, else null (the gateway)
};
// {"error":{"message":...,"type":...,"param":...,"code":...}}: `type` follows the status as the
// openai-python client reads it (invalid_request_error, not_found_error, ...); `param` names the
// request field at fault, null when empty.
std::string encode_openai_error(int status, std::string_view message, std::string_view param = {},
                                OpenAiErrorCode code = OpenAiErrorCode::kStatus);

// `text` with each byte that starts no valid UTF-8 sequence replaced by U+FFFD (its three
// bytes), for callers that want the character itself rather than the writers' \ufffd escape.
std::string valid_utf8(std::string_view text);

// ---- Route grammar
// -------------------------------------------------------------------------------

// The families of parameterised paths the inference APIs share. Fixed paths (/v2/health/live,
// /metrics, /invocations, ...) are kOther: each server names its own.
enum class PathKind {
  kOther,
  kOipModel,         // /v2/models/{name}[/versions/{version}]{rest}
  kServingEndpoint,  // /serving-endpoints/{name}{rest}
  kOpenAi,           // /v1{rest}; for /v1/models/{id}, name is the id (which may hold '/')
};

// A request target split along the grammar. The views point into the parsed target.
struct ParsedPath {
  PathKind kind = PathKind::kOther;
  // The family's prefix with an empty name or version: /v2/models/, /v2/models//infer,
  // /v2/models/m/versions//infer, /serving-endpoints//invocations, /v1/models/. No server
  // serves these (404).
  bool malformed = false;
  std::string_view path;     // the target before '?'
  std::string_view query;    // from '?' on; "" when none
  std::string_view name;     // the model or endpoint; "" for kOther and kOpenAi but /v1/models/{id}
  std::string_view version;  // "" unless /versions/{version}
  std::string_view rest;     // after name (and version), or after /v1: "" or from a '/' on
};

// Splits `target` (path and query, as sent). Never fails: what fits no family is kOther. Which
// paths of a family a server serves, with which methods, is its own policy
// (gateway/routing.cc, replica/replica.cc).
ParsedPath parse_path(std::string_view target);

// ---- helpers shared by encoders ----------------------------------------------------------------

// Appends `value` as a JSON string literal (quoted and escaped; invalid UTF-8 replaced).
void append_json_string(std::string_view value, std::string& out);
// The most bytes write_json_string writes for a value of `size` bytes: every byte escaped as
// \u00XX, and the quotes.
constexpr size_t json_string_bound(size_t size) {
  return 6 * size + 2;
}
// append_json_string's text written at `out`, which has room for json_string_bound bytes;
// returns the end of what it wrote. For writers that keep a buffer of their own.
char* write_json_string(std::string_view value, char* out);

}  // namespace flotilla::protocol

// The llm module's contract: Flotilla's engine for Llama-architecture decoder models
// (DESIGN.md §1 "Runtimes"). A Hugging Face model directory is loaded into a Model; an Engine
// runs many sequences on it with iteration-level continuous batching over a paged KV cache.
// The tokenizer (llm/tokenizer.h) is part of this contract.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/common.h"
#include "llm/tokenizer.h"

namespace flotilla::llm {

// ---------------------------------------------------------------------------------------------
// Model configuration (config.json)

enum class RopeScalingType { kNone, kLinear, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position = 8192;
};

// The fields of LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM that the forward pass
// reads.
struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  int vocab_size = 0;
  int max_position = 0;  // the context length: prompt plus generated tokens
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2, or attention_bias
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;
};

// Parses config.json. kInvalidArgument naming the field for a missing or wrong one, and for an
// architecture other than the three above.
Result<ModelConfig> parse_model_config(std::string_view json_text);

// Whether `dir` holds a config.json naming a supported architecture: what `runtime: auto` asks.
bool is_llm_directory(const std::string& dir);

// ---------------------------------------------------------------------------------------------
// Weights and model

// How a weight matrix is stored in memory. Activations and the KV cache are always fp32.
enum class WeightFormat { kF32, kBF16, kInt8, kFp8 };

std::string_view weight_format_name(WeightFormat format);

struct LoadOptions {
  // Format of every weight matrix; nullopt: bf16 for a 16-bit checkpoint, fp32 for fp32 ones.
  std::optional<WeightFormat> dtype;
  // Weight-only quantization with one scale per output channel (kInt8 or kFp8): the MLP
  // projections and the LM head, and the attention projections too when quantize_attention.
  std::optional<WeightFormat> quantize;
  bool quantize_attention = false;
  int threads = 0;  // compute threads; 0: every core this process may use
  // Set while the safetensors files are still downloading: the loader reads each header and
  // tensor only once this says it is present, so loading overlaps the download (lazy loading).
  // Other files must be complete. Not kept past load_model().
  std::function<Status(const std::string& path, uint64_t offset, uint64_t length)> await_bytes;
};

class Model;

// Loads config.json and the safetensors weights (one file or shards with an index) of a Hugging
// Face model directory. Files are memory-mapped; weights already in the wanted format are used
// in place. Errors name the file and the tensor (missing, wrong shape, unsupported dtype).
Result<std::shared_ptr<const Model>> load_model(const std::string& dir, const LoadOptions& options);

const ModelConfig& model_config(const Model& model);
// Bytes of weights read by one forward step: what bounds decoding speed.
int64_t model_weight_bytes(const Model& model);

// ---------------------------------------------------------------------------------------------
// Generation

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

// Checks ranges; kInvalidArgument naming the parameter.
Status validate(const SamplingParams& params);

enum class FinishReason { kNone, kLength, kStop, kCancelled, kError };
std::string_view finish_reason_name(FinishReason reason);

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
};

using EventCallback = std::function<void(GenerationEvent&& event)>;

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  EventCallback on_event;
};

struct EngineOptions {
  int kv_cache_tokens = 0;             // 0: enough for max_sequences full contexts, at most 64K
  int kv_block_tokens = 16;            // tokens per KV cache block
  int max_sequences = 64;              // sequences in the running batch at once
  int max_waiting = 1024;              // queued sequences past which submit() refuses more
  int max_tokens_per_step = 512;       // prefill chunks and decode tokens of one forward step
  bool overlap_postprocessing = true;  // output work of step N runs during step N+1
};

struct EngineStats {
  int running = 0;
  int waiting = 0;
  int kv_blocks_used = 0;
  int kv_blocks_total = 0;
  int64_t prompt_tokens = 0;     // processed, cumulative
  int64_t generated_tokens = 0;  // cumulative
  int64_t steps = 0;
  int64_t preemptions = 0;
  // The integral of `waiting` over time, in request-seconds, up to the stats() call: its rate
  // is the mean number of requests waiting (runtime::Runtime::queue_wait_seconds).
  double queue_wait_seconds = 0;
};

// Runs generation requests on one model. One engine thread owns the batch and the KV cache;
// a second thread does the output work (detokenization, stop strings, callbacks).
class Engine {
 public:
  virtual ~Engine() = default;

  // Queues a request and returns its id. Invalid ones (empty prompt, token outside the
  // vocabulary, prompt plus max_tokens past the context, bad sampling) return kInvalidArgument,
  // and a full queue (max_waiting) kResourceExhausted; neither queues anything.
  virtual Result<uint64_t> submit(GenerationRequest&& request) = 0;
  // Stops a request and frees its KV blocks at the next step; its last event says kCancelled.
  // Unknown or finished ids are ignored.
  virtual void cancel(uint64_t id) = 0;
  virtual EngineStats stats() const = 0;
  virtual const ModelConfig& config() const = 0;
};

// `tokenizer` may be null (token ids only: then `stop` strings are refused and events carry no
// text). The engine keeps `model` and `tokenizer` alive; stopping it (destruction) cancels what
// is still running.
Result<std::unique_ptr<Engine>> create_engine(std::shared_ptr<const Model> model,
                                              std::shared_ptr<const Tokenizer> tokenizer,
                                              const EngineOptions& options);

}  // namespace flotilla::llm

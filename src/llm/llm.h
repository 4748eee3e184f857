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
#include "common/common_generation.h"
#include "llm/llm_config.h"
#include "llm/tokenizer.h"

namespace flotilla::llm {

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

// The sampling parameters and the events of a generation are common's value types
// (common/common_generation.h), so that they reach the runtime's users in the shape the engine
// makes them.
using flotilla::EventCallback;
using flotilla::finish_reason_name;
using flotilla::FinishReason;
using flotilla::GenerationEvent;
using flotilla::SamplingParams;
using flotilla::TokenLogprob;

// Checks ranges; kInvalidArgument naming the parameter.
Status validate(const SamplingParams& params);

// Whether a prompt of `prompt_tokens` tokens and up to `max_tokens` generated ones fit a model's
// context of `context_length` tokens: the one check of a request against the context, which
// Engine::submit makes (the runtime above it only derives a default max_tokens from the room).
// kInvalidArgument saying what does not fit: a prompt that leaves no room at all, or the prompt
// plus max_tokens.
Status check_context(int64_t prompt_tokens, int64_t max_tokens, int64_t context_length);

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  EventCallback on_event;
};

struct EngineOptions {
  int kv_cache_tokens = 0;        // 0: enough for max_sequences full contexts, at most 64K
  int kv_block_tokens = 16;       // tokens per KV cache block
  int max_sequences = 64;         // sequences in the running batch at once
  int max_waiting = 1024;         // queued sequences past which submit() refuses more
  int max_tokens_per_step = 512;  // prefill chunks and decode tokens of one forward step
  // Of those, prompt chunks (and recomputation); 0: only max_tokens_per_step bounds them.
  int max_prefill_tokens_per_step = 64;
  bool overlap_postprocessing = true;  // output work of step N runs during step N+1
  // Full KV blocks stay cached for requests whose tokens start the same (block_allocator.h).
  bool prefix_caching = true;
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
  // Prefix caching: the tokens of admitted sequences, and those of them found in cached blocks
  // (not computed again); their ratio is the hit rate.
  int64_t prefix_cache_queried_tokens = 0;
  int64_t prefix_cache_hit_tokens = 0;
  // Of `waiting`, those the last step's plan left out for lack of room (a sequence slot, KV
  // blocks or the step's token budget). A request that arrives during a step and joins the next
  // one is not among them: that one-step wait is the batching itself, not a full engine.
  int blocked = 0;
  // The integral of `blocked` over time, in request-seconds, up to the stats() call: its rate
  // is the mean number of requests waiting for room (runtime::Runtime::queue_wait_seconds, the
  // vertical autoscaler's in-replica queue).
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

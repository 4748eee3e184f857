// The runtime module's contract: the engines that run a model behind one interface, and the
// loader that picks one for an artifact (DESIGN.md §1 "Runtimes", §5). It names no engine's
// types: a generation's sampling parameters and events are common's (common_generation.h),
// its settings and gauges the runtime's own, so a user of this header builds without src/llm.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/common.h"
#include "common/common_generation.h"
#include "runtime/runtime_detect.h"

namespace flotilla::runtime {

// The llm runtime's engine (llm::EngineOptions, which has the same fields and defaults).
struct LlmEngineOptions {
  int kv_cache_tokens = 0;               // 0: enough for max_sequences full contexts, at most 64K
  int kv_block_tokens = 16;              // tokens per KV cache block
  int max_sequences = 64;                // sequences in the running batch at once
  int max_waiting = 1024;                // queued sequences past which generate() refuses more
  int max_tokens_per_step = 512;         // prefill chunks and decode tokens of one forward step
  int max_prefill_tokens_per_step = 64;  // of those, prompt chunks; 0: no separate bound
  bool overlap_postprocessing = true;    // output work of step N runs during step N+1
  bool prefix_caching = true;            // reuse full KV blocks of prompts that start the same
};

// Settings of the llm runtime (docs/llm.md).
struct LlmRuntimeOptions {
  std::string dtype = "auto";     // auto, float32 or bfloat16: the weights' format
  std::string quantize = "none";  // none, int8 or fp8: weight-only, one scale per channel
  bool quantize_attention = false;
  bool skip_tokenizer = false;  // serve token-id prompts only; no tokenizer files needed
  int threads = 0;              // compute threads; 0: every core
  LlmEngineOptions engine;
};

// Blocks until bytes [offset, offset + length) of the model file `path` may be read (a length
// past the end: up to the end).
using AwaitBytes = std::function<Status(const std::string& path, uint64_t offset, uint64_t length)>;

struct RuntimeOptions {
  std::string name;         // the model's name in metadata and responses
  int predict_threads = 1;  // threads one predict call may use (XGBoost's nthread)
  LlmRuntimeOptions llm;
  // Set while the model's files are still downloading (lazy loading; store::LazyArtifact):
  // load_runtime reads nothing before it has awaited it. The llm runtime awaits safetensors
  // weights tensor by tensor, so loading overlaps the download; the others await whole files.
  // Empty: the files are complete.
  AwaitBytes await_bytes;
};

// A language model's gauges (its engine's: the batch, the queue, the KV cache).
struct GeneratorStats {
  int running = 0;
  int waiting = 0;
  int kv_blocks_used = 0;
  int kv_blocks_total = 0;
  int64_t prompt_tokens = 0;     // processed, cumulative
  int64_t generated_tokens = 0;  // cumulative
  int64_t preemptions = 0;
  int64_t prefix_cache_queried_tokens = 0;  // prompt tokens looked up in the prefix cache
  int64_t prefix_cache_hit_tokens = 0;      // of those, found cached (not computed again)
};

// What a language model serves instead of tensors.
class Generator {
 public:
  virtual ~Generator() = default;
  virtual int context_length() const = 0;
  // Prepares the prompt (chat template, tokenization), sets the request's sampling.max_tokens
  // from its max_tokens, and starts generating with that sampling; events arrive on the
  // engine's output thread, the last with finish set. kInvalidArgument for a bad request (the
  // caller answers 400), with nothing started.
  virtual Result<uint64_t> generate(GenerationInput&& request, EventCallback on_event) = 0;
  virtual void cancel(uint64_t id) = 0;
  // What logprobs show of a token.
  struct TokenForms {
    // The bytes it adds to a text, incomplete characters included (llm::Tokenizer::
    // token_bytes); unset without a tokenizer.
    std::optional<std::string> bytes;
    // Its vocabulary entry ("Ġthe", "<0xE2>"); "token_id:N" without a tokenizer.
    std::string piece;
  };
  virtual TokenForms token_forms(int32_t id) const = 0;
  virtual GeneratorStats stats() const = 0;
};

// Rows of features, row-major float32: what a tabular model reads. Rows of several requests
// can be concatenated into one input (dynamic batching).
struct ModelInput {
  int64_t rows = 0;
  int64_t columns = 0;
  std::vector<float> values;
};

// All outputs for all rows of one run; every tensor's first dimension is the row count.
using RunCallback = std::function<void(Result<std::vector<Tensor>>)>;

// A loaded model. Thread-safe: prepare() and run() may be called from several threads at once.
class Runtime {
 public:
  virtual ~Runtime() = default;

  virtual const ModelMetadata& metadata() const = 0;
  // Whether rows of different requests may be merged into one run().
  virtual bool can_batch() const = 0;
  // Validates a decoded request against the model's inputs (names, feature count, types,
  // shapes) and converts it to rows. Cheap; never blocks. kInvalidArgument on bad input.
  virtual Result<ModelInput> prepare(const InferRequest& request) const = 0;
  // Runs the model and calls `done` exactly once, possibly inline on the calling thread,
  // possibly later on a thread the runtime owns. May block the caller for the compute time.
  virtual void run(ModelInput&& input, RunCallback done) = 0;
  // The text-generation interface of a language model; null for tensor models.
  virtual Generator* generator() { return nullptr; }
  // Seconds requests have waited inside the runtime for room in the engine (a full batch, busy
  // slots; not the wait for the next step of a batch with room), summed over requests, the waits
  // still going on included: its increase over an interval, divided by the interval, is the mean
  // number of requests waiting then (Little's law). What the vertical autoscaler reads as
  // in-replica queueing. 0 for a runtime that never queues (xgboost runs each call on the thread
  // that asked).
  virtual double queue_wait_seconds() const { return 0; }
};

// Loads the model at `model_path`. Errors name the file and the problem (kNotFound for a
// missing file, kInvalidArgument for an unreadable or invalid one).
Result<std::unique_ptr<Runtime>> load_runtime(RuntimeKind kind, const std::string& model_path,
                                              const RuntimeOptions& options);

// Pays a runtime's one-time start-up costs (library initialisation, first model parse) on a tiny
// built-in model, so that a warm-pool process loads its real model faster. kAuto warms every
// runtime auto can pick. Best effort: an error is worth a log line, nothing more. Blocks for
// tens of milliseconds.
Status warm_up(RuntimeKind kind);

}  // namespace flotilla::runtime

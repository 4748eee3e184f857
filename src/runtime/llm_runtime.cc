// The `llm` runtime: a Hugging Face Llama-family directory served by Flotilla's engine
// (src/llm). It answers the OpenAI routes through Generator; the tensor routes get a clear
// error.
#include <filesystem>

#include "llm/llm.h"
#include "runtime/runtime_internal.h"

namespace flotilla::runtime {
namespace {

// vLLM's default for /v1/completions, as in OpenAI's legacy API.
constexpr int kDefaultCompletionTokens = 16;

Result<std::optional<llm::WeightFormat>> parse_dtype(const std::string& name) {
  if (name == "auto") {
    return std::optional<llm::WeightFormat>();
  }
  if (name == "float32" || name == "fp32") {
    return std::optional(llm::WeightFormat::kF32);
  }
  if (name == "bfloat16" || name == "bf16") {
    return std::optional(llm::WeightFormat::kBF16);
  }
  return invalid_argument("dtype '" + name + "' is not supported (auto, float32, bfloat16)");
}

Result<std::optional<llm::WeightFormat>> parse_quantize(const std::string& name) {
  if (name == "none" || name.empty()) {
    return std::optional<llm::WeightFormat>();
  }
  if (name == "int8") {
    return std::optional(llm::WeightFormat::kInt8);
  }
  if (name == "fp8") {
    return std::optional(llm::WeightFormat::kFp8);
  }
  return invalid_argument("quantize '" + name + "' is not supported (none, int8, fp8)");
}

llm::EngineOptions engine_options(const LlmEngineOptions& o) {
  llm::EngineOptions engine;
  engine.kv_cache_tokens = o.kv_cache_tokens;
  engine.kv_block_tokens = o.kv_block_tokens;
  engine.max_sequences = o.max_sequences;
  engine.max_waiting = o.max_waiting;
  engine.max_tokens_per_step = o.max_tokens_per_step;
  engine.max_prefill_tokens_per_step = o.max_prefill_tokens_per_step;
  engine.overlap_postprocessing = o.overlap_postprocessing;
  engine.prefix_caching = o.prefix_caching;
  return engine;
}

class LlmRuntime final : public Runtime, public Generator {
 public:
  LlmRuntime(std::string name, std::shared_ptr<const llm::Tokenizer> tokenizer,
             std::unique_ptr<llm::Engine> engine)
      : tokenizer_(std::move(tokenizer)), engine_(std::move(engine)) {
    metadata_.name = std::move(name);
    metadata_.platform = "flotilla_llm";
    metadata_.versions = {"1"};
  }

  const ModelMetadata& metadata() const override { return metadata_; }
  bool can_batch() const override { return false; }
  Result<ModelInput> prepare(const InferRequest&) const override {
    return Status(StatusCode::kUnimplemented,
                  "model '" + metadata_.name +
                      "' is a language model: use /v1/completions or /v1/chat/completions");
  }
  void run(ModelInput&&, RunCallback done) override {
    done(Status(StatusCode::kUnimplemented, "a language model runs no tensor requests"));
  }
  Generator* generator() override { return this; }

  int context_length() const override { return engine_->config().max_position; }

  Result<uint64_t> generate(GenerationInput&& request, EventCallback on_event) override {
    std::vector<int32_t> prompt;
    bool chat = !request.chat.empty();
    if (chat || request.prompt_text) {
      if (tokenizer_ == nullptr) {
        return invalid_argument(
            "this model is served without a tokenizer (--skip-tokenizer): send the prompt as "
            "a list of token ids to /v1/completions");
      }
      if (chat) {
        FLOTILLA_ASSIGN_OR_RETURN(std::string text,
                                  tokenizer_->apply_chat_template(request.chat, true));
        prompt = tokenizer_->encode(text, /*add_special_tokens=*/false);
      } else {
        prompt = tokenizer_->encode(*request.prompt_text, /*add_special_tokens=*/true);
      }
    } else {
      prompt = std::move(request.prompt_tokens);
    }
    SamplingParams& sampling = request.sampling;
    // The default: the rest of the context for a chat, a few tokens for a completion. Whether
    // the prompt fits at all is the engine's one context check (llm::check_context): a prompt
    // with no room left gets a default of 1, which that check refuses.
    const int room = context_length() - static_cast<int>(prompt.size());
    sampling.max_tokens = request.max_tokens.value_or(
        std::max(1, chat ? room : std::min(room, kDefaultCompletionTokens)));
    if (tokenizer_ != nullptr && !sampling.ignore_eos) {
      // The chat family's end-of-turn tokens (<|eot_id|>, <|im_end|>) end a reply too.
      for (int32_t id : tokenizer_->eos_ids()) {
        sampling.stop_token_ids.push_back(id);
      }
    }
    return engine_->submit({std::move(prompt), std::move(sampling), std::move(on_event)});
  }

  void cancel(uint64_t id) override { engine_->cancel(id); }

  TokenForms token_forms(int32_t id) const override {
    std::string piece = tokenizer_ ? tokenizer_->token_piece(id) : std::string();
    if (piece.empty()) {  // no tokenizer, or an id the vocabulary leaves unused
      return {std::nullopt, "token_id:" + std::to_string(id)};
    }
    return {tokenizer_->token_bytes(id), std::move(piece)};
  }

  GeneratorStats stats() const override {
    const llm::EngineStats engine = engine_->stats();
    GeneratorStats out;
    out.running = engine.running;
    out.waiting = engine.waiting;
    out.kv_blocks_used = engine.kv_blocks_used;
    out.kv_blocks_total = engine.kv_blocks_total;
    out.prompt_tokens = engine.prompt_tokens;
    out.generated_tokens = engine.generated_tokens;
    out.preemptions = engine.preemptions;
    out.prefix_cache_queried_tokens = engine.prefix_cache_queried_tokens;
    out.prefix_cache_hit_tokens = engine.prefix_cache_hit_tokens;
    return out;
  }
  double queue_wait_seconds() const override { return engine_->stats().queue_wait_seconds; }

 private:
  ModelMetadata metadata_;
  std::shared_ptr<const llm::Tokenizer> tokenizer_;
  std::unique_ptr<llm::Engine> engine_;
};

}  // namespace

Result<std::unique_ptr<Runtime>> load_llm_runtime(const std::string& path,
                                                  const RuntimeOptions& options) {
  const LlmRuntimeOptions& o = options.llm;
  llm::LoadOptions load;
  FLOTILLA_ASSIGN_OR_RETURN(load.dtype, parse_dtype(o.dtype));
  FLOTILLA_ASSIGN_OR_RETURN(load.quantize, parse_quantize(o.quantize));
  load.quantize_attention = o.quantize_attention;
  load.threads = o.threads;
  load.await_bytes = options.await_bytes;
  FLOTILLA_ASSIGN_OR_RETURN(std::shared_ptr<const llm::Model> model, llm::load_model(path, load));
  std::shared_ptr<const llm::Tokenizer> tokenizer;
  if (!o.skip_tokenizer) {
    Result<std::unique_ptr<llm::Tokenizer>> loaded = llm::Tokenizer::load(path);
    if (!loaded.is_ok()) {
      if (loaded.status().code() == StatusCode::kNotFound) {
        return loaded.status().with_context(
            "loading the tokenizer (serve token ids only with --skip-tokenizer)");
      }
      return loaded.status().with_context("loading the tokenizer");
    }
    tokenizer = std::move(loaded).value();
  }
  FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<llm::Engine> engine,
                            llm::create_engine(model, tokenizer, engine_options(o.engine)));
  return std::unique_ptr<Runtime>(
      std::make_unique<LlmRuntime>(options.name, std::move(tokenizer), std::move(engine)));
}

}  // namespace flotilla::runtime

// The engine: iteration-level continuous batching over a paged KV cache.
//
// One engine thread owns the running batch, the KV cache and the forward pass. Each step it
// takes new requests and cancellations, gives every running sequence its next tokens (one for a
// decoding sequence, a chunk of the prompt for a prefilling one) within max_tokens_per_step
// (prompt chunks also within max_prefill_tokens_per_step), admits waiting sequences while
// blocks and budget last, runs one forward pass, samples, and hands the sampled tokens to the
// output thread. The output thread detokenizes, checks stop strings and calls back while the
// engine thread runs the next step. When the cache runs out of blocks, the youngest running
// sequence is preempted: its blocks are freed and it is recomputed later from its tokens. The
// scheduling decisions are scheduler.h's; this file runs them.
#include <algorithm>
#include <chrono>
#include <deque>
#include <thread>
#include <unordered_set>

#include "llm/model.h"
#include "llm/output.h"
#include "llm/sampler.h"
#include "llm/scheduler.h"

namespace flotilla::llm {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Work for the output thread: a token of a request, or its end.
struct OutputItem {
  std::shared_ptr<RequestOutput> output;
  int32_t token = -1;  // -1: no token, the request ended with `finish`
  std::optional<TokenLogprob> logprob;
  FinishReason finish = FinishReason::kNone;
};

SchedulerOptions scheduler_options(const EngineOptions& options) {
  SchedulerOptions out{options.max_tokens_per_step, options.max_sequences, options.kv_block_tokens};
  if (options.max_prefill_tokens_per_step > 0) {
    out.max_prefill_tokens_per_step = options.max_prefill_tokens_per_step;
  }
  return out;
}

class EngineImpl final : public Engine {
 public:
  EngineImpl(std::shared_ptr<const Model> model, std::shared_ptr<const Tokenizer> tokenizer,
             const EngineOptions& options, int kv_blocks)
      : model_(std::move(model)),
        tokenizer_(std::move(tokenizer)),
        options_(options),
        cache_(model_->config, kv_blocks, options.kv_block_tokens, options.prefix_caching),
        scheduler_(cache_.allocator(), scheduler_options(options)),
        pass_(model_, model_->options.threads) {
    stats_.kv_blocks_total = kv_blocks;
    output_thread_ = std::thread([this] { output_loop(); });
    engine_thread_ = std::thread([this] { engine_loop(); });
  }

  ~EngineImpl() override {
    {
      MutexLock lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    engine_thread_.join();
    {
      MutexLock lock(output_mutex_);
      output_stopping_ = true;
    }
    output_wake_.notify_all();
    output_thread_.join();
  }

  Result<uint64_t> submit(GenerationRequest&& request) override {
    const ModelConfig& c = model_->config;
    if (request.prompt.empty()) {
      return invalid_argument("the prompt is empty");
    }
    for (int32_t token : request.prompt) {
      if (token < 0 || token >= c.vocab_size) {
        return invalid_argument("token id " + std::to_string(token) +
                                " is outside the vocabulary (size " + std::to_string(c.vocab_size) +
                                ")");
      }
    }
    FLOTILLA_RETURN_IF_ERROR(validate(request.sampling));
    for (const auto& [token, bias] : request.sampling.logit_bias) {
      if (token >= c.vocab_size) {
        return invalid_argument("logit_bias: token id " + std::to_string(token) +
                                " is outside the vocabulary (size " + std::to_string(c.vocab_size) +
                                ")");
      }
    }
    const int64_t length =
        static_cast<int64_t>(request.prompt.size()) + request.sampling.max_tokens;
    FLOTILLA_RETURN_IF_ERROR(check_context(static_cast<int64_t>(request.prompt.size()),
                                           request.sampling.max_tokens, c.max_position));
    if (scheduler_.blocks_for(static_cast<int>(length)) > cache_.total_blocks()) {
      return invalid_argument("the prompt plus max_tokens needs more KV cache (" +
                              std::to_string(length) + " tokens) than this engine has (" +
                              std::to_string(cache_.total_blocks() * cache_.block_tokens()) + ")");
    }
    if (!request.sampling.stop.empty() && tokenizer_ == nullptr) {
      return invalid_argument("stop strings need a tokenizer; this model is served without one");
    }
    auto sequence = std::make_unique<Sequence>();
    sequence->prompt_length = static_cast<int>(request.prompt.size());
    sequence->tokens = std::move(request.prompt);
    sequence->tokens.reserve(length);
    sequence->sampling = std::move(request.sampling);
    sequence->rng.seed(sequence->sampling.seed.value_or(std::random_device{}()));
    MutexLock lock(mutex_);
    if (stats_.waiting >= options_.max_waiting) {
      return Status(StatusCode::kResourceExhausted,
                    std::to_string(stats_.waiting) +
                        " requests are already waiting for this model; retry later");
    }
    sequence->id = ++last_id_;
    sequence->output = std::make_shared<RequestOutput>(
        sequence->id, tokenizer_.get(), /*skip_special_tokens=*/true, sequence->sampling.stop,
        std::move(request.on_event), sequence->prompt_length, SteadyClock::now());
    uint64_t id = sequence->id;
    incoming_.push_back(std::move(sequence));
    ++stats_.waiting;
    wake_.notify_one();
    return id;
  }

  void cancel(uint64_t id) override {
    {
      MutexLock lock(mutex_);
      cancels_.push_back(id);
    }
    wake_.notify_one();
  }

  EngineStats stats() const override {
    MutexLock lock(mutex_);
    EngineStats stats = stats_;
    stats.queue_wait_seconds = blocked_integral();
    return stats;
  }

  const ModelConfig& config() const override { return model_->config; }

 private:
  // The integral of stats_.blocked over time up to now: what was accounted, plus the current
  // count since it last changed.
  double blocked_integral() const FLOTILLA_REQUIRES(mutex_) {
    const double since =
        std::chrono::duration<double>(SteadyClock::now() - blocked_counted_until_).count();
    return stats_.queue_wait_seconds + stats_.blocked * since;
  }

  // Brings the integral up to now; called before each change of stats_.blocked.
  void account_blocked() FLOTILLA_REQUIRES(mutex_) {
    stats_.queue_wait_seconds = blocked_integral();
    blocked_counted_until_ = SteadyClock::now();
  }

  // Output of this pass of the loop; handed over by publish() once the bookkeeping is done, so
  // that a caller who sees a request's final event also sees its blocks freed in stats().
  void emit(OutputItem&& item) { ready_output_.push_back(std::move(item)); }

  void publish() {
    {
      MutexLock lock(mutex_);
      stats_.running = static_cast<int>(running_.size());
      account_blocked();
      // After a step, waiting_ holds what its plan could not admit; incoming_ what arrived
      // during it.
      stats_.blocked = static_cast<int>(waiting_.size());
      stats_.waiting = static_cast<int>(waiting_.size() + incoming_.size());
      stats_.kv_blocks_used = cache_.total_blocks() - cache_.free_blocks();
      stats_.preemptions = preemptions_;
    }
    if (ready_output_.empty()) {
      return;
    }
    if (!options_.overlap_postprocessing) {
      for (const OutputItem& item : ready_output_) {
        process(item);
      }
      ready_output_.clear();
      return;
    }
    {
      MutexLock lock(output_mutex_);
      for (OutputItem& item : ready_output_) {
        output_queue_.push_back(std::move(item));
      }
    }
    ready_output_.clear();
    output_wake_.notify_one();
  }

  // Ends and drops the sequences named in `ids` wherever they are.
  void apply_cancellations(const std::vector<uint64_t>& ids, FinishReason reason) {
    if (ids.empty()) {
      return;
    }
    std::unordered_set<uint64_t> wanted(ids.begin(), ids.end());
    for (auto* list : {&running_, &waiting_}) {
      std::erase_if(*list, [&](std::unique_ptr<Sequence>& sequence) {
        if (!wanted.count(sequence->id)) {
          return false;
        }
        scheduler_.release(*sequence);
        emit({sequence->output, -1, std::nullopt, reason});
        return true;
      });
    }
  }

  // Takes new requests and cancellations; blocks while there is nothing to do. False: stop.
  bool collect() {
    std::vector<uint64_t> cancels, stops;
    {
      MutexLock lock(mutex_);
      while (!stopping_ && incoming_.empty() && cancels_.empty() && running_.empty() &&
             waiting_.empty()) {
        wake_.wait(mutex_);
      }
      if (stopping_) {
        return false;
      }
      for (auto& sequence : incoming_) {
        waiting_.push_back(std::move(sequence));
      }
      incoming_.clear();
      cancels.swap(cancels_);
    }
    {
      MutexLock lock(stop_mutex_);
      stops.swap(stopped_by_output_);
    }
    apply_cancellations(cancels, FinishReason::kCancelled);
    // Already finished by a stop string: the output side sent the final event.
    std::unordered_set<uint64_t> stopped(stops.begin(), stops.end());
    for (auto* list : {&running_, &waiting_}) {
      std::erase_if(*list, [&](std::unique_ptr<Sequence>& sequence) {
        if (!stopped.count(sequence->id)) {
          return false;
        }
        scheduler_.release(*sequence);
        return true;
      });
    }
    return true;
  }

  void step() {
    StepPlan plan = scheduler_.plan(running_, waiting_);
    preemptions_ += static_cast<int64_t>(plan.preempted.size());
    const std::vector<PlannedWork>& planned = plan.work;
    if (planned.empty()) {
      return;
    }
    std::vector<StepSequence> batch;
    batch.reserve(planned.size());
    int64_t prompt_tokens = 0;
    const SteadyClock::time_point step_start = SteadyClock::now();
    for (const PlannedWork& p : planned) {
      Sequence& s = *p.sequence;
      s.output->mark_scheduled(step_start);
      bool reaches_end = s.computed + p.tokens == static_cast<int>(s.tokens.size());
      batch.push_back({&s.blocks, s.computed,
                       std::span<const int32_t>(s.tokens).subspan(s.computed, p.tokens),
                       reaches_end ? p.tokens - 1 : p.tokens});
      prompt_tokens += std::max(0, std::min(s.prompt_length, s.computed + p.tokens) - s.computed);
    }
    std::span<const float> logits = pass_.forward(batch, cache_);
    const int vocab = model_->config.vocab_size;
    int row = 0;
    int64_t generated = 0;
    std::vector<uint64_t> finished;
    for (const PlannedWork& p : planned) {
      Sequence& s = *p.sequence;
      s.computed += p.tokens;
      scheduler_.cache_full_blocks(s);
      if (s.computed < static_cast<int>(s.tokens.size())) {
        continue;  // a prompt chunk: no token yet
      }
      TokenLogprob logprob;
      int32_t token = sampler_.sample(logits.subspan(static_cast<size_t>(row++) * vocab, vocab),
                                      s.sampling, s.rng, &logprob, {s.tokens, s.prompt_length});
      s.tokens.push_back(token);
      ++generated;
      FinishReason finish = FinishReason::kNone;
      const auto& eos = model_->config.eos_token_ids;
      const auto& stop_ids = s.sampling.stop_token_ids;
      if ((!s.sampling.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) ||
          std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) {
        finish = FinishReason::kStop;
      } else if (s.generated() >= s.sampling.max_tokens) {
        finish = FinishReason::kLength;
      }
      emit(
          {s.output, token,
           s.sampling.logprobs > 0 ? std::optional<TokenLogprob>(std::move(logprob)) : std::nullopt,
           finish});
      if (finish != FinishReason::kNone) {
        finished.push_back(s.id);
      }
    }
    std::unordered_set<uint64_t> done(finished.begin(), finished.end());
    std::erase_if(running_, [&](std::unique_ptr<Sequence>& sequence) {
      if (!done.count(sequence->id)) {
        return false;
      }
      scheduler_.release(*sequence);
      return true;
    });
    MutexLock lock(mutex_);
    stats_.prompt_tokens += prompt_tokens;
    stats_.prefix_cache_queried_tokens += plan.prefix_queried_tokens;
    stats_.prefix_cache_hit_tokens += plan.prefix_hit_tokens;
    stats_.generated_tokens += generated;
    ++stats_.steps;
  }

  void engine_loop() {
    while (collect()) {
      step();
      publish();
    }
    // Stopping: whatever is left ends as cancelled.
    std::vector<uint64_t> all;
    for (auto* list : {&running_, &waiting_}) {
      for (auto& sequence : *list) {
        all.push_back(sequence->id);
      }
    }
    {
      MutexLock lock(mutex_);
      for (auto& sequence : incoming_) {
        waiting_.push_back(std::move(sequence));
        all.push_back(waiting_.back()->id);
      }
      incoming_.clear();
    }
    apply_cancellations(all, FinishReason::kCancelled);
    publish();
  }

  void process(const OutputItem& item) {
    if (item.token < 0) {
      item.output->on_end(item.finish);
      return;
    }
    if (item.output->on_token(item.token, item.logprob ? &*item.logprob : nullptr, item.finish)) {
      // A stop string ended it: the engine stops generating at its next step.
      {
        MutexLock lock(stop_mutex_);
        stopped_by_output_.push_back(item.output->id());
      }
      wake_.notify_one();
    }
  }

  void output_loop() {
    std::deque<OutputItem> items;
    while (true) {
      {
        MutexLock lock(output_mutex_);
        while (!output_stopping_ && output_queue_.empty()) {
          output_wake_.wait(output_mutex_);
        }
        if (output_queue_.empty()) {
          return;  // stopping, and everything delivered
        }
        items.swap(output_queue_);
      }
      for (const OutputItem& item : items) {
        process(item);
      }
      items.clear();
    }
  }

  std::shared_ptr<const Model> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  const EngineOptions options_;

  // Engine thread only.
  KvCache cache_;
  Scheduler scheduler_;
  ForwardPass pass_;
  Sampler sampler_;
  SequenceQueue running_;  // oldest first
  SequenceQueue waiting_;
  int64_t preemptions_ = 0;
  std::vector<OutputItem> ready_output_;

  // Shared with callers.
  mutable Mutex mutex_;
  CondVar wake_;
  std::vector<std::unique_ptr<Sequence>> incoming_ FLOTILLA_GUARDED_BY(mutex_);
  std::vector<uint64_t> cancels_ FLOTILLA_GUARDED_BY(mutex_);
  uint64_t last_id_ FLOTILLA_GUARDED_BY(mutex_) = 0;
  bool stopping_ FLOTILLA_GUARDED_BY(mutex_) = false;
  EngineStats stats_ FLOTILLA_GUARDED_BY(mutex_);
  // See account_blocked.
  SteadyClock::time_point blocked_counted_until_ FLOTILLA_GUARDED_BY(mutex_) = SteadyClock::now();

  Mutex stop_mutex_;
  std::vector<uint64_t> stopped_by_output_ FLOTILLA_GUARDED_BY(stop_mutex_);

  Mutex output_mutex_;
  CondVar output_wake_;
  std::deque<OutputItem> output_queue_ FLOTILLA_GUARDED_BY(output_mutex_);
  bool output_stopping_ FLOTILLA_GUARDED_BY(output_mutex_) = false;

  std::thread output_thread_;
  std::thread engine_thread_;
};

}  // namespace

Status check_context(int64_t prompt_tokens, int64_t max_tokens, int64_t context_length) {
  if (prompt_tokens >= context_length) {
    // No room for a single token: say so whatever max_tokens was (a default one is the room).
    return invalid_argument("the prompt has " + std::to_string(prompt_tokens) +
                            " tokens; the model's context is " + std::to_string(context_length));
  }
  if (prompt_tokens + max_tokens > context_length) {
    return invalid_argument("the prompt (" + std::to_string(prompt_tokens) +
                            " tokens) plus max_tokens (" + std::to_string(max_tokens) +
                            ") is longer than the model's context of " +
                            std::to_string(context_length) + " tokens");
  }
  return Status::ok();
}

Result<std::unique_ptr<Engine>> create_engine(std::shared_ptr<const Model> model,
                                              std::shared_ptr<const Tokenizer> tokenizer,
                                              const EngineOptions& options) {
  if (model == nullptr) {
    return invalid_argument("no model");
  }
  const ModelConfig& c = model->config;
  if (options.kv_block_tokens < 1 || options.max_sequences < 1 || options.max_tokens_per_step < 1 ||
      options.kv_cache_tokens < 0 || options.max_waiting < 1 ||
      options.max_prefill_tokens_per_step < 0) {
    return invalid_argument(
        "kv_block_tokens, max_sequences, max_tokens_per_step and max_waiting must be positive, "
        "max_prefill_tokens_per_step not negative");
  }
  int64_t tokens = options.kv_cache_tokens > 0
                       ? options.kv_cache_tokens
                       : std::min<int64_t>(int64_t{options.max_sequences} * c.max_position, 65536);
  int blocks = static_cast<int>((tokens + options.kv_block_tokens - 1) / options.kv_block_tokens);
  return std::unique_ptr<Engine>(
      std::make_unique<EngineImpl>(std::move(model), std::move(tokenizer), options, blocks));
}

}  // namespace flotilla::llm

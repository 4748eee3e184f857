// The engine end to end on fixture models (no tokenizer: token ids in, token ids out):
// continuous batching gives the reference's greedy tokens and the same tokens as one-at-a-time;
// chunked prefill and the overlap switch change nothing; finish reasons; cancellation; and the
// scheduler's invariants under thousands of random requests and cancellations on a cache small
// enough to force preemption.
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include <gtest/gtest.h>

#include "llm/llm.h"
#include "llm/llm_fixtures.h"

namespace flotilla::llm {
namespace {

using testing::LlmFixtures;

std::shared_ptr<const Model> load_fp32(const std::string& name) {
  LoadOptions options;
  options.dtype = WeightFormat::kF32;
  options.threads = 2;
  Result<std::shared_ptr<const Model>> model = load_model(LlmFixtures::get().model(name), options);
  EXPECT_TRUE(model.is_ok()) << model.status().to_string();
  return model.is_ok() ? *model : nullptr;
}

// Collects the events of many requests and waits for their final events.
class Collector {
 public:
  struct Outcome {
    std::vector<int32_t> tokens;
    FinishReason finish = FinishReason::kNone;
    int finals = 0;
    int completion_tokens = 0;
    int prompt_tokens = 0;
    // The final event's path through the engine (for spans): taken, first computed, first
    // token, each set and in that order.
    bool times_in_order = false;
  };

  EventCallback callback(int key) {
    return [this, key](GenerationEvent&& event) {
      std::lock_guard lock(mutex_);
      Outcome& outcome = outcomes_[key];
      EXPECT_EQ(outcome.finals, 0) << "an event after the final one, request " << key;
      outcome.tokens.insert(outcome.tokens.end(), event.tokens.begin(), event.tokens.end());
      outcome.completion_tokens = event.completion_tokens;
      outcome.prompt_tokens = event.prompt_tokens;
      if (event.finish != FinishReason::kNone) {
        const std::chrono::steady_clock::time_point unset{};
        outcome.times_in_order = event.submitted != unset && event.submitted <= event.scheduled &&
                                 event.scheduled <= event.first_token;
        outcome.finish = event.finish;
        ++outcome.finals;
        ++finished_;
        done_.notify_all();
      }
    };
  }

  // Bounded wait: a hang fails the test instead of stalling it.
  bool wait_for(int count) {
    std::unique_lock lock(mutex_);
    return done_.wait_for(lock, std::chrono::seconds(120), [&] { return finished_ >= count; });
  }

  std::map<int, Outcome> outcomes() {
    std::lock_guard lock(mutex_);
    return outcomes_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::map<int, Outcome> outcomes_;
  int finished_ = 0;
};

SamplingParams greedy(int max_tokens) {
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = max_tokens;
  params.ignore_eos = true;
  return params;
}

// Runs every prompt through a fresh engine with `options`, all submitted at once; `stats`, when
// given, gets the engine's once all have finished.
std::vector<std::vector<int32_t>> generate(const std::string& model_name,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const SamplingParams& params,
                                           const EngineOptions& options,
                                           EngineStats* stats = nullptr) {
  std::shared_ptr<const Model> model = load_fp32(model_name);
  Result<std::unique_ptr<Engine>> engine = create_engine(model, nullptr, options);
  EXPECT_TRUE(engine.is_ok()) << engine.status().to_string();
  Collector collector;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Result<uint64_t> id = (*engine)->submit({prompts[i], params, collector.callback(i)});
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
  }
  EXPECT_TRUE(collector.wait_for(static_cast<int>(prompts.size())));
  std::vector<std::vector<int32_t>> out;
  for (auto& [key, outcome] : collector.outcomes()) {
    EXPECT_EQ(outcome.finish, FinishReason::kLength);
    EXPECT_EQ(outcome.completion_tokens, params.max_tokens);
    EXPECT_EQ(outcome.prompt_tokens, static_cast<int>(prompts[key].size()));
    EXPECT_TRUE(outcome.times_in_order) << "request " << key;
    out.push_back(outcome.tokens);
  }
  EXPECT_EQ((*engine)->stats().kv_blocks_used, 0);
  if (stats != nullptr) {
    *stats = (*engine)->stats();
  }
  return out;
}

TEST(EngineTest, ContinuousBatchingGivesTheReferenceGreedyTokens) {
  for (const std::string& name : testing::kLlmFixtureModels) {
    nlohmann::json reference = LlmFixtures::get().reference(name);
    auto prompts = reference["prompts"].get<std::vector<std::vector<int32_t>>>();
    auto expected = reference["greedy"].get<std::vector<std::vector<int32_t>>>();
    for (bool overlap : {true, false}) {
      // {step tokens, prefill tokens}: 4 or 3 make prompts prefill in chunks beside decodes.
      for (auto [step_tokens, prefill_tokens] : {std::pair{512, 64}, {4, 64}, {512, 3}}) {
        EngineOptions options;
        options.overlap_postprocessing = overlap;
        options.max_tokens_per_step = step_tokens;
        options.max_prefill_tokens_per_step = prefill_tokens;
        EXPECT_EQ(generate(name, prompts, greedy(expected[0].size()), options), expected)
            << name << " overlap " << overlap << " step tokens " << step_tokens
            << " prefill tokens " << prefill_tokens;
      }
    }
  }
}

TEST(EngineTest, BatchedSampledResultsEqualOneAtATime) {
  std::vector<std::vector<int32_t>> prompts;
  std::mt19937 rng(3);
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> prompt(1 + rng() % 20);
    for (int32_t& t : prompt) {
      t = static_cast<int32_t>(3 + rng() % 250);
    }
    prompts.push_back(prompt);
  }
  SamplingParams params;
  params.temperature = 0.9;
  params.top_k = 40;
  params.top_p = 0.95;
  params.seed = 1234;
  params.max_tokens = 10;
  params.ignore_eos = true;
  EngineOptions batched, single;
  single.max_sequences = 1;
  auto together = generate("llama-gqa", prompts, params, batched);
  EXPECT_EQ(together, generate("llama-gqa", prompts, params, single));
  // A seed makes sampling reproducible; another seed gives other tokens.
  EXPECT_EQ(together, generate("llama-gqa", prompts, params, batched));
  params.seed = 99;
  EXPECT_NE(together, generate("llama-gqa", prompts, params, batched));
}

// Prompts sharing a 30-token start: with prefix caching the later ones take its cached blocks
// and compute only the rest, and every request generates exactly what it does without caching:
// one at a time, batched with one prompt admitted a step, and on a cache small enough to
// preempt (recomputed sequences find their own blocks cached).
TEST(EngineTest, PrefixCachingReusesSharedStartsWithoutChangingAToken) {
  const std::string name = testing::kLlmFixtureModels[0];
  std::mt19937 random(7);
  std::uniform_int_distribution<int32_t> token(3, 200);
  std::vector<int32_t> shared(30);
  for (int32_t& t : shared) {
    t = token(random);
  }
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(shared);
    for (int k = 0; k < 10; ++k) {
      prompts.back().push_back(token(random));
    }
  }
  prompts.push_back(prompts[0]);  // the whole prompt cached: its last token is computed again
  EngineOptions plain;
  plain.kv_block_tokens = 4;
  plain.prefix_caching = false;
  EngineStats stats;
  const auto expected = generate(name, prompts, greedy(12), plain, &stats);
  EXPECT_EQ(stats.prefix_cache_hit_tokens, 0);
  EXPECT_EQ(stats.prompt_tokens, 7 * 40);

  EngineOptions cached = plain;
  cached.prefix_caching = true;
  cached.max_sequences = 1;
  cached.kv_cache_tokens = 1024;  // room to keep every block cached
  EXPECT_EQ(generate(name, prompts, greedy(12), cached, &stats), expected);
  // 7 full blocks (28 tokens) of the shared start for each of 5 prompts, and 9 blocks (all but
  // the block of the last token) for the repeated one.
  EXPECT_EQ(stats.prefix_cache_hit_tokens, 5 * 28 + 36);
  EXPECT_EQ(stats.prefix_cache_queried_tokens, 7 * 40);
  EXPECT_EQ(stats.prompt_tokens, 7 * 40 - (5 * 28 + 36));

  cached.max_sequences = 64;
  cached.max_tokens_per_step = 40;  // one prompt admitted a step, beside the decodes
  EXPECT_EQ(generate(name, prompts, greedy(12), cached, &stats), expected);
  EXPECT_GT(stats.prefix_cache_hit_tokens, 0);

  cached.max_tokens_per_step = 512;
  cached.kv_cache_tokens = 96;  // 24 blocks: two sequences of 52 tokens do not fit
  EXPECT_EQ(generate(name, prompts, greedy(12), cached, &stats), expected);
  EXPECT_GT(stats.preemptions, 0);
  EXPECT_GT(stats.prefix_cache_hit_tokens, 0);
  std::printf("small cache: %lld preemptions, %lld of %lld prompt tokens found cached\n",
              static_cast<long long>(stats.preemptions),
              static_cast<long long>(stats.prefix_cache_hit_tokens),
              static_cast<long long>(stats.prefix_cache_queried_tokens));
}

TEST(EngineTest, StopTokensEndARequestAndRefusalsQueueNothing) {
  std::shared_ptr<const Model> model = load_fp32("llama-gqa");
  auto engine = create_engine(model, nullptr, {});
  ASSERT_TRUE(engine.is_ok());
  nlohmann::json reference = LlmFixtures::get().reference("llama-gqa");
  auto prompt = reference["prompts"][1].get<std::vector<int32_t>>();
  int32_t third = reference["greedy"][1][2].get<int32_t>();
  Collector collector;
  SamplingParams params = greedy(8);
  params.stop_token_ids = {third};
  ASSERT_TRUE((*engine)->submit({prompt, params, collector.callback(0)}).is_ok());
  ASSERT_TRUE(collector.wait_for(1));
  Collector::Outcome outcome = collector.outcomes()[0];
  EXPECT_EQ(outcome.finish, FinishReason::kStop);
  EXPECT_EQ(outcome.tokens.size(), 3u);  // the stop token is the last one returned
  EXPECT_EQ(outcome.tokens.back(), third);

  struct Case {
    std::vector<int32_t> prompt;
    SamplingParams params;
    std::string message;
  };
  SamplingParams too_long = greedy(model_config(*model).max_position);
  SamplingParams zero = greedy(0);
  SamplingParams hot = greedy(4);
  hot.temperature = -1;
  SamplingParams stop_text = greedy(4);
  stop_text.stop = {"."};
  std::vector<Case> cases = {
      {{}, greedy(4), "empty"},
      {{5, 300}, greedy(4), "token id 300"},
      {{5, -1}, greedy(4), "token id -1"},
      {{5, 6}, too_long, "context"},
      {{5, 6}, zero, "max_tokens"},
      {{5, 6}, hot, "temperature"},
      {{5, 6}, stop_text, "tokenizer"},
  };
  for (Case& c : cases) {
    Result<uint64_t> id = (*engine)->submit({c.prompt, c.params, collector.callback(1)});
    ASSERT_FALSE(id.is_ok()) << c.message;
    EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(id.status().message().find(c.message), std::string::npos) << id.status().message();
  }
  EXPECT_EQ((*engine)->stats().waiting, 0);
}

// Thousands of requests of random lengths, a third cancelled at random moments, on a KV cache
// that holds a few sequences at once: every request ends exactly once, finished ones with all
// their tokens, and no block leaks.
TEST(EngineTest, SchedulerInvariantsUnderRandomLoadAndCancellations) {
  std::shared_ptr<const Model> model = load_fp32("llama3-rope");
  EngineOptions options;
  options.kv_cache_tokens = 96;  // 24 blocks of 4: preemption is frequent
  options.kv_block_tokens = 4;
  options.max_sequences = 16;
  options.max_tokens_per_step = 48;
  options.max_waiting = 2000;  // every request is queued at once
  auto engine = create_engine(model, nullptr, options);
  ASSERT_TRUE(engine.is_ok());
  Collector collector;
  std::mt19937 rng(7);
  constexpr int kRequests = 2000;  // options.max_waiting above
  std::vector<uint64_t> ids;
  std::vector<int> max_tokens(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    std::vector<int32_t> prompt(1 + rng() % 40);
    for (int32_t& t : prompt) {
      t = static_cast<int32_t>(rng() % 256);
    }
    SamplingParams params;
    params.temperature = (rng() % 2) ? 0.0 : 1.0;
    params.max_tokens = max_tokens[i] = 1 + static_cast<int>(rng() % 24);
    params.ignore_eos = true;
    Result<uint64_t> id = (*engine)->submit({prompt, params, collector.callback(i)});
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    ids.push_back(*id);
    if (rng() % 3 == 0) {
      (*engine)->cancel(ids[rng() % ids.size()]);
    }
  }
  ASSERT_TRUE(collector.wait_for(kRequests));
  int cancelled = 0;
  for (auto& [key, outcome] : collector.outcomes()) {
    EXPECT_EQ(outcome.finals, 1) << key;
    if (outcome.finish == FinishReason::kCancelled) {
      ++cancelled;
      EXPECT_LE(static_cast<int>(outcome.tokens.size()), max_tokens[key]);
    } else {
      EXPECT_EQ(outcome.finish, FinishReason::kLength) << key;
      EXPECT_EQ(static_cast<int>(outcome.tokens.size()), max_tokens[key]) << key;
    }
  }
  EXPECT_GT(cancelled, 0);
  EngineStats stats = (*engine)->stats();
  EXPECT_EQ(stats.kv_blocks_used, 0);
  EXPECT_EQ(stats.running, 0);
  EXPECT_EQ(stats.waiting, 0);
  EXPECT_GT(stats.preemptions, 0);
  std::printf("%d requests, %d cancelled, %lld steps, %lld preemptions\n", kRequests, cancelled,
              static_cast<long long>(stats.steps), static_cast<long long>(stats.preemptions));
}

TEST(EngineTest, AFullQueueRefusesMoreUntilItDrains) {
  std::shared_ptr<const Model> model = load_fp32("llama-gqa");
  EngineOptions options;
  options.max_waiting = 3;
  options.max_sequences = 1;  // one runs for 20 steps while the loop below fills the queue
  auto engine = create_engine(model, nullptr, options);
  ASSERT_TRUE(engine.is_ok());
  Collector collector;
  // Submitted far faster than one sequence at a time drains them: most are refused, none of
  // the accepted ones is lost.
  int accepted = 0, refused = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) {
    Result<uint64_t> id = (*engine)->submit({{5, 6, 7}, greedy(20), collector.callback(accepted)});
    if (id.is_ok()) {
      ++accepted;
    } else {
      EXPECT_EQ(id.status().code(), StatusCode::kResourceExhausted);
      ++refused;
    }
  }
  ASSERT_TRUE(collector.wait_for(accepted));
  EXPECT_GE(accepted, 3);
  EXPECT_GT(refused, 0);
  EXPECT_EQ(static_cast<int>(collector.outcomes().size()), accepted);
  // The queue's integral: the accepted requests waited for the one sequence slot, none longer
  // than the whole run.
  const double waited = (*engine)->stats().queue_wait_seconds;
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(waited, 0);
  EXPECT_LE(waited, accepted * wall);
  EXPECT_EQ((*engine)->stats().queue_wait_seconds, waited);  // nothing waits any more
  // Drained: accepted again.
  EXPECT_TRUE((*engine)->submit({{5, 6, 7}, greedy(4), collector.callback(accepted)}).is_ok());
  ASSERT_TRUE(collector.wait_for(accepted + 1));
  std::printf("%d accepted, %d refused\n", accepted, refused);
}

TEST(EngineTest, InvalidOptionsAreRefused) {
  std::shared_ptr<const Model> model = load_fp32("llama-gqa");
  const std::vector<std::pair<const char*, void (*)(EngineOptions&)>> cases = {
      {"kv_block_tokens 0",
       [](EngineOptions& o) {
         o.kv_block_tokens = 0;
       }},
      {"max_sequences 0",
       [](EngineOptions& o) {
         o.max_sequences = 0;
       }},
      {"max_waiting 0",
       [](EngineOptions& o) {
         o.max_waiting = 0;
       }},
      {"max_tokens_per_step 0",
       [](EngineOptions& o) {
         o.max_tokens_per_step = 0;
       }},
      {"max_prefill_tokens_per_step -1",
       [](EngineOptions& o) {
         o.max_prefill_tokens_per_step = -1;
       }},
      {"kv_cache_tokens -1",
       [](EngineOptions& o) {
         o.kv_cache_tokens = -1;
       }},
  };
  for (const auto& [name, spoil] : cases) {
    EngineOptions options;
    spoil(options);
    auto engine = create_engine(model, nullptr, options);
    ASSERT_FALSE(engine.is_ok()) << name;
    EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument) << name;
  }
  EngineOptions unbounded_prefill;  // 0: only the step's budget bounds prompt chunks
  unbounded_prefill.max_prefill_tokens_per_step = 0;
  EXPECT_TRUE(create_engine(model, nullptr, unbounded_prefill).is_ok());
}

// A request that arrives during a step joins the next one: with room for all, nothing waits
// for room, however the arrivals fall against the steps (what the vertical autoscaler reads
// as in-replica queueing must not count the batching itself).
TEST(EngineTest, JoiningTheNextStepIsNotWaitingForRoom) {
  std::shared_ptr<const Model> model = load_fp32("llama-gqa");
  auto engine = create_engine(model, nullptr, EngineOptions{});
  ASSERT_TRUE(engine.is_ok());
  Collector collector;
  int accepted = 0;
  for (int i = 0; i < 24; ++i) {
    ASSERT_TRUE((*engine)->submit({{5, 6, 7}, greedy(8), collector.callback(accepted)}).is_ok());
    ++accepted;
    std::this_thread::sleep_for(std::chrono::microseconds(300 * (i % 4)));
  }
  ASSERT_TRUE(collector.wait_for(accepted));
  EXPECT_EQ((*engine)->stats().queue_wait_seconds, 0);
}

TEST(EngineTest, DestroyingTheEngineCancelsWhatIsLeft) {
  std::shared_ptr<const Model> model = load_fp32("llama-gqa");
  Collector collector;
  {
    auto engine = create_engine(model, nullptr, {});
    ASSERT_TRUE(engine.is_ok());
    for (int i = 0; i < 20; ++i) {
      ASSERT_TRUE((*engine)->submit({{5, 6, 7}, greedy(100), collector.callback(i)}).is_ok());
    }
  }
  ASSERT_TRUE(collector.wait_for(20));
  for (auto& [key, outcome] : collector.outcomes()) {
    EXPECT_EQ(outcome.finals, 1);
  }
}

}  // namespace
}  // namespace flotilla::llm

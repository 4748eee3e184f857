#include "replica/openai_handler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>

#include "protocol/protocol.h"

namespace flotilla::replica {
namespace {

using Clock = std::chrono::steady_clock;

// nginx's code for "the client closed the request before the answer": counted, never sent.
constexpr int kClientClosed = 499;

std::string response_id(bool chat) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(rng()));
  return (chat ? "chatcmpl-" : "cmpl-") + std::string(hex);
}

// An OpenAI error; a full queue (429) says when to come back, as the gateway's 429s do.
http::Response error_response(int status, const std::string& message) {
  http::Response response = json_response(status, protocol::encode_openai_error(status, message));
  if (status == 429) {
    response.headers.emplace_back("Retry-After", "1");
  }
  return response;
}

// A token as logprobs show it (protocol::TokenChoice): logprob_token_text() of its bytes, unless
// an earlier token of `taken` has that form (two ids with the same bytes, as a SentencePiece
// byte token "<0x41>" and "A"): then its vocabulary entry, then "token_id:N". Completions'
// top_logprobs is an object keyed by these, so each token of a position needs its own key.
protocol::TokenChoice token_choice(const runtime::Generator& generator, int32_t id, float logprob,
                                   const std::vector<protocol::TokenChoice>& taken) {
  runtime::Generator::TokenForms forms = generator.token_forms(id);
  auto is_taken = [&taken](const std::string& token) {
    return std::any_of(taken.begin(), taken.end(),
                       [&token](const protocol::TokenChoice& c) { return c.token == token; });
  };
  std::string token = forms.bytes ? protocol::logprob_token_text(*forms.bytes) : forms.piece;
  if (is_taken(token)) {
    token = is_taken(forms.piece) || forms.piece.empty() ? "token_id:" + std::to_string(id)
                                                         : std::move(forms.piece);
  }
  return {std::move(token), std::move(forms.bytes), logprob};
}

protocol::LogprobEntry logprob_entry(const runtime::Generator& generator, const TokenLogprob& lp,
                                     int top_logprobs) {
  protocol::LogprobEntry entry;
  const int top = std::min(top_logprobs, static_cast<int>(lp.top.size()));
  for (int i = 0; i < top; ++i) {
    entry.top.push_back(token_choice(generator, lp.top[i].first, lp.top[i].second, entry.top));
  }
  // The chosen token is shown as it is among the top ones, when it is one of them.
  entry.chosen = token_choice(generator, lp.token, lp.logprob, {});
  for (int i = 0; i < top; ++i) {
    if (lp.top[i].first == lp.token) {
      entry.chosen.token = entry.top[i].token;
    }
  }
  return entry;
}

// One request's answer in progress. Events come in order from the engine's output thread.
struct Generation {
  std::shared_ptr<http::Responder> responder;
  std::function<void(int)> done;
  bool stream = false;
  bool include_usage = false;
  int top_logprobs = 0;
  protocol::CompletionOutput output;  // the whole answer, or the current chunk when streaming
  bool started = false;               // the stream's head has been sent
  bool had_token = false;
  Clock::time_point last_token;
  std::shared_ptr<RequestTrace> traced;  // null unless sampled
};

// A traced generation's spans from its final event: the wait for room in the engine, the
// prompt's computation up to the first token, and the decoding after it.
void record_engine_spans(RequestTrace& traced, const GenerationEvent& event) {
  const Clock::time_point end = Clock::now();
  const Clock::time_point unset{};
  traced.server.set("gen_ai.usage.input_tokens", event.prompt_tokens);
  traced.server.set("gen_ai.usage.output_tokens", event.completion_tokens);
  if (event.submitted == unset) {
    return;
  }
  const Clock::time_point scheduled = event.scheduled == unset ? end : event.scheduled;
  traced.record("llm queue", event.submitted, scheduled);
  if (event.scheduled == unset) {
    return;
  }
  const Clock::time_point first = event.first_token == unset ? end : event.first_token;
  trace::Span prefill = traced.child("llm prefill", scheduled, first);
  prefill.set("gen_ai.usage.input_tokens", event.prompt_tokens);
  traced.tracer.record(std::move(prefill));
  if (event.first_token != unset) {
    traced.server.set("flotilla.llm.time_to_first_token_ms",
                      std::chrono::duration<double, std::milli>(first - event.submitted).count());
    trace::Span decode = traced.child("llm decode", first, end);
    decode.set("gen_ai.usage.output_tokens", event.completion_tokens);
    traced.tracer.record(std::move(decode));
  }
}

}  // namespace

OpenAiHandler::OpenAiHandler(runtime::Generator& generator, std::string model_name,
                             MetricsRegistry& registry)
    : generator_(generator),
      model_name_(std::move(model_name)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()),
      time_to_first_token_(
          registry.histogram("flotilla_llm_time_to_first_token_seconds",
                             "From a generation request's arrival to its first generated token.",
                             exponential_buckets(1e-3, 2, 16))),
      inter_token_latency_(registry.histogram("flotilla_llm_inter_token_latency_seconds",
                                              "Between consecutive tokens of one generation.",
                                              exponential_buckets(1e-4, 2, 16))) {
  auto stat = [&generator](auto field) {
    return [&generator, field] {
      return static_cast<double>(generator.stats().*field);
    };
  };
  using Stats = runtime::GeneratorStats;
  registry.callback("flotilla_llm_running_sequences", "Sequences in the running batch.", "gauge",
                    stat(&Stats::running));
  registry.callback("flotilla_llm_waiting_sequences",
                    "Sequences waiting for a place in the batch or for KV cache.", "gauge",
                    stat(&Stats::waiting));
  registry.callback("flotilla_llm_kv_blocks_used", "KV cache blocks held by sequences.", "gauge",
                    stat(&Stats::kv_blocks_used));
  registry.callback("flotilla_llm_kv_blocks_free", "KV cache blocks free.", "gauge", [&generator] {
    runtime::GeneratorStats stats = generator.stats();
    return static_cast<double>(stats.kv_blocks_total - stats.kv_blocks_used);
  });
  registry.callback("flotilla_llm_prompt_tokens_total", "Prompt tokens processed.", "counter",
                    stat(&Stats::prompt_tokens));
  registry.callback("flotilla_llm_generated_tokens_total", "Tokens generated.", "counter",
                    stat(&Stats::generated_tokens));
  registry.callback("flotilla_llm_preemptions_total",
                    "Sequences whose KV cache was taken back to make room (recomputed later).",
                    "counter", stat(&Stats::preemptions));
  // vLLM's pair (vllm:prefix_cache_queries, vllm:prefix_cache_hits): the hit rate over any
  // window is the ratio of their rates.
  registry.callback("flotilla_llm_prefix_cache_queries_total",
                    "Prompt tokens of admitted requests looked up in the prefix cache.", "counter",
                    stat(&Stats::prefix_cache_queried_tokens));
  registry.callback("flotilla_llm_prefix_cache_hits_total",
                    "Of those, tokens found in cached KV blocks (not computed again).", "counter",
                    stat(&Stats::prefix_cache_hit_tokens));
}

std::string OpenAiHandler::models_json() const {
  return protocol::encode_openai_models(model_name_, created_, generator_.context_length());
}

std::string OpenAiHandler::model_json() const {
  return protocol::encode_openai_model(model_name_, created_, generator_.context_length());
}

void OpenAiHandler::completions(http::Request&& request, std::shared_ptr<http::Responder> responder,
                                bool chat, std::shared_ptr<RequestTrace> traced,
                                std::function<void(int)> done) {
  auto fail = [&](const Status& status) {
    int code = http_status_for(status.code());
    responder->send(error_response(code, status.message()));
    done(code);
  };
  Result<protocol::CompletionRequest> decoded =
      protocol::decode_completion_request(request.body, chat);
  if (!decoded.is_ok()) {
    fail(decoded.status());
    return;
  }
  if (!decoded->model.empty() && decoded->model != model_name_) {
    fail(not_found("model '" + decoded->model + "' does not exist; this server serves '" +
                   model_name_ + "'"));
    return;
  }
  if (traced) {
    traced->record("decode", traced->server.start, Clock::now());
    traced->server.set("gen_ai.request.model", model_name_);
  }
  auto generation = std::make_shared<Generation>();
  generation->traced = std::move(traced);
  generation->responder = responder;
  generation->done = std::move(done);
  generation->stream = decoded->stream;
  generation->include_usage = decoded->include_usage;
  generation->top_logprobs = decoded->top_logprobs;
  protocol::CompletionOutput& out = generation->output;
  out.chat = chat;
  out.id = response_id(chat);
  out.model = model_name_;
  out.created = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  out.return_token_ids = decoded->return_token_ids;
  out.want_logprobs = decoded->want_logprobs;

  auto on_event = [this, generation](GenerationEvent&& event) {
    Generation& g = *generation;
    protocol::CompletionOutput& out = g.output;
    if (!event.tokens.empty()) {
      auto now = Clock::now();
      if (g.had_token) {
        inter_token_latency_.observe(std::chrono::duration<double>(now - g.last_token).count());
      } else {
        time_to_first_token_.observe(event.time_to_first_token_s);
      }
      g.had_token = true;
      g.last_token = now;
    }
    out.prompt_tokens = event.prompt_tokens;
    out.completion_tokens = event.completion_tokens;
    if (g.traced && event.finish != FinishReason::kNone) {
      record_engine_spans(*g.traced, event);
    }
    if (event.finish == FinishReason::kCancelled) {
      // The client went away (or the server stops): there is no one to answer.
      if (g.started) {
        g.responder->finish();
      } else {
        g.responder->send(
            json_response(503, protocol::encode_openai_error(503, "the generation was cancelled")));
      }
      g.done(kClientClosed);
      return;
    }
    if (event.finish == FinishReason::kError) {
      std::string error = protocol::encode_openai_error(500, event.error);
      if (g.started) {
        g.responder->write("data: " + error + "\n\n" + std::string(protocol::kSseDone));
        g.responder->finish();
      } else {
        g.responder->send(json_response(500, std::move(error)));
      }
      g.done(500);
      return;
    }
    if (g.stream) {
      out.text.clear();
      out.token_ids.clear();
      out.logprobs.clear();
    }
    out.text += event.text;
    out.token_ids.insert(out.token_ids.end(), event.tokens.begin(), event.tokens.end());
    for (const TokenLogprob& lp : event.logprobs) {
      out.logprobs.push_back(logprob_entry(generator_, lp, g.top_logprobs));
    }
    bool final = event.finish != FinishReason::kNone;
    out.finish_reason = finish_reason_name(event.finish);  // "" while it goes on
    if (!g.stream) {
      if (final) {
        g.responder->send(json_response(200, protocol::encode_completion_response(out)));
        g.done(200);
      }
      return;
    }
    if (!g.started) {
      g.responder->start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
    }
    // A token whose text is held back (an incomplete character, a possible stop string) makes
    // no chunk unless the client wants token ids.
    if (!out.text.empty() || final || (out.return_token_ids && !out.token_ids.empty()) ||
        !g.started) {
      g.responder->write(protocol::encode_completion_chunk(out, !g.started));
    }
    g.started = true;
    if (final) {
      if (g.include_usage) {
        g.responder->write(protocol::encode_usage_chunk(out));
      }
      g.responder->write(std::string(protocol::kSseDone));
      g.responder->finish();
      g.done(200);
    }
  };
  Result<uint64_t> id = generator_.generate(std::move(decoded->generation), std::move(on_event));
  if (!id.is_ok()) {
    int code = http_status_for(id.status().code());
    responder->send(error_response(code, id.status().message()));
    generation->done(code);  // `done` itself was moved into the generation
    return;
  }
  responder->on_client_gone([this, id = *id] { generator_.cancel(id); });
}

}  // namespace flotilla::replica

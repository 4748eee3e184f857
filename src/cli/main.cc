// `flotilla`: the command-line entry point. Subcommands: replica, gateway, sim, up, and the
// control-plane client commands (deploy, ls, get, predict, rm, tokens, events).
#include <algorithm>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "common/common.h"
#include "http/http.h"
#include "orchestrator/orchestrator.h"
#include "replica/replica_process.h"
#include "runtime/runtime.h"

namespace flotilla {
namespace {

static_assert(replica::kExitBadInput == cli::kExitBadInput &&
              replica::kExitCannotListen == cli::kExitCannotListen &&
              replica::kExitDrainTimeout == cli::kExitDrainTimeout);

using ReplicaFlags = replica::ProcessFlags;

// The llm runtime's settings (docs/llm.md).
void add_llm_options(CLI::App& cmd, runtime::LlmRuntimeOptions& llm) {
  cmd.add_option("--dtype", llm.dtype,
                 "llm: weight format, auto (bfloat16 for 16-bit checkpoints), float32 or bfloat16")
      ->check(CLI::IsMember({"auto", "float32", "bfloat16"}))
      ->capture_default_str();
  cmd.add_option("--quantize", llm.quantize,
                 "llm: weight-only quantization with one scale per output channel of the MLP "
                 "and LM head: none, int8 or fp8 (e4m3)")
      ->check(CLI::IsMember({"none", "int8", "fp8"}))
      ->capture_default_str();
  cmd.add_flag("--quantize-attention", llm.quantize_attention,
               "llm: quantize the attention projections too (default: they keep --dtype)");
  cmd.add_flag("--skip-tokenizer", llm.skip_tokenizer,
               "llm: serve a model directory without tokenizer files; token-id prompts only");
  cmd.add_option("--llm-threads", llm.threads, "llm: compute threads (0: every core)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  cmd.add_option("--max-sequences", llm.engine.max_sequences,
                 "llm: sequences in the running batch at once")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd.add_option("--max-waiting", llm.engine.max_waiting,
                 "llm: queued requests past which new ones get 429")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd.add_option("--max-tokens-per-step", llm.engine.max_tokens_per_step,
                 "llm: prompt and decode tokens of one forward step")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd.add_option("--max-prefill-tokens-per-step", llm.engine.max_prefill_tokens_per_step,
                 "llm: of those, prompt tokens (0: no separate bound); smaller keeps decoders' "
                 "steps short while prompts join, larger gets prompts their first token sooner")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd.add_option("--kv-cache-tokens", llm.engine.kv_cache_tokens,
                 "llm: KV cache size in tokens (0: max-sequences full contexts, at most 64K)")
      ->check(CLI::Range(0, 1 << 26))
      ->capture_default_str();
  cmd.add_option("--kv-block-tokens", llm.engine.kv_block_tokens,
                 "llm: tokens per KV cache block (the prefix cache reuses whole blocks)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd.add_flag(
      "--no-prefix-caching", [&llm](int64_t) { llm.engine.prefix_caching = false; },
      "llm: compute every prompt in full, even when its start is cached");
  cmd.add_flag(
      "--no-overlap", [&llm](int64_t) { llm.engine.overlap_postprocessing = false; },
      "llm: do the output work of a step on the engine thread (for comparison)");
}

void add_replica_command(CLI::App& app, ReplicaFlags& flags) {
  CLI::App* cmd = app.add_subcommand(
      "replica",
      "Serve one model over the Open Inference "
      "Protocol v2, MLflow /invocations, OpenAI /v1 (language models) and /metrics.");
  cmd->add_option("--model", flags.model,
                  "Model file or MLflow model directory, or an http(s) URL of either (a "
                  "directory: .../flotilla-manifest.json) pulled into --cache-dir (required)");
  cmd->add_option("--cache-dir", flags.cache_dir, "Artifact cache for URL models")
      ->capture_default_str();
  cmd->add_flag("--no-lazy-load", flags.no_lazy_load,
                "URL models: download the whole model before loading it (default: loading "
                "overlaps the download, the loader's reads fetched first)");
  cmd->add_option("--name", flags.name, "Model name (default: the file's stem or directory name)");
  cmd->add_option("--model-version", flags.model_version,
                  "The model's version: what /v2/models/NAME/versions/V/... must name, and "
                  "model_version in responses")
      ->check([](const std::string& v) {
        return v.empty() || v.size() > 128 || v.find_first_of("/?#% \t") != std::string::npos
                   ? std::string("must be 1 to 128 characters, none of / ? # % or a space")
                   : std::string();
      })
      ->capture_default_str();
  cmd->add_option("--runtime", flags.runtime,
                  "auto, xgboost, llm or synthetic (auto never picks synthetic)")
      ->check(CLI::IsMember({"auto", "xgboost", "llm", "synthetic"}))
      ->capture_default_str();
  add_llm_options(*cmd, flags.llm);
  cmd->add_option("--host", flags.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", flags.port, "Port to listen on; 0 picks a free one (printed on stdout)")
      ->capture_default_str();
  cmd->add_option("--grpc-port", flags.grpc_port,
                  "Also serve the Open Inference Protocol over gRPC on this port of --host (0: "
                  "any free one; default: no gRPC)");
  cmd->add_option("--workers", flags.workers, "Event-loop threads (0: one per core)")
      ->check(CLI::Range(0, 256))
      ->capture_default_str();
  cmd->add_option("--max-batch-size", flags.max_batch_size,
                  "Rows merged into one model call at most")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--max-queue-delay-us", flags.max_queue_delay_us,
                  "How long a batch waits for more rows (0: never wait)")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000}))
      ->capture_default_str();
  cmd->add_flag("--no-batching", flags.no_batching, "Run every request on its own");
  cmd->add_option("--max-body-bytes", flags.max_body_bytes,
                  "Largest request body accepted (413 above)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 32))
      ->capture_default_str();
  cmd->add_option("--header-timeout-ms", flags.header_timeout_ms,
                  "Time to receive a request header")
      ->check(CLI::Range(int64_t{1}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--body-timeout-ms", flags.body_timeout_ms, "Time to receive a request body")
      ->check(CLI::Range(int64_t{1}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--idle-timeout-ms", flags.idle_timeout_ms, "Idle keep-alive connection lifetime")
      ->check(CLI::Range(int64_t{1}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--drain-timeout-ms", flags.drain_timeout_ms,
                  "On SIGTERM, how long in-flight requests may take before exit")
      ->check(CLI::Range(int64_t{0}, int64_t{3'600'000}))
      ->capture_default_str();
  cmd->add_option("--predict-threads", flags.predict_threads, "Threads one model call may use")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--log-level", flags.log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  cli::add_log_format_flag(*cmd, flags.log_format);
  cli::add_tracing_flags(*cmd, flags.otlp_endpoint, flags.trace_sample_ratio);
  cmd->add_option("--replica-id", flags.replica_id,
                  "This replica's id in its log lines (given by the orchestrator; default: "
                  "$POD_NAME)");
  cmd->add_flag("--standby", flags.standby,
                "Warm pool mode (for orchestrators): start, then read one JSON line "
                "{\"args\": [replica flags]} from stdin and serve as if started with them; "
                "exit on end of input");
}

// The flags of a standby's stdin line, parsed as `flotilla replica` parses its own.
Result<ReplicaFlags> parse_replica_flags(std::vector<std::string> args) {
  CLI::App app{"flotilla replica (from standby)"};
  ReplicaFlags flags;
  add_replica_command(app, flags);
  args.insert(args.begin(), "replica");
  std::reverse(args.begin(), args.end());  // CLI11 takes arguments in reverse order
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return invalid_argument(e.what());
  }
  return flags;
}

int run_standby(const ReplicaFlags& flags) {
  return replica::run_standby_process(
      flags,
      {orchestrator::exit_with_parent, orchestrator::disarm_parent_death, parse_replica_flags});
}

}  // namespace
}  // namespace flotilla

int main(int argc, char** argv) {
  CLI::App app{"Flotilla: real-time model serving"};
  app.require_subcommand(1);
  app.set_version_flag("--version", FLOTILLA_VERSION);
  flotilla::ReplicaFlags replica_flags;
  flotilla::add_replica_command(app, replica_flags);
  auto run_gateway = flotilla::cli::add_gateway_command(app);
  auto run_controller = flotilla::cli::add_controller_command(app);
  auto run_sim = flotilla::cli::add_sim_command(app);
  auto run_up = flotilla::cli::add_up_command(app);
  auto run_client = flotilla::cli::add_client_commands(app);
  auto run_artifact = flotilla::cli::add_artifact_commands(app);
  auto run_top = flotilla::cli::add_top_command(app);
  auto run_logs = flotilla::cli::add_logs_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // Servers size their connection caps from the descriptor limit: a shell's default soft
  // limit (1024) is usually far below the hard one.
  if (app.got_subcommand("replica") || app.got_subcommand("gateway") || app.got_subcommand("up")) {
    flotilla::http::raise_open_file_limit();
  }
  if (app.got_subcommand("replica")) {
    return replica_flags.standby ? flotilla::run_standby(replica_flags)
                                 : flotilla::replica::run_replica_process(replica_flags);
  }
  if (app.got_subcommand("gateway")) {
    return run_gateway();
  }
  if (app.got_subcommand("controller")) {
    return run_controller();
  }
  if (app.got_subcommand("sim")) {
    return run_sim();
  }
  if (app.got_subcommand("up")) {
    return run_up();
  }
  if (const int code = run_artifact(); code >= 0) {
    return code;
  }
  if (const int code = run_top(); code >= 0) {
    return code;
  }
  if (const int code = run_logs(); code >= 0) {
    return code;
  }
  const int code = run_client();
  return code < 0 ? 0 : code;
}

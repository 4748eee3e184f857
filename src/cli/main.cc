// `flotilla`: the command-line entry point. Subcommands: replica, gateway, sim, up, and the
// control-plane client commands (deploy, ls, get, predict, rm, tokens, events).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "common/common.h"
#include "replica/replica.h"
#include "runtime/runtime.h"
#include "store/store.h"

namespace flotilla {
namespace {

using cli::kExitBadInput;
using cli::kExitCannotListen;
using cli::kExitDrainTimeout;

struct ReplicaFlags {
  std::string model;
  std::string name;
  std::string runtime = "auto";
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  int workers = 0;
  int64_t max_batch_size = 64;
  int64_t max_queue_delay_us = 0;
  bool no_batching = false;
  size_t max_body_bytes = 8 * 1024 * 1024;
  int64_t header_timeout_ms = 10'000;
  int64_t body_timeout_ms = 30'000;
  int64_t idle_timeout_ms = 60'000;
  int64_t drain_timeout_ms = 30'000;
  int predict_threads = 1;
  std::string log_level = "info";
  std::string cache_dir = ".flotilla/cache";
  bool standby = false;
  runtime::LlmRuntimeOptions llm;
};

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
  cmd.add_option("--kv-cache-tokens", llm.engine.kv_cache_tokens,
                 "llm: KV cache size in tokens (0: max-sequences full contexts, at most 64K)")
      ->check(CLI::Range(0, 1 << 26))
      ->capture_default_str();
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
  cmd->add_option("--name", flags.name, "Model name (default: the file's stem or directory name)");
  cmd->add_option("--runtime", flags.runtime,
                  "auto, xgboost, llm or synthetic (auto never picks synthetic)")
      ->check(CLI::IsMember({"auto", "xgboost", "llm", "synthetic"}))
      ->capture_default_str();
  add_llm_options(*cmd, flags.llm);
  cmd->add_option("--host", flags.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", flags.port, "Port to listen on; 0 picks a free one (printed on stdout)")
      ->capture_default_str();
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
  cmd->add_flag("--standby", flags.standby,
                "Warm pool mode (for orchestrators): start, then read one JSON line "
                "{\"args\": [replica flags]} from stdin and serve as if started with them; "
                "exit on end of input");
}

int run_replica(const ReplicaFlags& flags);

// A warm pool process: everything a replica needs is loaded; the model comes later, on stdin,
// so that a scale-up pays only for the model load.
int run_standby(const ReplicaFlags& standby_flags) {
  if (Status status = init_logging(standby_flags.log_level); !status.is_ok()) {
    std::cerr << "flotilla replica: " << status.message() << "\n";
    return kExitBadInput;
  }
  if (auto kind = runtime::parse_runtime_kind(standby_flags.runtime); kind.is_ok()) {
    if (Status warmed = runtime::warm_up(*kind); !warmed.is_ok()) {
      spdlog::warn("standby: {}", warmed.message());
    }
  }
  spdlog::info("standby: waiting on stdin for the model to serve");
  std::string line;
  if (!std::getline(std::cin, line)) {
    return 0;  // the orchestrator closed the pool
  }
  std::vector<std::string> args;
  try {
    args = nlohmann::json::parse(line).at("args").get<std::vector<std::string>>();
  } catch (const std::exception& e) {
    std::cerr << "flotilla replica --standby: bad command line on stdin: " << e.what() << "\n";
    return kExitBadInput;
  }
  CLI::App app{"flotilla replica (from standby)"};
  ReplicaFlags flags;
  add_replica_command(app, flags);
  args.insert(args.begin(), "replica");
  std::reverse(args.begin(), args.end());  // CLI11 takes arguments in reverse order
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    std::cerr << "flotilla replica --standby: " << e.what() << "\n";
    return kExitBadInput;
  }
  if (flags.standby) {
    std::cerr << "flotilla replica --standby: --standby on stdin\n";
    return kExitBadInput;
  }
  return run_replica(flags);
}

// The model as a local path: a URL is pulled into the cache first (or found there).
Result<std::string> local_model(const ReplicaFlags& flags) {
  if (!store::is_url(flags.model)) {
    return flags.model;
  }
  FLOTILLA_ASSIGN_OR_RETURN(std::unique_ptr<store::ArtifactCache> cache,
                            store::ArtifactCache::open(flags.cache_dir, 0));
  const auto start = std::chrono::steady_clock::now();
  FLOTILLA_ASSIGN_OR_RETURN(std::string path, cache->pull(flags.model, store::PullOptions{}));
  spdlog::info("model {} is {} ({:.3f} s)", flags.model, path,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return path;
}

// What the default model name comes from: the local path, except for a directory from a
// manifest URL (its cache directory is named by digest): the URL's directory.
std::string model_name_source(const std::string& model, const std::string& local) {
  if (!store::is_url(model) || !model.ends_with(store::kManifestName)) {
    return local;
  }
  const std::string directory = model.substr(0, model.size() - store::kManifestName.size() - 1);
  return directory.substr(directory.rfind('/') + 1);
}

int run_replica(const ReplicaFlags& flags) {
  if (Status status = init_logging(flags.log_level); !status.is_ok()) {
    std::cerr << "flotilla replica: " << status.message() << "\n";
    return kExitBadInput;
  }
  if (flags.model.empty()) {
    std::cerr << "flotilla replica: --model is required\n";
    return kExitBadInput;
  }
  auto kind = runtime::parse_runtime_kind(flags.runtime);
  if (!kind.is_ok()) {
    std::cerr << "flotilla replica: " << kind.status().message() << "\n";
    return kExitBadInput;
  }
  const auto load_start = std::chrono::steady_clock::now();
  Result<std::string> model = local_model(flags);
  if (!model.is_ok()) {
    std::cerr << "flotilla replica: cannot fetch model: " << model.status().message() << "\n";
    return model.status().code() == StatusCode::kInvalidArgument ? kExitBadInput : 1;
  }
  runtime::RuntimeOptions runtime_options;
  runtime_options.name = flags.name.empty()
                             ? runtime::default_model_name(model_name_source(flags.model, *model))
                             : flags.name;
  runtime_options.predict_threads = flags.predict_threads;
  runtime_options.llm = flags.llm;
  auto runtime = runtime::load_runtime(*kind, *model, runtime_options);
  if (!runtime.is_ok()) {
    std::cerr << "flotilla replica: cannot load model: " << runtime.status().message() << "\n";
    return kExitBadInput;
  }
  replica::ReplicaOptions options;
  options.model_load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  options.server.host = flags.host;
  options.server.port = flags.port;
  options.server.workers = flags.workers;
  options.server.max_body_bytes = flags.max_body_bytes;
  options.server.header_timeout = std::chrono::milliseconds(flags.header_timeout_ms);
  options.server.body_timeout = std::chrono::milliseconds(flags.body_timeout_ms);
  options.server.idle_timeout = std::chrono::milliseconds(flags.idle_timeout_ms);
  options.batching.enabled = !flags.no_batching;
  options.batching.max_batch_rows = flags.max_batch_size;
  options.batching.max_queue_delay = std::chrono::microseconds(flags.max_queue_delay_us);
  options.drain_timeout = std::chrono::milliseconds(flags.drain_timeout_ms);

  MetricsRegistry& registry = default_registry();
  register_process_metrics(registry);
  auto replica = replica::Replica::create(std::move(runtime).value(), options, registry);
  if (!replica.is_ok()) {
    std::cerr << "flotilla replica: " << replica.status().message() << "\n";
    return replica.status().code() == StatusCode::kInvalidArgument ? kExitBadInput
                                                                   : kExitCannotListen;
  }
  // The first stdout line is for orchestrators: where to reach this replica.
  const nlohmann::json listening = {{"event", "listening"},
                                    {"host", flags.host},
                                    {"port", (*replica)->port()},
                                    {"model", runtime_options.name}};
  std::cout << listening.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
            << std::endl;
  spdlog::info("serving model '{}' on {}:{} (model loaded in {:.3f} s)", runtime_options.name,
               flags.host, (*replica)->port(), options.model_load_seconds);
  const bool clean = (*replica)->run();
  spdlog::info(clean ? "drained, exiting" : "drain timed out, exiting");
  return clean ? 0 : kExitDrainTimeout;
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
  auto run_sim = flotilla::cli::add_sim_command(app);
  auto run_up = flotilla::cli::add_up_command(app);
  auto run_client = flotilla::cli::add_client_commands(app);
  auto run_artifact = flotilla::cli::add_artifact_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (app.got_subcommand("replica")) {
    return replica_flags.standby ? flotilla::run_standby(replica_flags)
                                 : flotilla::run_replica(replica_flags);
  }
  if (app.got_subcommand("gateway")) {
    return run_gateway();
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
  const int code = run_client();
  return code < 0 ? 0 : code;
}

// `flotilla`: the command-line entry point. Subcommands: replica, gateway, sim, up, and the
// control-plane client commands (deploy, ls, get, predict, rm, tokens, events).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "common/common.h"
#include "http/http.h"
#include "orchestrator/orchestrator.h"
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
  std::string model_version = "1";
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
  bool no_lazy_load = false;
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
  // An idle standby dies with its orchestrator (a kill -9 of `flotilla up` closes its stdin
  // too, but a standby must not outlive it whatever holds that open).
  if (!orchestrator::exit_with_parent()) {
    return 0;
  }
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
  // A replica now: it outlives a restart of its orchestrator, which adopts it.
  orchestrator::disarm_parent_death();
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

// What the default model name comes from: the local path, except for a directory from a
// manifest URL (its cache directory is named by digest): the URL's directory.
std::string model_name_source(const std::string& model, const std::string& local) {
  if (!store::is_url(model) || !model.ends_with(store::kManifestName)) {
    return local;
  }
  const std::string directory = model.substr(0, model.size() - store::kManifestName.size() - 1);
  return directory.substr(directory.rfind('/') + 1);
}

// Download progress of a URL model in /metrics, for whoever watches a replica load.
std::function<void(const store::Progress&)> download_gauges(MetricsRegistry& registry) {
  Gauge& done = registry.gauge("flotilla_model_download_bytes",
                               "Bytes of the model's files downloaded so far (a resumed download "
                               "counts what it had).");
  Gauge& size = registry.gauge("flotilla_model_download_size_bytes",
                               "Bytes of the model's files being downloaded; 0 while unknown.");
  Gauge& rate = registry.gauge("flotilla_model_download_bytes_per_second",
                               "Download rate of the model's files.");
  Gauge& eta = registry.gauge("flotilla_model_download_eta_seconds",
                              "Seconds the download should still take at its current rate; 0 "
                              "when done or unknown.");
  return [&done, &size, &rate, &eta](const store::Progress& progress) {
    done.set(static_cast<double>(progress.done_bytes));
    size.set(static_cast<double>(progress.total_bytes));
    rate.set(progress.bytes_per_second);
    eta.set(progress.bytes_per_second > 0 && progress.total_bytes > progress.done_bytes
                ? static_cast<double>(progress.total_bytes - progress.done_bytes) /
                      progress.bytes_per_second
                : 0);
  };
}

// The model a replica serves and, for a URL, the pulled artifact: holding it pins it in the
// cache (eviction skips it) for as long as the replica lives.
struct ServedModel {
  std::unique_ptr<store::ArtifactCache> cache;
  std::unique_ptr<store::LazyArtifact> artifact;
  std::unique_ptr<runtime::Runtime> runtime;
  std::string name;
};

// Fetches and loads the model. A URL is pulled into the cache, and unless --no-lazy-load the
// loading overlaps the download: the runtime awaits each byte range before it reads it, the
// download fetches awaited ranges first, and the model is served only once every file has
// arrived and matched its digest. Errors say "cannot fetch model" or "cannot load model"; a
// load error is kInvalidArgument.
Result<ServedModel> load_model(const ReplicaFlags& flags, runtime::RuntimeKind kind,
                               MetricsRegistry& registry) {
  auto fetch_error = [](const Status& status) {
    return Status(status.code(), "cannot fetch model: " + status.message());
  };
  auto load_error = [](const Status& status) {
    return invalid_argument("cannot load model: " + status.message());
  };
  ServedModel served;
  std::string path = flags.model;
  const bool lazy = store::is_url(flags.model) && !flags.no_lazy_load;
  const auto start = std::chrono::steady_clock::now();
  if (store::is_url(flags.model)) {
    Result<std::unique_ptr<store::ArtifactCache>> cache =
        store::ArtifactCache::open(flags.cache_dir, 0);
    if (!cache.is_ok()) {
      return fetch_error(cache.status());
    }
    served.cache = std::move(cache).value();
    store::PullOptions pull;
    pull.on_progress = download_gauges(registry);
    Result<std::unique_ptr<store::LazyArtifact>> artifact =
        served.cache->pull_lazy(flags.model, pull);
    if (!artifact.is_ok()) {
      return fetch_error(artifact.status());
    }
    served.artifact = std::move(artifact).value();
    path = served.artifact->path();
    if (!lazy) {
      Result<std::string> fetched = served.artifact->finish();
      if (!fetched.is_ok()) {
        return fetch_error(fetched.status());
      }
      path = *fetched;
    }
  }
  runtime::RuntimeOptions options;
  options.name = flags.name.empty()
                     ? runtime::default_model_name(model_name_source(flags.model, path))
                     : flags.name;
  options.predict_threads = flags.predict_threads;
  options.llm = flags.llm;
  if (lazy) {
    options.await_bytes = [&served](const std::string& file, uint64_t offset, uint64_t length) {
      return served.artifact->await(file, offset, length);
    };
  }
  Result<std::unique_ptr<runtime::Runtime>> runtime = runtime::load_runtime(kind, path, options);
  if (lazy) {
    // Even when loading failed: bytes that fail their digest explain a load error best.
    Result<std::string> fetched = served.artifact->finish();
    if (!fetched.is_ok()) {
      return fetch_error(fetched.status());
    }
    path = *fetched;
  }
  if (!runtime.is_ok()) {
    return load_error(runtime.status());
  }
  if (store::is_url(flags.model)) {
    spdlog::info("model {} is {} (fetched{} in {:.3f} s)", flags.model, path,
                 lazy ? " and loaded" : "",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  served.runtime = std::move(runtime).value();
  served.name = options.name;
  return served;
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
  replica::ReplicaOptions options;
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
  options.model_version = flags.model_version;
  // SIGTERM or SIGINT while the model is fetched or loaded: nothing to drain, and a download
  // can take minutes, so exit now instead of when loading ends. Nothing was printed on stdout
  // yet; the model cache survives a process that dies mid-pull (flocks, resumable partials).
  options.on_drained_while_loading = [] {
    spdlog::info("drained while the model was loading, exiting");
    spdlog::default_logger()->flush();
    std::fflush(nullptr);
    std::_Exit(0);
  };

  MetricsRegistry& registry = default_registry();
  register_process_metrics(registry);
  // Listen before loading: liveness and /metrics (download progress) answer during a long
  // fetch, readiness and the model routes answer 503 until serve().
  auto replica = replica::Replica::listen(options, registry);
  if (!replica.is_ok()) {
    std::cerr << "flotilla replica: " << replica.status().message() << "\n";
    return replica.status().code() == StatusCode::kInvalidArgument ? kExitBadInput
                                                                   : kExitCannotListen;
  }
  spdlog::info("listening on {}:{}, loading the model", flags.host, (*replica)->port());
  const auto load_start = std::chrono::steady_clock::now();
  Result<ServedModel> model = load_model(flags, *kind, registry);
  if (!model.is_ok()) {
    std::cerr << "flotilla replica: " << model.status().message() << "\n";
    return model.status().code() == StatusCode::kInvalidArgument ? kExitBadInput : 1;
  }
  const std::chrono::duration<double> load_time = std::chrono::steady_clock::now() - load_start;
  if (Status served = (*replica)->serve(std::move(model->runtime), load_time); !served.is_ok()) {
    // A drain began before the model was in place (the signal raced the end of loading, and
    // on_drained_while_loading has not run yet): nothing to serve; wait for it to finish.
    spdlog::info("{}, exiting", served.message());
    (*replica)->run();
    return 0;
  }
  // The first stdout line is for orchestrators: where to reach this replica.
  const nlohmann::json listening = {{"event", "listening"},
                                    {"host", flags.host},
                                    {"port", (*replica)->port()},
                                    {"model", model->name}};
  std::cout << listening.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
            << std::endl;
  spdlog::info("serving model '{}' on {}:{} (model loaded in {:.3f} s)", model->name, flags.host,
               (*replica)->port(), load_time.count());
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
  // Servers size their connection caps from the descriptor limit: a shell's default soft
  // limit (1024) is usually far below the hard one.
  if (app.got_subcommand("replica") || app.got_subcommand("gateway") || app.got_subcommand("up")) {
    flotilla::http::raise_open_file_limit();
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

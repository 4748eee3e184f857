// The replica process (replica/replica_process.h): fetch, load, serve, and the standby mode.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/common_logging.h"
#include "replica/replica.h"
#include "replica/replica_process.h"
#include "replica/replica_standby.h"
#include "store/store.h"
#include "trace/trace.h"

namespace flotilla::replica {
namespace {

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
Result<ServedModel> load_model(const ProcessFlags& flags, runtime::RuntimeKind kind,
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

}  // namespace

int run_replica_process(const ProcessFlags& flags) {
  const char* pod = std::getenv("POD_NAME");
  const std::string replica_id = !flags.replica_id.empty() ? flags.replica_id : pod ? pod : "";
  LogFields fields{.component = "replica", .endpoint = flags.name, .replica = replica_id};
  if (Status status = init_logging(flags.log_level, flags.log_format, std::move(fields));
      !status.is_ok()) {
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
  ReplicaOptions options;
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
  if (flags.grpc_port) {
    const bool ipv6 = flags.host.find(':') != std::string::npos;
    options.grpc_listen =
        (ipv6 ? "[" + flags.host + "]" : flags.host) + ":" + std::to_string(*flags.grpc_port);
  }
  auto tracing = trace::tracer_options_from_env("flotilla-replica", flags.otlp_endpoint,
                                                flags.trace_sample_ratio);
  if (!tracing.is_ok()) {
    std::cerr << "flotilla replica: " << tracing.status().message() << "\n";
    return kExitBadInput;
  }
  options.tracing = std::move(tracing).value();
  if (options.tracing) {
    // Which model and replica a span comes from, on every span of this process.
    auto& resource = options.tracing->resource_attributes;
    if (!flags.name.empty()) {
      resource.emplace_back("flotilla.endpoint", flags.name);
    }
    resource.emplace_back("flotilla.version", flags.model_version);
    if (!replica_id.empty()) {
      resource.emplace_back("service.instance.id", replica_id);
    }
  }
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
  auto replica = Replica::listen(options, registry);
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
  nlohmann::json listening = {{"event", "listening"},
                              {"host", flags.host},
                              {"port", (*replica)->port()},
                              {"model", model->name}};
  if ((*replica)->grpc_port() != 0) {
    listening["grpc_port"] = (*replica)->grpc_port();
  }
  std::cout << listening.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
            << std::endl;
  spdlog::info("serving model '{}' on {}:{} (model loaded in {:.3f} s)", model->name, flags.host,
               (*replica)->port(), load_time.count());
  const bool clean = (*replica)->run();
  spdlog::info(clean ? "drained, exiting" : "drain timed out, exiting");
  return clean ? 0 : kExitDrainTimeout;
}

// A warm pool process: everything a replica needs is loaded; the model comes later, on stdin,
// so that a scale-up pays only for the model load.
int run_standby_process(const ProcessFlags& standby_flags, const StandbyHooks& hooks) {
  // An idle standby dies with its orchestrator (a kill -9 of `flotilla up` closes its stdin
  // too, but a standby must not outlive it whatever holds that open).
  if (!hooks.exit_with_parent()) {
    return 0;
  }
  if (Status status =
          init_logging(standby_flags.log_level, standby_flags.log_format, {.component = "replica"});
      !status.is_ok()) {
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
  hooks.disarm_parent_death();
  Result<std::vector<std::string>> args = parse_standby_command(line);
  if (!args.is_ok()) {
    std::cerr << "flotilla replica --standby: bad command line on stdin: "
              << args.status().message() << "\n";
    return kExitBadInput;
  }
  Result<ProcessFlags> flags = hooks.parse_flags(std::move(args).value());
  if (!flags.is_ok()) {
    std::cerr << "flotilla replica --standby: " << flags.status().message() << "\n";
    return kExitBadInput;
  }
  if (flags->standby) {
    std::cerr << "flotilla replica --standby: --standby on stdin\n";
    return kExitBadInput;
  }
  return run_replica_process(*flags);
}

}  // namespace flotilla::replica

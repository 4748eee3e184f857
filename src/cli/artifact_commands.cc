// `flotilla pull URI` and `flotilla artifact pack DIR`: the artifact store from the command line.
#include <cstdio>
#include <iostream>
#include <memory>

#include <unistd.h>

#include "cli/commands.h"
#include "common/common.h"
#include "store/store.h"

namespace flotilla::cli {
namespace {

struct PullFlags {
  std::string uri;
  std::string data_dir = ".flotilla";
  int connections = 8;
  uint64_t range_mib = 4;
  uint64_t max_cache_mib = 0;
  std::string log_level = "info";
  std::string log_format = "json";
};

struct PackFlags {
  std::string dir;
};

// "[=====>    ]  41%  420.0 of 1024.0 MiB  93.1 MiB/s  ETA 6 s" on one terminal line.
void draw_progress(const store::Progress& progress) {
  constexpr double kMiB = 1 << 20;
  const double fraction = progress.total_bytes > 0 ? static_cast<double>(progress.done_bytes) /
                                                         static_cast<double>(progress.total_bytes)
                                                   : 0;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(fraction * kWidth);
  std::string bar(static_cast<size_t>(filled), '=');
  bar.resize(kWidth, ' ');
  const double eta = progress.bytes_per_second > 0 && progress.total_bytes > progress.done_bytes
                         ? static_cast<double>(progress.total_bytes - progress.done_bytes) /
                               progress.bytes_per_second
                         : 0;
  std::fprintf(stderr, "\r[%s] %3.0f%%  %.1f of %.1f MiB  %.1f MiB/s  ETA %.0f s ", bar.c_str(),
               fraction * 100, static_cast<double>(progress.done_bytes) / kMiB,
               static_cast<double>(progress.total_bytes) / kMiB, progress.bytes_per_second / kMiB,
               eta);
  std::fflush(stderr);
}

int run_pull(const PullFlags& flags) {
  if (Status logging = init_logging(flags.log_level, flags.log_format, {.component = "pull"});
      !logging.is_ok()) {
    std::cerr << "flotilla pull: " << logging.message() << "\n";
    return kExitBadInput;
  }
  if (flags.connections < 1 || flags.connections > 256 || flags.range_mib < 1) {
    std::cerr << "flotilla pull: --connections must be 1..256 and --range-mib at least 1\n";
    return kExitBadInput;
  }
  Result<std::unique_ptr<store::ArtifactCache>> cache = store::ArtifactCache::open(
      flags.data_dir + "/cache", flags.max_cache_mib * (uint64_t{1} << 20));
  if (!cache.is_ok()) {
    std::cerr << "flotilla pull: " << cache.status().message() << "\n";
    return 1;
  }
  store::PullOptions options;
  options.connections = flags.connections;
  options.range_bytes = flags.range_mib << 20;
  // A progress bar only for a person watching: stdout carries the path for scripts.
  const bool terminal = ::isatty(STDOUT_FILENO) && ::isatty(STDERR_FILENO);
  Mutex draw_mu;  // one progress line at a time
  if (terminal) {
    options.on_progress = [&](const store::Progress& progress) {
      MutexLock lock(draw_mu);
      draw_progress(progress);
    };
  }
  Result<std::string> path = cache.value()->pull(flags.uri, options);
  if (terminal) {
    std::fprintf(stderr, "\n");
  }
  if (!path.is_ok()) {
    std::cerr << "flotilla pull: " << path.status().message() << "\n";
    return path.status().code() == StatusCode::kInvalidArgument ? kExitBadInput : 1;
  }
  std::cout << path.value() << "\n";
  return 0;
}

int run_pack(const PackFlags& flags) {
  Result<store::Manifest> manifest = store::pack_directory(flags.dir);
  if (!manifest.is_ok()) {
    std::cerr << "flotilla artifact pack: " << manifest.status().message() << "\n";
    return manifest.status().code() == StatusCode::kInvalidArgument ? kExitBadInput : 1;
  }
  uint64_t bytes = 0;
  for (const store::ManifestFile& file : manifest->files) {
    bytes += file.size;
  }
  std::cerr << manifest->files.size() << " files, " << bytes << " bytes; upload the directory "
            << "and pull .../" << store::kManifestName << "\n";
  std::cout << flags.dir << "/" << store::kManifestName << "\n";
  return 0;
}

}  // namespace

std::function<int()> add_artifact_commands(CLI::App& app) {
  auto pull = std::make_shared<PullFlags>();
  CLI::App* pull_cmd = app.add_subcommand(
      "pull",
      "Fetch an artifact (path, http(s) URL, or a manifest URL) into the cache; prints "
      "its local path");
  pull_cmd
      ->add_option("uri", pull->uri,
                   "Artifact: local path, URL, or .../" + std::string(store::kManifestName))
      ->required();
  pull_cmd->add_option("--data-dir", pull->data_dir, "Data directory (the cache is DIR/cache)")
      ->capture_default_str();
  pull_cmd->add_option("--connections", pull->connections, "Parallel ranged requests per file")
      ->capture_default_str();
  pull_cmd->add_option("--range-mib", pull->range_mib, "Size of each ranged request")
      ->capture_default_str();
  pull_cmd
      ->add_option("--max-cache-mib", pull->max_cache_mib,
                   "Trim the cache to this size afterwards, least recently used first "
                   "(0: no limit)")
      ->capture_default_str();
  pull_cmd->add_option("--log-level", pull->log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  add_log_format_flag(*pull_cmd, pull->log_format);

  auto pack = std::make_shared<PackFlags>();
  CLI::App* artifact = app.add_subcommand("artifact", "Artifact tools");
  artifact->require_subcommand(1);
  CLI::App* pack_cmd = artifact->add_subcommand(
      "pack", "Write DIR/" + std::string(store::kManifestName) +
                  " (every file's size and SHA-256) so DIR can be served by any HTTP server");
  pack_cmd->add_option("dir", pack->dir, "The model directory")->required();

  return [&app, pull, pack, pull_cmd, pack_cmd]() -> int {
    if (pull_cmd->parsed()) {
      return run_pull(*pull);
    }
    if (pack_cmd->parsed()) {
      return run_pack(*pack);
    }
    (void)app;
    return -1;
  };
}

}  // namespace flotilla::cli

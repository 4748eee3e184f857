#include <filesystem>

#include "runtime/runtime_internal.h"

namespace flotilla::runtime {

namespace fs = std::filesystem;

Status warm_up(RuntimeKind kind) {
  // The llm runtime has no one-time start-up cost worth paying ahead: its model is mapped.
  return kind == RuntimeKind::kSynthetic || kind == RuntimeKind::kLlm ? Status::ok()
                                                                      : warm_up_xgboost();
}

namespace {

bool is_weights(const fs::path& path) {
  return path.extension() == ".safetensors";
}

// Awaits whole each file of the model (the model itself, or a file under its directory) that
// `wanted` picks.
Status await_files(const std::string& model_path, const AwaitBytes& await_bytes,
                   bool (*wanted)(const fs::path&)) {
  std::error_code ec;
  if (!fs::is_directory(model_path, ec)) {
    return wanted(model_path) ? await_bytes(model_path, 0, UINT64_MAX) : Status::ok();
  }
  for (const auto& entry : fs::recursive_directory_iterator(model_path, ec)) {
    if (entry.is_regular_file(ec) && wanted(entry.path())) {
      FLOTILLA_RETURN_IF_ERROR(await_bytes(entry.path().string(), 0, UINT64_MAX));
    }
  }
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Runtime>> load_runtime(RuntimeKind kind, const std::string& model_path,
                                              const RuntimeOptions& options) {
  if (options.await_bytes) {
    // What tells the runtime apart (config.json, MLmodel) and what every runtime reads whole.
    FLOTILLA_RETURN_IF_ERROR(await_files(model_path, options.await_bytes,
                                         [](const fs::path& path) { return !is_weights(path); }));
  }
  if (kind == RuntimeKind::kAuto) {
    FLOTILLA_ASSIGN_OR_RETURN(kind, detect_runtime(model_path));
  }
  if (options.await_bytes && kind != RuntimeKind::kLlm) {
    // The llm runtime awaits its weights tensor by tensor; the others read them whole.
    FLOTILLA_RETURN_IF_ERROR(await_files(model_path, options.await_bytes, is_weights));
  }
  std::error_code ec;
  if (!fs::exists(model_path, ec)) {
    return not_found("model path '" + model_path + "' does not exist");
  }
  switch (kind) {
    case RuntimeKind::kXgboost:
      return load_xgboost_runtime(model_path, options);
    case RuntimeKind::kSynthetic:
      return load_synthetic_runtime(model_path, options);
    case RuntimeKind::kLlm:
      return load_llm_runtime(model_path, options);
    case RuntimeKind::kAuto:
      break;
  }
  return internal_error("no runtime chosen");
}

}  // namespace flotilla::runtime

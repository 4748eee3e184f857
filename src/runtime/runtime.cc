#include <filesystem>
#include <fstream>

#include <yaml-cpp/yaml.h>

#include "runtime/runtime_internal.h"

namespace flotilla::runtime {

namespace fs = std::filesystem;

Result<RuntimeKind> parse_runtime_kind(std::string_view name) {
  if (name == "auto")
    return RuntimeKind::kAuto;
  if (name == "xgboost")
    return RuntimeKind::kXgboost;
  if (name == "synthetic")
    return RuntimeKind::kSynthetic;
  if (name == "llm")
    return RuntimeKind::kLlm;
  return invalid_argument("unknown runtime '" + std::string(name) +
                          "' (use auto, xgboost, llm or synthetic)");
}

Result<int64_t> llm_context_length(const std::string& model_path) {
  const fs::path path = fs::path(model_path) / "config.json";
  std::ifstream file(path);
  if (!file) {
    return not_found("cannot read '" + path.string() + "'");
  }
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  FLOTILLA_ASSIGN_OR_RETURN(llm::ModelConfig config, llm::parse_model_config(text));
  return int64_t{config.max_position};
}

Result<RuntimeKind> detect_runtime(const std::string& model_path) {
  std::error_code ec;
  if (!fs::exists(model_path, ec)) {
    return not_found("model path '" + model_path + "' does not exist");
  }
  if (fs::is_directory(model_path, ec)) {
    if (llm::is_llm_directory(model_path)) {
      return RuntimeKind::kLlm;
    }
    const fs::path mlmodel = fs::path(model_path) / "MLmodel";
    if (!fs::exists(mlmodel, ec)) {
      return invalid_argument("cannot tell the runtime of directory '" + model_path +
                              "': it has neither an MLmodel file nor a config.json of a "
                              "supported language model");
    }
    try {
      YAML::Node root = YAML::LoadFile(mlmodel.string());
      if (root["flavors"] && root["flavors"]["xgboost"]) {
        return RuntimeKind::kXgboost;
      }
    } catch (const std::exception& e) {
      return invalid_argument("cannot read '" + mlmodel.string() + "': " + e.what());
    }
    return invalid_argument("'" + mlmodel.string() + "' has no flavor this server runs (xgboost)");
  }
  const std::string extension = fs::path(model_path).extension().string();
  for (const char* known : {".json", ".ubj", ".xgb", ".bst", ".model"}) {
    if (extension == known) {
      return RuntimeKind::kXgboost;
    }
  }
  if (extension == ".yaml" || extension == ".yml") {
    return invalid_argument("cannot tell the runtime of '" + model_path +
                            "'; a synthetic model needs --runtime synthetic");
  }
  return invalid_argument("cannot tell the runtime of '" + model_path +
                          "' from its extension; pass --runtime");
}

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

std::string default_model_name(const std::string& model_path) {
  fs::path path(model_path);
  if (!path.has_filename()) {
    path = path.parent_path();  // "dir/" → "dir"
  }
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    return path.filename().string();
  }
  return path.stem().string();
}

}  // namespace flotilla::runtime

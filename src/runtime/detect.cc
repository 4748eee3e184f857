// Runtime detection (runtime/runtime_detect.h): reads an artifact's marker files, loads
// nothing. Built as its own library so that its users (the control plane) link no runtime.
#include <filesystem>
#include <fstream>
#include <iterator>

#include <yaml-cpp/yaml.h>

#include "llm/llm_config.h"
#include "runtime/runtime_detect.h"

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

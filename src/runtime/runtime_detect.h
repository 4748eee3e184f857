// The light part of the runtime module's contract: naming a runtime and telling which one an
// artifact needs, without loading it. It links no runtime (no XGBoost, no LLM engine: only the
// config.json parser of llm/llm_config.h), so the control plane can ask it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/common.h"

namespace flotilla::runtime {

enum class RuntimeKind { kAuto, kXgboost, kSynthetic, kLlm };

Result<RuntimeKind> parse_runtime_kind(std::string_view name);

// The runtime `auto` picks for an artifact: an MLflow directory with an xgboost flavor or an
// XGBoost model file (.json, .ubj, .xgb, .bst, .model): xgboost; a directory whose config.json
// names a Llama-family architecture: llm. Never kSynthetic.
Result<RuntimeKind> detect_runtime(const std::string& model_path);

// The context length (prompt plus generated tokens) of the language model in directory
// `model_path`, from its config.json: what its replicas report as `max_model_len`. Reads the
// file; errors as parse_model_config's, kNotFound when there is no config.json.
Result<int64_t> llm_context_length(const std::string& model_path);

// "models/fraud.json" → "fraud"; "models/fraud/" → "fraud".
std::string default_model_name(const std::string& model_path);

}  // namespace flotilla::runtime

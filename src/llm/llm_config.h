// The light part of the llm module's contract: a model directory's config.json, parsed without
// the engine (no weights, kernels or tokenizer), for whoever only needs to tell a language model
// apart or read its context length (runtime detection, the control plane).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/common.h"

namespace flotilla::llm {

// ---------------------------------------------------------------------------------------------
// Model configuration (config.json)

enum class RopeScalingType { kNone, kLinear, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position = 8192;
};

// The fields of LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM that the forward pass
// reads.
struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  int vocab_size = 0;
  int max_position = 0;  // the context length: prompt plus generated tokens
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2, or attention_bias
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;
};

// Parses config.json. kInvalidArgument naming the field for a missing or wrong one, and for an
// architecture other than the three above.
Result<ModelConfig> parse_model_config(std::string_view json_text);

// Whether `dir` holds a config.json naming a supported architecture: what `runtime: auto` asks.
bool is_llm_directory(const std::string& dir);

}  // namespace flotilla::llm

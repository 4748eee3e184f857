// config.json of Llama-family decoders: the field sets of LlamaForCausalLM, MistralForCausalLM
// and Qwen2ForCausalLM as transformers writes them.
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "llm/llm_config.h"

namespace flotilla::llm {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kArchitectures[] = {"LlamaForCausalLM", "MistralForCausalLM",
                                               "Qwen2ForCausalLM"};

Result<int> positive_int(const Json& config, const char* field) {
  auto it = config.find(field);
  if (it == config.end() || !it->is_number_integer() || it->get<int64_t>() <= 0 ||
      it->get<int64_t>() > (1 << 30)) {
    return invalid_argument(std::string("config.json: '") + field + "' must be a positive integer");
  }
  return it->get<int>();
}

Result<double> positive_number(const Json& config, const char* field, double fallback) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) {
    return fallback;
  }
  if (!it->is_number() || it->get<double>() <= 0) {
    return invalid_argument(std::string("config.json: '") + field + "' must be a positive number");
  }
  return it->get<double>();
}

// eos_token_id may be one id or a list (Llama 3.1 lists three).
Result<std::vector<int32_t>> token_ids(const Json& config, const char* field) {
  std::vector<int32_t> ids;
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) {
    return ids;
  }
  const Json list = it->is_array() ? *it : Json::array({*it});
  for (const Json& id : list) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      return invalid_argument(std::string("config.json: '") + field +
                              "' must be a token id or a list of them");
    }
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

Result<RopeScaling> parse_rope_scaling(const Json& config) {
  RopeScaling scaling;
  auto it = config.find("rope_scaling");
  if (it == config.end() || it->is_null()) {
    return scaling;
  }
  if (!it->is_object()) {
    return invalid_argument("config.json: 'rope_scaling' must be an object");
  }
  std::string type = it->value("rope_type", it->value("type", std::string()));
  FLOTILLA_ASSIGN_OR_RETURN(scaling.factor, positive_number(*it, "factor", 1.0));
  if (type == "default") {
    scaling.type = RopeScalingType::kNone;
  } else if (type == "linear") {
    scaling.type = RopeScalingType::kLinear;
  } else if (type == "llama3") {
    scaling.type = RopeScalingType::kLlama3;
    FLOTILLA_ASSIGN_OR_RETURN(scaling.low_freq_factor, positive_number(*it, "low_freq_factor", 1));
    FLOTILLA_ASSIGN_OR_RETURN(scaling.high_freq_factor,
                              positive_number(*it, "high_freq_factor", 4));
    FLOTILLA_ASSIGN_OR_RETURN(scaling.original_max_position,
                              positive_int(*it, "original_max_position_embeddings"));
    if (scaling.high_freq_factor <= scaling.low_freq_factor) {
      return invalid_argument("config.json: rope_scaling needs high_freq_factor > low_freq_factor");
    }
  } else {
    return invalid_argument("config.json: rope_scaling type '" + type +
                            "' is not supported (default, linear, llama3 are)");
  }
  return scaling;
}

Result<ModelConfig> parse(const Json& config) {
  if (!config.is_object()) {
    return invalid_argument("config.json: not a JSON object");
  }
  ModelConfig out;
  auto architectures = config.find("architectures");
  if (architectures == config.end() || !architectures->is_array() || architectures->empty() ||
      !(*architectures)[0].is_string()) {
    return invalid_argument("config.json: 'architectures' must list the model class");
  }
  out.architecture = (*architectures)[0].get<std::string>();
  if (std::find(std::begin(kArchitectures), std::end(kArchitectures), out.architecture) ==
      std::end(kArchitectures)) {
    return invalid_argument("config.json: architecture '" + out.architecture +
                            "' is not supported (LlamaForCausalLM, MistralForCausalLM and "
                            "Qwen2ForCausalLM are)");
  }
  std::string activation = config.value("hidden_act", std::string("silu"));
  if (activation != "silu") {
    return invalid_argument("config.json: hidden_act '" + activation +
                            "' is not supported (silu is)");
  }
  FLOTILLA_ASSIGN_OR_RETURN(out.hidden_size, positive_int(config, "hidden_size"));
  FLOTILLA_ASSIGN_OR_RETURN(out.num_layers, positive_int(config, "num_hidden_layers"));
  FLOTILLA_ASSIGN_OR_RETURN(out.num_heads, positive_int(config, "num_attention_heads"));
  out.num_kv_heads = out.num_heads;
  if (config.contains("num_key_value_heads") && !config["num_key_value_heads"].is_null()) {
    FLOTILLA_ASSIGN_OR_RETURN(out.num_kv_heads, positive_int(config, "num_key_value_heads"));
  }
  if (out.num_heads % out.num_kv_heads != 0) {
    return invalid_argument("config.json: num_attention_heads (" + std::to_string(out.num_heads) +
                            ") is not a multiple of num_key_value_heads (" +
                            std::to_string(out.num_kv_heads) + ")");
  }
  if (config.contains("head_dim") && !config["head_dim"].is_null()) {
    FLOTILLA_ASSIGN_OR_RETURN(out.head_dim, positive_int(config, "head_dim"));
  } else if (out.hidden_size % out.num_heads == 0) {
    out.head_dim = out.hidden_size / out.num_heads;
  } else {
    return invalid_argument("config.json: hidden_size is not a multiple of num_attention_heads");
  }
  if (out.head_dim % 2 != 0) {
    return invalid_argument("config.json: head_dim must be even for rotary embeddings");
  }
  FLOTILLA_ASSIGN_OR_RETURN(out.intermediate_size, positive_int(config, "intermediate_size"));
  FLOTILLA_ASSIGN_OR_RETURN(out.vocab_size, positive_int(config, "vocab_size"));
  FLOTILLA_ASSIGN_OR_RETURN(out.max_position, positive_int(config, "max_position_embeddings"));
  // Mistral's sliding window is not implemented: the context stops where it would start.
  if (auto it = config.find("sliding_window");
      it != config.end() && it->is_number_integer() && it->get<int64_t>() > 0 &&
      config.value("use_sliding_window", out.architecture != "Qwen2ForCausalLM")) {
    out.max_position = std::min<int64_t>(out.max_position, it->get<int64_t>());
  }
  FLOTILLA_ASSIGN_OR_RETURN(out.rope_theta, positive_number(config, "rope_theta", 10000.0));
  FLOTILLA_ASSIGN_OR_RETURN(out.rope_scaling, parse_rope_scaling(config));
  FLOTILLA_ASSIGN_OR_RETURN(out.rms_norm_eps, positive_number(config, "rms_norm_eps", 1e-6));
  // transformers' default for all three when the field is missing.
  out.tie_word_embeddings = config.value("tie_word_embeddings", false);
  out.qkv_bias = out.architecture == "Qwen2ForCausalLM" || config.value("attention_bias", false);
  FLOTILLA_ASSIGN_OR_RETURN(out.eos_token_ids, token_ids(config, "eos_token_id"));
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<int32_t> bos, token_ids(config, "bos_token_id"));
  if (!bos.empty()) {
    out.bos_token_id = bos.front();
  }
  return out;
}

}  // namespace

Result<ModelConfig> parse_model_config(std::string_view json_text) {
  Json config = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) {
    return invalid_argument("config.json: malformed JSON");
  }
  try {
    return parse(config);
  } catch (const Json::exception& error) {  // a field of the wrong JSON type
    return invalid_argument(std::string("config.json: ") + error.what());
  }
}

bool is_llm_directory(const std::string& dir) {
  // Read here rather than with safetensors' reader: this file builds without the engine.
  std::ifstream file(std::filesystem::path(dir) / "config.json");
  if (!file) {
    return false;
  }
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  return parse_model_config(text).is_ok();
}

}  // namespace flotilla::llm

// Loading a Hugging Face Llama-family directory: config.json, then the safetensors tensors into
// the weight matrices and vectors of a Model (stacked, converted or quantized as asked), and the
// RoPE tables.
#include "llm/weights.h"

#include <cmath>
#include <filesystem>
#include <numbers>

namespace flotilla::llm {
namespace {

namespace fs = std::filesystem;

bool is_16_bit(const TensorView& view) {
  return view.dtype != TensorDtype::kF32;
}

std::vector<float> to_floats(const TensorView& view) {
  std::vector<float> out(view.elements());
  for (int64_t i = 0; i < view.elements(); ++i) {
    out[i] = view.at(i);
  }
  return out;
}

// Whether the tensor is stored exactly as `format` wants it, so the mapping can be used as is.
bool usable_in_place(const TensorView& view, WeightFormat format) {
  return (format == WeightFormat::kF32 && view.dtype == TensorDtype::kF32) ||
         (format == WeightFormat::kBF16 && view.dtype == TensorDtype::kBF16);
}

// Stacks the named [rows_i][cols] tensors into one matrix of `format`.
Result<WeightMatrix> load_matrix(const SafetensorsSet& files,
                                 const std::vector<std::pair<std::string, int>>& parts, int cols,
                                 WeightFormat format) {
  std::vector<const TensorView*> views;
  int rows = 0;
  for (const auto& [name, part_rows] : parts) {
    FLOTILLA_ASSIGN_OR_RETURN(const TensorView* view, files.get(name, {part_rows, cols}));
    views.push_back(view);
    rows += part_rows;
  }
  if (views.size() == 1 && usable_in_place(*views[0], format)) {
    WeightMatrix w;
    w.format = format;
    w.rows = rows;
    w.cols = cols;
    w.data = views[0]->data.data();
    return w;
  }
  std::vector<float> values;
  values.reserve(static_cast<size_t>(rows) * cols);
  for (const TensorView* view : views) {
    std::vector<float> part = to_floats(*view);
    values.insert(values.end(), part.begin(), part.end());
  }
  return make_weight_matrix(format, rows, cols, values.data());
}

Result<std::vector<float>> load_vector(const SafetensorsSet& files, const std::string& name,
                                       int size) {
  FLOTILLA_ASSIGN_OR_RETURN(const TensorView* view, files.get(name, {size}));
  return to_floats(*view);
}

// Inverse frequencies of the rotary embedding, with the checkpoint's scaling applied, and the
// factor positions are multiplied by (linear scaling).
std::pair<std::vector<double>, double> rope_frequencies(const ModelConfig& config) {
  int half = config.head_dim / 2;
  std::vector<double> inverse(half);
  for (int i = 0; i < half; ++i) {
    inverse[i] = 1.0 / std::pow(config.rope_theta, 2.0 * i / config.head_dim);
  }
  const RopeScaling& scaling = config.rope_scaling;
  if (scaling.type == RopeScalingType::kLinear) {
    return {inverse, 1.0 / scaling.factor};
  }
  if (scaling.type == RopeScalingType::kLlama3) {
    // Long wavelengths are slowed down by `factor`, short ones kept, the band between blended.
    double low_wavelength = scaling.original_max_position / scaling.low_freq_factor;
    double high_wavelength = scaling.original_max_position / scaling.high_freq_factor;
    for (double& frequency : inverse) {
      double wavelength = 2 * std::numbers::pi / frequency;
      if (wavelength > low_wavelength) {
        frequency /= scaling.factor;
      } else if (wavelength >= high_wavelength) {
        double smooth = (scaling.original_max_position / wavelength - scaling.low_freq_factor) /
                        (scaling.high_freq_factor - scaling.low_freq_factor);
        frequency = (1 - smooth) * frequency / scaling.factor + smooth * frequency;
      }
    }
  }
  return {inverse, 1.0};
}

void build_rope_tables(Model& model) {
  const ModelConfig& config = model.config;
  auto [inverse, position_scale] = rope_frequencies(config);
  int half = config.head_dim / 2;
  model.rope_cos.resize(static_cast<size_t>(config.max_position) * half);
  model.rope_sin.resize(model.rope_cos.size());
  for (int p = 0; p < config.max_position; ++p) {
    for (int i = 0; i < half; ++i) {
      double angle = p * position_scale * inverse[i];
      model.rope_cos[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(angle));
      model.rope_sin[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

}  // namespace

Result<std::shared_ptr<const Model>> load_model(const std::string& dir,
                                                const LoadOptions& options) {
  auto model = std::make_shared<Model>();
  model->options = options;
  model->options.await_bytes = nullptr;  // used only while loading
  FLOTILLA_ASSIGN_OR_RETURN(std::string config_text,
                            read_text_file((fs::path(dir) / "config.json").string()));
  Result<ModelConfig> config = parse_model_config(config_text);
  if (!config.is_ok()) {
    return config.status().with_context(dir);
  }
  model->config = std::move(config).value();
  const ModelConfig& c = model->config;
  Result<SafetensorsSet> files = SafetensorsSet::open_directory(dir, options.await_bytes);
  if (!files.is_ok()) {
    return files.status().with_context("loading " + dir);
  }
  model->files = std::move(files).value();
  const SafetensorsSet& f = model->files;

  auto fail = [&](const Status& status) {
    return status.with_context("loading " + dir);
  };
  Result<const TensorView*> embedding =
      f.get("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  if (!embedding.is_ok()) {
    return fail(embedding.status());
  }
  model->embedding = *embedding;
  WeightFormat base = options.dtype.value_or(is_16_bit(*model->embedding) ? WeightFormat::kBF16
                                                                          : WeightFormat::kF32);
  if (base != WeightFormat::kF32 && base != WeightFormat::kBF16) {
    return invalid_argument("dtype must be float32 or bfloat16; quantization is separate");
  }
  if (options.quantize && *options.quantize != WeightFormat::kInt8 &&
      *options.quantize != WeightFormat::kFp8) {
    return invalid_argument("quantize must be int8 or fp8");
  }
  WeightFormat mlp = options.quantize.value_or(base);
  WeightFormat attention = options.quantize_attention ? mlp : base;

  int q_rows = c.num_heads * c.head_dim, kv_rows = c.num_kv_heads * c.head_dim;
  for (int i = 0; i < c.num_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights layer;
    auto matrix = [&](const std::vector<std::pair<std::string, int>>& parts, int cols,
                      WeightFormat format) {
      return load_matrix(f, parts, cols, format);
    };
    auto vector = [&](const std::string& name, int size) {
      return load_vector(f, name, size);
    };
    Result<std::vector<float>> input_norm = vector(p + "input_layernorm.weight", c.hidden_size);
    Result<std::vector<float>> post_norm =
        vector(p + "post_attention_layernorm.weight", c.hidden_size);
    Result<WeightMatrix> qkv = matrix({{p + "self_attn.q_proj.weight", q_rows},
                                       {p + "self_attn.k_proj.weight", kv_rows},
                                       {p + "self_attn.v_proj.weight", kv_rows}},
                                      c.hidden_size, attention);
    Result<WeightMatrix> o =
        matrix({{p + "self_attn.o_proj.weight", c.hidden_size}}, q_rows, attention);
    Result<WeightMatrix> gate_up = matrix({{p + "mlp.gate_proj.weight", c.intermediate_size},
                                           {p + "mlp.up_proj.weight", c.intermediate_size}},
                                          c.hidden_size, mlp);
    Result<WeightMatrix> down =
        matrix({{p + "mlp.down_proj.weight", c.hidden_size}}, c.intermediate_size, mlp);
    for (const Status* status : {&input_norm.status(), &post_norm.status(), &qkv.status(),
                                 &o.status(), &gate_up.status(), &down.status()}) {
      if (!status->is_ok()) {
        return fail(*status);
      }
    }
    layer.input_norm = std::move(input_norm).value();
    layer.post_norm = std::move(post_norm).value();
    layer.qkv = std::move(qkv).value();
    layer.o = std::move(o).value();
    layer.gate_up = std::move(gate_up).value();
    layer.down = std::move(down).value();
    if (c.qkv_bias) {
      for (const auto& [name, size] :
           {std::pair{"q_proj.bias", q_rows}, std::pair{"k_proj.bias", kv_rows},
            std::pair{"v_proj.bias", kv_rows}}) {
        Result<std::vector<float>> bias = vector(p + "self_attn." + name, size);
        if (!bias.is_ok()) {
          return fail(bias.status());
        }
        layer.qkv.bias.insert(layer.qkv.bias.end(), bias->begin(), bias->end());
      }
    }
    model->layers.push_back(std::move(layer));
  }
  Result<std::vector<float>> final_norm = load_vector(f, "model.norm.weight", c.hidden_size);
  if (!final_norm.is_ok()) {
    return fail(final_norm.status());
  }
  model->final_norm = std::move(final_norm).value();
  std::string head = c.tie_word_embeddings || !f.contains("lm_head.weight")
                         ? "model.embed_tokens.weight"
                         : "lm_head.weight";
  if (!c.tie_word_embeddings && head != "lm_head.weight") {
    return fail(not_found("tensor 'lm_head.weight' is missing (tie_word_embeddings is false)"));
  }
  Result<WeightMatrix> lm_head = load_matrix(f, {{head, c.vocab_size}}, c.hidden_size, mlp);
  if (!lm_head.is_ok()) {
    return fail(lm_head.status());
  }
  model->lm_head = std::move(lm_head).value();
  model->files.stop_awaiting();
  build_rope_tables(*model);
  return std::shared_ptr<const Model>(std::move(model));
}

const ModelConfig& model_config(const Model& model) {
  return model.config;
}

int64_t model_weight_bytes(const Model& model) {
  int64_t bytes = model.lm_head.bytes();
  for (const LayerWeights& layer : model.layers) {
    bytes += layer.qkv.bytes() + layer.o.bytes() + layer.gate_up.bytes() + layer.down.bytes();
  }
  return bytes;
}

std::string_view weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return "float32";
    case WeightFormat::kBF16:
      return "bfloat16";
    case WeightFormat::kInt8:
      return "int8";
    case WeightFormat::kFp8:
      return "fp8";
  }
  return "unknown";
}

}  // namespace flotilla::llm

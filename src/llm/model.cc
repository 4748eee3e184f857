// Loading a Hugging Face Llama-family directory, and the forward pass (HF transformers'
// LlamaModel semantics: pre-norm residual blocks, rotate-half RoPE, grouped-query attention,
// SwiGLU MLP).
#include "llm/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numbers>
#include <thread>

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

int default_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    return std::max(1, CPU_COUNT(&set));
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

void rms_norm(const float* x, const float* weight, float eps, int n, float* out) {
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    sum += static_cast<double>(x[i]) * x[i];
  }
  float inverse = static_cast<float>(1.0 / std::sqrt(sum / n + eps));
  for (int i = 0; i < n; ++i) {
    out[i] = x[i] * inverse * weight[i];
  }
}

// Rotate-half RoPE on one head vector at `position`.
void apply_rope(float* v, int head_dim, const float* cos, const float* sin) {
  int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    float a = v[i], b = v[i + half];
    v[i] = a * cos[i] - b * sin[i];
    v[i + half] = b * cos[i] + a * sin[i];
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

// ---------------------------------------------------------------------------------------------
// KV cache

KvCache::KvCache(const ModelConfig& config, int blocks, int block_tokens)
    : block_tokens_(block_tokens),
      total_blocks_(blocks),
      kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim),
      allocator_(blocks) {
  size_t floats =
      static_cast<size_t>(config.num_layers) * blocks * kv_heads_ * block_tokens_ * head_dim_;
  keys_.resize(floats);
  values_.resize(floats);
}

int64_t KvCache::offset(int layer, int block, int kv_head) const {
  return ((static_cast<int64_t>(layer) * total_blocks_ + block) * kv_heads_ + kv_head) *
         block_tokens_ * head_dim_;
}

float* KvCache::key(int layer, int block, int kv_head) {
  return keys_.data() + offset(layer, block, kv_head);
}

float* KvCache::value(int layer, int block, int kv_head) {
  return values_.data() + offset(layer, block, kv_head);
}

// ---------------------------------------------------------------------------------------------
// Forward pass

ForwardPass::ForwardPass(std::shared_ptr<const Model> model, int threads)
    : model_(std::move(model)),
      kernels_(kernels()),
      pool_(threads > 0 ? threads : default_threads()) {}

void ForwardPass::attention(std::span<const StepSequence> step, int layer, KvCache& cache) {
  const ModelConfig& c = model_->config;
  const int hd = c.head_dim;
  const int q_width = c.num_heads * hd;
  const int qkv_width = q_width + 2 * c.num_kv_heads * hd;
  const int group = c.num_heads / c.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int block_tokens = cache.block_tokens();
  // Work items: (token of the step, head); each item reads the cache up to its own position.
  std::vector<std::pair<int, int>> rows;  // (sequence index, token index) per step row
  for (int s = 0; s < static_cast<int>(step.size()); ++s) {
    for (int t = 0; t < static_cast<int>(step[s].tokens.size()); ++t) {
      rows.emplace_back(s, t);
    }
  }
  const int items = static_cast<int>(rows.size()) * c.num_heads;
  pool_.parallel_for(items, 1, [&](int begin, int end) {
    // Scratch for one item's scores; chunks on one thread run one after another.
    thread_local std::vector<float> scores;
    scores.resize(c.max_position);
    for (int item = begin; item < end; ++item) {
      int row = item / c.num_heads, head = item % c.num_heads, kv_head = head / group;
      const StepSequence& seq = step[rows[row].first];
      int position = seq.start + rows[row].second;
      const float* q = qkv_.data() + static_cast<int64_t>(row) * qkv_width + head * hd;
      float max_score = -INFINITY;
      for (int p = 0; p <= position; ++p) {
        const float* k =
            cache.key(layer, (*seq.blocks)[p / block_tokens], kv_head) + (p % block_tokens) * hd;
        scores[p] = kernels_.dot(q, k, hd) * scale;
        max_score = std::max(max_score, scores[p]);
      }
      float sum = 0;
      for (int p = 0; p <= position; ++p) {
        scores[p] = std::exp(scores[p] - max_score);
        sum += scores[p];
      }
      float* out = attn_.data() + static_cast<int64_t>(row) * q_width + head * hd;
      std::fill(out, out + hd, 0.0f);
      for (int p = 0; p <= position; ++p) {
        const float* v =
            cache.value(layer, (*seq.blocks)[p / block_tokens], kv_head) + (p % block_tokens) * hd;
        kernels_.axpy(scores[p] / sum, v, out, hd);
      }
    }
  });
}

std::span<const float> ForwardPass::forward(std::span<const StepSequence> step, KvCache& cache) {
  const Model& m = *model_;
  const ModelConfig& c = m.config;
  const int hidden = c.hidden_size, hd = c.head_dim;
  const int q_width = c.num_heads * hd, kv_width = c.num_kv_heads * hd;
  const int qkv_width = q_width + 2 * kv_width;
  const int half = hd / 2;
  const int block_tokens = cache.block_tokens();
  const float eps = static_cast<float>(c.rms_norm_eps);

  int rows = 0, logit_rows = 0;
  for (const StepSequence& seq : step) {
    FLOTILLA_DCHECK(seq.start + static_cast<int>(seq.tokens.size()) <= c.max_position);
    rows += static_cast<int>(seq.tokens.size());
    logit_rows += std::max(0, static_cast<int>(seq.tokens.size()) - seq.logits_from);
  }
  x_.resize(static_cast<size_t>(rows) * hidden);
  normed_.resize(x_.size());
  qkv_.resize(static_cast<size_t>(rows) * qkv_width);
  attn_.resize(static_cast<size_t>(rows) * q_width);
  mlp_.resize(static_cast<size_t>(rows) * 2 * c.intermediate_size);

  int row = 0;
  for (const StepSequence& seq : step) {
    for (int32_t token : seq.tokens) {
      float* out = x_.data() + static_cast<int64_t>(row++) * hidden;
      int64_t base = static_cast<int64_t>(token) * hidden;
      for (int i = 0; i < hidden; ++i) {
        out[i] = m.embedding->at(base + i);
      }
    }
  }

  auto matmul = [&](const float* in, const WeightMatrix& w, float* out, int ldy, bool add) {
    pool_.parallel_for(w.rows, 3, [&](int begin, int end) {
      kernels_.matmul(in, rows, w, begin, end, out, ldy, add);
    });
  };

  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& layer = m.layers[l];
    for (int r = 0; r < rows; ++r) {
      rms_norm(x_.data() + static_cast<int64_t>(r) * hidden, layer.input_norm.data(), eps, hidden,
               normed_.data() + static_cast<int64_t>(r) * hidden);
    }
    matmul(normed_.data(), layer.qkv, qkv_.data(), qkv_width, false);
    // RoPE on q and k, then k and v into the cache at each token's position.
    row = 0;
    for (const StepSequence& seq : step) {
      for (int t = 0; t < static_cast<int>(seq.tokens.size()); ++t, ++row) {
        int position = seq.start + t;
        const float* cos = m.rope_cos.data() + static_cast<int64_t>(position) * half;
        const float* sin = m.rope_sin.data() + static_cast<int64_t>(position) * half;
        float* q = qkv_.data() + static_cast<int64_t>(row) * qkv_width;
        for (int h = 0; h < c.num_heads + c.num_kv_heads; ++h) {
          apply_rope(q + h * hd, hd, cos, sin);
        }
        int block = (*seq.blocks)[position / block_tokens], slot = position % block_tokens;
        for (int h = 0; h < c.num_kv_heads; ++h) {
          std::memcpy(cache.key(l, block, h) + slot * hd, q + q_width + h * hd, hd * 4);
          std::memcpy(cache.value(l, block, h) + slot * hd, q + q_width + kv_width + h * hd,
                      hd * 4);
        }
      }
    }
    attention(step, l, cache);
    matmul(attn_.data(), layer.o, x_.data(), hidden, true);
    for (int r = 0; r < rows; ++r) {
      rms_norm(x_.data() + static_cast<int64_t>(r) * hidden, layer.post_norm.data(), eps, hidden,
               normed_.data() + static_cast<int64_t>(r) * hidden);
    }
    const int inter = c.intermediate_size;
    matmul(normed_.data(), layer.gate_up, mlp_.data(), 2 * inter, false);
    // SwiGLU in place, then rows compacted: gate_up wrote [rows][2 * inter], down reads
    // [rows][inter]. In order it is safe: row r's new place overlaps only rows already moved.
    pool_.parallel_for(rows, 1, [&](int begin, int end) {
      for (int r = begin; r < end; ++r) {
        float* gate = mlp_.data() + static_cast<int64_t>(r) * 2 * inter;
        kernels_.silu_mul(gate, gate + inter, inter);
      }
    });
    for (int r = 1; r < rows; ++r) {
      std::memmove(mlp_.data() + static_cast<int64_t>(r) * inter,
                   mlp_.data() + static_cast<int64_t>(r) * 2 * inter, inter * 4);
    }
    matmul(mlp_.data(), layer.down, x_.data(), hidden, true);
  }

  logits_in_.resize(static_cast<size_t>(logit_rows) * hidden);
  row = 0;
  int out_row = 0;
  for (const StepSequence& seq : step) {
    for (int t = 0; t < static_cast<int>(seq.tokens.size()); ++t, ++row) {
      if (t >= seq.logits_from) {
        rms_norm(x_.data() + static_cast<int64_t>(row) * hidden, m.final_norm.data(), eps, hidden,
                 logits_in_.data() + static_cast<int64_t>(out_row++) * hidden);
      }
    }
  }
  logits_.resize(static_cast<size_t>(logit_rows) * c.vocab_size);
  if (logit_rows > 0) {
    pool_.parallel_for(c.vocab_size, 3, [&](int begin, int end) {
      kernels_.matmul(logits_in_.data(), logit_rows, m.lm_head, begin, end, logits_.data(),
                      c.vocab_size, false);
    });
  }
  return logits_;
}

}  // namespace flotilla::llm

// The forward pass (HF transformers' LlamaModel semantics: pre-norm residual blocks, rotate-half
// RoPE, grouped-query attention, SwiGLU MLP) over a batch of sequences on a paged KV cache.
#include "llm/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

namespace flotilla::llm {
namespace {

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
      // A cache block's positions are rows of hd floats one after another: one kernel call a
      // block. A call a position (a dot product, then an axpy) and the attention took 12-14% of
      // a 16-client bf16 replica's samples, 11.5% so; the replica +7% req/s (median of 5 pairs).
      // Items by KV head, its blocks read once for the query heads that share it, ran slower
      // (-2% to -7%: half as many items to balance).
      for (int p = 0; p <= position; p += block_tokens) {
        kernels_.dot_rows(q, cache.key(layer, (*seq.blocks)[p / block_tokens], kv_head),
                          std::min(block_tokens, position + 1 - p), hd, scores.data() + p);
      }
      float max_score = -INFINITY;
      for (int p = 0; p <= position; ++p) {
        scores[p] *= scale;
        max_score = std::max(max_score, scores[p]);
      }
      float sum = 0;
      for (int p = 0; p <= position; ++p) {
        scores[p] = std::exp(scores[p] - max_score);
        sum += scores[p];
      }
      for (int p = 0; p <= position; ++p) {
        scores[p] /= sum;
      }
      float* out = attn_.data() + static_cast<int64_t>(row) * q_width + head * hd;
      std::fill(out, out + hd, 0.0f);
      for (int p = 0; p <= position; p += block_tokens) {
        kernels_.weighted_sum(scores.data() + p,
                              cache.value(layer, (*seq.blocks)[p / block_tokens], kv_head),
                              std::min(block_tokens, position + 1 - p), hd, out);
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

  // One matmul over the step's rows, split by weight rows between the threads; the activations
  // are converted once, here, not by every thread's chunk.
  auto matmul = [&](const float* in, int m, const WeightMatrix& w, float* out, int ldy, bool add) {
    const void* prepared = kernels_.prepare != nullptr ? kernels_.prepare(in, m, w) : nullptr;
    pool_.parallel_for(w.rows, kernels_.tile_rows, [&](int begin, int end) {
      kernels_.matmul(in, m, w, begin, end, out, ldy, add, prepared);
    });
  };

  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights& layer = m.layers[l];
    for (int r = 0; r < rows; ++r) {
      rms_norm(x_.data() + static_cast<int64_t>(r) * hidden, layer.input_norm.data(), eps, hidden,
               normed_.data() + static_cast<int64_t>(r) * hidden);
    }
    matmul(normed_.data(), rows, layer.qkv, qkv_.data(), qkv_width, false);
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
    matmul(attn_.data(), rows, layer.o, x_.data(), hidden, true);
    for (int r = 0; r < rows; ++r) {
      rms_norm(x_.data() + static_cast<int64_t>(r) * hidden, layer.post_norm.data(), eps, hidden,
               normed_.data() + static_cast<int64_t>(r) * hidden);
    }
    const int inter = c.intermediate_size;
    matmul(normed_.data(), rows, layer.gate_up, mlp_.data(), 2 * inter, false);
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
    matmul(mlp_.data(), rows, layer.down, x_.data(), hidden, true);
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
    matmul(logits_in_.data(), logit_rows, m.lm_head, logits_.data(), c.vocab_size, false);
  }
  return logits_;
}

}  // namespace flotilla::llm

// The loaded model's weights (immutable, shared by engines): every tensor in the format the
// kernels read, and the RoPE tables. load_model() (llm.h) builds one.
#pragma once

#include <vector>

#include "llm/kernels.h"
#include "llm/llm.h"
#include "llm/safetensors.h"

namespace flotilla::llm {

struct LayerWeights {
  std::vector<float> input_norm;
  WeightMatrix qkv;  // q, k and v projections stacked: one matmul for the three
  WeightMatrix o;
  std::vector<float> post_norm;
  WeightMatrix gate_up;  // gate and up projections stacked
  WeightMatrix down;
};

class Model {
 public:
  ModelConfig config;
  LoadOptions options;
  SafetensorsSet files;  // keeps the mapped weights alive
  const TensorView* embedding = nullptr;
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;
  WeightMatrix lm_head;
  // cos and sin of every position's rotary angles: [max_position][head_dim / 2] each.
  std::vector<float> rope_cos;
  std::vector<float> rope_sin;
};

}  // namespace flotilla::llm

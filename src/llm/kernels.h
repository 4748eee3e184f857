// Compute kernels of the forward pass, with runtime CPU dispatch: AVX-512 paths (F, and VNNI
// int8 and BF16 dot products where the CPU has them, and AMX int8 and bf16 tiles), an
// AVX2+FMA+F16C path, and a portable one that any x86-64 or other target runs. Matrices are
// weights in the Hugging Face layout, [output features][input features], so y = x · Wᵀ is a dot
// product per output row, and a weight row is read once for every activation row of the step.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "llm/huge_pages.h"
#include "llm/llm.h"

namespace flotilla::llm {

// Bytes a weight takes in a format.
constexpr int element_bytes(WeightFormat format) {
  return format == WeightFormat::kF32 ? 4 : format == WeightFormat::kBF16 ? 2 : 1;
}

// A weight matrix in one of the formats; `data` points into `owned` or into a mapped file.
struct WeightMatrix {
  WeightFormat format = WeightFormat::kF32;
  int rows = 0;  // output features
  int cols = 0;  // input features
  const std::byte* data = nullptr;
  std::vector<std::byte, HugePageAllocator<std::byte>> owned;  // see huge_pages.h
  std::vector<float> scales;  // one per row for kInt8 and kFp8: weight = code value x scale
  std::vector<float> bias;    // empty, or one per row

  int64_t row_bytes() const;
  int64_t bytes() const;
};

struct Kernels {
  std::string_view name;  // "avx512-vnni-bf16-amx", "avx512-vnni-bf16", "avx512-vnni",
                          // "avx512-bf16", "avx512f", "avx2", "portable"
  // y[i][r] (+)= x[i] · W[r] (+ bias[r]) for rows r in [row_begin, row_end), i < m. Row i of x
  // starts at x + i * w.cols, of y at y + i * ldy. With accumulate, adds to y (residuals).
  // `prepared`: what prepare() returned for the same x, m and w, or nullptr (the call then
  // converts x itself, as prepare would).
  void (*matmul)(const float* x, int m, const WeightMatrix& w, int row_begin, int row_end, float* y,
                 int ldy, bool accumulate, const void* prepared);
  // Attention over `tokens` cached positions, rows of n floats one after another (a block of
  // the KV cache): scores[t] = q · k[t], and out += the sum over t of weights[t] x v[t]. One
  // call a block, not one a position: per position, the calls cost more than their products.
  void (*dot_rows)(const float* q, const float* k, int tokens, int n, float* scores);
  void (*weighted_sum)(const float* weights, const float* v, int tokens, int n, float* out);
  // SwiGLU's activation: gate[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g).
  void (*silu_mul)(float* gate, const float* up, int n);
  // Weight rows a matmul tile takes at once: row ranges split between threads start at its
  // multiples, so that only the last range has a partial tile.
  int tile_rows = 1;
  // The activation rows converted once for every chunk of one matmul on `w` (int8 codes for the
  // VNNI path, bf16 for the BF16 one), in the calling thread's scratch: valid until that thread
  // prepares again. Without it each thread's chunk converts all of x again. nullptr when the
  // path reads x as it is for `w`; the member itself is nullptr on paths that never convert.
  const void* (*prepare)(const float* x, int m, const WeightMatrix& w) = nullptr;
};

// The best path this CPU runs; FLOTILLA_LLM_KERNELS=NAME picks another that it runs (an unknown
// or unsupported name: the best, with a warning).
const Kernels& kernels();
const Kernels& portable_kernels();
// nullptr when the CPU (or the build) has no AVX2, FMA and F16C. Its int8 matmul takes the
// activation rows as int16 codes, one scale a row, up to this code: a row's int32 sums of
// products with int8 weights (|w| <= 128) cannot overflow.
const Kernels* avx2_kernels();
constexpr int avx2_int16_code_limit(int cols) {
  return static_cast<int>(
      std::clamp<int64_t>(INT32_MAX / (128 * static_cast<int64_t>(cols)), 1, 32767));
}
// The AVX-512 tables (F, BW and VL): avx512f widens every format to fp32; with `vnni` int8
// weights go through vpdpbusd on int8-quantized activations, with `bf16` bf16 weights through
// vdpbf16ps on bf16-rounded ones (at any number of activation rows). nullptr when the build
// has no AVX-512; hands out a table whatever the CPU: supported_kernels() is what checks.
const Kernels* avx512_kernel_table(bool vnni, bool bf16);
// avx512-vnni-bf16 with int8 and bf16 weights by 4 or more activation rows through AMX tiles
// (tdpbssd, tdpbf16ps); nullptr when the build has no AMX.
const Kernels* amx_kernel_table();
// Every path this CPU runs: the portable one first, the best last.
std::vector<const Kernels*> supported_kernels();

// Builds `format` weights from fp32 values (row-major rows x cols). kInt8 and kFp8 get one
// scale per row: int8 to ±127, fp8 e4m3 to ±448.
WeightMatrix make_weight_matrix(WeightFormat format, int rows, int cols, const float* values);

// The exact fp32 value of every e4m3 code (0x7f and 0xff, the NaNs, decode as 0).
const float* fp8_e4m3_table();
uint8_t float_to_fp8_e4m3(float value);  // nearest, ties to even, saturating at ±448

}  // namespace flotilla::llm

// The AVX2 path: compiled with -mavx2 -mfma -mf16c (only this file), used only when the CPU
// reports all three. Decoding speed is bound by reading weights, so each weight vector is loaded
// and widened to fp32 once and used for up to kTileX activation rows; a 3 x 4 tile of
// accumulators fills 12 of the 16 ymm registers.
#include <cmath>
#include <cstring>
#include <vector>

#include <immintrin.h>

#include "llm/kernels.h"
#include "llm/safetensors.h"

namespace flotilla::llm {

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
namespace {

constexpr int kTileW = 3;  // weight rows per tile
constexpr int kTileX = 4;  // activation rows per tile

// Eight consecutive weights as fp32 (before the row scale). fp8 e4m3 comes out 2^-8 too small:
// its bits shifted into an fp16 (same mantissa width plus 7, exponent bias 15 instead of 7)
// give value x 2^-8 for normals and subnormals alike, and F16C widens that exactly.
template <WeightFormat F>
inline __m256 load8(const std::byte* p) {
  if constexpr (F == WeightFormat::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (F == WeightFormat::kBF16) {
    __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
  } else if constexpr (F == WeightFormat::kInt8) {
    __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  } else {
    __m128i words = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    __m128i magnitude = _mm_slli_epi16(_mm_and_si128(words, _mm_set1_epi16(0x7f)), 7);
    __m128i sign = _mm_slli_epi16(_mm_and_si128(words, _mm_set1_epi16(0x80)), 8);
    return _mm256_cvtph_ps(_mm_or_si128(magnitude, sign));
  }
}

template <WeightFormat F>
constexpr int kElementBytes = F == WeightFormat::kF32    ? 4
                              : F == WeightFormat::kBF16 ? 2
                                                         : 1;

template <WeightFormat F>
inline float scalar_weight(const std::byte* p) {
  if constexpr (F == WeightFormat::kF32) {
    float value;
    std::memcpy(&value, p, 4);
    return value;
  } else if constexpr (F == WeightFormat::kBF16) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    return bf16_to_float(bits);
  } else if constexpr (F == WeightFormat::kInt8) {
    return static_cast<float>(static_cast<int8_t>(*p));
  } else {
    return fp8_e4m3_table()[static_cast<uint8_t>(*p)] / 256.0f;  // as load8 gives it
  }
}

inline float hsum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

// Dot products of WR weight rows with XR activation rows: out[w][x].
template <WeightFormat F, int WR, int XR>
inline void tile(const std::byte* const* wrows, const float* const* xrows, int cols,
                 float (&out)[kTileW][kTileX]) {
  // The small loops must be unrolled for acc and wv to live in registers; -O2 alone leaves
  // them as loops over stack arrays (measured: 8x slower).
  __m256 acc[WR][XR];
#pragma GCC unroll 4
  for (int a = 0; a < WR; ++a) {
#pragma GCC unroll 4
    for (int b = 0; b < XR; ++b) {
      acc[a][b] = _mm256_setzero_ps();
    }
  }
  int c = 0;
  for (; c + 8 <= cols; c += 8) {
    __m256 wv[WR];
#pragma GCC unroll 4
    for (int a = 0; a < WR; ++a) {
      if constexpr (XR <= 2 && kElementBytes<F> == 1) {
        // Few activation rows of int8/fp8 weights: the loop waits on memory. Asking for the
        // lines 1 KiB ahead keeps more of each row in flight than the hardware prefetcher
        // does: +50-75% at one row (llm_matmul_bench); no gain for bf16, a loss for fp32.
        _mm_prefetch(reinterpret_cast<const char*>(wrows[a] + c * kElementBytes<F>) + 1024,
                     _MM_HINT_T0);
      }
      wv[a] = load8<F>(wrows[a] + c * kElementBytes<F>);
    }
#pragma GCC unroll 4
    for (int b = 0; b < XR; ++b) {
      __m256 xv = _mm256_loadu_ps(xrows[b] + c);
#pragma GCC unroll 4
      for (int a = 0; a < WR; ++a) {
        acc[a][b] = _mm256_fmadd_ps(wv[a], xv, acc[a][b]);
      }
    }
  }
  for (int a = 0; a < WR; ++a) {
    for (int b = 0; b < XR; ++b) {
      float sum = hsum(acc[a][b]);
      for (int k = c; k < cols; ++k) {
        sum += scalar_weight<F>(wrows[a] + k * kElementBytes<F>) * xrows[b][k];
      }
      out[a][b] = sum;
    }
  }
}

template <WeightFormat F, int WR>
void tile_rows(const std::byte* const* wrows, const float* const* xrows, int xr, int cols,
               float (&out)[kTileW][kTileX]) {
  switch (xr) {
    case 1:
      return tile<F, WR, 1>(wrows, xrows, cols, out);
    case 2:
      return tile<F, WR, 2>(wrows, xrows, cols, out);
    case 3:
      return tile<F, WR, 3>(wrows, xrows, cols, out);
    default:
      return tile<F, WR, 4>(wrows, xrows, cols, out);
  }
}

template <WeightFormat F>
void tile_any(int wr, const std::byte* const* wrows, const float* const* xrows, int xr, int cols,
              float (&out)[kTileW][kTileX]) {
  switch (wr) {
    case 1:
      return tile_rows<F, 1>(wrows, xrows, xr, cols, out);
    case 2:
      return tile_rows<F, 2>(wrows, xrows, xr, cols, out);
    default:
      return tile_rows<F, 3>(wrows, xrows, xr, cols, out);
  }
}

template <WeightFormat F>
void matmul_format(const float* x, int m, const WeightMatrix& w, int row_begin, int row_end,
                   float* y, int ldy, bool accumulate) {
  // fp8 decodes 2^-8 too small (see load8); the row scale puts it back.
  constexpr float kDecodeScale = F == WeightFormat::kFp8 ? 256.0f : 1.0f;
  const int64_t row_bytes = static_cast<int64_t>(w.cols) * kElementBytes<F>;
  // Activation rows in chunks that stay in L2 while every weight row of the range passes by.
  constexpr int kChunkX = 32;
  // With more activation rows than one tile holds, a narrow format's rows are widened to fp32
  // once into this buffer (L1-sized) instead of once per tile of activation rows: the widening
  // instructions compete with the FMAs for the same ports.
  thread_local std::vector<float> widened;
  for (int x0 = 0; x0 < m; x0 += kChunkX) {
    int x_end = std::min(m, x0 + kChunkX);
    const bool widen = F != WeightFormat::kF32 && x_end - x0 > kTileX;
    for (int r = row_begin; r < row_end; r += kTileW) {
      int wr = std::min(kTileW, row_end - r);
      const std::byte* wrows[kTileW];
      for (int a = 0; a < wr; ++a) {
        wrows[a] = w.data + (r + a) * row_bytes;
      }
      if (widen) {
        widened.resize(static_cast<size_t>(kTileW) * w.cols);
        for (int a = 0; a < wr; ++a) {
          float* out = widened.data() + static_cast<size_t>(a) * w.cols;
          int c = 0;
          for (; c + 8 <= w.cols; c += 8) {
            _mm256_storeu_ps(out + c, load8<F>(wrows[a] + c * kElementBytes<F>));
          }
          for (; c < w.cols; ++c) {
            out[c] = scalar_weight<F>(wrows[a] + c * kElementBytes<F>);
          }
          wrows[a] = reinterpret_cast<const std::byte*>(out);
        }
      }
      for (int i = x0; i < x_end; i += kTileX) {
        int xr = std::min(kTileX, x_end - i);
        const float* xrows[kTileX];
        for (int b = 0; b < xr; ++b) {
          xrows[b] = x + static_cast<int64_t>(i + b) * w.cols;
        }
        float out[kTileW][kTileX];
        if (widen) {
          tile_any<WeightFormat::kF32>(wr, wrows, xrows, xr, w.cols, out);
        } else {
          tile_any<F>(wr, wrows, xrows, xr, w.cols, out);
        }
        for (int a = 0; a < wr; ++a) {
          float scale = (w.scales.empty() ? 1.0f : w.scales[r + a]) * kDecodeScale;
          float bias = w.bias.empty() ? 0.0f : w.bias[r + a];
          for (int b = 0; b < xr; ++b) {
            float& dst = y[static_cast<int64_t>(i + b) * ldy + r + a];
            dst = (accumulate ? dst : 0.0f) + out[a][b] * scale + bias;
          }
        }
      }
    }
  }
}

void avx2_matmul(const float* x, int m, const WeightMatrix& w, int row_begin, int row_end, float* y,
                 int ldy, bool accumulate) {
  switch (w.format) {
    case WeightFormat::kF32:
      return matmul_format<WeightFormat::kF32>(x, m, w, row_begin, row_end, y, ldy, accumulate);
    case WeightFormat::kBF16:
      return matmul_format<WeightFormat::kBF16>(x, m, w, row_begin, row_end, y, ldy, accumulate);
    case WeightFormat::kInt8:
      return matmul_format<WeightFormat::kInt8>(x, m, w, row_begin, row_end, y, ldy, accumulate);
    case WeightFormat::kFp8:
      return matmul_format<WeightFormat::kFp8>(x, m, w, row_begin, row_end, y, ldy, accumulate);
  }
}

float avx2_dot(const float* a, const float* b, int n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  }
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) {
    sum += a[i] * b[i];
  }
  return sum;
}

void avx2_axpy(float alpha, const float* x, float* y, int n) {
  __m256 a = _mm256_set1_ps(alpha);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) {
    y[i] += alpha * x[i];
  }
}

// e^x for x in [-87, 88] (clamped), to ~2 ulp: x = n ln2 + f with |f| <= ln2/2, e^f by its
// degree-6 Taylor polynomial, 2^n put into the exponent bits (Cephes' expf scheme).
inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  f = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), f);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  __m256i exponent =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

void avx2_silu_mul(float* gate, const float* up, int n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 g = _mm256_loadu_ps(gate + i);
    __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
    __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  }
}

const Kernels kAvx2{"avx2", avx2_matmul, avx2_dot, avx2_axpy, avx2_silu_mul};

}  // namespace

const Kernels* avx2_kernels() {
  __builtin_cpu_init();
  bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                   __builtin_cpu_supports("f16c");
  return supported ? &kAvx2 : nullptr;
}

#else

const Kernels* avx2_kernels() {
  return nullptr;
}

#endif

}  // namespace flotilla::llm

// The AVX2 path: compiled with -mavx2 -mfma -mf16c (only this file), used only when the CPU
// reports all three: the tiled matmul of kernels_tiles.h on 8-lane vectors, every weight
// format widened to fp32.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <immintrin.h>

#include "llm/kernels.h"
#include "llm/safetensors.h"

namespace flotilla::llm {

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
namespace {

#include "llm/kernels_tiles.h"  // inside the anonymous namespace: this ISA's own copy

constexpr int kTileW = 3;  // weight rows per tile
constexpr int kTileX = 4;  // activation rows per tile: 12 of the 16 ymm registers accumulate
constexpr int kChunkX = 32;

inline float hsum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

struct Avx2 {
  static constexpr int kLanes = 8;
  using V = __m256;
  static V zero() { return _mm256_setzero_ps(); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(V v) { return hsum(v); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  // Eight consecutive weights as fp32 (before the row scale). fp8 e4m3 comes out 2^-8 too
  // small: its bits shifted into an fp16 (same mantissa width plus 7, exponent bias 15 instead
  // of 7) give value x 2^-8 for normals and subnormals alike, and F16C widens that exactly.
  template <WeightFormat F>
  static V widen(const std::byte* p) {
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
};

void avx2_matmul(const float* x, int m, const WeightMatrix& w, int row_begin, int row_end, float* y,
                 int ldy, bool accumulate, const void* /*prepared*/) {
  matmul_any_widened<Avx2, kTileW, kTileX, kChunkX>(x, m, w, row_begin, row_end, y, ldy,
                                                    accumulate);
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

const Kernels kAvx2{"avx2", avx2_matmul, avx2_dot, avx2_axpy, avx2_silu_mul, kTileW, nullptr};

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

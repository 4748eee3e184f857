// The AVX2 path: compiled with -mavx2 -mfma -mf16c (only this file), used only when the CPU
// reports all three: the tiled matmul of kernels_tiles.h on 8-lane vectors, with the weights
// widened to fp32, but for int8 weights (integer products, vpmaddwd) and bf16 weights by one
// activation row (widened two a lane).
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

// ---- int8 weights by int16 activations (vpmaddwd) -----------------------------------------

// AVX2 has no 8-bit dot product that takes both signs (vpmaddubsw wants one operand unsigned,
// and saturates). vpmaddwd multiplies 16-bit pairs into exact 32-bit sums: the weights are
// sign-extended to 16 bits (one instruction for 16 of them, shared by every activation row of a
// tile), the activation rows quantized to int16 once a matmul, one scale a row, as fine as the
// int32 sums allow (avx2_int16_code_limit). Per 16 products: one vpmaddwd and one vpaddd, where
// widening to fp32 took two conversions and two FMAs.
struct Int16Rows {
  int stride = 0;  // codes a row, padded with zero codes to a multiple of 16
  int16_t* codes = nullptr;
  float* scales = nullptr;  // per row: x ~ code x scale
};

// The codes and scales live in the calling thread's scratch.
Int16Rows quantize_rows_int16(const float* x, int m, int cols) {
  thread_local Scratch<int16_t> codes_scratch;
  thread_local Scratch<float> scales_scratch;
  Int16Rows q;
  q.stride = (cols + 15) / 16 * 16;
  q.codes = codes_scratch.get(static_cast<size_t>(m) * q.stride, /*zero=*/true);
  q.scales = scales_scratch.get(m);
  const auto limit = static_cast<float>(avx2_int16_code_limit(cols));
  for (int i = 0; i < m; ++i) {
    const float* row = x + static_cast<int64_t>(i) * cols;
    int16_t* codes = q.codes + static_cast<int64_t>(i) * q.stride;
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    __m256 amax8 = _mm256_setzero_ps();
    int c = 0;
    for (; c + 8 <= cols; c += 8) {
      amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign_bit, _mm256_loadu_ps(row + c)));
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, amax8);
    float amax = *std::max_element(lanes, lanes + 8);
    for (int k = c; k < cols; ++k) {
      amax = std::max(amax, std::fabs(row[k]));
    }
    q.scales[i] = amax / limit;
    const float inverse = amax > 0 ? limit / amax : 0;
    const __m256 inverse8 = _mm256_set1_ps(inverse);
    c = 0;
    for (; c + 16 <= cols; c += 16) {
      // Rounded to nearest even (the default rounding mode), within ±limit by construction;
      // packs interleave 128-bit lanes, permute puts them back in order.
      __m256i low = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + c), inverse8));
      __m256i high = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + c + 8), inverse8));
      __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(low, high), 0xd8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + c), packed);
    }
    for (; c < cols; ++c) {
      codes[c] = static_cast<int16_t>(std::nearbyint(row[c] * inverse));
    }
  }
  return q;
}

// How far ahead of each weight row the tiles that read their rows in sequence prefetch
// (prefetch_ahead): the one-row bf16 tile and every int8 tile. On a 2-core
// AVX2 EPYC (19 GB/s), decoding one sequence in bf16 with the rows then read interleaved: 1 KiB
// ahead +3%, 4 KiB +12%, 16 KiB +18%, 32 KiB +12% (bench/RESULTS.md, "Prefetching the
// weights"). With the rows in sequence, this path on an AVX-512 EPYC (FLOTILLA_LLM_KERNELS=avx2,
// one client, against the same order without it): bf16 +6-24%, int8 within noise. The int8
// tiles at 16 rows prefetch the same lines again for each pair of activation rows; only the
// first pair prefetching ran 0.82-1.02x at 16 clients.
constexpr uintptr_t kPrefetchBytes = 16 * 1024;

// 3 x 2 accumulators, so a tile reads its weight rows one after another (kStreamRows) at any
// number of activation rows. With 3 x 3, GCC computed the nine products before adding them and
// kept two of the nine accumulators on the stack (18 registers wanted of 16); with 3 x 4, more.
// On an AVX-512 EPYC running this path, one thread, int8 at 4-64 rows: 1.14-1.23x on a matrix
// the L3 holds, the LM head 1.00-1.22x; the replica at 16 clients +0-31% (bench/RESULTS.md, "The
// next weight rows into L2").
constexpr int kInt8TileX = 2;

inline int32_t hsum_epi32(__m256i v) {
  __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0x4e));
  sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0xb1));
  return _mm_cvtsi128_si32(sum);
}

template <int WR, int XR>
inline void tile_int8_madd(const int8_t* const* wrows, const int16_t* const* xrows, int cols,
                           float (&out)[kTileW][kInt8TileX]) {
  static_assert(kStreamRows<XR>);
  __m256i acc[WR][XR];
#pragma GCC unroll 4
  for (int a = 0; a < WR; ++a) {
#pragma GCC unroll 4
    for (int b = 0; b < XR; ++b) {
      acc[a][b] = _mm256_setzero_si256();
    }
  }
  int c = 0;
#pragma GCC unroll 4
  for (int a = 0; a < WR; ++a) {
    for (c = 0; c + 16 <= cols; c += 16) {
      prefetch_ahead<kPrefetchBytes>(wrows[a] + c);
      const __m256i wv =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wrows[a] + c)));
#pragma GCC unroll 2
      for (int b = 0; b < XR; ++b) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xrows[b] + c));
        acc[a][b] = _mm256_add_epi32(acc[a][b], _mm256_madd_epi16(wv, xv));
      }
    }
  }
  for (int a = 0; a < WR; ++a) {
    for (int b = 0; b < XR; ++b) {
      int32_t sum = hsum_epi32(acc[a][b]);
      for (int k = c; k < cols; ++k) {
        sum += static_cast<int32_t>(wrows[a][k]) * xrows[b][k];
      }
      out[a][b] = static_cast<float>(sum);
    }
  }
}

void matmul_int8_madd(const Int16Rows& q, int m, const WeightMatrix& w, int row_begin, int row_end,
                      float* y, int ldy, bool accumulate) {
  const int8_t* wrows[kTileW];
  auto weight_rows = [&](int r, int wr, int, int) {
    for (int a = 0; a < wr; ++a) {
      wrows[a] = reinterpret_cast<const int8_t*>(w.data) + static_cast<int64_t>(r + a) * w.cols;
    }
  };
  auto tile = [&](int r, int wr, int i, int xr) {
    const int16_t* xrows[kInt8TileX];
    for (int b = 0; b < xr; ++b) {
      xrows[b] = q.codes + static_cast<int64_t>(i + b) * q.stride;
    }
    float out[kTileW][kInt8TileX];
    dispatch_tile<kTileW, kInt8TileX>(wr, xr, [&](auto wr_c, auto xr_c) {
      tile_int8_madd<decltype(wr_c)::value, decltype(xr_c)::value>(wrows, xrows, w.cols, out);
    });
    for (int a = 0; a < wr; ++a) {
      for (int b = 0; b < xr; ++b) {
        out[a][b] *= q.scales[i + b];
      }
    }
    store_tile(out, w, r, wr, i, xr, 1.0f, y, ldy, accumulate);
  };
  for_each_tile<kTileW, kInt8TileX, kChunkX>(m, row_begin, row_end, weight_rows, tile);
}

// ---- bf16 weights by one activation row --------------------------------------------------

// A bf16 value is the upper half of an fp32: 16 bf16 weights loaded as 8 32-bit lanes are the
// 8 odd-indexed ones as fp32 once the lower halves are masked off (one vpand), and the 8
// even-indexed ones once shifted up (one vpslld). Widening 8 at a time took a vpmovzxwd and a
// vpslld. The activation row is put once a matmul into the same order: in each block of 16
// columns, its 8 even columns, then its 8 odd ones (the columns past the last block as they are).
// On the AVX-512 host, decoding one sequence was bound by this widening, not by memory (1.3x
// the weights a second, bench/RESULTS.md, "AVX2 kernels"); on a 19 GB/s AVX2 host memory binds
// it, hence prefetch_ahead.
constexpr int kPairBlock = 16;

// The row lives in the calling thread's scratch.
const float* deinterleave_row(const float* x, int cols) {
  thread_local Scratch<float> scratch;
  float* out = scratch.get(cols);
  int c = 0;
  for (; c + kPairBlock <= cols; c += kPairBlock) {
    for (int j = 0; j < kPairBlock / 2; ++j) {
      out[c + j] = x[c + 2 * j];
      out[c + kPairBlock / 2 + j] = x[c + 2 * j + 1];
    }
  }
  std::copy(x + c, x + cols, out + c);
  return out;
}

template <int WR>
inline void tile_bf16_row(const uint16_t* const* wrows, const float* x, int cols,
                          float (&out)[kTileW][kTileX]) {
  __m256 even[WR], odd[WR];  // two chains of FMAs a weight row
#pragma GCC unroll 4
  for (int a = 0; a < WR; ++a) {
    even[a] = odd[a] = _mm256_setzero_ps();
  }
  const __m256i upper = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  int c = 0;
  // One weight row after another, as kStreamRows tiles read them: this tile takes one row.
#pragma GCC unroll 4
  for (int a = 0; a < WR; ++a) {
    for (c = 0; c + kPairBlock <= cols; c += kPairBlock) {
      prefetch_ahead<kPrefetchBytes>(wrows[a] + c);
      const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wrows[a] + c));
      even[a] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)),
                                _mm256_loadu_ps(x + c), even[a]);
      odd[a] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(pairs, upper)),
                               _mm256_loadu_ps(x + c + 8), odd[a]);
    }
  }
  for (int a = 0; a < WR; ++a) {
    float sum = hsum(_mm256_add_ps(even[a], odd[a]));
    for (int k = c; k < cols; ++k) {
      sum += bf16_to_float(wrows[a][k]) * x[k];
    }
    out[a][0] = sum;
  }
}

void matmul_bf16_row(const float* deinterleaved, const WeightMatrix& w, int row_begin, int row_end,
                     float* y, bool accumulate) {
  const uint16_t* wrows[kTileW];
  auto weight_rows = [&](int r, int wr, int, int) {
    for (int a = 0; a < wr; ++a) {
      wrows[a] = reinterpret_cast<const uint16_t*>(w.data) + static_cast<int64_t>(r + a) * w.cols;
    }
  };
  auto tile = [&](int r, int wr, int i, int xr) {
    float out[kTileW][kTileX];
    with_count<kTileW>(wr, [&](auto wr_c) {
      tile_bf16_row<decltype(wr_c)::value>(wrows, deinterleaved, w.cols, out);
    });
    store_tile(out, w, r, wr, i, xr, 1.0f, y, /*ldy=*/0, accumulate);
  };
  for_each_tile<kTileW, kTileX, kChunkX>(1, row_begin, row_end, weight_rows, tile);
}

const void* avx2_prepare(const float* x, int m, const WeightMatrix& w) {
  if (w.format == WeightFormat::kBF16 && m == 1) {
    return deinterleave_row(x, w.cols);
  }
  if (w.format != WeightFormat::kInt8) {
    return nullptr;
  }
  thread_local Int16Rows quantized;
  quantized = quantize_rows_int16(x, m, w.cols);
  return &quantized;
}

void avx2_matmul(const float* x, int m, const WeightMatrix& w, int row_begin, int row_end, float* y,
                 int ldy, bool accumulate, const void* prepared) {
  if (w.format == WeightFormat::kInt8) {
    if (prepared == nullptr) {
      prepared = avx2_prepare(x, m, w);
    }
    return matmul_int8_madd(*static_cast<const Int16Rows*>(prepared), m, w, row_begin, row_end, y,
                            ldy, accumulate);
  }
  if (w.format == WeightFormat::kBF16 && m == 1) {
    if (prepared == nullptr) {
      prepared = avx2_prepare(x, m, w);
    }
    return matmul_bf16_row(static_cast<const float*>(prepared), w, row_begin, row_end, y,
                           accumulate);
  }
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

void avx2_dot_rows(const float* q, const float* k, int tokens, int n, float* scores) {
  for (int t = 0; t < tokens; ++t) {
    scores[t] = avx2_dot(q, k + static_cast<int64_t>(t) * n, n);
  }
}

// out's columns 32 at a time in four registers over every position, then the rest one by one.
void avx2_weighted_sum(const float* weights, const float* v, int tokens, int n, float* out) {
  int c = 0;
  for (; c + 32 <= n; c += 32) {
    __m256 acc[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      acc[i] = _mm256_loadu_ps(out + c + 8 * i);
    }
    for (int t = 0; t < tokens; ++t) {
      const __m256 weight = _mm256_set1_ps(weights[t]);
      const float* row = v + static_cast<int64_t>(t) * n + c;
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        acc[i] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(row + 8 * i), acc[i]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      _mm256_storeu_ps(out + c + 8 * i, acc[i]);
    }
  }
  for (; c < n; ++c) {
    for (int t = 0; t < tokens; ++t) {
      out[c] += weights[t] * v[static_cast<int64_t>(t) * n + c];
    }
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

const Kernels kAvx2{"avx2",        avx2_matmul, avx2_dot_rows, avx2_weighted_sum,
                    avx2_silu_mul, kTileW,      avx2_prepare};

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

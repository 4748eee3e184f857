// The AVX-512 paths: compiled with AVX-512 F/BW/VL, VNNI, BF16 and AMX (only this file), used only
// when the CPU reports what each table needs (kernels.cc checks before handing one out).
// - avx512f: every weight format widened to fp32, 16 lanes, a 4 x 4 tile of accumulators (16
//   of the 32 zmm registers).
// - VNNI int8 (vpdpbusd): the activation rows are quantized to int8 once a matmul (one scale per
//   32 columns, amax / 127, as llama.cpp's Q8_0 activations are), and 64 weight-activation
//   products go into one instruction, with no widening. vpdpbusd multiplies unsigned by signed
//   bytes: the weights are made unsigned by flipping their sign bit (w + 128), and 128 x the
//   scaled sums of the activation codes are taken off the result.
// - BF16 (vdpbf16ps): the activation rows are rounded to bf16 once a matmul, and 32
//   products of bf16 pairs accumulate in fp32 in one instruction, again with no widening.
// - AMX (tdpbssd, tdpbf16ps; also compiled here), for int8 and bf16 weights by 4 or more
//   activation rows: the same roundings, 16 x 16 x 32 products an instruction.
// All trade the fp32 activations of the other paths for a rounding of them: kernels_test bounds
// the difference from the portable reference by that rounding.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

// GCC 12's AVX-512 headers make their "undefined" vectors by self-initialization, which its
// own -Wuninitialized then reports at every reduction (GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#include "llm/kernels.h"
#include "llm/safetensors.h"

namespace flotilla::llm {

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX512BF16__) && defined(__FMA__) && defined(__F16C__)
namespace {

#include "llm/kernels_tiles.h"  // inside the anonymous namespace: this ISA's own copy

constexpr int kTileW = 4;  // weight rows per tile
constexpr int kTileX = 4;  // activation rows per tile: 16 of the 32 zmm registers accumulate
constexpr int kChunkX = 32;

// The same 512 bits as the other vector type (the compiler emits no instruction).
inline __m512bh as_bf16(__m512i v) {
  __m512bh out;
  std::memcpy(&out, &v, sizeof out);
  return out;
}

struct Avx512 {
  static constexpr int kLanes = 16;
  using V = __m512;
  static V zero() { return _mm512_setzero_ps(); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  // Sixteen consecutive weights as fp32 (before the row scale); fp8 e4m3 2^-8 too small, as in
  // kernels_avx2.cc (its bits shifted into an fp16, which F16C widens exactly).
  template <WeightFormat F>
  static V widen(const std::byte* p) {
    if constexpr (F == WeightFormat::kF32) {
      return _mm512_loadu_ps(p);
    } else if constexpr (F == WeightFormat::kBF16) {
      __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    } else if constexpr (F == WeightFormat::kInt8) {
      __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
    } else {
      __m256i words = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      __m256i magnitude = _mm256_slli_epi16(_mm256_and_si256(words, _mm256_set1_epi16(0x7f)), 7);
      __m256i sign = _mm256_slli_epi16(_mm256_and_si256(words, _mm256_set1_epi16(0x80)), 8);
      return _mm512_cvtph_ps(_mm256_or_si256(magnitude, sign));
    }
  }
};

// The mask of a step of N elements at column c: all N, or those before cols in the last step.
template <int N, typename Mask>
inline Mask step_mask(int c, int cols) {
  return c + N <= cols ? static_cast<Mask>(~Mask{0})
                       : static_cast<Mask>(~Mask{0} >> (N - (cols - c)));
}

// Two vectors' lanes summed pairwise within each 128-bit chunk q: [x(q), y(q), x'(q), y'(q)],
// where x(q) + x'(q) is x's sum over chunk q.
inline __m512 add_pairs(__m512 x, __m512 y) {
  return _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
}

// out[a][b] = the sum of acc[a][b]'s lanes. Every loop here is unrolled: one indexed access to
// acc made GCC 12 keep the whole tile in memory, storing every accumulator after every product
// in the tile's loop (the bf16 and VNNI tiles ran at half their speed, or less). A full 4 x 4
// tile is summed as a transpose: the 16 vectors fold into one whose lane 4a + b is out[a][b],
// 45 instructions where 16 reductions take about 130.
template <int WR, int XR>
inline void sum_lanes(const __m512 (&acc)[WR][XR], float (&out)[kTileW][kTileX]) {
  if constexpr (WR == 4 && XR == 4 && kTileW == 4 && kTileX == 4) {
    __m512 rows[4];  // rows[a]: chunk q holds acc[a][0..3]'s sums over chunk q
#pragma GCC unroll 4
    for (int a = 0; a < 4; ++a) {
      __m512 p01 = add_pairs(acc[a][0], acc[a][1]), p23 = add_pairs(acc[a][2], acc[a][3]);
      rows[a] = _mm512_add_ps(
          _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(p01), _mm512_castps_pd(p23))),
          _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(p01), _mm512_castps_pd(p23))));
    }
    // Chunks of two rows, even with odd: [r0 q0+q1, r0 q2+q3, r1 q0+q1, r1 q2+q3].
    auto fold = [](__m512 x, __m512 y) {
      return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0b10001000),
                           _mm512_shuffle_f32x4(x, y, 0b11011101));
    };
    __m512 r01 = fold(rows[0], rows[1]), r23 = fold(rows[2], rows[3]);
    _mm512_storeu_ps(&out[0][0], fold(r01, r23));
  } else {
#pragma GCC unroll 4
    for (int a = 0; a < WR; ++a) {
#pragma GCC unroll 4
      for (int b = 0; b < XR; ++b) {
        out[a][b] = _mm512_reduce_add_ps(acc[a][b]);
      }
    }
  }
}

// Points rows[a] at weight row r + a of w, as elements of type T, for a < wr.
template <typename T>
inline void point_at_rows(const WeightMatrix& w, int r, int wr, const T* (&rows)[kTileW]) {
  for (int a = 0; a < wr; ++a) {
    rows[a] = reinterpret_cast<const T*>(w.data) + static_cast<int64_t>(r + a) * w.cols;
  }
}

// ---- VNNI: int8 weights by int8 activations --------------------------------------------

// Activation rows as int8 codes with one scale per block of 32 columns (llama.cpp's Q8_0
// granularity: one per row cost 4-6x the fp32 error of int8 weights alone on the test models,
// as a heavy-tailed row's largest value coarsens the step for all of it). A 64-byte vpdpbusd
// sums columns 4l..4l+3 into lane l, so lanes 0-7 hold one block and lanes 8-15 the next: each
// step's 16 int32 sums are scaled by a vector of the blocks' scales, one per lane.
constexpr int kBlock = 32;

struct QuantizedRows {
  int stride = 0;                // codes a row, padded with zero codes to a multiple of 64
  int8_t* codes = nullptr;       // x ~ code x its block's scale
  float* lane_scales = nullptr;  // stride / 4 a row: each lane's block scale
  float* offsets = nullptr;      // per row: 128 x the sum over blocks of scale x code sum
};

// The rows' codes, lane scales and offsets live in the calling thread's scratch.
QuantizedRows quantize_rows(const float* x, int m, int cols) {
  thread_local Scratch<int8_t> codes_scratch;
  thread_local Scratch<float> lanes_scratch, offsets_scratch;
  QuantizedRows q;
  q.stride = (cols + 63) / 64 * 64;
  q.codes = codes_scratch.get(static_cast<size_t>(m) * q.stride, /*zero=*/true);
  q.lane_scales = lanes_scratch.get(static_cast<size_t>(m) * q.stride / 4, /*zero=*/true);
  q.offsets = offsets_scratch.get(m);
  for (int i = 0; i < m; ++i) {
    const float* row = x + static_cast<int64_t>(i) * cols;
    int8_t* codes = q.codes + static_cast<int64_t>(i) * q.stride;
    float* lanes = q.lane_scales + static_cast<int64_t>(i) * q.stride / 4;
    double offset = 0;
    for (int c0 = 0; c0 < cols; c0 += kBlock) {
      const int n = std::min(kBlock, cols - c0);
      float amax = 0;
      int c = 0;
      if (n == kBlock) {
        __m512 a = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(row + c0)),
                                 _mm512_abs_ps(_mm512_loadu_ps(row + c0 + 16)));
        amax = _mm512_reduce_max_ps(a);
        c = kBlock;
      }
      for (int k = c; k < n; ++k) {
        amax = std::max(amax, std::fabs(row[c0 + k]));
      }
      const float scale = amax / 127;
      const float inverse = amax > 0 ? 127 / amax : 0;
      int32_t sum = 0;
      c = 0;
      if (n == kBlock) {
        const __m512 inverse16 = _mm512_set1_ps(inverse);
        for (; c < kBlock; c += 16) {
          // Rounded to nearest even (the default rounding mode), within ±127 by construction.
          __m512i code =
              _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(row + c0 + c), inverse16));
          sum += _mm512_reduce_add_epi32(code);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + c0 + c), _mm512_cvtsepi32_epi8(code));
        }
      }
      for (; c < n; ++c) {
        const auto code = static_cast<int32_t>(std::nearbyint(row[c0 + c] * inverse));
        codes[c0 + c] = static_cast<int8_t>(std::clamp(code, -127, 127));
        sum += codes[c0 + c];
      }
      std::fill_n(lanes + c0 / 4, kBlock / 4, scale);
      offset += 128.0 * scale * sum;
    }
    q.offsets[i] = static_cast<float>(offset);
  }
  return q;
}

template <int WR, int XR>
inline void tile_vnni(const int8_t* const* wrows, const int8_t* const* qrows,
                      const float* const* lane_scales, int cols, uintptr_t next,
                      float (&out)[kTileW][kTileX]) {
  __m512 acc[WR][XR];
#pragma GCC unroll 4
  for (int a = 0; a < WR; ++a) {
#pragma GCC unroll 4
    for (int b = 0; b < XR; ++b) {
      acc[a][b] = _mm512_setzero_ps();
    }
  }
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  if constexpr (kStreamRows<XR>) {
#pragma GCC unroll 4
    for (int a = 0; a < WR; ++a) {
      for (int c = 0; c < cols; c += 64) {
        const __m512i wv = _mm512_xor_si512(
            _mm512_maskz_loadu_epi8(step_mask<64, __mmask64>(c, cols), wrows[a] + c), flip);
#pragma GCC unroll 2
        for (int b = 0; b < XR; ++b) {
          const __m512i sums =
              _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, _mm512_loadu_si512(qrows[b] + c));
          acc[a][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums),
                                      _mm512_loadu_ps(lane_scales[b] + c / 4), acc[a][b]);
        }
      }
    }
    sum_lanes(acc, out);
    return;
  }
  for (int c = 0; c < cols; c += 64) {
    const auto mask = step_mask<64, __mmask64>(c, cols);
    if (next != 0) {
      prefetch_next_group<WR * 64>(next, int64_t{c} * WR);
    }
    __m512i wv[WR];
#pragma GCC unroll 4
    for (int a = 0; a < WR; ++a) {
      // Beyond the row (masked off) the weight reads 0, then 128 once flipped; the activation
      // codes there are 0.
      wv[a] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, wrows[a] + c), flip);
    }
#pragma GCC unroll 4
    for (int b = 0; b < XR; ++b) {
      __m512i xv = _mm512_loadu_si512(qrows[b] + c);  // padded: always 64 codes
      __m512 scales = _mm512_loadu_ps(lane_scales[b] + c / 4);
#pragma GCC unroll 4
      for (int a = 0; a < WR; ++a) {
        __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[a], xv);
        acc[a][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scales, acc[a][b]);
      }
    }
  }
  sum_lanes(acc, out);
}

void matmul_int8_vnni(const QuantizedRows& q, int m, const WeightMatrix& w, int row_begin,
                      int row_end, float* y, int ldy, bool accumulate) {
  const int8_t* wrows[kTileW];
  auto weight_rows = [&](int r, int wr, int, int) {
    point_at_rows(w, r, wr, wrows);
  };
  auto tile = [&](int r, int wr, int i, int xr) {
    const int8_t* qrows[kTileX];
    const float* lane_scales[kTileX];
    for (int b = 0; b < xr; ++b) {
      qrows[b] = q.codes + static_cast<int64_t>(i + b) * q.stride;
      lane_scales[b] = q.lane_scales + static_cast<int64_t>(i + b) * q.stride / 4;
    }
    float out[kTileW][kTileX];
    const uintptr_t next = next_group<kTileW, kChunkX>(w, r, i);
    dispatch_tile<kTileW, kTileX>(wr, xr, [&](auto wr_c, auto xr_c) {
      tile_vnni<decltype(wr_c)::value, decltype(xr_c)::value>(wrows, qrows, lane_scales, w.cols,
                                                              next, out);
    });
    for (int a = 0; a < wr; ++a) {
      for (int b = 0; b < xr; ++b) {
        out[a][b] -= q.offsets[i + b];
      }
    }
    store_tile(out, w, r, wr, i, xr, 1.0f, y, ldy, accumulate);
  };
  for_each_tile<kTileW, kTileX, kChunkX>(m, row_begin, row_end, weight_rows, tile);
}

// ---- BF16: bf16 weights by bf16 activations -----------------------------------------------

// Activation rows rounded to bf16 (nearest even), each padded with zeros to `stride` (a
// multiple of 32).
struct Bf16Rows {
  int stride = 0;
  uint16_t* values = nullptr;
};

// The rounded rows live in the calling thread's scratch.
Bf16Rows round_rows_to_bf16(const float* x, int m, int cols) {
  thread_local Scratch<uint16_t> scratch;
  Bf16Rows out;
  out.stride = (cols + 31) / 32 * 32;
  out.values = scratch.get(static_cast<size_t>(m) * out.stride, /*zero=*/true);
  for (int i = 0; i < m; ++i) {
    const float* row = x + static_cast<int64_t>(i) * cols;
    uint16_t* dst = out.values + static_cast<int64_t>(i) * out.stride;
    int c = 0;
    for (; c + 32 <= cols; c += 32) {
      // The second operand fills the lower half.
      __m512bh pair = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + c + 16), _mm512_loadu_ps(row + c));
      std::memcpy(dst + c, &pair, sizeof pair);
    }
    for (; c < cols; ++c) {
      dst[c] = float_to_bf16(row[c]);
    }
  }
  return out;
}

template <int WR, int XR>
inline void tile_bf16(const uint16_t* const* wrows, const uint16_t* const* xrows, int cols,
                      uintptr_t next, float (&out)[kTileW][kTileX]) {
  __m512 acc[WR][XR];
#pragma GCC unroll 4
  for (int a = 0; a < WR; ++a) {
#pragma GCC unroll 4
    for (int b = 0; b < XR; ++b) {
      acc[a][b] = _mm512_setzero_ps();
    }
  }
  if constexpr (kStreamRows<XR>) {
#pragma GCC unroll 4
    for (int a = 0; a < WR; ++a) {
      for (int c = 0; c < cols; c += 32) {
        const __m512i wv =
            _mm512_maskz_loadu_epi16(step_mask<32, __mmask32>(c, cols), wrows[a] + c);
#pragma GCC unroll 2
        for (int b = 0; b < XR; ++b) {
          const __m512i xv = _mm512_loadu_si512(xrows[b] + c);
          acc[a][b] = _mm512_dpbf16_ps(acc[a][b], as_bf16(wv), as_bf16(xv));
        }
      }
    }
    sum_lanes(acc, out);
    return;
  }
  for (int c = 0; c < cols; c += 32) {
    const auto mask = step_mask<32, __mmask32>(c, cols);
    if (next != 0) {
      prefetch_next_group<WR * 64>(next, int64_t{c} * kElementBytes<WeightFormat::kBF16> * WR);
    }
    __m512i wv[WR];
#pragma GCC unroll 4
    for (int a = 0; a < WR; ++a) {
      wv[a] = _mm512_maskz_loadu_epi16(mask, wrows[a] + c);  // zeros beyond the row
    }
#pragma GCC unroll 4
    for (int b = 0; b < XR; ++b) {
      __m512i xv = _mm512_loadu_si512(xrows[b] + c);  // padded: always 32 values
#pragma GCC unroll 4
      for (int a = 0; a < WR; ++a) {
        acc[a][b] = _mm512_dpbf16_ps(acc[a][b], as_bf16(wv[a]), as_bf16(xv));
      }
    }
  }
  sum_lanes(acc, out);
}

void matmul_bf16_dot(const Bf16Rows& rounded, int m, const WeightMatrix& w, int row_begin,
                     int row_end, float* y, int ldy, bool accumulate) {
  const uint16_t* wrows[kTileW];
  auto weight_rows = [&](int r, int wr, int, int) {
    point_at_rows(w, r, wr, wrows);
  };
  auto tile = [&](int r, int wr, int i, int xr) {
    const uint16_t* xrows[kTileX];
    for (int b = 0; b < xr; ++b) {
      xrows[b] = rounded.values + static_cast<int64_t>(i + b) * rounded.stride;
    }
    float out[kTileW][kTileX];
    const uintptr_t next = next_group<kTileW, kChunkX>(w, r, i);
    dispatch_tile<kTileW, kTileX>(wr, xr, [&](auto wr_c, auto xr_c) {
      tile_bf16<decltype(wr_c)::value, decltype(xr_c)::value>(wrows, xrows, w.cols, next, out);
    });
    store_tile(out, w, r, wr, i, xr, 1.0f, y, ldy, accumulate);
  };
  for_each_tile<kTileW, kTileX, kChunkX>(m, row_begin, row_end, weight_rows, tile);
}

// ---- AMX: int8 and bf16 weights, 16 x 16 x 32 products an instruction ---------------------

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)
// tdpbssd multiplies signed bytes by signed bytes (no flip, no offset). Tile A holds 16 weight
// rows x one block of 32 columns, loaded in place; tile B the same block of 16 activation rows
// in the layout AMX wants (its row k: columns 4k..4k+3 of each activation row in turn), packed
// once a matmul by prepare; tile C their 16 x 16 int32 sums, scaled after every block by the
// block's activation scales into fp32 accumulators (one scale per 32 columns, as the VNNI path:
// int32 sums of blocks with different scales cannot be added).
constexpr int kAmxTile = 16;    // weight rows and activation rows of a tile
constexpr int kAmxMinRows = 4;  // fewer activation rows: the VNNI path (AMX computes 16 anyway)
constexpr int kAmxBlockBytes = 32;

struct AmxRows {
  const QuantizedRows* quantized = nullptr;  // for the VNNI path's share: rows past the last 16
  int tiles = 0;                             // tiles of 16 activation rows (the last padded)
  int blocks = 0;                            // column blocks of 32
  int8_t* packed = nullptr;                  // [tile][block][8][64]
  float* scales = nullptr;                   // [tile][block][16]: each activation row's scale
};

// int8 and bf16 weights by enough activation rows, in whole blocks of 32 columns (a tile load
// reads a whole block: a partial one would read past the row).
bool uses_amx(int m, const WeightMatrix& w) {
  return (w.format == WeightFormat::kInt8 || w.format == WeightFormat::kBF16) && m >= kAmxMinRows &&
         w.cols % kAmxBlockBytes == 0;
}

// The tile loop of both formats: for every 16 weight rows of [row_begin, row_end) and every
// tile of 16 activation rows, tile(r, t, rows_follow, out) fills out[row][n] with weight row
// r + row by activation row 16t + n (before the row scale), and it is stored here;
// `rows_follow`: another 16 weight rows come after these. The rows past the last 16 go to
// tail(first_row), the format's dot-product path.
template <typename Tile, typename Tail>
void for_each_amx_tile(int tiles, int m, const WeightMatrix& w, int row_begin, int row_end,
                       float* y, int ldy, bool accumulate, Tile&& tile, Tail&& tail) {
  const int amx_end = row_begin + (row_end - row_begin) / kAmxTile * kAmxTile;
  alignas(64) float out[kAmxTile][kAmxTile];
  for (int r = row_begin; r < amx_end; r += kAmxTile) {
    for (int t = 0; t < tiles; ++t) {
      tile(r, t, r + kAmxTile < amx_end, out);
      const int xr = std::min(kAmxTile, m - t * kAmxTile);
      store_tile(out, w, r, kAmxTile, t * kAmxTile, xr, 1.0f, y, ldy, accumulate);
    }
  }
  if (amx_end < row_end) {
    tail(amx_end);
  }
}

// Palette 1, for int8: tiles 0-3 (C) 16 rows of 16 int32, one per block of a round; tiles 4,
// 5 (A) 16 rows of 32 bytes; tiles 6, 7 (B) 8 rows of 64 bytes. For bf16: the same C tiles, A
// and B 16 rows of 64 bytes (32 bf16 values; pairs in B). As bytes in memory (a struct with
// initializers on the stack was found half unwritten when ldtilecfg read it: GCC 12 does not
// see the instruction read all 64 bytes).
constexpr uint8_t kA = kAmxBlockBytes, kB = kAmxBlockBytes / 4;  // int8: A's bytes a row, B's rows
alignas(64) constexpr uint8_t kAmxInt8Config[64] = {
    1,  0,                                                      // palette, start row
    0,  0,  0,  0,  0,  0,  0,  0, 0,  0, 0,  0, 0,  0,         // reserved
    64, 0,  64, 0,  64, 0,  64, 0, kA, 0, kA, 0, 64, 0, 64, 0,  // bytes a row, tiles 0-7
    0,  0,  0,  0,  0,  0,  0,  0, 0,  0, 0,  0, 0,  0, 0,  0,  // tiles 8-15
    16, 16, 16, 16, 16, 16, kB, kB};                            // rows, tiles 0-7
alignas(64) constexpr uint8_t kAmxBf16Config[64] = {
    1,  0,                                                      // palette, start row
    0,  0,  0,  0,  0,  0,  0,  0, 0,  0, 0,  0, 0,  0,         // reserved
    64, 0,  64, 0,  64, 0,  64, 0, 64, 0, 64, 0, 64, 0, 64, 0,  // bytes a row, tiles 0-7
    0,  0,  0,  0,  0,  0,  0,  0, 0,  0, 0,  0, 0,  0, 0,  0,  // tiles 8-15
    16, 16, 16, 16, 16, 16, 16, 16};                            // rows, tiles 0-7

// The configuration is per thread and stays until the thread sets another (nothing else here
// uses the tiles): loaded only when a matmul needs the other one.
void configure_amx_tiles(const uint8_t* config) {
  thread_local const uint8_t* loaded = nullptr;
  if (loaded != config) {
    _tile_loadconfig(config);
    loaded = config;
  }
}

AmxRows pack_for_amx(const QuantizedRows& q, int m, int cols) {
  thread_local Scratch<int8_t> packed_scratch;
  thread_local Scratch<float> scales_scratch;
  AmxRows a;
  a.tiles = (m + kAmxTile - 1) / kAmxTile;
  a.blocks = cols / kAmxBlockBytes;
  const size_t tile_blocks = static_cast<size_t>(a.tiles) * a.blocks;
  a.packed = packed_scratch.get(tile_blocks * 8 * 64, /*zero=*/true);
  a.scales = scales_scratch.get(tile_blocks * kAmxTile, /*zero=*/true);
  for (int i = 0; i < m; ++i) {
    const int t = i / kAmxTile, n = i % kAmxTile;
    const int8_t* codes = q.codes + static_cast<int64_t>(i) * q.stride;
    const float* lanes = q.lane_scales + static_cast<int64_t>(i) * q.stride / 4;
    for (int b = 0; b < a.blocks; ++b) {
      const size_t tile_block = static_cast<size_t>(t) * a.blocks + b;
      int8_t* block = a.packed + tile_block * 8 * 64;
      for (int k = 0; k < 8; ++k) {
        std::memcpy(block + k * 64 + n * 4, codes + b * kAmxBlockBytes + k * 4, 4);
      }
      a.scales[tile_block * kAmxTile + n] = lanes[b * kAmxBlockBytes / 4];
    }
  }
  return a;
}

// The same 128 bytes of each of the next 16 weight rows (`ldw` bytes apart), into L1: the
// hardware prefetcher does not follow 16 interleaved row streams (the LM head, 16-32 MB, ran
// 15% faster by int8 at 16 rows; matrices that stay in L2 lose a little).
inline void prefetch_next_rows(const char* block, int ldw) {
  for (int row = 0; row < kAmxTile; ++row) {
    const char* next = block + static_cast<int64_t>(kAmxTile + row) * ldw;
    _mm_prefetch(next, _MM_HINT_T0);
    _mm_prefetch(next + 64, _MM_HINT_T0);
  }
}

// One round: N (1-4) consecutive blocks into C tiles 0..N-1, alternating the A and B tiles so
// that loads overlap products; then each block's sums, scaled, into acc. `packed` and `scales`
// are the first block's.
template <int N>
inline void amx_round(const int8_t* wblock, int ldw, const int8_t* packed, const float* scales,
                      __m512 (&acc)[kAmxTile]) {
  constexpr int kPacked = 8 * 64;  // bytes of one block of B
  _tile_zero(0);
  _tile_loadd(4, wblock, ldw);
  _tile_loadd(6, packed, 64);
  _tile_dpbssd(0, 4, 6);
  if constexpr (N > 1) {
    _tile_zero(1);
    _tile_loadd(5, wblock + kAmxBlockBytes, ldw);
    _tile_loadd(7, packed + kPacked, 64);
    _tile_dpbssd(1, 5, 7);
  }
  if constexpr (N > 2) {
    _tile_zero(2);
    _tile_loadd(4, wblock + 2 * kAmxBlockBytes, ldw);
    _tile_loadd(6, packed + 2 * kPacked, 64);
    _tile_dpbssd(2, 4, 6);
  }
  if constexpr (N > 3) {
    _tile_zero(3);
    _tile_loadd(5, wblock + 3 * kAmxBlockBytes, ldw);
    _tile_loadd(7, packed + 3 * kPacked, 64);
    _tile_dpbssd(3, 5, 7);
  }
  alignas(64) int32_t sums[4][kAmxTile][kAmxTile];
  constexpr int kStride = kAmxTile * sizeof(int32_t);
  _tile_stored(0, sums[0], kStride);
  if constexpr (N > 1) {
    _tile_stored(1, sums[1], kStride);
  }
  if constexpr (N > 2) {
    _tile_stored(2, sums[2], kStride);
  }
  if constexpr (N > 3) {
    _tile_stored(3, sums[3], kStride);
  }
#pragma GCC unroll 4
  for (int j = 0; j < N; ++j) {
    const __m512 block_scales = _mm512_loadu_ps(scales + j * kAmxTile);
#pragma GCC unroll 16
    for (int row = 0; row < kAmxTile; ++row) {
      acc[row] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[j][row])), block_scales,
                                 acc[row]);
    }
  }
}

void matmul_int8_amx(const AmxRows& a, int m, const WeightMatrix& w, int row_begin, int row_end,
                     float* y, int ldy, bool accumulate) {
  configure_amx_tiles(kAmxInt8Config);
  auto tile = [&](int r, int t, bool rows_follow, float(&out)[kAmxTile][kAmxTile]) {
    const int8_t* wrows =
        reinterpret_cast<const int8_t*>(w.data) + static_cast<int64_t>(r) * w.cols;
    __m512 acc[kAmxTile];
    for (__m512& v : acc) {
      v = _mm512_setzero_ps();
    }
    for (int b = 0; b < a.blocks; b += 4) {
      const size_t tile_block = static_cast<size_t>(t) * a.blocks + b;
      const int8_t* wblock = wrows + b * kAmxBlockBytes;
      const int8_t* packed = a.packed + tile_block * 8 * 64;
      const float* scales = a.scales + tile_block * kAmxTile;
      if (t == 0 && rows_follow) {
        prefetch_next_rows(reinterpret_cast<const char*>(wblock), w.cols);
      }
      switch (std::min(4, a.blocks - b)) {
        case 4:
          amx_round<4>(wblock, w.cols, packed, scales, acc);
          break;
        case 3:
          amx_round<3>(wblock, w.cols, packed, scales, acc);
          break;
        case 2:
          amx_round<2>(wblock, w.cols, packed, scales, acc);
          break;
        default:
          amx_round<1>(wblock, w.cols, packed, scales, acc);
      }
    }
    for (int row = 0; row < kAmxTile; ++row) {
      _mm512_store_ps(out[row], acc[row]);
    }
  };
  for_each_amx_tile(a.tiles, m, w, row_begin, row_end, y, ldy, accumulate, tile, [&](int first) {
    matmul_int8_vnni(*a.quantized, m, w, first, row_end, y, ldy, accumulate);
  });
}

// bf16 weights by bf16-rounded activations through tdpbf16ps: 16 weight rows x 16 activation
// rows x 32 columns an instruction, accumulating in fp32 inside the C tile (no scales to apply
// between blocks). Tile A: 16 weight rows in place; tile B: a block of activation rows packed
// as AMX wants (its row k: columns 2k, 2k+1 of each activation row in turn).
struct AmxBf16Rows {
  const Bf16Rows* rounded = nullptr;  // for the BF16 dot path's share: rows past the last 16
  int tiles = 0;                      // tiles of 16 activation rows (the last padded)
  int blocks = 0;                     // column blocks of 32
  uint16_t* packed = nullptr;         // [tile][block][16][32]
};

AmxBf16Rows pack_bf16_for_amx(const Bf16Rows& rounded, int m, int cols) {
  thread_local Scratch<uint16_t> packed_scratch;
  AmxBf16Rows a;
  a.rounded = &rounded;
  a.tiles = (m + kAmxTile - 1) / kAmxTile;
  a.blocks = cols / 32;
  a.packed = packed_scratch.get(static_cast<size_t>(a.tiles) * a.blocks * 16 * 32, /*zero=*/true);
  for (int i = 0; i < m; ++i) {
    const int t = i / kAmxTile, n = i % kAmxTile;
    const uint16_t* values = rounded.values + static_cast<int64_t>(i) * rounded.stride;
    for (int b = 0; b < a.blocks; ++b) {
      uint16_t* block = a.packed + (static_cast<size_t>(t) * a.blocks + b) * 16 * 32;
      for (int k = 0; k < 16; ++k) {
        std::memcpy(block + k * 32 + n * 2, values + b * 32 + k * 2, 2 * sizeof(uint16_t));
      }
    }
  }
  return a;
}

void matmul_bf16_amx(const AmxBf16Rows& a, int m, const WeightMatrix& w, int row_begin, int row_end,
                     float* y, int ldy, bool accumulate) {
  configure_amx_tiles(kAmxBf16Config);
  const int ldw = w.cols * static_cast<int>(sizeof(uint16_t));
  constexpr int kPacked = 16 * 32;  // values of one block of B
  auto tile = [&](int r, int t, bool rows_follow, float(&out)[kAmxTile][kAmxTile]) {
    const uint16_t* wrows =
        reinterpret_cast<const uint16_t*>(w.data) + static_cast<int64_t>(r) * w.cols;
    const uint16_t* packed = a.packed + static_cast<size_t>(t) * a.blocks * kPacked;
    // Even blocks into C tile 0, odd ones into 1, alternating A and B tiles so that loads
    // overlap products.
    _tile_zero(0);
    _tile_zero(1);
    int b = 0;
    for (; b + 2 <= a.blocks; b += 2) {
      if (t == 0 && rows_follow) {
        prefetch_next_rows(reinterpret_cast<const char*>(wrows + b * 32), ldw);
      }
      _tile_loadd(4, wrows + b * 32, ldw);
      _tile_loadd(6, packed + b * kPacked, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(5, wrows + (b + 1) * 32, ldw);
      _tile_loadd(7, packed + (b + 1) * kPacked, 64);
      _tile_dpbf16ps(1, 5, 7);
    }
    if (b < a.blocks) {
      _tile_loadd(4, wrows + b * 32, ldw);
      _tile_loadd(6, packed + b * kPacked, 64);
      _tile_dpbf16ps(0, 4, 6);
    }
    alignas(64) float sums[2][kAmxTile][kAmxTile];
    _tile_stored(0, sums[0], kAmxTile * sizeof(float));
    _tile_stored(1, sums[1], kAmxTile * sizeof(float));
    for (int row = 0; row < kAmxTile; ++row) {
      _mm512_store_ps(out[row],
                      _mm512_add_ps(_mm512_load_ps(sums[0][row]), _mm512_load_ps(sums[1][row])));
    }
  };
  for_each_amx_tile(a.tiles, m, w, row_begin, row_end, y, ldy, accumulate, tile, [&](int first) {
    matmul_bf16_dot(*a.rounded, m, w, first, row_end, y, ldy, accumulate);
  });
}
#endif

// ---- The tables ---------------------------------------------------------------------------

// vdpbf16ps at any number of activation rows: with its accumulators kept in registers (see
// sum_lanes) it runs 2x the widened path's GFLOP/s at 4-64 rows on an AVX-512 BF16 host without
// AMX (bench/llm/kernel_paths.py; 1.1x at one row). With AMX, 4 rows or more take the tiles.
bool uses_int8_dot(bool vnni, const WeightMatrix& w) {
  return vnni && w.format == WeightFormat::kInt8;
}
bool uses_bf16_dot(bool bf16, const WeightMatrix& w) {
  return bf16 && w.format == WeightFormat::kBF16;
}

template <bool kVnni, bool kBf16>
const void* avx512_prepare(const float* x, int m, const WeightMatrix& w) {
  if (uses_int8_dot(kVnni, w)) {
    thread_local QuantizedRows quantized;
    quantized = quantize_rows(x, m, w.cols);
    return &quantized;
  }
  if (uses_bf16_dot(kBf16, w)) {
    thread_local Bf16Rows rounded;
    rounded = round_rows_to_bf16(x, m, w.cols);
    return &rounded;
  }
  return nullptr;
}

template <bool kVnni, bool kBf16>
void avx512_matmul(const float* x, int m, const WeightMatrix& w, int row_begin, int row_end,
                   float* y, int ldy, bool accumulate, const void* prepared) {
  if (uses_int8_dot(kVnni, w) || uses_bf16_dot(kBf16, w)) {
    if (prepared == nullptr) {
      prepared = avx512_prepare<kVnni, kBf16>(x, m, w);
    }
    if (w.format == WeightFormat::kInt8) {
      return matmul_int8_vnni(*static_cast<const QuantizedRows*>(prepared), m, w, row_begin,
                              row_end, y, ldy, accumulate);
    }
    return matmul_bf16_dot(*static_cast<const Bf16Rows*>(prepared), m, w, row_begin, row_end, y,
                           ldy, accumulate);
  }
  matmul_any_widened<Avx512, kTileW, kTileX, kChunkX>(x, m, w, row_begin, row_end, y, ldy,
                                                      accumulate);
}

float avx512_dot(const float* a, const float* b, int n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  if (i + 16 <= n) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    i += 16;
  }
  if (i < n) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, a + i), _mm512_maskz_loadu_ps(mask, b + i),
                           acc1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

void avx512_dot_rows(const float* q, const float* k, int tokens, int n, float* scores) {
  for (int t = 0; t < tokens; ++t) {
    scores[t] = avx512_dot(q, k + static_cast<int64_t>(t) * n, n);
  }
}

// out's columns 64 at a time in four registers over every position (the last ones masked).
void avx512_weighted_sum(const float* weights, const float* v, int tokens, int n, float* out) {
  for (int c = 0; c < n; c += 64) {
    __mmask16 mask[4];
    __m512 acc[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const int col = c + 16 * i;
      mask[i] = col >= n        ? 0
                : col + 16 <= n ? static_cast<__mmask16>(0xffff)
                                : static_cast<__mmask16>((1u << (n - col)) - 1);
      acc[i] = _mm512_maskz_loadu_ps(mask[i], out + col);  // masked-off lanes are not read
    }
    for (int t = 0; t < tokens; ++t) {
      const __m512 weight = _mm512_set1_ps(weights[t]);
      const float* row = v + static_cast<int64_t>(t) * n + c;
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        acc[i] = _mm512_fmadd_ps(weight, _mm512_maskz_loadu_ps(mask[i], row + 16 * i), acc[i]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      _mm512_mask_storeu_ps(out + c + 16 * i, mask[i], acc[i]);
    }
  }
}

// e^x as kernels_avx2.cc's exp256 computes it (Cephes' expf scheme), 16 lanes.
inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  f = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), f);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);  // p x 2^n
}

void avx512_silu_mul(float* gate, const float* up, int n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 g = _mm512_loadu_ps(gate + i);
    __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_storeu_ps(gate + i, _mm512_mul_ps(silu, _mm512_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  }
}

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)
// The VNNI and BF16 table's work, but int8 and bf16 weights by at least kAmxMinRows activation
// rows go through the tiles.
const void* amx_prepare(const float* x, int m, const WeightMatrix& w) {
  if (!uses_amx(m, w)) {
    return avx512_prepare<true, true>(x, m, w);
  }
  if (w.format == WeightFormat::kInt8) {
    thread_local AmxRows packed;
    const auto* quantized = static_cast<const QuantizedRows*>(avx512_prepare<true, true>(x, m, w));
    packed = pack_for_amx(*quantized, m, w.cols);
    packed.quantized = quantized;
    return &packed;
  }
  thread_local Bf16Rows rounded;
  thread_local AmxBf16Rows packed;
  rounded = round_rows_to_bf16(x, m, w.cols);
  packed = pack_bf16_for_amx(rounded, m, w.cols);
  return &packed;
}

void amx_matmul(const float* x, int m, const WeightMatrix& w, int row_begin, int row_end, float* y,
                int ldy, bool accumulate, const void* prepared) {
  if (!uses_amx(m, w)) {
    return avx512_matmul<true, true>(x, m, w, row_begin, row_end, y, ldy, accumulate, prepared);
  }
  if (prepared == nullptr) {
    prepared = amx_prepare(x, m, w);
  }
  if (w.format == WeightFormat::kInt8) {
    return matmul_int8_amx(*static_cast<const AmxRows*>(prepared), m, w, row_begin, row_end, y, ldy,
                           accumulate);
  }
  matmul_bf16_amx(*static_cast<const AmxBf16Rows*>(prepared), m, w, row_begin, row_end, y, ldy,
                  accumulate);
}
#endif

template <bool kVnni, bool kBf16>
constexpr Kernels avx512_table(std::string_view name) {
  return {name,
          avx512_matmul<kVnni, kBf16>,
          avx512_dot_rows,
          avx512_weighted_sum,
          avx512_silu_mul,
          kTileW,
          kVnni || kBf16 ? avx512_prepare<kVnni, kBf16> : nullptr};
}

const Kernels kAvx512f = avx512_table<false, false>("avx512f");
const Kernels kAvx512Vnni = avx512_table<true, false>("avx512-vnni");
const Kernels kAvx512Bf16 = avx512_table<false, true>("avx512-bf16");
const Kernels kAvx512VnniBf16 = avx512_table<true, true>("avx512-vnni-bf16");
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)
// Row ranges split between threads in whole tiles of 16 weight rows.
const Kernels kAmx = {"avx512-vnni-bf16-amx", amx_matmul, avx512_dot_rows, avx512_weighted_sum,
                      avx512_silu_mul,        kAmxTile,   amx_prepare};
#endif

}  // namespace

const Kernels* amx_kernel_table() {
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AMX_BF16__)
  return &kAmx;
#else
  return nullptr;
#endif
}

const Kernels* avx512_kernel_table(bool vnni, bool bf16) {
  if (vnni) {
    return bf16 ? &kAvx512VnniBf16 : &kAvx512Vnni;
  }
  return bf16 ? &kAvx512Bf16 : &kAvx512f;
}

#else

const Kernels* avx512_kernel_table(bool, bool) {
  return nullptr;
}
const Kernels* amx_kernel_table() {
  return nullptr;
}

#endif

}  // namespace flotilla::llm

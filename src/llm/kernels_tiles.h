// The tiled matmul that the vector paths share, written once over an ISA's vector operations:
// kernels_avx2.cc and kernels_avx512.cc include it INSIDE their anonymous namespace, each
// compiled with its own target flags, so every function here gets internal linkage and one copy
// per ISA (a shared inline definition would let the linker hand an AVX2-only CPU the AVX-512
// copy).
//
// Decoding speed is bound by reading weights, so each weight vector is loaded (and widened to
// fp32) once and used for up to TileX activation rows, in a TileW x TileX tile of accumulators.
//
// An ISA is a struct of static members:
//   kLanes                       fp32 lanes of a vector
//   V                            the vector type
//   zero(), fmadd(a, b, c), sum(v), load(const float*), store(float*, v)
//   widen<F>(const std::byte*)   kLanes consecutive weights of format F as fp32 (fp8 2^-8 small)
// No #pragma once and no #include: the including file includes <algorithm>, <cstring>,
// <type_traits>, <immintrin.h> and llm/kernels.h first, at global scope. Nothing here may
// instantiate a template with external linkage that has out-of-line code (std::vector's
// members, say): see Scratch.

// Per-thread scratch that grows and is never shrunk. Not std::vector: its out-of-line members,
// instantiated in an ISA file, are compiled for that ISA and shared with the rest of the
// program, and the linker may keep that copy for every caller (AVX-512 code run on an
// AVX2-only CPU). This one's members have internal linkage.
template <typename T>
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { delete[] data_; }
  // At least n elements; with `zero`, the first n are zero, else unspecified.
  T* get(size_t n, bool zero = false) {
    if (n > size_) {
      delete[] data_;
      data_ = new T[n];
      size_ = n;
    }
    if (zero) {
      std::memset(data_, 0, n * sizeof(T));
    }
    return data_;
  }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

// At one or two activation rows a tile is bound by how fast its weights stream in, so it reads
// its weight rows one after another: each thread's share of a matmul is then one sequential
// stream, which the hardware prefetcher follows. Read interleaved (a step of each of the tile's
// rows in turn, as the compute-bound tiles do), they made short streams of 0.5-3 KiB that broke
// off at every tile. On an AVX-512 EPYC without AMX, one thread, the LM head at one row (33 MB
// of bf16, past the L3): 11.5 GB/s interleaved with a prefetch 4 KiB ahead, 31 in sequence; the
// replica at one client, paired runs: bf16 +50-74% req/s, int8 +17-48%, fp8 +17-22%, fp32
// +16-25%. A matrix the L3 holds (the loop of llm_matmul_bench) reads 0.7-0.9x as fast in
// sequence (bench/RESULTS.md, "Weight rows in sequence").
template <int XR>
constexpr bool kStreamRows = XR <= 2;

// A prefetch into L1 of the line `Bytes` past `at`: with one or two activation rows a matmul
// streams each weight once, bound by memory, and on some hosts asking ahead of the stream keeps
// more lines in flight than the hardware prefetcher does. An address, not a pointer: it may lie
// past the matrix, which a prefetch never faults on.
template <uintptr_t Bytes>
inline void prefetch_ahead(const void* at) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(at) + Bytes), _MM_HINT_T0);
}

// From 3 activation rows on, a tile reads a step of each of its weight rows in turn and is bound
// by its products: the later tiles of a group of weight rows find the rows in L1, but the first
// takes them from memory in short interleaved streams that the hardware prefetcher does not
// follow (see kStreamRows), and stalls on its loads. So that first tile asks for the next
// group's rows, which follow its own in memory, into L2 as it goes: each step of its loop
// prefetches as many bytes of the next group as it reads of its own. On an AVX-512 EPYC without
// AMX, one thread, bf16 at 16 rows: the LM head (past the L3) 87 -> 137 GFLOP/s; the whole
// group prefetched at once when the group starts, 125-134, and 0.93x on a matrix the L3 holds.
// The replica at 16 clients, paired runs: bf16 +19-33%, int8 (VNNI) -5% to +16%, fp32 0-24%
// and on the AVX2 path +27-48%. Rows a tile widens into a buffer first (bf16 on AVX2, fp8) are
// prefetched the same way: the AVX2 path's bf16 LM head at 16 rows 1.40x, fp8 1.05-1.13x
// (bench/RESULTS.md, "The next weight rows into L2").
//
// The address of the next group for the tile of activation rows from i (the first of a chunk
// of ChunkX), of weight rows from r; 0 for the other tiles. An address: it may lie past the
// matrix, which a prefetch never faults on.
template <int TileW, int ChunkX>
inline uintptr_t next_group(const WeightMatrix& w, int r, int i) {
  return i % ChunkX == 0 ? reinterpret_cast<uintptr_t>(w.data) +
                               static_cast<uintptr_t>(r + TileW) * w.row_bytes()
                         : 0;
}

// A tile's step, `offset` bytes into its group: Bytes of the next group from there into L2.
template <int Bytes>
inline void prefetch_next_group(uintptr_t next, int64_t offset) {
  for (int k = 0; k < Bytes; k += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(next + offset + k), _MM_HINT_T1);
  }
}

template <WeightFormat F>
constexpr int kElementBytes = element_bytes(F);

// One weight as the vector paths widen it (fp8 e4m3 2^-8 too small: the row scale puts it back).
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
    return fp8_e4m3_table()[static_cast<uint8_t>(*p)] / 256.0f;
  }
}

// f(std::integral_constant<int, k>{}) with k = n clamped to [1, N]: a run-time count as a
// compile-time one, so that tiles' small loops unroll into registers.
template <int N, typename Body>
inline void with_count(int n, Body&& body) {
  if constexpr (N > 1) {
    if (n < N) {
      return with_count<N - 1>(n, body);
    }
  }
  body(std::integral_constant<int, N>{});
}

// tile(WR, XR) as integral constants, for wr <= MaxW weight rows and xr <= MaxX activation rows.
template <int MaxW, int MaxX, typename Tile>
inline void dispatch_tile(int wr, int xr, Tile&& tile) {
  with_count<MaxW>(wr, [&](auto w) { with_count<MaxX>(xr, [&](auto x) { tile(w, x); }); });
}

// Calls tile(r, wr, i, xr) over weight rows [row_begin, row_end) by activation rows [0, m):
// activation rows in chunks of ChunkX (they stay in L2 while every weight row of the range
// passes by); within a chunk, for each TileW weight rows, first weight_rows(r, wr, x0, x_end),
// then the tiles of TileX activation rows.
template <int TileW, int TileX, int ChunkX, typename WeightRows, typename Tile>
inline void for_each_tile(int m, int row_begin, int row_end, WeightRows&& weight_rows,
                          Tile&& tile) {
  for (int x0 = 0; x0 < m; x0 += ChunkX) {
    const int x_end = std::min(m, x0 + ChunkX);
    for (int r = row_begin; r < row_end; r += TileW) {
      const int wr = std::min(TileW, row_end - r);
      weight_rows(r, wr, x0, x_end);
      for (int i = x0; i < x_end; i += TileX) {
        tile(r, wr, i, std::min(TileX, x_end - i));
      }
    }
  }
}

// y = (y if accumulate) + out x row scale x decode_scale + bias, for one tile.
template <int TileW, int TileX>
inline void store_tile(const float (&out)[TileW][TileX], const WeightMatrix& w, int r, int wr,
                       int i, int xr, float decode_scale, float* y, int ldy, bool accumulate) {
  for (int a = 0; a < wr; ++a) {
    const float scale = (w.scales.empty() ? 1.0f : w.scales[r + a]) * decode_scale;
    const float bias = w.bias.empty() ? 0.0f : w.bias[r + a];
    for (int b = 0; b < xr; ++b) {
      float& dst = y[static_cast<int64_t>(i + b) * ldy + r + a];
      dst = (accumulate ? dst : 0.0f) + out[a][b] * scale + bias;
    }
  }
}

// Dot products of WR weight rows with XR activation rows, weights widened from format F. `next`:
// see next_group, for the matrix's own rows, in format Stored (F, or F's rows widened to fp32).
template <typename Isa, WeightFormat F, WeightFormat Stored, int WR, int XR, int TileW, int TileX>
inline void tile_widened(const std::byte* const* wrows, const float* const* xrows, int cols,
                         uintptr_t next, float (&out)[TileW][TileX]) {
  constexpr int kLanes = Isa::kLanes;
  // The small loops must be unrolled for acc and wv to live in registers; -O2 alone leaves
  // them as loops over stack arrays (measured on AVX2: 8x slower).
  typename Isa::V acc[WR][XR];
#pragma GCC unroll 4
  for (int a = 0; a < WR; ++a) {
#pragma GCC unroll 4
    for (int b = 0; b < XR; ++b) {
      acc[a][b] = Isa::zero();
    }
  }
  int c = 0;
  if constexpr (kStreamRows<XR>) {
#pragma GCC unroll 4
    for (int a = 0; a < WR; ++a) {
      for (c = 0; c + kLanes <= cols; c += kLanes) {
        if constexpr (kElementBytes<F> == 1) {
          // int8/fp8 weights, 1 KiB ahead: +50-75% at one row on AVX2 (llm_matmul_bench,
          // rows then interleaved); no gain for bf16, a loss for fp32.
          prefetch_ahead<1024>(wrows[a] + c * kElementBytes<F>);
        }
        const typename Isa::V wv = Isa::template widen<F>(wrows[a] + c * kElementBytes<F>);
#pragma GCC unroll 2
        for (int b = 0; b < XR; ++b) {
          acc[a][b] = Isa::fmadd(wv, Isa::load(xrows[b] + c), acc[a][b]);
        }
      }
    }
  } else {
    for (; c + kLanes <= cols; c += kLanes) {
      if (next != 0) {
        prefetch_next_group<WR * kLanes * kElementBytes<Stored>>(
            next, int64_t{c} * kElementBytes<Stored> * WR);
      }
      typename Isa::V wv[WR];
#pragma GCC unroll 4
      for (int a = 0; a < WR; ++a) {
        wv[a] = Isa::template widen<F>(wrows[a] + c * kElementBytes<F>);
      }
#pragma GCC unroll 4
      for (int b = 0; b < XR; ++b) {
        const typename Isa::V xv = Isa::load(xrows[b] + c);
#pragma GCC unroll 4
        for (int a = 0; a < WR; ++a) {
          acc[a][b] = Isa::fmadd(wv[a], xv, acc[a][b]);
        }
      }
    }
  }
  for (int a = 0; a < WR; ++a) {
    for (int b = 0; b < XR; ++b) {
      float sum = Isa::sum(acc[a][b]);
      for (int k = c; k < cols; ++k) {
        sum += scalar_weight<F>(wrows[a] + k * kElementBytes<F>) * xrows[b][k];
      }
      out[a][b] = sum;
    }
  }
}

// y = x · Wᵀ over rows [row_begin, row_end) with every weight widened to fp32.
template <typename Isa, WeightFormat F, int TileW, int TileX, int ChunkX>
void matmul_widened(const float* x, int m, const WeightMatrix& w, int row_begin, int row_end,
                    float* y, int ldy, bool accumulate) {
  constexpr float kDecodeScale = F == WeightFormat::kFp8 ? 256.0f : 1.0f;
  constexpr int kLanes = Isa::kLanes;
  const int64_t row_bytes = static_cast<int64_t>(w.cols) * kElementBytes<F>;
  // With more activation rows than one tile holds, a narrow format's rows are widened to fp32
  // once into this buffer (L1-sized) instead of once per tile of activation rows: the widening
  // instructions compete with the FMAs for the same ports.
  thread_local Scratch<float> widened;
  const std::byte* wrows[TileW];
  bool widen = false;
  auto weight_rows = [&](int r, int wr, int x0, int x_end) {
    widen = F != WeightFormat::kF32 && x_end - x0 > TileX;
    for (int a = 0; a < wr; ++a) {
      wrows[a] = w.data + (r + a) * row_bytes;
    }
    if (!widen) {
      return;
    }
    float* buffer = widened.get(static_cast<size_t>(TileW) * w.cols);
    for (int a = 0; a < wr; ++a) {
      float* out = buffer + static_cast<size_t>(a) * w.cols;
      int c = 0;
      for (; c + kLanes <= w.cols; c += kLanes) {
        Isa::store(out + c, Isa::template widen<F>(wrows[a] + c * kElementBytes<F>));
      }
      for (; c < w.cols; ++c) {
        out[c] = scalar_weight<F>(wrows[a] + c * kElementBytes<F>);
      }
      wrows[a] = reinterpret_cast<const std::byte*>(out);
    }
  };
  auto tile = [&](int r, int wr, int i, int xr) {
    const float* xrows[TileX];
    for (int b = 0; b < xr; ++b) {
      xrows[b] = x + static_cast<int64_t>(i + b) * w.cols;
    }
    float out[TileW][TileX];
    // Widened rows too: the next widening then reads its rows from L2.
    const uintptr_t next = next_group<TileW, ChunkX>(w, r, i);
    dispatch_tile<TileW, TileX>(wr, xr, [&](auto wr_c, auto xr_c) {
      if (widen) {
        tile_widened<Isa, WeightFormat::kF32, F, decltype(wr_c)::value, decltype(xr_c)::value>(
            wrows, xrows, w.cols, next, out);
      } else {
        tile_widened<Isa, F, F, decltype(wr_c)::value, decltype(xr_c)::value>(wrows, xrows, w.cols,
                                                                              next, out);
      }
    });
    store_tile(out, w, r, wr, i, xr, kDecodeScale, y, ldy, accumulate);
  };
  for_each_tile<TileW, TileX, ChunkX>(m, row_begin, row_end, weight_rows, tile);
}

// Every weight format through matmul_widened.
template <typename Isa, int TileW, int TileX, int ChunkX>
void matmul_any_widened(const float* x, int m, const WeightMatrix& w, int row_begin, int row_end,
                        float* y, int ldy, bool accumulate) {
  switch (w.format) {
    case WeightFormat::kF32:
      return matmul_widened<Isa, WeightFormat::kF32, TileW, TileX, ChunkX>(
          x, m, w, row_begin, row_end, y, ldy, accumulate);
    case WeightFormat::kBF16:
      return matmul_widened<Isa, WeightFormat::kBF16, TileW, TileX, ChunkX>(
          x, m, w, row_begin, row_end, y, ldy, accumulate);
    case WeightFormat::kInt8:
      return matmul_widened<Isa, WeightFormat::kInt8, TileW, TileX, ChunkX>(
          x, m, w, row_begin, row_end, y, ldy, accumulate);
    case WeightFormat::kFp8:
      return matmul_widened<Isa, WeightFormat::kFp8, TileW, TileX, ChunkX>(
          x, m, w, row_begin, row_end, y, ldy, accumulate);
  }
}

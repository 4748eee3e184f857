// Every kernel path the CPU runs (AVX-512 with VNNI and BF16, AVX2) against the portable one for
// every weight format and awkward shapes, and the fp8 e4m3 codec against its definition.
#include "llm/kernels.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <span>
#include <string>

#include <gtest/gtest.h>

#include "llm/thread_pool.h"

namespace flotilla::llm {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> out(n);
  for (float& v : out) {
    v = normal(rng);
  }
  return out;
}

// The weights as the portable path reads them (code x row scale), row-major: row r is its dot
// product with one-hot vectors.
std::vector<float> dequantized(const WeightMatrix& w) {
  WeightMatrix plain = w;
  plain.bias.clear();
  std::vector<float> out(static_cast<size_t>(w.rows) * w.cols), column(w.rows);
  std::vector<float> hot(w.cols, 0.0f);
  for (int c = 0; c < w.cols; ++c) {
    hot[c] = 1;
    portable_kernels().matmul(hot.data(), 1, plain, 0, w.rows, column.data(), w.rows, false,
                              nullptr);
    hot[c] = 0;
    for (int r = 0; r < w.rows; ++r) {
      out[static_cast<size_t>(r) * w.cols + c] = column[r];
    }
  }
  return out;
}

// How far a path may be from the portable reference at one output: fp32 rounding, plus the
// rounding of the activations that the VNNI path (to int8 codes: half a step of amax / 127
// each), the AVX2 path's int8 matmul (to int16 codes: half a step of amax / its code limit) and
// the BF16 path (to bf16: 2^-9 relative each) make. `weights` is the output's row of
// dequantized(), `x` its activation row.
float allowed_error(const Kernels& k, WeightFormat format, std::span<const float> weights,
                    const float* x, float expected) {
  float bound = 1e-4f * (1 + std::fabs(expected));
  float amax = 0, weight_sum = 0, product_sum = 0;
  for (size_t c = 0; c < weights.size(); ++c) {
    amax = std::max(amax, std::fabs(x[c]));
    weight_sum += std::fabs(weights[c]);
    product_sum += std::fabs(weights[c] * x[c]);
  }
  if (format == WeightFormat::kInt8 && k.name.find("vnni") != std::string_view::npos) {
    bound += weight_sum * amax / 127 / 2;
  }
  if (format == WeightFormat::kInt8 && k.name == "avx2") {
    bound += weight_sum * amax / static_cast<float>(avx2_int16_code_limit(weights.size())) / 2;
  }
  if (format == WeightFormat::kBF16 && k.name.find("bf16") != std::string_view::npos) {
    bound += product_sum * std::ldexp(1.0f, -8);
  }
  return bound;
}

// Every path this CPU runs against the portable one, for every weight format and awkward
// shapes: tails of rows and columns (of 8, 16, 32 and 64), one activation row, more than a
// chunk of them.
TEST(KernelsTest, EveryPathMatchesPortableForEveryFormatAndShape) {
  const std::vector<const Kernels*> paths = supported_kernels();
  ASSERT_EQ(paths.front(), &portable_kernels());
  EXPECT_EQ(paths.back(), &kernels());
  for (const Kernels* k : paths) {
    std::printf("kernels: %s%s\n", std::string(k->name).c_str(),
                k == &kernels() ? " (the one the engine runs)" : "");
  }
  for (const Kernels* k : std::span(paths).subspan(1)) {
    for (WeightFormat format :
         {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kInt8, WeightFormat::kFp8}) {
      for (auto [rows, cols, m] :
           {std::tuple{7, 19, 1}, std::tuple{12, 64, 5}, std::tuple{5, 8, 9},
            std::tuple{33, 136, 37}, std::tuple{9, 257, 2}, std::tuple{4, 96, 4},
            // one row over blocks of 16 and a tail; AVX2's int16 codes coarser than 32767
            std::tuple{5, 40, 1}, std::tuple{3, 1100, 2},
            // AMX tiles: two of weight rows and a VNNI tail; two of activation rows, one partial
            std::tuple{40, 160, 21}, std::tuple{16, 64, 8}}) {
        std::vector<float> values = random_values(static_cast<size_t>(rows) * cols, rows + cols);
        WeightMatrix w = make_weight_matrix(format, rows, cols, values.data());
        const std::vector<float> weights = dequantized(w);
        w.bias = random_values(rows, 3);
        std::vector<float> x = random_values(static_cast<size_t>(m) * cols, 5);
        std::vector<float> expected(static_cast<size_t>(m) * rows, 1.0f), actual = expected;
        portable_kernels().matmul(x.data(), m, w, 0, rows, expected.data(), rows, true, nullptr);
        k->matmul(x.data(), m, w, 0, rows, actual.data(), rows, true, nullptr);
        // As the forward pass calls it: converted once, then in chunks split at a tile: the same
        // values, bit for bit.
        std::vector<float> chunked(expected.size(), 1.0f);
        const void* prepared = k->prepare != nullptr ? k->prepare(x.data(), m, w) : nullptr;
        const int split = std::min(rows, k->tile_rows);
        k->matmul(x.data(), m, w, 0, split, chunked.data(), rows, true, prepared);
        k->matmul(x.data(), m, w, split, rows, chunked.data(), rows, true, prepared);
        ASSERT_EQ(chunked, actual) << k->name << " " << weight_format_name(format) << " " << rows
                                   << "x" << cols << " m=" << m;
        for (int i = 0; i < m; ++i) {
          for (int r = 0; r < rows; ++r) {
            const size_t at = static_cast<size_t>(i) * rows + r;
            ASSERT_NEAR(
                actual[at], expected[at],
                allowed_error(*k, format,
                              std::span(weights).subspan(static_cast<size_t>(r) * cols, cols),
                              x.data() + static_cast<size_t>(i) * cols, expected[at]))
                << k->name << " " << weight_format_name(format) << " " << rows << "x" << cols
                << " m=" << m << " i=" << i << " r=" << r;
          }
        }
      }
    }
    std::vector<float> gate = random_values(203, 4), up = random_values(203, 6);
    for (float& g : gate) {
      g *= 30;  // far into both tails of the exponential
    }
    std::vector<float> expected = gate, actual = gate;
    portable_kernels().silu_mul(expected.data(), up.data(), 203);
    k->silu_mul(actual.data(), up.data(), 203);
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_NEAR(actual[i], expected[i], 1e-5f * (1 + std::fabs(expected[i])))
          << k->name << " " << gate[i];
    }
    // Attention over a cache block: head widths with and without a whole number of vectors,
    // blocks of one position, a few and a full 16.
    for (int n : {67, 64, 128, 16, 5}) {
      for (int tokens : {1, 3, 16}) {
        std::vector<float> q = random_values(n, 1), rows = random_values(tokens * n, 2);
        std::vector<float> expected(tokens), actual(tokens);
        portable_kernels().dot_rows(q.data(), rows.data(), tokens, n, expected.data());
        k->dot_rows(q.data(), rows.data(), tokens, n, actual.data());
        for (int t = 0; t < tokens; ++t) {
          ASSERT_NEAR(actual[t], expected[t], 1e-4f) << k->name << " n=" << n << " t=" << t;
        }
        std::vector<float> weights = random_values(tokens, 3);
        std::vector<float> out_expected = random_values(n, 4), out_actual = out_expected;
        portable_kernels().weighted_sum(weights.data(), rows.data(), tokens, n,
                                        out_expected.data());
        k->weighted_sum(weights.data(), rows.data(), tokens, n, out_actual.data());
        for (int i = 0; i < n; ++i) {
          ASSERT_NEAR(out_actual[i], out_expected[i], 1e-5f * (1 + std::fabs(out_expected[i])))
              << k->name << " n=" << n << " tokens=" << tokens;
        }
      }
    }
  }
}

TEST(KernelsTest, QuantizedWeightsReconstructWithinTheirStep) {
  std::vector<float> values = random_values(4 * 256, 9);
  for (WeightFormat format : {WeightFormat::kInt8, WeightFormat::kFp8}) {
    WeightMatrix w = make_weight_matrix(format, 4, 256, values.data());
    // Row r's dot product with a one-hot vector at column c is the reconstructed weight.
    for (int c : {0, 17, 255}) {
      std::vector<float> one_hot(256, 0.0f);
      one_hot[c] = 1;
      std::vector<float> y(4);
      portable_kernels().matmul(one_hot.data(), 1, w, 0, 4, y.data(), 4, false, nullptr);
      for (int r = 0; r < 4; ++r) {
        float original = values[r * 256 + c];
        // int8: half a step of amax/127; e4m3: 3 mantissa bits, half an ulp is 1/16 relative.
        float bound = format == WeightFormat::kInt8 ? w.scales[r] / 2 + 1e-6f
                                                    : std::fabs(original) / 16 + w.scales[r] / 512;
        EXPECT_NEAR(y[r], original, bound) << weight_format_name(format) << " r=" << r;
      }
    }
  }
}

TEST(KernelsTest, Fp8E4m3CodecFollowsTheFormat) {
  const float* table = fp8_e4m3_table();
  EXPECT_EQ(table[0x00], 0.0f);
  EXPECT_EQ(table[0x01], std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(table[0x08], std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(table[0x7e], 448.0f);                // largest finite
  EXPECT_EQ(table[0xfe], -448.0f);
  EXPECT_EQ(float_to_fp8_e4m3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(float_to_fp8_e4m3(-1.0f), 0xb8);
  for (int code = 0; code < 0x7f; ++code) {
    EXPECT_EQ(float_to_fp8_e4m3(table[code]), code);
    EXPECT_EQ(float_to_fp8_e4m3(-table[code]), code == 0 ? 0 : code | 0x80);
  }
  // Halfway between 1.0 (0x38) and 1.125 (0x39) goes to the even code.
  EXPECT_EQ(float_to_fp8_e4m3(1.0625f), 0x38);
}

TEST(ThreadPoolTest, CoversEveryIndexOnceInAlignedChunks) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int n : {1, 7, 100, 1000}) {
      for (int round = 0; round < 50; ++round) {
        std::vector<std::atomic<int>> covered(n);
        pool.parallel_for(n, 3, [&](int begin, int end) {
          EXPECT_EQ(begin % 3, 0);
          for (int i = begin; i < end; ++i) {
            covered[i].fetch_add(1);
          }
        });
        for (auto& c : covered) {
          ASSERT_EQ(c.load(), 1) << threads << " threads, n " << n;
        }
      }
    }
  }
}

// Weight buffers of 2 MiB or more start on a 2 MiB boundary (where a huge page can back them),
// smaller ones come from the ordinary heap; either way they hold what was written.
TEST(KernelsTest, LargeWeightBuffersStartOnAHugePageBoundary) {
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  for (size_t bytes : {size_t{100}, size_t{2} << 20, (size_t{5} << 20) + 3}) {
    std::vector<std::byte, HugePageAllocator<std::byte>> buffer(bytes, std::byte{7});
    if (bytes >= kHugePage) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % kHugePage, 0u) << bytes;
    }
    EXPECT_EQ(buffer.front(), std::byte{7});
    EXPECT_EQ(buffer.back(), std::byte{7});
  }
  std::vector<float> values(600 * 1024, 0.5f);
  WeightMatrix w = make_weight_matrix(WeightFormat::kF32, 1024, 600, values.data());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.data) % kHugePage, 0u);  // 2.4 MB of fp32
}

}  // namespace
}  // namespace flotilla::llm

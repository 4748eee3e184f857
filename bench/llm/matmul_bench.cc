// The forward pass's matmul (y = x · Wᵀ, W in the Hugging Face [out][in] layout) on the issue-7
// benchmark shapes, per weight format and batch rows, single-threaded: bytes of weights read
// per second (decode is bound by them) and GFLOP/s (prefill is bound by them). With OpenBLAS
// present (Debian libopenblas-dev), its sgemm on the same fp32 shapes runs beside ours.
//
//   build/release/bench/llm_matmul_bench --benchmark_filter=...
//   bench/llm/kernel_paths.py   (the table of paths side by side, with ratios to AVX2)
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "llm/kernels.h"

#ifdef FLOTILLA_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace flotilla::llm {
namespace {

std::vector<float> random_values(size_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> out(n);
  for (float& v : out) {
    v = normal(rng);
  }
  return out;
}

// Args: rows (output features), cols, batch rows m, format, kernel path (an index into
// supported_kernels(): every path this CPU runs is measured in the same run).
void BM_Matmul(benchmark::State& state) {
  const int rows = static_cast<int>(state.range(0)), cols = static_cast<int>(state.range(1));
  const int m = static_cast<int>(state.range(2));
  const auto format = static_cast<WeightFormat>(state.range(3));
  const Kernels& k = *supported_kernels().at(state.range(4));
  std::vector<float> values = random_values(static_cast<size_t>(rows) * cols);
  WeightMatrix w = make_weight_matrix(format, rows, cols, values.data());
  std::vector<float> x = random_values(static_cast<size_t>(m) * cols);
  std::vector<float> y(static_cast<size_t>(m) * rows);
  for (auto _ : state) {
    k.matmul(x.data(), m, w, 0, rows, y.data(), rows, false, nullptr);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(std::string(k.name) + " " + std::string(weight_format_name(format)));
  state.counters["weight_GB/s"] = benchmark::Counter(
      static_cast<double>(w.bytes()) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * cols * m * state.iterations() / 1e9,
                                                 benchmark::Counter::kIsRate);
}

void shapes(benchmark::internal::Benchmark* b) {
  const auto paths = static_cast<int64_t>(supported_kernels().size());
  for (int format : {0, 1, 2, 3}) {
    for (int m : {1, 4, 16, 64}) {
      for (int64_t path = 1; path < paths; ++path) {  // not the portable one: minutes a shape
        b->Args({2816, 512, m, format, path});        // gate and up stacked
        b->Args({32000, 512, m, format, path});       // LM head
      }
    }
  }
}
BENCHMARK(BM_Matmul)->Apply(shapes)->Unit(benchmark::kMicrosecond);

#ifdef FLOTILLA_HAVE_OPENBLAS
void BM_OpenBlasSgemm(benchmark::State& state) {
  const int rows = static_cast<int>(state.range(0)), cols = static_cast<int>(state.range(1));
  const int m = static_cast<int>(state.range(2));
  openblas_set_num_threads(1);
  std::vector<float> w = random_values(static_cast<size_t>(rows) * cols);
  std::vector<float> x = random_values(static_cast<size_t>(m) * cols);
  std::vector<float> y(static_cast<size_t>(m) * rows);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, rows, cols, 1.0f, x.data(), cols,
                w.data(), cols, 0.0f, y.data(), rows);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel("openblas float32");
  state.counters["weight_GB/s"] =
      benchmark::Counter(4.0 * rows * cols * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * cols * m * state.iterations() / 1e9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_OpenBlasSgemm)
    ->ArgsProduct({{2816, 32000}, {512}, {1, 16, 64}})
    ->Unit(benchmark::kMicrosecond);
#endif

}  // namespace
}  // namespace flotilla::llm

BENCHMARK_MAIN();

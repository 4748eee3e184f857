// The in-process limit for the replica: one libxgboost prediction with no server around it.
//   FLOTILLA_BENCH_MODEL=model.json build/release/xgboost_predict_bench
// BM_RawPredict calls XGBoosterPredictFromDense directly with a reused proxy DMatrix (its
// fastest use); BM_RawPredictNoProxy lets XGBoost build a proxy per call (what most callers
// do); BM_RuntimePredict goes through the xgboost runtime (validation, conversion, output
// copy), so its difference to BM_RawPredict is the runtime's own cost.
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include <benchmark/benchmark.h>
#include <xgboost/c_api.h>

#include "common/common_logging.h"
#include "runtime/runtime.h"

namespace {

std::string model_path() {
  const char* path = std::getenv("FLOTILLA_BENCH_MODEL");
  return path ? path : "";
}

std::vector<float> random_rows(int64_t rows, int64_t columns) {
  std::mt19937 random(7);
  std::uniform_real_distribution<float> value(0, 100);
  std::vector<float> values(static_cast<size_t>(rows * columns));
  for (float& v : values) {
    v = value(random);
  }
  return values;
}

void raw_predict(benchmark::State& state, bool reuse_proxy) {
  BoosterHandle booster = nullptr;
  if (XGBoosterCreate(nullptr, 0, &booster) != 0 ||
      XGBoosterLoadModel(booster, model_path().c_str()) != 0) {
    state.SkipWithError("set FLOTILLA_BENCH_MODEL to an XGBoost model file");
    return;
  }
  XGBoosterSetParam(booster, "nthread", "1");
  bst_ulong features = 0;
  XGBoosterGetNumFeature(booster, &features);
  const int64_t rows = state.range(0);
  auto values = random_rows(rows, static_cast<int64_t>(features));
  char array_interface[160];
  std::snprintf(array_interface, sizeof(array_interface),
                "{\"data\":[%llu,true],\"shape\":[%lld,%llu],\"typestr\":\"<f4\",\"version\":3}",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(values.data())),
                static_cast<long long>(rows), static_cast<unsigned long long>(features));
  const char* config =
      "{\"type\":0,\"training\":false,\"iteration_begin\":0,\"iteration_end\":0,\"cache_id\":0,"
      "\"strict_shape\":false,\"missing\":NaN}";
  DMatrixHandle proxy = nullptr;
  if (reuse_proxy) {
    XGProxyDMatrixCreate(&proxy);
  }
  for (auto _ : state) {
    const bst_ulong* shape = nullptr;
    bst_ulong dims = 0;
    const float* result = nullptr;
    XGBoosterPredictFromDense(booster, array_interface, config, proxy, &shape, &dims, &result);
    benchmark::DoNotOptimize(result);
  }
  state.SetItemsProcessed(state.iterations() * rows);
  if (proxy != nullptr) {
    XGDMatrixFree(proxy);
  }
  XGBoosterFree(booster);
}

void BM_RawPredict(benchmark::State& state) {
  raw_predict(state, true);
}
void BM_RawPredictNoProxy(benchmark::State& state) {
  raw_predict(state, false);
}
BENCHMARK(BM_RawPredict)->Arg(1)->Arg(16)->Arg(64);
BENCHMARK(BM_RawPredictNoProxy)->Arg(1)->Arg(16)->Arg(64);

void BM_RuntimePredict(benchmark::State& state) {
  (void)flotilla::init_logging("warn");  // keep stdout for the benchmark's own report
  flotilla::runtime::RuntimeOptions options;
  options.name = "bench";
  auto runtime = flotilla::runtime::load_runtime(flotilla::runtime::RuntimeKind::kXgboost,
                                                 model_path(), options);
  if (!runtime.is_ok()) {
    state.SkipWithError(runtime.status().message().c_str());
    return;
  }
  const int64_t rows = state.range(0);
  const int64_t columns = (*runtime)->metadata().inputs[0].shape.back();
  flotilla::InferRequest request;
  flotilla::Tensor tensor{"input", flotilla::DataType::kFp32, {rows, columns}, {}};
  for (float v : random_rows(rows, columns)) {
    tensor.append(v);
  }
  request.inputs.push_back(std::move(tensor));
  for (auto _ : state) {
    auto input = (*runtime)->prepare(request);
    (*runtime)->run(
        std::move(input).value(),
        [](flotilla::Result<std::vector<flotilla::Tensor>> out) { benchmark::DoNotOptimize(out); });
  }
  state.SetItemsProcessed(state.iterations() * rows);
}
BENCHMARK(BM_RuntimePredict)->Arg(1)->Arg(16)->Arg(64);

}  // namespace

BENCHMARK_MAIN();

// Cost of the protocol codecs for a single-row request of 30 features, the replica benchmark's
// request: decode (simdjson) and encode (hand-written writer).
//   build/release/codec_bench
#include <string>

#include <benchmark/benchmark.h>

#include "protocol/protocol.h"

namespace {

std::string row_json() {
  std::string row = "[";
  for (int i = 0; i < 30; ++i) {
    row += (i ? "," : "") + std::to_string(i * 1.37 + 0.001);
  }
  return row + "]";
}

void BM_DecodeOipSingleRow(benchmark::State& state) {
  const std::string body =
      R"({"id":"1","inputs":[{"name":"input","datatype":"FP32","shape":[1,30],"data":[)" +
      row_json() + "]}]}";
  for (auto _ : state) {
    std::string copy = body;
    auto request = flotilla::protocol::decode_oip_infer_request(copy);
    benchmark::DoNotOptimize(request);
  }
}
BENCHMARK(BM_DecodeOipSingleRow);

void BM_DecodeMlflowSingleRow(benchmark::State& state) {
  const std::string body = R"({"instances":[)" + row_json() + "]}";
  for (auto _ : state) {
    std::string copy = body;
    auto request = flotilla::protocol::decode_mlflow_json(copy);
    benchmark::DoNotOptimize(request);
  }
}
BENCHMARK(BM_DecodeMlflowSingleRow);

void BM_EncodeOipResponse(benchmark::State& state) {
  flotilla::InferResponse response;
  response.model_name = "bench";
  response.id = "1";
  flotilla::Tensor output{"predict", flotilla::DataType::kFp32, {1}, {}};
  output.append(0.024643792f);
  response.outputs.push_back(output);
  for (auto _ : state) {
    std::string out;
    flotilla::protocol::encode_oip_infer_response(response, out);
    benchmark::DoNotOptimize(out);
  }
}
BENCHMARK(BM_EncodeOipResponse);

}  // namespace

BENCHMARK_MAIN();

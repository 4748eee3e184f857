// The gateway's per-request token check (auth::Authenticator::check) with 1 and 1,000 tokens
// known: the cost auth adds to every request through `flotilla up` (issue #25 item 3).
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "auth/auth.h"

namespace {

using flotilla::auth::Authenticator;
using flotilla::auth::AuthResult;
using flotilla::auth::generate_token;
using flotilla::auth::TokenRecord;

void BM_CheckValidToken(benchmark::State& state) {
  std::vector<TokenRecord> records;
  std::string header;
  for (int64_t i = 0; i < state.range(0); ++i) {
    auto minted = generate_token("client-" + std::to_string(i), {"iris"}).value();
    records.push_back(minted.record);
    header = "Bearer " + minted.token;
  }
  const Authenticator authenticator(std::move(records));
  for (auto _ : state) {
    AuthResult result = authenticator.check(header, "iris");
    benchmark::DoNotOptimize(result);
  }
  if (authenticator.check(header, "iris") != AuthResult::kAllowed) {
    state.SkipWithError("the token did not pass");
  }
}
BENCHMARK(BM_CheckValidToken)->Arg(1)->Arg(1000);

void BM_CheckWrongSecret(benchmark::State& state) {
  auto minted = generate_token("client", {"iris"}).value();
  std::string header = "Bearer " + minted.token;
  header.back() = header.back() == '0' ? '1' : '0';
  const Authenticator authenticator({minted.record});
  for (auto _ : state) {
    AuthResult result = authenticator.check(header, "iris");
    benchmark::DoNotOptimize(result);
  }
}
BENCHMARK(BM_CheckWrongSecret);

}  // namespace

BENCHMARK_MAIN();

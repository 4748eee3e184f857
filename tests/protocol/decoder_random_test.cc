// A short, seeded randomized run of every request decoder (the same decoders the libFuzzer
// targets in tests/fuzz drive for longer): mutated valid bodies must decode or fail with
// kInvalidArgument, never crash, hang or throw.
#include <random>

#include <gtest/gtest.h>

#include "protocol/protocol.h"
#include "protocol/test_util.h"

namespace flotilla::protocol {
namespace {

std::string mutate(const std::string& seed, std::mt19937& random) {
  std::string body = seed;
  static const std::string kFragments[] = {
      "[",  "]",       "{",        "}",    ",",
      ":",  "\"",      "null",     "true", "1e999",
      "-0", "\\u0000", "\"FP32\"", "[[[",  "9223372036854775808"};
  const int edits = 1 + static_cast<int>(random() % 4);
  for (int e = 0; e < edits && !body.empty(); ++e) {
    const size_t pos = random() % body.size();
    switch (random() % 4) {
      case 0:
        body[pos] = static_cast<char>(random() % 256);
        break;
      case 1:
        body.erase(pos, 1 + random() % 8);
        break;
      case 2:
        body.insert(pos, kFragments[random() % std::size(kFragments)]);
        break;
      case 3:
        body.resize(pos);
        break;
    }
  }
  return body;
}

template <typename Decode>
void run_random(const std::vector<std::string>& seeds, Decode decode) {
  std::mt19937 random(12345);
  int decoded = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string body = mutate(seeds[i % seeds.size()], random);
    Result<InferRequest> result = decode(body);
    if (result.is_ok()) {
      ++decoded;
      for (const Tensor& tensor : result->inputs) {
        ASSERT_EQ(static_cast<int64_t>(tensor.data.size()),
                  tensor.element_count() * static_cast<int64_t>(element_size(tensor.datatype)));
      }
    } else {
      ASSERT_EQ(result.status().code(), StatusCode::kInvalidArgument) << result.status().message();
    }
  }
  // Mutations that keep the body valid must still decode: the run exercised both paths.
  EXPECT_GT(decoded, 0);
}

TEST(DecoderRandomTest, OipDecoderSurvivesMutations) {
  run_random({flotilla::testing::read_test_data("fuzz/oip/seed1.json"),
              flotilla::testing::read_test_data("fuzz/oip/seed2.json")},
             [](std::string& body) { return decode_oip_infer_request(body); });
}

TEST(DecoderRandomTest, MlflowJsonDecoderSurvivesMutations) {
  std::vector<std::string> seeds;
  for (const char* name : {"seed1.json", "seed2.json", "seed3.json", "seed4.json"}) {
    seeds.push_back(flotilla::testing::read_test_data(std::string("fuzz/mlflow_json/") + name));
  }
  run_random(seeds, [](std::string& body) { return decode_mlflow_json(body); });
}

TEST(DecoderRandomTest, MlflowCsvDecoderSurvivesMutations) {
  run_random({flotilla::testing::read_test_data("fuzz/mlflow_csv/seed1.csv")},
             [](std::string& body) { return decode_mlflow_csv(body); });
}

}  // namespace
}  // namespace flotilla::protocol

// The forward pass against the numpy reference of tests/fixtures/make_llm.py: fp32 logits to
// 1e-4 relative error in one step, in chunks, token by token and batched with other sequences;
// greedy generations identical; bf16/int8/fp8 within a stated error. Loader errors name what is
// wrong.
#include "llm/model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <unistd.h>

#include "llm/kernels.h"
#include "llm/llm_fixtures.h"

namespace flotilla::llm {
namespace {

using testing::kLlmFixtureModels;
using testing::LlmFixtures;

constexpr double kFp32Tolerance = 1e-4;

std::shared_ptr<const Model> load(const std::string& name, LoadOptions options = {}) {
  if (!options.dtype && !options.quantize) {
    options.dtype = WeightFormat::kF32;
  }
  Result<std::shared_ptr<const Model>> model = load_model(LlmFixtures::get().model(name), options);
  EXPECT_TRUE(model.is_ok()) << model.status().to_string();
  return model.is_ok() ? *model : nullptr;
}

// Max |ours - ref| over the row, relative to the row's largest |ref|.
double relative_error(std::span<const float> ours, const nlohmann::json& reference) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    double ref = reference[i].get<double>();
    max_ref = std::max(max_ref, std::fabs(ref));
    max_diff = std::max(max_diff, std::fabs(ours[i] - ref));
  }
  return max_diff / max_ref;
}

// Runs one sequence through the cache in chunks of the given sizes (the last repeats), with
// logits for every token; returns them row by row.
std::vector<std::vector<float>> run_chunked(ForwardPass& pass, KvCache& cache,
                                            const std::vector<int32_t>& prompt, int chunk) {
  const ModelConfig& c = pass.model().config;
  std::vector<int> blocks;
  int needed = (static_cast<int>(prompt.size()) + cache.block_tokens() - 1) / cache.block_tokens();
  for (int i = 0; i < needed; ++i) {
    blocks.push_back(cache.allocator().allocate());
  }
  std::vector<std::vector<float>> rows;
  for (size_t start = 0; start < prompt.size(); start += chunk) {
    size_t n = std::min<size_t>(chunk, prompt.size() - start);
    StepSequence seq{&blocks, static_cast<int>(start),
                     std::span<const int32_t>(prompt).subspan(start, n), 0};
    std::span<const float> logits = pass.forward({&seq, 1}, cache);
    for (size_t t = 0; t < n; ++t) {
      rows.emplace_back(logits.begin() + t * c.vocab_size, logits.begin() + (t + 1) * c.vocab_size);
    }
  }
  for (int block : blocks) {
    cache.allocator().release(block);
  }
  return rows;
}

class ModelParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelParityTest, Fp32LogitsMatchTheReferenceInOneStepAndInChunks) {
  std::shared_ptr<const Model> model = load(GetParam());
  ASSERT_NE(model, nullptr);
  nlohmann::json reference = LlmFixtures::get().reference(GetParam());
  ForwardPass pass(model, 2);
  KvCache cache(model->config, 16, 4);
  for (int chunk : {64, 5, 1}) {
    for (size_t p = 0; p < reference["prompts"].size(); ++p) {
      std::vector<int32_t> prompt = reference["prompts"][p].get<std::vector<int32_t>>();
      std::vector<std::vector<float>> rows = run_chunked(pass, cache, prompt, chunk);
      ASSERT_EQ(rows.size(), prompt.size());
      for (size_t t = 0; t < rows.size(); ++t) {
        EXPECT_LT(relative_error(rows[t], reference["logits"][p][t]), kFp32Tolerance)
            << "prompt " << p << " position " << t << " chunk " << chunk;
      }
    }
    EXPECT_EQ(cache.free_blocks(), cache.total_blocks());
  }
}

// All prompts as one step (a batch mixing sequences of different lengths), then greedy decoding
// of all of them together, one token each per step, as the engine runs them.
TEST_P(ModelParityTest, BatchedPrefillAndGreedyDecodeMatchTheReference) {
  std::shared_ptr<const Model> model = load(GetParam());
  ASSERT_NE(model, nullptr);
  nlohmann::json reference = LlmFixtures::get().reference(GetParam());
  const int vocab = model->config.vocab_size;
  ForwardPass pass(model, 2);
  KvCache cache(model->config, 64, 4);
  size_t count = reference["prompts"].size();
  std::vector<std::vector<int32_t>> sequences(count);
  std::vector<std::vector<int>> blocks(count);
  auto grow = [&](size_t s, size_t length) {
    while (blocks[s].size() * cache.block_tokens() < length) {
      blocks[s].push_back(cache.allocator().allocate());
    }
  };
  std::vector<StepSequence> step;
  for (size_t s = 0; s < count; ++s) {
    sequences[s] = reference["prompts"][s].get<std::vector<int32_t>>();
    grow(s, sequences[s].size());
    step.push_back({&blocks[s], 0, sequences[s], 0});
  }
  std::span<const float> logits = pass.forward(step, cache);
  size_t row = 0;
  std::vector<int32_t> next(count);
  for (size_t s = 0; s < count; ++s) {
    for (size_t t = 0; t < sequences[s].size(); ++t, ++row) {
      EXPECT_LT(relative_error(logits.subspan(row * vocab, vocab), reference["logits"][s][t]),
                kFp32Tolerance)
          << "sequence " << s << " position " << t;
    }
    auto last = logits.subspan((row - 1) * vocab, vocab);
    next[s] = static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
  }
  std::vector<std::vector<int32_t>> generated(count);
  size_t greedy_tokens = reference["greedy"][0].size();
  for (size_t i = 0; i < greedy_tokens; ++i) {
    step.clear();
    for (size_t s = 0; s < count; ++s) {
      generated[s].push_back(next[s]);
      sequences[s].push_back(next[s]);
      grow(s, sequences[s].size());
      step.push_back({&blocks[s], static_cast<int>(sequences[s].size()) - 1,
                      std::span<const int32_t>(sequences[s]).last(1), 0});
    }
    logits = pass.forward(step, cache);
    for (size_t s = 0; s < count; ++s) {
      auto row_logits = logits.subspan(s * vocab, vocab);
      next[s] = static_cast<int32_t>(std::max_element(row_logits.begin(), row_logits.end()) -
                                     row_logits.begin());
    }
  }
  for (size_t s = 0; s < count; ++s) {
    EXPECT_EQ(generated[s], reference["greedy"][s].get<std::vector<int32_t>>()) << "sequence " << s;
  }
}

// Lower-precision weights: bounded error against fp32 and the share of positions whose top token
// agrees (printed, and held to a floor well below what they reach).
TEST_P(ModelParityTest, LowerPrecisionWeightsStayCloseToFp32) {
  nlohmann::json reference = LlmFixtures::get().reference(GetParam());
  struct Case {
    const char* name;
    LoadOptions options;
    double tolerance;
  };
  auto options = [](WeightFormat dtype, std::optional<WeightFormat> quantize, bool attention) {
    LoadOptions out;
    out.dtype = dtype;
    out.quantize = quantize;
    out.quantize_attention = attention;
    return out;
  };
  const WeightFormat f32 = WeightFormat::kF32, int8 = WeightFormat::kInt8, fp8 = WeightFormat::kFp8;
  std::vector<Case> cases = {
      {"bf16", options(WeightFormat::kBF16, std::nullopt, false), 0.03},
      {"int8", options(f32, int8, false), 0.05},
      {"int8+attention", options(f32, int8, true), 0.06},
      {"fp8", options(f32, fp8, false), 0.15},
      {"fp8+attention", options(f32, fp8, true), 0.2},
  };
  for (const Case& c : cases) {
    std::shared_ptr<const Model> model = load(GetParam(), c.options);
    ASSERT_NE(model, nullptr);
    ForwardPass pass(model, 2);
    KvCache cache(model->config, 16, 4);
    double worst = 0;
    int agree = 0, total = 0;
    for (size_t p = 0; p < reference["prompts"].size(); ++p) {
      std::vector<int32_t> prompt = reference["prompts"][p].get<std::vector<int32_t>>();
      std::vector<std::vector<float>> rows = run_chunked(pass, cache, prompt, 64);
      for (size_t t = 0; t < rows.size(); ++t) {
        const nlohmann::json& ref = reference["logits"][p][t];
        worst = std::max(worst, relative_error(rows[t], ref));
        size_t ours = std::max_element(rows[t].begin(), rows[t].end()) - rows[t].begin();
        size_t theirs = 0;
        for (size_t i = 1; i < ref.size(); ++i) {
          theirs = ref[i].get<double>() > ref[theirs].get<double>() ? i : theirs;
        }
        agree += ours == theirs;
        ++total;
      }
    }
    std::printf("%-12s %-15s max relative error %.4f, top-1 agreement %d/%d (kernels: %s)\n",
                GetParam().c_str(), c.name, worst, agree, total,
                std::string(kernels().name).c_str());
    EXPECT_LT(worst, c.tolerance) << c.name;
    EXPECT_GE(agree, total * 3 / 4) << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelParityTest, ::testing::ValuesIn(kLlmFixtureModels),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(ModelConfigTest, ParsesTheFieldSetsAndDefaults) {
  Result<ModelConfig> config = parse_model_config(R"({
    "architectures": ["MistralForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
    "max_position_embeddings": 4096, "sliding_window": 1024, "eos_token_id": [2, 7]})");
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->num_kv_heads, 4);
  EXPECT_EQ(config->head_dim, 16);
  EXPECT_EQ(config->max_position, 1024);  // the sliding window bounds the context
  EXPECT_EQ(config->eos_token_ids, (std::vector<int32_t>{2, 7}));
  EXPECT_FALSE(config->qkv_bias);
  EXPECT_EQ(config->rope_theta, 10000.0);
}

TEST(ModelConfigTest, RefusesWhatItCannotRunNamingTheField) {
  const std::string base = R"("hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64)";
  struct Case {
    std::string json;
    std::string message;
  };
  std::vector<Case> cases = {
      {"{", "malformed JSON"},
      {R"({"architectures": ["GPT2LMHeadModel"], )" + base + "}", "GPT2LMHeadModel"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64})", "num_hidden_layers"},
      {R"({"architectures": ["LlamaForCausalLM"], "num_key_value_heads": 3, )" + base + "}",
       "num_key_value_heads"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_act": "gelu", )" + base + "}", "gelu"},
      {R"({"architectures": ["LlamaForCausalLM"], "rope_scaling": {"type": "yarn",
         "factor": 4}, )" +
           base + "}",
       "yarn"},
      {R"({"architectures": ["LlamaForCausalLM"], "vocab_size": "big", "hidden_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128})",
       "vocab_size"},
  };
  for (const Case& c : cases) {
    Result<ModelConfig> config = parse_model_config(c.json);
    ASSERT_FALSE(config.is_ok()) << c.json;
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(config.status().message().find(c.message), std::string::npos)
        << config.status().message();
  }
}

// A copy of a fixture model with one file changed by `edit`.
std::string broken_copy(const std::string& name,
                        const std::function<void(const std::string&)>& edit) {
  static int counter = 0;
  std::string dir = LlmFixtures::get().dir() + "/broken-" + std::to_string(counter++);
  std::filesystem::copy(LlmFixtures::get().model(name), dir);
  edit(dir);
  return dir;
}

void expect_load_error(const std::string& dir, const std::string& message) {
  Result<std::shared_ptr<const Model>> model = load_model(dir, {});
  ASSERT_FALSE(model.is_ok()) << dir;
  EXPECT_NE(model.status().message().find(message), std::string::npos) << model.status().message();
}

void rewrite_header(const std::string& file, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t length;
  std::memcpy(&length, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, length));
  edit(header);
  std::string text = header.dump();
  text.resize(length, ' ');  // same length: data offsets stay valid
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << bytes.substr(0, 8) << text << bytes.substr(8 + length);
}

TEST(ModelLoaderTest, NamesTheMissingOrMisShapedTensorAndTheBadFile) {
  expect_load_error("/nonexistent/model", "config.json");
  expect_load_error(broken_copy("llama-gqa",
                                [](const std::string& dir) {
                                  std::filesystem::remove(dir + "/model.safetensors");
                                }),
                    "model.safetensors");
  expect_load_error(broken_copy("llama-gqa",
                                [](const std::string& dir) {
                                  rewrite_header(dir + "/model.safetensors", [](auto& header) {
                                    header["model.layers.1.mlp.up_proj.weightX"] =
                                        header["model.layers.1.mlp.up_proj.weight"];
                                    header.erase("model.layers.1.mlp.up_proj.weight");
                                  });
                                }),
                    "model.layers.1.mlp.up_proj.weight' is missing");
  expect_load_error(broken_copy("llama-gqa",
                                [](const std::string& dir) {
                                  rewrite_header(dir + "/model.safetensors", [](auto& header) {
                                    header["model.norm.weight"]["shape"] = {32, 2};
                                  });
                                }),
                    "'model.norm.weight' in");
  expect_load_error(broken_copy("llama-gqa",
                                [](const std::string& dir) {
                                  rewrite_header(dir + "/model.safetensors", [](auto& header) {
                                    header["model.norm.weight"]["dtype"] = "I8";
                                  });
                                }),
                    "dtype I8 is not supported");
  expect_load_error(broken_copy("llama-gqa",
                                [](const std::string& dir) {
                                  std::filesystem::resize_file(dir + "/model.safetensors", 1000);
                                }),
                    "past the end of the file");
  expect_load_error(
      broken_copy("mistral-f16",
                  [](const std::string& dir) {
                    std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
                  }),
      "model-00002-of-00002.safetensors");
}

// Lazy loading: the loader must read no byte of a safetensors file before it has awaited it,
// since the rest of the file may still be downloading.
TEST(ModelLoaderTest, AwaitsEveryHeaderAndTensorBeforeReadingIt) {
  for (const std::string name : {"llama-gqa", "mistral-f16"}) {
    std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> awaited;  // file → ranges
    LoadOptions options;
    options.await_bytes = [&](const std::string& path, uint64_t offset, uint64_t length) {
      awaited[path].emplace_back(offset, length);
      return Status::ok();
    };
    Result<std::shared_ptr<const Model>> model =
        load_model(LlmFixtures::get().model(name), options);
    ASSERT_TRUE(model.is_ok()) << model.status().message();
    ASSERT_FALSE(awaited.empty());
    for (auto& [file, ranges] : awaited) {
      // The header's length, then the header, first; then tensors, which the fixtures' models
      // use every one of: together they cover the rest of the file exactly once.
      ASSERT_GE(ranges.size(), 3u) << file;
      EXPECT_EQ(ranges[0], std::make_pair(uint64_t{0}, uint64_t{8})) << file;
      EXPECT_EQ(ranges[1].first, 8u) << file;
      std::sort(ranges.begin() + 2, ranges.end());
      uint64_t end = 8 + ranges[1].second;
      for (size_t i = 2; i < ranges.size(); ++i) {
        EXPECT_EQ(ranges[i].first, end) << file << " tensor " << i;
        end = ranges[i].first + ranges[i].second;
      }
      EXPECT_EQ(end, std::filesystem::file_size(file)) << file;
    }
  }
}

TEST(ModelLoaderTest, AnAwaitFailureFailsTheLoad) {
  LoadOptions options;
  options.await_bytes = [](const std::string&, uint64_t offset, uint64_t) {
    return offset < 1000 ? Status::ok() : unavailable("the download failed");
  };
  Result<std::shared_ptr<const Model>> model =
      load_model(LlmFixtures::get().model("llama-gqa"), options);
  ASSERT_FALSE(model.is_ok());
  EXPECT_NE(model.status().message().find("the download failed"), std::string::npos)
      << model.status().message();
}

TEST(ModelLoaderTest, DetectsLlmDirectories) {
  EXPECT_TRUE(is_llm_directory(LlmFixtures::get().model("qwen2-tied")));
  EXPECT_FALSE(is_llm_directory(LlmFixtures::get().dir()));
}

// Found by tests/fuzz/safetensors_fuzz (issue 18): a shape whose element count overflows int64
// was multiplied out unchecked. This one wraps around to 4 elements, exactly the 16 bytes of
// F32 data the tensor holds, so it was accepted; each dimension is under the 2^40 bound.
TEST(SafetensorsTest, RefusesAShapeWhoseElementCountOverflows) {
  const std::string dir =
      ::testing::TempDir() + "/safetensors-overflow-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string header =
      R"({"w": {"dtype": "F32", "shape": [4, 5, 5581, 8681, 49477, 384773], )"
      R"("data_offsets": [0, 16]}})";
  const uint64_t length = header.size();
  std::ofstream out(dir + "/model.safetensors", std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << header << std::string(16, '\0');
  out.close();
  Result<SafetensorsSet> set = SafetensorsSet::open_directory(dir);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(set.is_ok()) << "a shape of 2^64 + 4 elements passed for 4";
  EXPECT_EQ(set.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(set.status().message().find("too many elements"), std::string::npos)
      << set.status().message();
}

}  // namespace
}  // namespace flotilla::llm

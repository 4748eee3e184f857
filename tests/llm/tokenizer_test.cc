#include "llm/tokenizer.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

namespace flotilla::llm {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// The four tokenizer directories written by tests/fixtures/make_tokenizers.py, once per binary,
// into a directory (with the variants and toys the tests add) removed when the binary exits.
class FixturesDir {
 public:
  FixturesDir()
      : path_(fs::temp_directory_path() / ("flotilla-tokenizers-" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
    const std::string command = "/usr/bin/python3 " + std::string(FLOTILLA_FIXTURES) +
                                "/make_tokenizers.py " + path_.string();
    if (std::system(command.c_str()) != 0) {
      ADD_FAILURE() << "cannot write tokenizer fixtures: " << command;
    }
  }
  ~FixturesDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  FixturesDir(const FixturesDir&) = delete;
  FixturesDir& operator=(const FixturesDir&) = delete;

  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

const fs::path& fixtures_dir() {
  static const FixturesDir dir;
  return dir.path();
}

Json read_json(const fs::path& path) {
  std::ifstream in(path);
  return Json::parse(in);
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::unique_ptr<Tokenizer> load_fixture(const std::string& name) {
  auto tokenizer = Tokenizer::load((fixtures_dir() / name).string());
  EXPECT_TRUE(tokenizer.is_ok()) << name << ": " << tokenizer.status().to_string();
  return tokenizer.is_ok() ? std::move(tokenizer).value() : nullptr;
}

// A copy of fixture `base` named `name` whose tokenizer.json and tokenizer_config.json went
// through `edit`.
fs::path make_variant(const std::string& base, const std::string& name,
                      const std::function<void(Json& tokenizer, Json& config)>& edit) {
  const fs::path dir = fixtures_dir() / "variants" / name;
  fs::create_directories(dir);
  Json tokenizer = read_json(fixtures_dir() / base / "tokenizer.json");
  Json config = read_json(fixtures_dir() / base / "tokenizer_config.json");
  edit(tokenizer, config);
  write_file(dir / "tokenizer.json", tokenizer.dump());
  write_file(dir / "tokenizer_config.json", config.dump());
  return dir;
}

bool is_valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t length = c < 0x80           ? 1
                          : (c >> 5) == 0x6  ? 2
                          : (c >> 4) == 0xE  ? 3
                          : (c >> 3) == 0x1E ? 4
                                             : 0;
    if (length == 0 || i + length > s.size()) {
      return false;
    }
    for (size_t k = 1; k < length; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) {
        return false;
      }
    }
    i += length;
  }
  return true;
}

std::vector<int32_t> ids_of(const Json& array) {
  return array.get<std::vector<int32_t>>();
}

std::string stream_decode(const Tokenizer& tokenizer, const std::vector<int32_t>& ids,
                          bool skip_special_tokens) {
  StreamDecoder stream(tokenizer, skip_special_tokens);
  std::string text;
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    EXPECT_TRUE(is_valid_utf8(piece)) << "after id " << id;
    text += piece;
  }
  const std::string rest = stream.finish();
  EXPECT_TRUE(is_valid_utf8(rest));
  return text + rest;
}

// ---------------------------------------------------------------------------------------------
// Every fixture against the Python reference encoder and decoder

class TokenizerFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerFixtureTest, EncodesLikeReference) {
  auto tokenizer = load_fixture(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  const Json expected = read_json(fixtures_dir() / GetParam() / "expected.json");
  EXPECT_EQ(tokenizer->vocab_size(), expected["vocab_size"].get<int32_t>());
  for (const Json& c : expected["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tokenizer->encode(text, false), ids_of(c["ids"])) << "text: " << text;
    EXPECT_EQ(tokenizer->encode(text, true), ids_of(c["ids_with_special"])) << "text: " << text;
  }
}

TEST_P(TokenizerFixtureTest, DecodesLikeReference) {
  auto tokenizer = load_fixture(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  const Json expected = read_json(fixtures_dir() / GetParam() / "expected.json");
  for (const Json& c : expected["cases"]) {
    const std::string text = c["text"];
    const std::string decoded = tokenizer->decode(ids_of(c["ids"]), false);
    EXPECT_EQ(decoded, c["decoded"].get<std::string>()) << "text: " << text;
    EXPECT_EQ(tokenizer->decode(ids_of(c["ids_with_special"]), true),
              c["decoded_skip_special"].get<std::string>())
        << "text: " << text;
    if (c["roundtrip"].get<bool>()) {
      EXPECT_EQ(decoded, text);
    }
  }
}

TEST_P(TokenizerFixtureTest, StreamDecoderConcatenatesToDecode) {
  auto tokenizer = load_fixture(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  const Json expected = read_json(fixtures_dir() / GetParam() / "expected.json");
  for (const Json& c : expected["cases"]) {
    const std::vector<int32_t> ids = ids_of(c["ids_with_special"]);
    for (bool skip : {false, true}) {
      EXPECT_EQ(stream_decode(*tokenizer, ids, skip), tokenizer->decode(ids, skip))
          << "text: " << c["text"].get<std::string>() << " skip: " << skip;
    }
  }
}

TEST_P(TokenizerFixtureTest, StreamDecoderHandlesRandomIds) {
  auto tokenizer = load_fixture(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  SeededRandom random(42);
  const auto vocab = static_cast<uint64_t>(tokenizer->vocab_size());
  for (int round = 0; round < 500; ++round) {
    std::vector<int32_t> ids(1 + random.uniform(24));
    for (int32_t& id : ids) {
      // Low ids are the byte and single-character tokens, where characters split.
      id = static_cast<int32_t>(random.uniform(2) == 0 ? random.uniform(300)
                                                       : random.uniform(vocab));
    }
    for (bool skip : {false, true}) {
      const std::string whole = tokenizer->decode(ids, skip);
      const std::string streamed = stream_decode(*tokenizer, ids, skip);
      if (whole.find("\xEF\xBF\xBD") == std::string::npos) {
        EXPECT_EQ(streamed, whole);
      }
    }
  }
}

TEST_P(TokenizerFixtureTest, RoundTripsText) {
  auto tokenizer = load_fixture(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  const bool drops_leading_space = GetParam() == "mistral";  // Metaspace decoder, as in HF
  for (const std::string text :
       {"", "plain ascii text", "Grüße aus München, schön!", "Привет, мир!", "你好，世界！",
        "日本語のテキスト", "한국어 텍스트", "😀👍🏽👨‍👩‍👧🇩🇪❤️",
        "tabs\tand\nnewlines\r\n\n  and   runs of    spaces  ", "trailing   ", "\u00a0\u3000",
        "mixed 世界 мир 😀 text",
        "a"
        "\xCC\x81"
        "\xF0\x9F\x98"}) {
    const std::string decoded = tokenizer->decode(tokenizer->encode(text, false), false);
    if (text == "a\xCC\x81\xF0\x9F\x98") {
      // Invalid UTF-8 input is read with U+FFFD; NFC (qwen2) composes a + U+0301.
      EXPECT_TRUE(decoded == "a\xCC\x81\xEF\xBF\xBD" || decoded == "\xC3\xA1\xEF\xBF\xBD")
          << decoded;
      continue;
    }
    EXPECT_EQ(decoded, text);
  }
  const std::string leading = "  two leading spaces";
  const std::string decoded = tokenizer->decode(tokenizer->encode(leading, false), false);
  EXPECT_EQ(decoded, drops_leading_space ? leading.substr(1) : leading);
}

TEST_P(TokenizerFixtureTest, IsSafeForConcurrentUse) {
  auto tokenizer = load_fixture(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  const std::string text = "Concurrent encode: Grüße, 你好, 😀 and <|eot_id|> text. ";
  const std::vector<int32_t> expected = tokenizer->encode(text, true);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const std::vector<int32_t> ids = tokenizer->encode(text, true);
        mismatches[t] += ids != expected || tokenizer->decode(ids, false).empty();
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST_P(TokenizerFixtureTest, EncodesLongTextQuickly) {
  auto tokenizer = load_fixture(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  std::string text;
  while (text.size() < 200'000) {
    text += "The quick brown fox jumps over the lazy dog. Grüße aus München! 你好，世界！😀\n";
  }
  text += std::string(20'000, ' ') + std::string(20'000, 'a');  // one long word, one long run
  const std::vector<int32_t> ids = tokenizer->encode(text, false);
  EXPECT_GT(ids.size(), 1000u);
  EXPECT_EQ(tokenizer->decode(ids, false), text);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerFixtureTest,
                         ::testing::Values("llama3", "qwen2", "llama2", "mistral"),
                         [](const auto& info) { return info.param; });

// ---------------------------------------------------------------------------------------------
// Special tokens

TEST(TokenizerTest, MatchesSpecialTokensInTextAsSingleTokens) {
  auto tokenizer = load_fixture("llama3");
  ASSERT_NE(tokenizer, nullptr);
  const int32_t begin = tokenizer->token_id("<|begin_of_text|>").value();
  const int32_t header = tokenizer->token_id("<|start_header_id|>").value();
  const int32_t eot = tokenizer->token_id("<|eot_id|>").value();
  EXPECT_EQ(begin, 1000);
  EXPECT_TRUE(tokenizer->is_special(eot));
  EXPECT_FALSE(tokenizer->is_special(tokenizer->token_id("a").value()));
  EXPECT_FALSE(tokenizer->token_id("<|not_a_token|>").has_value());

  const std::vector<int32_t> ids = tokenizer->encode("<|start_header_id|>user<|eot_id|>", false);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), header);
  EXPECT_EQ(ids.back(), eot);
  // A near miss is ordinary text.
  const std::vector<int32_t> near = tokenizer->encode("<|eot_id |>", false);
  EXPECT_EQ(std::count(near.begin(), near.end(), eot), 0);
}

TEST(TokenizerTest, AddsBosFromPostProcessorOrConfig) {
  auto llama3 = load_fixture("llama3");
  ASSERT_NE(llama3, nullptr);
  EXPECT_EQ(llama3->bos_id(), 1000);
  EXPECT_EQ(llama3->encode("Hi", true).front(), 1000);
  EXPECT_NE(llama3->encode("Hi", false).front(), 1000);

  // llama2's tokenizer_config.json says add_bos_token and add_eos_token.
  auto llama2 = load_fixture("llama2");
  ASSERT_NE(llama2, nullptr);
  EXPECT_EQ(llama2->bos_id(), 1);
  const std::vector<int32_t> ids = llama2->encode("Hi", true);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_EQ(llama2->encode("", true), (std::vector<int32_t>{1, 2}));

  auto qwen2 = load_fixture("qwen2");
  ASSERT_NE(qwen2, nullptr);
  EXPECT_FALSE(qwen2->bos_id().has_value());
  EXPECT_EQ(qwen2->encode("Hi", true), qwen2->encode("Hi", false));
}

TEST(TokenizerTest, NamesEndOfSequenceTokens) {
  auto llama3 = load_fixture("llama3");
  ASSERT_NE(llama3, nullptr);
  EXPECT_EQ(llama3->eos_ids(), std::vector<int32_t>{llama3->token_id("<|eot_id|>").value()});

  auto qwen2 = load_fixture("qwen2");
  ASSERT_NE(qwen2, nullptr);
  EXPECT_EQ(qwen2->eos_ids(), std::vector<int32_t>{qwen2->token_id("<|im_end|>").value()});

  // generation_config.json's list is added, without duplicates.
  const fs::path dir = make_variant("llama3", "generation_config", [](Json&, Json&) {});
  write_file(dir / "generation_config.json", R"({"eos_token_id": [1001, 1008, 1009]})");
  auto tokenizer = Tokenizer::load(dir.string());
  ASSERT_TRUE(tokenizer.is_ok()) << tokenizer.status().to_string();
  EXPECT_EQ(tokenizer.value()->eos_ids(), (std::vector<int32_t>{1009, 1001, 1008}));
}

TEST(TokenizerTest, SkipsSpecialTokensWhenDecoding) {
  auto tokenizer = load_fixture("llama3");
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<int32_t> ids = tokenizer->encode("Hi<|eot_id|>", true);
  EXPECT_EQ(tokenizer->decode(ids, false), "<|begin_of_text|>Hi<|eot_id|>");
  EXPECT_EQ(tokenizer->decode(ids, true), "Hi");
  // Ids outside the vocabulary are skipped.
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{-1, 5000000}, false), "");
}

TEST(TokenizerTest, StripsWhitespaceAroundLstripRstripTokens) {
  auto tokenizer = load_fixture("llama2");
  ASSERT_NE(tokenizer, nullptr);
  const int32_t extra = tokenizer->token_id("<extra>").value();
  EXPECT_FALSE(tokenizer->is_special(extra));
  EXPECT_EQ(tokenizer->encode("hello   <extra>   world", false),
            tokenizer->encode("hello<extra>world", false));
}

// ---------------------------------------------------------------------------------------------
// Byte fallback, NFC, streaming

TEST(TokenizerTest, FallsBackToByteTokens) {
  auto tokenizer = load_fixture("llama2");
  ASSERT_NE(tokenizer, nullptr);
  // "한" (U+D55C, ED 95 9C) is not in the vocabulary: "▁" then three byte tokens.
  const std::vector<int32_t> ids = tokenizer->encode("한", false);
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[1], tokenizer->token_id("<0xED>").value());
  EXPECT_EQ(ids[2], tokenizer->token_id("<0x95>").value());
  EXPECT_EQ(ids[3], tokenizer->token_id("<0x9C>").value());
  EXPECT_EQ(tokenizer->decode(ids, false), "한");
  // Incomplete or invalid byte groups decode to one U+FFFD per byte.
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{ids[1], ids[2]}, false),
            "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerTest, NormalizesToNfc) {
  auto tokenizer = load_fixture("qwen2");
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->encode("cafe\xCC\x81", false), tokenizer->encode("caf\xC3\xA9", false));
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("cafe\xCC\x81", false), false), "caf\xC3\xA9");
  // Hangul jamo compose into a syllable; the Angstrom sign becomes Å.
  EXPECT_EQ(
      tokenizer->decode(
          tokenizer->encode("\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB \xE2\x84\xAB", false), false),
      "\xED\x95\x9C \xC3\x85");
}

TEST(StreamDecoderTest, HoldsBackIncompleteCharacters) {
  auto tokenizer = load_fixture("llama2");
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<int32_t> ids = tokenizer->encode("한😀 ok", false);
  StreamDecoder stream(*tokenizer, false);
  std::vector<std::string> pieces;
  for (int32_t id : ids) {
    pieces.push_back(stream.push(id));
  }
  pieces.push_back(stream.finish());
  std::string all;
  for (const std::string& piece : pieces) {
    EXPECT_TRUE(is_valid_utf8(piece)) << piece;
    all += piece;
  }
  EXPECT_EQ(all, "한😀 ok");
  // "▁" and the first two bytes of 한 produce nothing yet; the third completes it.
  EXPECT_EQ(pieces[0], "");
  EXPECT_EQ(pieces[1], "");
  EXPECT_EQ(pieces[2], "");
  EXPECT_EQ(pieces[3], "한");
}

TEST(StreamDecoderTest, KeepsSpacesBetweenTokensAndAfterSkippedOnes) {
  auto tokenizer = load_fixture("llama2");
  ASSERT_NE(tokenizer, nullptr);
  std::vector<int32_t> ids = tokenizer->encode("Hello world", false);
  ids.insert(ids.begin() + 1, 2);  // </s> between the words, skipped
  ids.insert(ids.begin(), 1);      // <s>
  EXPECT_EQ(stream_decode(*tokenizer, ids, true), "Hello world");
  EXPECT_EQ(stream_decode(*tokenizer, ids, true), tokenizer->decode(ids, true));
  EXPECT_EQ(stream_decode(*tokenizer, ids, false), tokenizer->decode(ids, false));
}

TEST(StreamDecoderTest, FlushesInvalidBytesAsReplacementCharacters) {
  auto tokenizer = load_fixture("llama2");
  ASSERT_NE(tokenizer, nullptr);
  const int32_t ff = tokenizer->token_id("<0xFF>").value();
  const int32_t e6 = tokenizer->token_id("<0xE6>").value();
  StreamDecoder stream(*tokenizer, false);
  EXPECT_EQ(stream.push(tokenizer->token_id("a").value()), "a");
  EXPECT_EQ(stream.push(ff), "");
  EXPECT_EQ(stream.push(e6), "");
  EXPECT_EQ(stream.finish(), "\xEF\xBF\xBD\xEF\xBF\xBD");
  // finish() resets: the decoder starts a new sequence.
  EXPECT_EQ(stream.push(tokenizer->token_id("a").value()), "a");
}

TEST(StreamDecoderTest, DecodesByteLevelCharactersSplitAcrossTokens) {
  auto tokenizer = load_fixture("llama3");
  ASSERT_NE(tokenizer, nullptr);
  // Rare characters are byte tokens in this small vocabulary: 🦀 is four of them.
  const std::vector<int32_t> ids = tokenizer->encode("🦀", false);
  ASSERT_GT(ids.size(), 1u);
  StreamDecoder stream(*tokenizer, false);
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string piece = stream.push(ids[i]);
    EXPECT_EQ(piece, i + 1 == ids.size() ? "🦀" : "");
    text += piece;
  }
  EXPECT_EQ(text + stream.finish(), "🦀");
}

// ---------------------------------------------------------------------------------------------
// Components the fixtures do not use, on toy tokenizers

// A tokenizer.json whose vocabulary is `tokens` (ids in order), with ignore_merges and no
// merges, so every piece the pipeline produces that is in the vocabulary comes out as one id.
Json toy_tokenizer(const std::vector<std::string>& tokens) {
  Json vocab = Json::object();
  for (size_t i = 0; i < tokens.size(); ++i) {
    vocab[tokens[i]] = i;
  }
  return {
      {"version", "1.0"},
      {"added_tokens", Json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder", nullptr},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array()}, {"ignore_merges", true}}}};
}

std::unique_ptr<Tokenizer> load_toy(const std::string& name, const Json& tokenizer,
                                    const Json& config = nullptr) {
  const fs::path dir = fixtures_dir() / "toys" / name;
  fs::create_directories(dir);
  write_file(dir / "tokenizer.json", tokenizer.dump());
  if (!config.is_null()) {
    write_file(dir / "tokenizer_config.json", config.dump());
  }
  auto loaded = Tokenizer::load(dir.string());
  EXPECT_TRUE(loaded.is_ok()) << name << ": " << loaded.status().to_string();
  return loaded.is_ok() ? std::move(loaded).value() : nullptr;
}

// The token strings encode() produces (a toy has no decoder, so decode() of one id is its token).
std::vector<std::string> token_strings(const Tokenizer& tokenizer, const std::string& text) {
  std::vector<std::string> out;
  for (int32_t id : tokenizer.encode(text, false)) {
    out.push_back(tokenizer.decode(std::vector<int32_t>{id}, false));
  }
  return out;
}

using Strings = std::vector<std::string>;

TEST(PreTokenizerTest, SplitsWithEveryBehavior) {
  const Json base = toy_tokenizer({"a", "b", "c", "-", "a-", "b-", "-b", "-c", "--"});
  struct Case {
    const char* behavior;
    bool invert;
    Strings pieces;
  };
  const Case cases[] = {
      {"Isolated", false, {"a", "-", "b", "-", "-", "c"}},
      {"Removed", false, {"a", "b", "c"}},
      {"MergedWithPrevious", false, {"a-", "b-", "-", "c"}},
      {"MergedWithNext", false, {"a", "-b", "-", "-c"}},
      {"Contiguous", false, {"a", "-", "b", "--", "c"}},
      {"Removed", true, {"-", "-", "-"}},
  };
  for (const Case& c : cases) {
    Json tokenizer = base;
    tokenizer["pre_tokenizer"] = {{"type", "Split"},
                                  {"pattern", {{"String", "-"}}},
                                  {"behavior", c.behavior},
                                  {"invert", c.invert}};
    auto toy =
        load_toy(std::string("split_") + c.behavior + (c.invert ? "_inverted" : ""), tokenizer);
    ASSERT_NE(toy, nullptr);
    EXPECT_EQ(token_strings(*toy, "a-b--c"), c.pieces) << c.behavior << " " << c.invert;
  }
}

TEST(PreTokenizerTest, SplitsDigits) {
  Json tokenizer = toy_tokenizer({"a", "b", "c", "1", "2", "3", "4", "ab", "1234"});
  tokenizer["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", false}};
  auto runs = load_toy("digits", tokenizer);
  ASSERT_NE(runs, nullptr);
  EXPECT_EQ(token_strings(*runs, "ab1234c"), (Strings{"ab", "1234", "c"}));
  tokenizer["pre_tokenizer"]["individual_digits"] = true;
  auto single = load_toy("digits_individual", tokenizer);
  ASSERT_NE(single, nullptr);
  EXPECT_EQ(token_strings(*single, "ab1234c"), (Strings{"ab", "1", "2", "3", "4", "c"}));
}

// GPT-2's byte-to-character map, written out independently of the tokenizer.
std::string byte_level_char(unsigned char b) {
  int next = 256;
  for (int c = 0; c < 256; ++c) {
    const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
    const int mapped = printable ? c : next++;
    if (c == b) {
      std::string out;
      if (mapped < 0x80) {
        out += static_cast<char>(mapped);
      } else {
        out += static_cast<char>(0xC0 | (mapped >> 6));
        out += static_cast<char>(0x80 | (mapped & 0x3F));
      }
      return out;
    }
  }
  return {};
}

TEST(PreTokenizerTest, ByteLevelAddsPrefixSpaceAndSplitsWithGpt2Pattern) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(byte_level_char(static_cast<unsigned char>(b)));
  }
  const std::string space = byte_level_char(' ');
  tokens.push_back(space + "hello");
  tokens.push_back(space + "world");
  Json tokenizer = toy_tokenizer(tokens);
  tokenizer["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}};
  tokenizer["decoder"] = {{"type", "ByteLevel"}};
  auto toy = load_toy("gpt2", tokenizer);
  ASSERT_NE(toy, nullptr);
  const std::vector<int32_t> ids = toy->encode("hello world's", false);
  EXPECT_EQ(ids, (std::vector<int32_t>{256, 257, toy->token_id("'").value(),
                                       toy->token_id("s").value()}));
  EXPECT_EQ(toy->decode(ids, false), " hello world's");
}

TEST(BpeTest, ReplacesUnknownCharactersWithUnk) {
  Json tokenizer = toy_tokenizer({"<unk>", "a", "b"});
  tokenizer["model"]["unk_token"] = "<unk>";
  tokenizer["model"]["fuse_unk"] = true;
  auto fused = load_toy("unk_fused", tokenizer);
  ASSERT_NE(fused, nullptr);
  EXPECT_EQ(fused->encode("axyb", false), (std::vector<int32_t>{1, 0, 2}));
  tokenizer["model"]["fuse_unk"] = false;
  auto unfused = load_toy("unk", tokenizer);
  ASSERT_NE(unfused, nullptr);
  EXPECT_EQ(unfused->encode("axyb", false), (std::vector<int32_t>{1, 0, 0, 2}));
  tokenizer["model"].erase("unk_token");
  auto dropped = load_toy("no_unk", tokenizer);
  ASSERT_NE(dropped, nullptr);
  EXPECT_EQ(dropped->encode("axyb", false), (std::vector<int32_t>{1, 2}));
  // Without a decoder, tokens are joined with spaces.
  EXPECT_EQ(dropped->decode(std::vector<int32_t>{1, 2}, false), "a b");
}

TEST(BpeTest, MergesByRank) {
  Json tokenizer = toy_tokenizer({"a", "b", "c", "ab", "bc", "abc"});
  tokenizer["model"]["ignore_merges"] = false;
  // "b c" outranks "a b", so "abc" becomes a + bc; no merge makes "abc" from those.
  tokenizer["model"]["merges"] = {"b c", "a b", {"ab", "c"}};
  auto toy = load_toy("ranks", tokenizer);
  ASSERT_NE(toy, nullptr);
  EXPECT_EQ(token_strings(*toy, "abc"), (Strings{"a", "bc"}));
  EXPECT_EQ(token_strings(*toy, "ababc"), (Strings{"ab", "a", "bc"}));
  tokenizer["model"]["merges"] = {"a b", "b c", {"ab", "c"}};
  auto other = load_toy("ranks_other", tokenizer);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(token_strings(*other, "abc"), (Strings{"abc"}));
}

TEST(NormalizerTest, StripsAndReplacesWithRegex) {
  Json tokenizer = toy_tokenizer({"a", "b", "_"});
  tokenizer["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
        {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", "_"}}}}};
  auto toy = load_toy("strip_replace", tokenizer);
  ASSERT_NE(toy, nullptr);
  EXPECT_EQ(token_strings(*toy, " \u3000a \t\u00a0b  "), (Strings{"a", "_", "b"}));
}

TEST(AddedTokenTest, SingleWordTokensMatchWholeWordsOnly) {
  Json tokenizer = toy_tokenizer({"c", "a", "t", "o", "n", " ", "."});
  tokenizer["added_tokens"] = {{{"id", 7},
                                {"content", "cat"},
                                {"single_word", true},
                                {"lstrip", false},
                                {"rstrip", false},
                                {"normalized", false},
                                {"special", false}}};
  auto toy = load_toy("single_word", tokenizer);
  ASSERT_NE(toy, nullptr);
  EXPECT_EQ(toy->encode("cat concat cat.", false),
            (std::vector<int32_t>{7, 5, 0, 3, 4, 0, 1, 2, 5, 7, 6}));
}

TEST(AddedTokenTest, NormalizedTokensMatchNormalizedText) {
  Json tokenizer = toy_tokenizer({"\u2581", "s", "a", "y", "h", "e", "l", "o", "x", "\u2581say"});
  tokenizer["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Prepend"}, {"prepend", "\u2581"}},
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}};
  tokenizer["added_tokens"] = {
      {{"id", 10}, {"content", "hello"}, {"normalized", true}, {"special", false}}};
  auto toy = load_toy("normalized_added", tokenizer);
  ASSERT_NE(toy, nullptr);
  // The token is matched as its normalized form "▁hello".
  EXPECT_EQ(toy->encode("hello", false), (std::vector<int32_t>{10}));
  EXPECT_EQ(toy->encode("say hello", false), (std::vector<int32_t>{9, 10}));
  EXPECT_EQ(toy->encode("xhello", false).size(), 7u);
}

TEST(AddedTokenTest, SplitSpecialTokensReadsThemAsText) {
  const fs::path dir = make_variant("llama3", "split_special", [](Json&, Json& config) {
    config["split_special_tokens"] = true;
  });
  auto tokenizer = Tokenizer::load(dir.string());
  ASSERT_TRUE(tokenizer.is_ok()) << tokenizer.status().to_string();
  const int32_t eot = tokenizer.value()->token_id("<|eot_id|>").value();
  const std::vector<int32_t> ids = tokenizer.value()->encode("Hi<|eot_id|>", false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), eot), 0);
  EXPECT_EQ(tokenizer.value()->decode(ids, false), "Hi<|eot_id|>");
}

// ---------------------------------------------------------------------------------------------
// Chat templates

const std::vector<ChatMessage> kChat = {{"system", "You are terse."},
                                        {"user", "Hi!"},
                                        {"assistant", "Hello."},
                                        {"user", " How are you? "}};

std::string render(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages,
                   bool add_generation_prompt) {
  auto text = tokenizer.apply_chat_template(messages, add_generation_prompt);
  EXPECT_TRUE(text.is_ok()) << text.status().to_string();
  return text.is_ok() ? text.value() : "";
}

TEST(ChatTemplateTest, RendersLlama3) {
  auto tokenizer = load_fixture("llama3");
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->chat_template_family(), ChatTemplateFamily::kLlama3);
  const std::string text = render(*tokenizer, kChat, true);
  EXPECT_EQ(text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are "
            "terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHow are you?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const std::vector<int32_t> ids = tokenizer->encode(text, false);
  EXPECT_EQ(ids.front(), tokenizer->bos_id());
  EXPECT_EQ(ids[1], tokenizer->token_id("<|start_header_id|>"));
}

TEST(ChatTemplateTest, RendersLlama31SystemHeader) {
  const fs::path dir = make_variant("llama3", "llama31", [](Json&, Json& config) {
    config["chat_template"] =
        "{{- bos_token }}{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
        "{{- \"Cutting Knowledge Date: December 2023\\n\" }}"
        "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}";
  });
  auto tokenizer = Tokenizer::load(dir.string());
  ASSERT_TRUE(tokenizer.is_ok()) << tokenizer.status().to_string();
  EXPECT_EQ(render(*tokenizer.value(), {kChat[0], kChat[1]}, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
            "You are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render(*tokenizer.value(), {kChat[1]}, false),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>");
}

TEST(ChatTemplateTest, RendersChatMlWithDefaultSystemPrompt) {
  auto tokenizer = load_fixture("qwen2");
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->chat_template_family(), ChatTemplateFamily::kChatMl);
  EXPECT_EQ(render(*tokenizer, {kChat[1]}, true),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render(*tokenizer, kChat, false),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n How are you? "
            "<|im_end|>\n");
}

TEST(ChatTemplateTest, RendersLlama2) {
  auto tokenizer = load_fixture("llama2");
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->chat_template_family(), ChatTemplateFamily::kLlama2);
  EXPECT_EQ(render(*tokenizer, kChat, true),
            "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi! [/INST] Hello. </s>"
            "<s>[INST] How are you? [/INST]");
  EXPECT_EQ(render(*tokenizer, {kChat[1]}, true), "<s>[INST] Hi! [/INST]");
}

TEST(ChatTemplateTest, RendersMistral) {
  auto tokenizer = load_fixture("mistral");
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(tokenizer->chat_template_family(), ChatTemplateFamily::kMistral);
  EXPECT_EQ(render(*tokenizer, {kChat[1], kChat[2], kChat[3]}, true),
            "<s>[INST] Hi! [/INST]Hello.</s>[INST]  How are you?  [/INST]");
  EXPECT_EQ(render(*tokenizer, {kChat[0], kChat[1]}, true),
            "<s>[INST] You are terse.\n\nHi! [/INST]");
}

TEST(ChatTemplateTest, RendersChatMlWhenThereIsNoTemplate) {
  const fs::path dir = make_variant("llama2", "no_template",
                                    [](Json&, Json& config) { config.erase("chat_template"); });
  auto tokenizer = Tokenizer::load(dir.string());
  ASSERT_TRUE(tokenizer.is_ok()) << tokenizer.status().to_string();
  EXPECT_EQ(tokenizer.value()->chat_template_family(), ChatTemplateFamily::kNone);
  EXPECT_EQ(render(*tokenizer.value(), {kChat[0], kChat[1]}, true),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, RejectsUnsupportedRolesAndOrders) {
  auto llama2 = load_fixture("llama2");
  ASSERT_NE(llama2, nullptr);
  auto twice = llama2->apply_chat_template(std::vector<ChatMessage>{kChat[1], kChat[1]}, true);
  ASSERT_FALSE(twice.is_ok());
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("alternate"), std::string::npos);
  auto assistant_first = llama2->apply_chat_template(std::vector<ChatMessage>{kChat[2]}, true);
  EXPECT_EQ(assistant_first.status().code(), StatusCode::kInvalidArgument);

  auto llama3 = load_fixture("llama3");
  ASSERT_NE(llama3, nullptr);
  auto tool = llama3->apply_chat_template(std::vector<ChatMessage>{{"tool", "{}"}}, true);
  ASSERT_FALSE(tool.is_ok());
  EXPECT_EQ(tool.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(tool.status().message().find("'tool'"), std::string::npos);
}

TEST(ChatTemplateTest, RefusesUnrecognizedTemplates) {
  const fs::path dir = make_variant("llama3", "gemma_template", [](Json&, Json& config) {
    config["chat_template"] = "{% for m in messages %}<start_of_turn>{{ m.content }}{% endfor %}";
  });
  auto tokenizer = Tokenizer::load(dir.string());
  ASSERT_TRUE(tokenizer.is_ok()) << tokenizer.status().to_string();
  EXPECT_EQ(tokenizer.value()->chat_template_family(), ChatTemplateFamily::kUnrecognized);
  EXPECT_EQ(tokenizer.value()->apply_chat_template(kChat, true).status().code(),
            StatusCode::kUnimplemented);
}

// ---------------------------------------------------------------------------------------------
// Bad inputs

Status load_error(const fs::path& dir) {
  auto tokenizer = Tokenizer::load(dir.string());
  EXPECT_FALSE(tokenizer.is_ok()) << dir;
  return tokenizer.status();
}

void expect_invalid(const Status& status, const std::vector<std::string>& words) {
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
  for (const std::string& word : words) {
    EXPECT_NE(status.message().find(word), std::string::npos)
        << "'" << word << "' not in: " << status.message();
  }
}

TEST(TokenizerLoadTest, MissingDirectoryIsNotFound) {
  const Status status = load_error(fixtures_dir() / "no_such_model");
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_NE(status.message().find("tokenizer.json"), std::string::npos);
}

TEST(TokenizerLoadTest, MalformedJsonNamesTheFile) {
  const fs::path dir = make_variant("llama3", "malformed", [](Json&, Json&) {});
  write_file(dir / "tokenizer.json", "{\"model\": {\"type\": \"BPE\", ");
  expect_invalid(load_error(dir), {"tokenizer.json", "not valid JSON"});

  const fs::path config_dir = make_variant("llama3", "malformed_config", [](Json&, Json&) {});
  write_file(config_dir / "tokenizer_config.json", "[1, 2");
  expect_invalid(load_error(config_dir), {"tokenizer_config.json"});
}

TEST(TokenizerLoadTest, UnsupportedModelTypesAreNamed) {
  for (const std::string type : {"Unigram", "WordPiece", "WordLevel"}) {
    const fs::path dir = make_variant("llama3", "model_" + type, [&](Json& tokenizer, Json&) {
      tokenizer["model"]["type"] = type;
    });
    expect_invalid(load_error(dir), {"tokenizer.json", "model type '" + type + "'"});
  }
}

TEST(TokenizerLoadTest, UnsupportedComponentsAreNamed) {
  expect_invalid(load_error(make_variant("llama2", "nfkc",
                                         [](Json& tokenizer, Json&) {
                                           tokenizer["normalizer"] = {{"type", "NFKC"}};
                                         })),
                 {"normalizer 'NFKC'"});
  expect_invalid(load_error(make_variant("llama2", "whitespace",
                                         [](Json& tokenizer, Json&) {
                                           tokenizer["pre_tokenizer"] = {{"type", "Whitespace"}};
                                         })),
                 {"pre-tokenizer 'Whitespace'"});
  expect_invalid(load_error(make_variant("llama2", "ctc",
                                         [](Json& tokenizer, Json&) {
                                           tokenizer["decoder"] = {{"type", "CTC"}};
                                         })),
                 {"decoder 'CTC'"});
  expect_invalid(
      load_error(make_variant("llama3", "bad_regex",
                              [](Json& tokenizer, Json&) {
                                tokenizer["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
                                    "(unclosed";
                              })),
      {"regex '(unclosed'"});
}

// A Sequence nested `depth` times around one NFC normalizer.
Json nested_normalizer(int depth) {
  std::string text;
  for (int i = 0; i < depth; ++i) {
    text += R"({"type":"Sequence","normalizers":[)";
  }
  text += R"({"type":"NFC"})";
  for (int i = 0; i < depth; ++i) {
    text += "]}";
  }
  return Json::parse(text);
}

// The loaders recurse into Sequence: a file nesting it thousands of times overflowed the stack
// (found by tokenizer_fuzz); real files nest a level or two.
TEST(TokenizerLoadTest, DeeplyNestedSequencesAreRefused) {
  expect_invalid(load_error(make_variant("llama2", "nested_deep",
                                         [](Json& tokenizer, Json&) {
                                           tokenizer["normalizer"] = nested_normalizer(17);
                                         })),
                 {"normalizer Sequence nested deeper than 16"});
  const fs::path shallow = make_variant("llama2", "nested_ok", [](Json& tokenizer, Json&) {
    tokenizer["normalizer"] = nested_normalizer(3);
  });
  EXPECT_TRUE(Tokenizer::load(shallow.string()).is_ok());
}

TEST(TokenizerLoadTest, MergesNamingUnknownTokensAreRejected) {
  expect_invalid(load_error(make_variant("llama2", "bad_merge",
                                         [](Json& tokenizer, Json&) {
                                           tokenizer["model"]["merges"].push_back("nosuch token");
                                         })),
                 {"merge #", "'nosuch'", "not in the vocabulary"});
  expect_invalid(load_error(make_variant("llama3", "bad_merge_pair",
                                         [](Json& tokenizer, Json&) {
                                           tokenizer["model"]["merges"].push_back({"a", "b"});
                                           tokenizer["model"]["vocab"].erase("ab");
                                         })),
                 {"makes 'ab'"});
  expect_invalid(load_error(make_variant("llama2", "malformed_merge",
                                         [](Json& tokenizer, Json&) {
                                           tokenizer["model"]["merges"].push_back("abc");
                                         })),
                 {"'abc'", "two tokens"});
}

TEST(TokenizerLoadTest, MistypedFieldsBecomeErrors) {
  expect_invalid(load_error(make_variant(
                     "llama3", "mistyped",
                     [](Json& tokenizer, Json&) { tokenizer["added_tokens"][0]["id"] = "one"; })),
                 {"tokenizer.json"});
  expect_invalid(
      load_error(make_variant("llama3", "unknown_bos",
                              [](Json&, Json& config) { config["bos_token"] = "<nope>"; })),
      {"tokenizer_config.json", "bos_token '<nope>'"});
}

// Issue 18: logprobs show a token by the bytes it adds, which decode() of the token alone
// cannot give (a piece of a character decodes to U+FFFD, SentencePiece drops a leading space).
TEST(TokenizerTokenBytesTest, ByteLevelTokensGiveTheirRawBytes) {
  auto tokenizer = load_fixture("llama3");
  ASSERT_NE(tokenizer, nullptr);
  const std::optional<int32_t> e2 = tokenizer->token_id("\u00e2");  // byte 0xE2's character
  const std::optional<int32_t> space = tokenizer->token_id("\u0120");
  ASSERT_TRUE(e2 && space);
  EXPECT_EQ(tokenizer->token_bytes(*e2), "\xe2");
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{*e2}, false), "\xef\xbf\xbd");  // U+FFFD
  EXPECT_EQ(tokenizer->token_bytes(*space), " ");
  EXPECT_EQ(tokenizer->token_piece(*space), "\u0120");
  const std::optional<int32_t> eot = tokenizer->token_id("<|eot_id|>");
  ASSERT_TRUE(eot);
  EXPECT_EQ(tokenizer->token_bytes(*eot), "<|eot_id|>");
  EXPECT_EQ(tokenizer->token_bytes(-1), "");
  EXPECT_EQ(tokenizer->token_piece(tokenizer->vocab_size()), "");
}

TEST(TokenizerTokenBytesTest, SentencePieceTokensKeepTheirSpaceAndByteValue) {
  for (const char* name : {"llama2", "mistral"}) {
    SCOPED_TRACE(name);
    auto tokenizer = load_fixture(name);
    ASSERT_NE(tokenizer, nullptr);
    const std::optional<int32_t> e2 = tokenizer->token_id("<0xE2>");
    ASSERT_TRUE(e2);
    EXPECT_EQ(tokenizer->token_bytes(*e2), "\xe2");
    EXPECT_EQ(tokenizer->token_piece(*e2), "<0xE2>");
    const std::optional<int32_t> the = tokenizer->token_id("\u2581the");
    ASSERT_TRUE(the);
    EXPECT_EQ(tokenizer->token_bytes(*the), " the");
    EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{*the}, false), "the");
  }
}

TEST(TokenizerTokenBytesTest, BytesOfConsecutiveTokensConcatenateToTheText) {
  const std::string text = "Emoji: \U0001F600\U0001F44D\U0001F3FD \u4f60\u597d, sch\u00f6n";
  for (const char* name : {"llama3", "qwen2", "llama2", "mistral"}) {
    SCOPED_TRACE(name);
    auto tokenizer = load_fixture(name);
    ASSERT_NE(tokenizer, nullptr);
    std::string bytes;
    for (int32_t id : tokenizer->encode(text, /*add_special_tokens=*/false)) {
      bytes += tokenizer->token_bytes(id);
    }
    // SentencePiece models prepend a space marker to the text; the raw bytes keep it.
    const std::string_view model = name;
    const bool sentencepiece = model == "llama2" || model == "mistral";
    EXPECT_EQ(bytes, sentencepiece ? " " + text : text);
  }
}

}  // namespace
}  // namespace flotilla::llm

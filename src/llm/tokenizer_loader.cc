// Tokenizer::load(): reads tokenizer.json into a detail::TokenizerModel (tokenizer_model.h), then
// the optional tokenizer_config.json, generation_config.json and chat_template.jinja.
// nlohmann::json throws on a missing key or a mistyped field; load_json_if_present() turns that
// into a Status naming the file.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "llm/tokenizer.h"
#include "llm/tokenizer_model.h"

namespace flotilla::llm {
namespace detail {
namespace {

using Json = nlohmann::json;

// Ids above this are refused at load: a corrupt file must not make us allocate gigabytes.
constexpr int64_t kMaxTokenId = 1 << 24;

// ---------------------------------------------------------------------------------------------
// Loading tokenizer.json

// A nullable string field: nullopt when absent or null. Other types throw json::type_error,
// which load() turns into a Status.
std::optional<std::string> optional_string(const Json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) {
    return std::nullopt;
  }
  return it->get<std::string>();
}

bool bool_or(const Json& object, const char* key, bool fallback) {
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? fallback : it->get<bool>();
}

std::string type_of(const Json& component) {
  auto it = component.find("type");
  return it != component.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// {"String": "..."} or {"Regex": "..."}, the pattern of Split and Replace.
Status load_pattern(const Json& pattern, std::string& literal, std::optional<Regex>& regex,
                    std::string_view where) {
  if (auto text = optional_string(pattern, "String")) {
    literal = *text;
    return Status::ok();
  }
  if (auto text = optional_string(pattern, "Regex")) {
    FLOTILLA_ASSIGN_OR_RETURN(regex, Regex::compile(*text));
    return Status::ok();
  }
  return invalid_argument(std::string(where) + " pattern is neither {\"String\": ...} nor " +
                          "{\"Regex\": ...}");
}

// Real tokenizers nest Sequence a level or two; a file nesting thousands (a fuzzer's, or an
// attacker's) would otherwise overflow the stack of these recursive loaders.
constexpr int kMaxSequenceDepth = 16;

Status check_sequence_depth(int depth, std::string_view what) {
  if (depth >= kMaxSequenceDepth) {
    return invalid_argument(std::string(what) + " Sequence nested deeper than " +
                            std::to_string(kMaxSequenceDepth) + " levels");
  }
  return Status::ok();
}

Status load_normalizer(const Json& json, TokenizerModel& model, int depth = 0) {
  if (json.is_null()) {
    return Status::ok();
  }
  const std::string type = type_of(json);
  if (type == "Sequence") {
    FLOTILLA_RETURN_IF_ERROR(check_sequence_depth(depth, "normalizer"));
    for (const Json& item : json.at("normalizers")) {
      FLOTILLA_RETURN_IF_ERROR(load_normalizer(item, model, depth + 1));
    }
    return Status::ok();
  }
  NormalizerStep step;
  if (type == "Prepend") {
    step.kind = NormalizerKind::kPrepend;
    step.text = json.at("prepend").get<std::string>();
  } else if (type == "Replace") {
    step.kind = NormalizerKind::kReplace;
    step.text = json.at("content").get<std::string>();
    FLOTILLA_RETURN_IF_ERROR(
        load_pattern(json.at("pattern"), step.literal, step.regex, "normalizer Replace"));
  } else if (type == "NFC") {
    step.kind = NormalizerKind::kNfc;
    if (model.nfc == nullptr) {
      model.nfc = std::make_unique<const NfcNormalizer>();
    }
  } else if (type == "Strip") {
    step.kind = NormalizerKind::kStrip;
    step.strip_left = bool_or(json, "strip_left", true);
    step.strip_right = bool_or(json, "strip_right", true);
  } else {
    return invalid_argument("normalizer '" + type +
                            "' is not supported (supported: Sequence, Prepend, Replace, NFC, "
                            "Strip)");
  }
  model.normalizers.push_back(std::move(step));
  return Status::ok();
}

Result<PrependScheme> load_prepend_scheme(const Json& json) {
  if (auto scheme = optional_string(json, "prepend_scheme")) {
    if (*scheme == "always") {
      return PrependScheme::kAlways;
    }
    if (*scheme == "first") {
      return PrependScheme::kFirst;
    }
    if (*scheme == "never") {
      return PrependScheme::kNever;
    }
    return invalid_argument("Metaspace prepend_scheme '" + *scheme + "' is unknown");
  }
  // Files written before prepend_scheme existed say add_prefix_space.
  return bool_or(json, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

Status load_pre_tokenizer(const Json& json, TokenizerModel& model, int depth = 0) {
  if (json.is_null()) {
    return Status::ok();
  }
  const std::string type = type_of(json);
  if (type == "Sequence") {
    FLOTILLA_RETURN_IF_ERROR(check_sequence_depth(depth, "pre_tokenizer"));
    for (const Json& item : json.at("pretokenizers")) {
      FLOTILLA_RETURN_IF_ERROR(load_pre_tokenizer(item, model, depth + 1));
    }
    return Status::ok();
  }
  PreTokenizerStep step;
  if (type == "Split") {
    step.kind = PreTokenizerKind::kSplit;
    FLOTILLA_RETURN_IF_ERROR(
        load_pattern(json.at("pattern"), step.literal, step.regex, "pre-tokenizer Split"));
    const std::string behavior = json.at("behavior").get<std::string>();
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    auto it = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                           [&](const auto& known) { return behavior == known.first; });
    if (it == std::end(kBehaviors)) {
      return invalid_argument("pre-tokenizer Split behavior '" + behavior + "' is unknown");
    }
    step.behavior = it->second;
    step.invert = bool_or(json, "invert", false);
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerKind::kByteLevel;
    step.add_prefix_space = bool_or(json, "add_prefix_space", true);
    if (bool_or(json, "use_regex", true)) {
      FLOTILLA_ASSIGN_OR_RETURN(step.regex,
                                Regex::compile("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| "
                                               "?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"));
    }
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerKind::kMetaspace;
    step.literal = optional_string(json, "replacement").value_or("\xE2\x96\x81");
    FLOTILLA_ASSIGN_OR_RETURN(step.prepend_scheme, load_prepend_scheme(json));
    step.split = bool_or(json, "split", true);
  } else if (type == "Digits") {
    // Rust's char::is_numeric is \p{N}; runs of digits stay together unless individual_digits.
    step.kind = PreTokenizerKind::kSplit;
    const bool individual = bool_or(json, "individual_digits", false);
    FLOTILLA_ASSIGN_OR_RETURN(step.regex, Regex::compile(individual ? "\\p{N}" : "\\p{N}+"));
  } else {
    return invalid_argument("pre-tokenizer '" + type +
                            "' is not supported (supported: Sequence, Split, ByteLevel, "
                            "Metaspace, Digits)");
  }
  model.pre_tokenizers.push_back(std::move(step));
  return Status::ok();
}

Status load_decoder(const Json& json, std::vector<DecoderStep>& steps, int depth = 0) {
  const std::string type = type_of(json);
  if (type == "Sequence") {
    FLOTILLA_RETURN_IF_ERROR(check_sequence_depth(depth, "decoder"));
    for (const Json& item : json.at("decoders")) {
      FLOTILLA_RETURN_IF_ERROR(load_decoder(item, steps, depth + 1));
    }
    return Status::ok();
  }
  DecoderStep step;
  if (type == "ByteLevel") {
    step.kind = DecoderKind::kByteLevel;
  } else if (type == "Replace") {
    step.kind = DecoderKind::kReplace;
    std::optional<Regex> regex;
    FLOTILLA_RETURN_IF_ERROR(
        load_pattern(json.at("pattern"), step.pattern, regex, "decoder Replace"));
    if (regex) {
      return invalid_argument("decoder Replace with a Regex pattern is not supported");
    }
    step.content = json.at("content").get<std::string>();
  } else if (type == "ByteFallback") {
    step.kind = DecoderKind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderKind::kFuse;
  } else if (type == "Strip") {
    step.kind = DecoderKind::kStrip;
    step.pattern = json.at("content").get<std::string>();
    step.strip_start = json.value("start", size_t{0});
    step.strip_stop = json.value("stop", size_t{0});
  } else if (type == "Metaspace") {
    step.kind = DecoderKind::kMetaspace;
    step.pattern = optional_string(json, "replacement").value_or("\xE2\x96\x81");
    FLOTILLA_ASSIGN_OR_RETURN(PrependScheme scheme, load_prepend_scheme(json));
    step.drop_first_replacement = scheme != PrependScheme::kNever;
  } else {
    return invalid_argument("decoder '" + type +
                            "' is not supported (supported: Sequence, ByteLevel, Replace, "
                            "ByteFallback, Fuse, Strip, Metaspace)");
  }
  steps.push_back(std::move(step));
  return Status::ok();
}

// The special tokens add_special_tokens puts around a single sequence.
Status load_post_processor(const Json& json, std::vector<int32_t>& prefix,
                           std::vector<int32_t>& suffix, int depth = 0) {
  if (json.is_null()) {
    return Status::ok();
  }
  const std::string type = type_of(json);
  if (type == "Sequence") {
    FLOTILLA_RETURN_IF_ERROR(check_sequence_depth(depth, "post_processor"));
    for (const Json& item : json.at("processors")) {
      FLOTILLA_RETURN_IF_ERROR(load_post_processor(item, prefix, suffix, depth + 1));
    }
    return Status::ok();
  }
  if (type == "ByteLevel") {
    return Status::ok();  // it only trims offsets
  }
  if (type == "TemplateProcessing") {
    bool seen_sequence = false;
    for (const Json& item : json.at("single")) {
      if (item.contains("Sequence")) {
        if (seen_sequence) {
          return invalid_argument("TemplateProcessing single template has two sequences");
        }
        seen_sequence = true;
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      const Json& special = json.at("special_tokens");
      if (!special.contains(name)) {
        return invalid_argument("TemplateProcessing names special token '" + name +
                                "' that its special_tokens do not define");
      }
      for (const Json& id : special.at(name).at("ids")) {
        (seen_sequence ? suffix : prefix).push_back(id.get<int32_t>());
      }
    }
    if (!seen_sequence) {
      return invalid_argument("TemplateProcessing single template has no sequence ($A)");
    }
    return Status::ok();
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    prefix.push_back(json.at("cls").at(1).get<int32_t>());
    suffix.push_back(json.at("sep").at(1).get<int32_t>());
    return Status::ok();
  }
  return invalid_argument("post_processor '" + type +
                          "' is not supported (supported: Sequence, ByteLevel, "
                          "TemplateProcessing, RobertaProcessing, BertProcessing)");
}

Status load_bpe(const Json& json, TokenizerModel& model) {
  if (!json.is_object()) {
    return invalid_argument("\"model\" is missing or not an object");
  }
  const std::string type = type_of(json);
  if (!type.empty() && type != "BPE") {
    return invalid_argument("model type '" + type + "' is not supported (only BPE)");
  }
  if (auto dropout = json.find("dropout");
      dropout != json.end() && !dropout->is_null() && dropout->get<double>() > 0) {
    return invalid_argument("BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!optional_string(json, key).value_or("").empty()) {
      return invalid_argument(std::string("BPE ") + key + " is not supported");
    }
  }
  BpeModel& bpe = model.bpe;
  auto vocab = json.find("vocab");
  if (vocab == json.end() || !vocab->is_object()) {
    return invalid_argument("model.vocab is missing or not an object");
  }
  bpe.vocab.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    const int64_t value = id.get<int64_t>();
    if (value < 0 || value >= kMaxTokenId) {
      return invalid_argument("vocab token '" + token + "' has id " + std::to_string(value) +
                              ", out of range");
    }
    bpe.vocab.emplace(token, static_cast<int32_t>(value));
  }
  auto merges = json.find("merges");
  if (merges == json.end() || !merges->is_array()) {
    return invalid_argument("model.merges is missing or not an array");
  }
  bpe.merges.reserve(merges->size());
  int32_t rank = 0;
  for (const Json& merge : *merges) {
    // "a b" in older files, ["a", "b"] since tokens may hold spaces.
    std::string left;
    std::string right;
    if (merge.is_string()) {
      const std::string& text = merge.get_ref<const std::string&>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        return invalid_argument("merge #" + std::to_string(rank) + " '" + text +
                                "' is not two tokens separated by one space");
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return invalid_argument("merge #" + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
    }
    for (const std::string* token : {&left, &right}) {
      if (!bpe.vocab.contains(*token)) {
        return invalid_argument("merge #" + std::to_string(rank) + " names token '" + *token +
                                "', which is not in the vocabulary");
      }
    }
    auto merged = bpe.vocab.find(left + right);
    if (merged == bpe.vocab.end()) {
      return invalid_argument("merge #" + std::to_string(rank) + " makes '" + left + right +
                              "', which is not in the vocabulary");
    }
    // A repeated pair takes its last rank, as Hugging Face's map does.
    bpe.merges.insert_or_assign(pair_key(bpe.vocab.at(left), bpe.vocab.at(right)),
                                MergeRule{rank, merged->second});
    ++rank;
  }
  bpe.fuse_unk = bool_or(json, "fuse_unk", false);
  bpe.byte_fallback = bool_or(json, "byte_fallback", false);
  bpe.ignore_merges = bool_or(json, "ignore_merges", false);
  for (int b = 0; b < 256; ++b) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    const std::string name = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
    auto it = bpe.vocab.find(name);
    bpe.byte_ids[b] = it == bpe.vocab.end() ? -1 : it->second;
  }
  return Status::ok();
}

Status load_added_tokens(const Json& json, TokenizerModel& model) {
  if (json.is_null()) {
    return Status::ok();
  }
  for (const Json& item : json) {
    AddedToken token;
    token.content = item.at("content").get<std::string>();
    const int64_t id = item.at("id").get<int64_t>();
    if (id < 0 || id >= kMaxTokenId) {
      return invalid_argument("added token '" + token.content + "' has id " + std::to_string(id) +
                              ", out of range");
    }
    token.id = static_cast<int32_t>(id);
    token.special = bool_or(item, "special", false);
    token.single_word = bool_or(item, "single_word", false);
    token.lstrip = bool_or(item, "lstrip", false);
    token.rstrip = bool_or(item, "rstrip", false);
    token.normalized = bool_or(item, "normalized", !token.special);
    if (token.content.empty()) {
      continue;  // Hugging Face ignores these too
    }
    model.added_ids.insert_or_assign(token.content, token.id);
    model.added_tokens.push_back(std::move(token));
  }
  bool single_word = false;
  for (const AddedToken& token : model.added_tokens) {
    single_word = single_word || token.single_word;
    if (token.normalized) {
      // Normalized tokens are looked for in normalized text, so in their normalized form.
      model.normalized_matcher.add(normalize(model, token.content), token);
    } else {
      model.raw_matcher.add(token.content, token);
    }
  }
  model.raw_matcher.finish();
  model.normalized_matcher.finish();
  if (single_word) {
    FLOTILLA_ASSIGN_OR_RETURN(model.word_char, Regex::compile("\\w"));
  }
  return Status::ok();
}

void build_id_table(TokenizerModel& model) {
  size_t size = 0;
  for (const auto& [token, id] : model.bpe.vocab) {
    size = std::max(size, static_cast<size_t>(id) + 1);
  }
  for (const AddedToken& token : model.added_tokens) {
    size = std::max(size, static_cast<size_t>(token.id) + 1);
  }
  model.id_to_token.assign(size, std::string());
  model.flags.assign(size, 0);
  for (const auto& [token, id] : model.bpe.vocab) {
    model.id_to_token[id] = token;
    model.flags[id] = TokenizerModel::kKnown;
  }
  for (const AddedToken& token : model.added_tokens) {
    model.id_to_token[token.id] = token.content;
    model.flags[token.id] = static_cast<uint8_t>(TokenizerModel::kKnown |
                                                 (token.special ? TokenizerModel::kSpecial : 0));
  }
}

Status load_tokenizer_json(const Json& root, TokenizerModel& model) {
  if (!root.is_object()) {
    return invalid_argument("the top level is not a JSON object");
  }
  // The normalizer comes first: normalized added tokens are stored in normalized form.
  FLOTILLA_RETURN_IF_ERROR(load_normalizer(root.value("normalizer", Json()), model));
  FLOTILLA_RETURN_IF_ERROR(load_pre_tokenizer(root.value("pre_tokenizer", Json()), model));
  FLOTILLA_RETURN_IF_ERROR(load_bpe(root.value("model", Json()), model));
  if (auto unk = optional_string(root.at("model"), "unk_token")) {
    auto it = model.bpe.vocab.find(*unk);
    if (it == model.bpe.vocab.end()) {
      return invalid_argument("unk_token '" + *unk + "' is not in the vocabulary");
    }
    model.bpe.unk_id = it->second;
  }
  FLOTILLA_RETURN_IF_ERROR(load_added_tokens(root.value("added_tokens", Json()), model));
  const Json decoder = root.value("decoder", Json());
  if (!decoder.is_null()) {
    model.decoders.emplace();
    FLOTILLA_RETURN_IF_ERROR(load_decoder(decoder, *model.decoders));
  }
  FLOTILLA_RETURN_IF_ERROR(load_post_processor(root.value("post_processor", Json()),
                                               model.prefix_ids, model.suffix_ids));
  build_id_table(model);
  if (!model.prefix_ids.empty()) {
    model.bos_id = model.prefix_ids.front();
  }
  for (const std::vector<int32_t>* ids : {&model.prefix_ids, &model.suffix_ids}) {
    for (int32_t id : *ids) {
      if (id < 0 || static_cast<size_t>(id) >= model.id_to_token.size()) {
        return invalid_argument("post_processor adds id " + std::to_string(id) +
                                ", which is not in the vocabulary");
      }
    }
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Loading the optional configuration files

Result<Json> read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return invalid_argument("cannot read '" + path.string() + "'");
  }
  const std::string data{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  try {
    return Json::parse(data);
  } catch (const Json::exception& e) {
    return invalid_argument("'" + path.string() + "' is not valid JSON: " + e.what());
  }
}

// bos_token / eos_token: a string, an AddedToken object {"content": ...}, or null.
std::optional<std::string> config_token(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    return std::nullopt;
  }
  if (it->is_object()) {
    return it->at("content").get<std::string>();
  }
  return it->get<std::string>();
}

Result<int32_t> config_token_id(const TokenizerModel& model, const std::string& token,
                                const char* key) {
  if (auto id = model.find(token)) {
    return *id;
  }
  return invalid_argument(std::string(key) + " '" + token + "' is not in the vocabulary");
}

// tokenizer_config.json: special tokens and the chat template. A missing file is fine.
Status load_tokenizer_config(const Json& config, TokenizerModel& model,
                             std::string& template_source, detail::ChatTemplate& chat) {
  if (!config.is_object()) {
    return invalid_argument("the top level is not a JSON object");
  }
  const std::optional<std::string> bos = config_token(config, "bos_token");
  const std::optional<std::string> eos = config_token(config, "eos_token");
  if (config.contains("bos_token")) {
    model.bos_id.reset();
    if (bos) {
      FLOTILLA_ASSIGN_OR_RETURN(model.bos_id, config_token_id(model, *bos, "bos_token"));
    }
  }
  if (eos) {
    FLOTILLA_ASSIGN_OR_RETURN(int32_t eos_id, config_token_id(model, *eos, "eos_token"));
    model.eos_ids.push_back(eos_id);
  }
  // As transformers' LlamaTokenizerFast: these flags, where present, replace what the
  // post_processor adds (defaults: BOS yes, EOS no).
  if (config.contains("add_bos_token") || config.contains("add_eos_token")) {
    model.prefix_ids.clear();
    model.suffix_ids.clear();
    if (bool_or(config, "add_bos_token", true)) {
      if (!model.bos_id) {
        return invalid_argument("add_bos_token is true but there is no bos_token");
      }
      model.prefix_ids.push_back(*model.bos_id);
    }
    if (bool_or(config, "add_eos_token", false)) {
      if (model.eos_ids.empty()) {
        return invalid_argument("add_eos_token is true but there is no eos_token");
      }
      model.suffix_ids.push_back(model.eos_ids.front());
    }
  }
  // transformers' split_special_tokens: special tokens typed by a user stay plain text.
  model.split_special_tokens = bool_or(config, "split_special_tokens", false);
  auto source = config.find("chat_template");
  if (source != config.end() && source->is_string()) {
    template_source = source->get<std::string>();
  } else if (source != config.end() && source->is_array()) {
    // Named templates: [{"name": "default", "template": ...}, {"name": "tool_use", ...}].
    for (const Json& named : *source) {
      if (template_source.empty() || named.value("name", "") == "default") {
        template_source = named.at("template").get<std::string>();
      }
    }
  }
  chat.bos_token = bos.value_or("");
  chat.eos_token = eos.value_or("");
  return Status::ok();
}

// generation_config.json's eos_token_id: one id or a list (Llama 3.1 lists three).
Status load_generation_config(const Json& config, TokenizerModel& model) {
  auto eos = config.find("eos_token_id");
  if (eos == config.end() || eos->is_null()) {
    return Status::ok();
  }
  std::vector<int64_t> ids;
  if (eos->is_array()) {
    ids = eos->get<std::vector<int64_t>>();
  } else {
    ids.push_back(eos->get<int64_t>());
  }
  for (int64_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= model.id_to_token.size()) {
      return invalid_argument("eos_token_id " + std::to_string(id) + " is not in the vocabulary");
    }
    model.eos_ids.push_back(static_cast<int32_t>(id));
  }
  return Status::ok();
}

// Completes eos_ids: the chat family's end-of-turn token ends a reply even where the config
// names another EOS (a base model's config with an instruct template); with no EOS named at all,
// the conventional names, so generation can still stop. Duplicates go.
void settle_eos_ids(ChatTemplateFamily family, TokenizerModel& model) {
  const char* end_of_turn = family == ChatTemplateFamily::kChatMl   ? "<|im_end|>"
                            : family == ChatTemplateFamily::kLlama3 ? "<|eot_id|>"
                                                                    : nullptr;
  if (end_of_turn != nullptr) {
    if (auto id = model.find(end_of_turn)) {
      model.eos_ids.push_back(*id);
    }
  }
  if (model.eos_ids.empty()) {
    for (const char* name : {"</s>", "<|end_of_text|>", "<|endoftext|>"}) {
      if (auto it = model.added_ids.find(name); it != model.added_ids.end()) {
        model.eos_ids.push_back(it->second);
        break;
      }
    }
  }
  std::vector<int32_t> unique;
  for (int32_t id : model.eos_ids) {
    if (std::find(unique.begin(), unique.end(), id) == unique.end()) {
      unique.push_back(id);
    }
  }
  model.eos_ids = std::move(unique);
}

// Loads a JSON file through `load` if it exists, naming the file in any error.
template <typename Load>
Status load_json_if_present(const std::filesystem::path& path, Load&& load) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    return Status::ok();
  }
  FLOTILLA_ASSIGN_OR_RETURN(Json json, read_json_file(path));
  try {
    return load(json).with_context("'" + path.string() + "'");
  } catch (const Json::exception& e) {
    return invalid_argument("'" + path.string() + "': " + e.what());
  }
}

}  // namespace
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Tokenizer::load

using detail::Json;
using detail::load_generation_config;
using detail::load_json_if_present;
using detail::load_tokenizer_config;
using detail::load_tokenizer_json;
using detail::settle_eos_ids;

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  const fs::path tokenizer_path = dir / "tokenizer.json";
  std::error_code error;
  if (!fs::is_regular_file(tokenizer_path, error)) {
    return not_found("no tokenizer.json in '" + model_dir + "'");
  }
  auto model = std::make_unique<detail::TokenizerModel>();
  std::string template_source;
  detail::ChatTemplate chat;
  FLOTILLA_RETURN_IF_ERROR(load_json_if_present(
      tokenizer_path, [&](const Json& json) { return load_tokenizer_json(json, *model); }));
  FLOTILLA_RETURN_IF_ERROR(
      load_json_if_present(dir / "tokenizer_config.json", [&](const Json& json) {
        return load_tokenizer_config(json, *model, template_source, chat);
      }));
  FLOTILLA_RETURN_IF_ERROR(
      load_json_if_present(dir / "generation_config.json",
                           [&](const Json& json) { return load_generation_config(json, *model); }));
  if (template_source.empty()) {
    // transformers 4.43+ saves the template beside the config.
    std::ifstream in(dir / "chat_template.jinja", std::ios::binary);
    template_source.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  if (!template_source.empty()) {
    const std::string bos = chat.bos_token;
    const std::string eos = chat.eos_token;
    chat = detail::detect_chat_template(template_source);
    chat.bos_token = bos;
    chat.eos_token = eos;
  }
  settle_eos_ids(chat.family, *model);
  // Templates write BOS/EOS by name; fill in the family's usual ones if the config has none.
  if (chat.bos_token.empty() && chat.family == ChatTemplateFamily::kLlama3) {
    chat.bos_token = "<|begin_of_text|>";
  }
  if (chat.family == ChatTemplateFamily::kLlama2 || chat.family == ChatTemplateFamily::kMistral) {
    chat.bos_token = chat.bos_token.empty() ? "<s>" : chat.bos_token;
    chat.eos_token = chat.eos_token.empty() ? "</s>" : chat.eos_token;
  }

  auto tokenizer = std::unique_ptr<Tokenizer>(new Tokenizer());
  tokenizer->model_ = std::move(model);
  tokenizer->chat_ = std::move(chat);
  return tokenizer;
}

}  // namespace flotilla::llm

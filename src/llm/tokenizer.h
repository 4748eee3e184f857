// Hugging Face `tokenizer.json` tokenizers for Llama-family models: byte-level BPE (GPT-2,
// Llama 3, Qwen2) and SentencePiece-style BPE with byte fallback (Llama 2, Mistral), plus the
// built-in chat template families. What is supported and what is not: docs/llm_tokenizer.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/common.h"
#include "common/common_generation.h"

namespace flotilla::llm {

using flotilla::ChatMessage;  // common/common_generation.h

// The chat template families apply_chat_template() renders without a Jinja engine, detected
// from the chat_template string of tokenizer_config.json (docs/llm_tokenizer.md).
enum class ChatTemplateFamily {
  kNone,          // no chat_template: rendered as ChatML without a system prompt
  kChatMl,        // contains "<|im_start|>" (Qwen2)
  kLlama3,        // contains "<|start_header_id|>" (Llama 3, 3.1)
  kLlama2,        // contains "[INST]" and "<<SYS>>"
  kMistral,       // contains "[INST]" but not "<<SYS>>"
  kUnrecognized,  // any other template: apply_chat_template() fails with kUnimplemented
};

namespace detail {

struct TokenizerModel;  // tokenizer_model.h

// What apply_chat_template() needs, settled at load.
struct ChatTemplate {
  ChatTemplateFamily family = ChatTemplateFamily::kNone;
  // ChatML: the system prompt the template inserts when the chat has none ("" for none).
  std::string default_system;
  // Llama 3.1 and later: a system block with "Cutting Knowledge Date" always comes first.
  bool knowledge_cutoff_header = false;
  std::string bos_token;
  std::string eos_token;
};

// Recognises the family of a Jinja chat template by its markers (chat_template.cc). Leaves
// bos_token and eos_token empty.
ChatTemplate detect_chat_template(std::string_view source);

}  // namespace detail

// A loaded tokenizer. Immutable after load(): its methods are const, safe to call from any
// number of threads at once, non-blocking, and never throw.
class Tokenizer {
 public:
  // Reads DIR/tokenizer.json (required), and DIR/tokenizer_config.json (add_bos_token,
  // add_eos_token, bos_token, eos_token, chat_template, split_special_tokens),
  // DIR/chat_template.jinja and DIR/generation_config.json (eos_token_id) when present. Fails with
  // kNotFound when tokenizer.json is missing and kInvalidArgument, naming the file and the part,
  // for malformed JSON and for components this tokenizer does not implement (model type "Unigram"
  // or "WordPiece", normalizer "NFKC", ...). Blocks on file I/O.
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& model_dir);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids for `text`. Added tokens (special or not) that appear literally in the text
  // become single tokens, as in Hugging Face. With `add_special_tokens`, BOS (and EOS where
  // configured) are added as tokenizer_config.json's add_bos_token/add_eos_token say, or else
  // as the post_processor says. Invalid UTF-8 in `text` is read as U+FFFD.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;

  // The text of `ids`, through the tokenizer.json decoder; always valid UTF-8. Ids outside the
  // vocabulary are skipped; so are special tokens when `skip_special_tokens`.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  // The bytes `id` adds inside a text: the decoder's steps without turning an incomplete
  // character into U+FFFD and without the start-of-text rules (Strip, Metaspace's first
  // token), so a SentencePiece "▁the" is " the" and a byte token "<0xE2>" the one byte 0xE2.
  // The bytes of consecutive tokens concatenate to their text. Empty for an unknown id.
  std::string token_bytes(int32_t id) const;
  // The token as the vocabulary writes it ("Ġthe", "▁the", "<0xE2>", "<|eot_id|>"); empty for
  // an unknown id.
  std::string token_piece(int32_t id) const;

  // Largest id + 1, added tokens included.
  int32_t vocab_size() const;
  // tokenizer_config.json's bos_token, else the first special token the post_processor adds.
  std::optional<int32_t> bos_id() const;
  // Ids that end a generation, no duplicates: tokenizer_config.json's eos_token, the ids of
  // generation_config.json's eos_token_id, and the chat family's end-of-turn token
  // (<|eot_id|>, <|im_end|>) when the vocabulary has it.
  std::vector<int32_t> eos_ids() const;
  // The id of a vocabulary or added token, by its exact content.
  std::optional<int32_t> token_id(std::string_view token) const;
  // Whether `id` is an added token marked special.
  bool is_special(int32_t id) const;

  ChatTemplateFamily chat_template_family() const { return chat_.family; }

  // The prompt text for `messages` in the detected family (docs/llm_tokenizer.md), ending with
  // the assistant header when `add_generation_prompt` and the family has one. The text holds
  // BOS where the template writes it, so encode it with add_special_tokens = false.
  // kInvalidArgument for a role or an order of roles the family does not support;
  // kUnimplemented when the model's template is of no built-in family.
  Result<std::string> apply_chat_template(std::span<const ChatMessage> messages,
                                          bool add_generation_prompt) const;

 private:
  Tokenizer();

  std::unique_ptr<const detail::TokenizerModel> model_;
  detail::ChatTemplate chat_;
};

// Incremental detokenization of one generated sequence. push() returns the text that `id`
// completes, always valid UTF-8: it holds back bytes of an incomplete character and keeps
// enough context that a SentencePiece leading space is stripped only at the very start.
// finish() returns what is still held back (bytes that never completed become U+FFFD) and
// resets the decoder for a new sequence. The concatenated pieces equal decode() of all the ids
// whenever that holds no U+FFFD; otherwise they may differ in the U+FFFDs.
// Not thread-safe: one per stream. Keeps a reference to `tokenizer`, which must outlive it.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);

  std::string push(int32_t id);
  std::string finish();

 private:
  // The text of window_ beyond prefix_, cut to whole characters.
  std::string text_after_prefix(const std::string& text) const;

  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  // Context tokens (the last emitted piece) followed by pending_ tokens not yet emitted.
  std::vector<int32_t> window_;
  size_t pending_ = 0;
  // Consecutive push() calls whose text ended in U+FFFD.
  size_t held_pushes_ = 0;
  // decode() of the context tokens alone.
  std::string prefix_;
};

}  // namespace flotilla::llm

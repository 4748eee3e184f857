// Built-in renderings of the chat template families (docs/llm_tokenizer.md). Each reproduces,
// character for character, what the family's Jinja template renders in transformers for plain
// user/assistant turns and the system messages the template accepts (Mistral's system message is
// our addition). Tools and multimodal content are out of scope, so no Jinja engine is needed.
#include <array>
#include <span>
#include <string>
#include <string_view>

#include "llm/tokenizer.h"

namespace flotilla::llm {
namespace {

constexpr std::string_view kLlama31SystemHeader =
    "<|start_header_id|>system<|end_header_id|>\n\n"
    "Cutting Knowledge Date: December 2023\n"
    "Today Date: 26 Jul 2024\n\n";

// Jinja's trim filter and Python's str.strip(): Python's whitespace, ASCII and Unicode.
std::string_view trim(std::string_view s) {
  static constexpr std::array<std::string_view, 19> kUnicodeSpaces = {
      "\xC2\x85",     "\xC2\xA0",     "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81",
      "\xE2\x80\x82", "\xE2\x80\x83", "\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86",
      "\xE2\x80\x87", "\xE2\x80\x88", "\xE2\x80\x89", "\xE2\x80\x8A", "\xE2\x80\xA8",
      "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"};
  const auto ascii_space = [](char c) {
    return (c >= '\t' && c <= '\r') || (c >= 0x1C && c <= ' ');
  };
  bool changed = true;
  while (changed && !s.empty()) {
    changed = false;
    if (ascii_space(s.front())) {
      s.remove_prefix(1);
      changed = true;
      continue;
    }
    for (std::string_view space : kUnicodeSpaces) {
      if (s.starts_with(space)) {
        s.remove_prefix(space.size());
        changed = true;
        break;
      }
    }
  }
  changed = true;
  while (changed && !s.empty()) {
    changed = false;
    if (ascii_space(s.back())) {
      s.remove_suffix(1);
      changed = true;
      continue;
    }
    for (std::string_view space : kUnicodeSpaces) {
      if (s.ends_with(space)) {
        s.remove_suffix(space.size());
        changed = true;
        break;
      }
    }
  }
  return s;
}

Status check_roles(std::span<const ChatMessage> messages, std::string_view family) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return invalid_argument("message " + std::to_string(i) + " has role '" + role +
                              "', which the " + std::string(family) +
                              " chat template does not support (system, user, assistant)");
    }
  }
  return Status::ok();
}

// Llama 2 and Mistral take one optional leading system message, then strictly alternating
// user/assistant turns starting with a user turn.
Status check_alternation(std::span<const ChatMessage> messages, size_t first,
                         std::string_view family) {
  for (size_t i = first; i < messages.size(); ++i) {
    const char* expected = (i - first) % 2 == 0 ? "user" : "assistant";
    if (messages[i].role != expected) {
      return invalid_argument(std::string(family) + " chat template: after an optional system " +
                              "message, roles must alternate user/assistant starting with user; " +
                              "message " + std::to_string(i) + " is '" + messages[i].role + "'");
    }
  }
  return Status::ok();
}

// Qwen2's template, and ChatML in general:
//   <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
std::string render_chatml(std::span<const ChatMessage> messages, const std::string& default_system,
                          bool add_generation_prompt) {
  std::string out;
  if (!messages.empty() && messages[0].role != "system" && !default_system.empty()) {
    out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
  }
  for (const ChatMessage& message : messages) {
    out += "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) {
    out += "<|im_start|>assistant\n";
  }
  return out;
}

// Llama 3: BOS, then <|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|> per
// message. Llama 3.1+ always opens with a system block carrying the knowledge cutoff and the
// date (its template's default date, since we render deterministically) and the first system
// message's text.
std::string render_llama3(std::span<const ChatMessage> messages, const detail::ChatTemplate& chat,
                          bool add_generation_prompt) {
  std::string out;
  size_t first = 0;
  if (chat.knowledge_cutoff_header) {
    out += chat.bos_token;
    out += kLlama31SystemHeader;
    if (!messages.empty() && messages[0].role == "system") {
      out += trim(messages[0].content);
      first = 1;
    }
    out += "<|eot_id|>";
  }
  for (size_t i = first; i < messages.size(); ++i) {
    if (i == 0 && !chat.knowledge_cutoff_header) {
      out += chat.bos_token;  // Llama 3.0 writes BOS with the first message only
    }
    out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n";
    out += trim(messages[i].content);
    out += "<|eot_id|>";
  }
  if (add_generation_prompt) {
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  return out;
}

// Llama 2: <s>[INST] {user} [/INST] {assistant} </s><s>[INST] ..., the system message wrapped
// in <<SYS>> at the start of the first user turn. There is no generation prompt: a prompt that
// ends in [/INST] already asks for the reply.
Result<std::string> render_llama2(std::span<const ChatMessage> messages,
                                  const detail::ChatTemplate& chat) {
  const bool has_system = !messages.empty() && messages[0].role == "system";
  const size_t first = has_system ? 1 : 0;
  FLOTILLA_RETURN_IF_ERROR(check_alternation(messages, first, "llama2"));
  std::string out;
  for (size_t i = first; i < messages.size(); ++i) {
    std::string content = messages[i].content;
    if (i == first && has_system) {
      content = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n" + content;
    }
    // Appended piece by piece: `" " + std::string(...)` trips GCC 12's -Wrestrict.
    if (messages[i].role == "user") {
      out += chat.bos_token;
      out += "[INST] ";
      out += trim(content);
      out += " [/INST]";
    } else {
      out += ' ';
      out += trim(content);
      out += ' ';
      out += chat.eos_token;
    }
  }
  return out;
}

// Mistral (v0.1/v0.2 template): <s>[INST] {user} [/INST]{assistant}</s>[INST] ... Its template
// has no system role; a leading system message is put before the first user message, separated
// by a blank line, which is how Mistral's later templates fold it in.
Result<std::string> render_mistral(std::span<const ChatMessage> messages,
                                   const detail::ChatTemplate& chat) {
  const bool has_system = !messages.empty() && messages[0].role == "system";
  const size_t first = has_system ? 1 : 0;
  FLOTILLA_RETURN_IF_ERROR(check_alternation(messages, first, "mistral"));
  std::string out = chat.bos_token;
  for (size_t i = first; i < messages.size(); ++i) {
    if (messages[i].role == "user") {
      out += "[INST] ";
      if (i == first && has_system) {
        out += messages[0].content + "\n\n";
      }
      out += messages[i].content + " [/INST]";
    } else {
      out += messages[i].content + chat.eos_token;
    }
  }
  return out;
}

// The literal system prompt a ChatML template inserts when the chat has none, as in Qwen2's
// '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n': text between
// "<|im_start|>system\n" (newline escaped or not) and "<|im_end|>" that holds no Jinja.
std::string find_default_system(std::string_view source) {
  constexpr std::string_view kOpen = "<|im_start|>system";
  constexpr std::string_view kClose = "<|im_end|>";
  for (size_t at = source.find(kOpen); at != std::string_view::npos;
       at = source.find(kOpen, at + 1)) {
    std::string_view rest = source.substr(at + kOpen.size());
    if (rest.starts_with("\\n")) {
      rest.remove_prefix(2);
    } else if (rest.starts_with("\n")) {
      rest.remove_prefix(1);
    } else {
      continue;
    }
    const size_t close = rest.find(kClose);
    if (close == std::string_view::npos || close == 0) {
      continue;
    }
    const std::string_view text = rest.substr(0, close);
    if (text.find_first_of("'\"{}+\\") == std::string_view::npos) {
      return std::string(text);
    }
  }
  return {};
}

}  // namespace

namespace detail {

ChatTemplate detect_chat_template(std::string_view source) {
  ChatTemplate chat;
  if (source.find("<|im_start|>") != std::string_view::npos) {
    chat.family = ChatTemplateFamily::kChatMl;
    chat.default_system = find_default_system(source);
  } else if (source.find("<|start_header_id|>") != std::string_view::npos) {
    chat.family = ChatTemplateFamily::kLlama3;
    chat.knowledge_cutoff_header = source.find("Cutting Knowledge Date") != std::string_view::npos;
  } else if (source.find("[INST]") != std::string_view::npos) {
    chat.family = source.find("<<SYS>>") != std::string_view::npos ? ChatTemplateFamily::kLlama2
                                                                   : ChatTemplateFamily::kMistral;
  } else {
    chat.family = ChatTemplateFamily::kUnrecognized;
  }
  return chat;
}

}  // namespace detail

Result<std::string> Tokenizer::apply_chat_template(std::span<const ChatMessage> messages,
                                                   bool add_generation_prompt) const {
  switch (chat_.family) {
    case ChatTemplateFamily::kNone:
      FLOTILLA_RETURN_IF_ERROR(check_roles(messages, "default (chatml)"));
      return render_chatml(messages, "", add_generation_prompt);
    case ChatTemplateFamily::kChatMl:
      FLOTILLA_RETURN_IF_ERROR(check_roles(messages, "chatml"));
      return render_chatml(messages, chat_.default_system, add_generation_prompt);
    case ChatTemplateFamily::kLlama3:
      FLOTILLA_RETURN_IF_ERROR(check_roles(messages, "llama3"));
      return render_llama3(messages, chat_, add_generation_prompt);
    case ChatTemplateFamily::kLlama2:
      return render_llama2(messages, chat_);
    case ChatTemplateFamily::kMistral:
      return render_mistral(messages, chat_);
    case ChatTemplateFamily::kUnrecognized:
      break;
  }
  return Status(StatusCode::kUnimplemented,
                "the model's chat template is of no built-in family (chatml, llama3, llama2, "
                "mistral); see docs/llm_tokenizer.md");
}

}  // namespace flotilla::llm

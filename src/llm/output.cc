#include "llm/output.h"

#include <algorithm>

#include "llm/tokenizer.h"

namespace flotilla::llm {
namespace {

// Moves `cut` back to the first byte of the UTF-8 character it falls in, so that cutting there
// splits no character.
size_t utf8_safe_cut(const std::string& text, size_t cut) {
  while (cut > 0 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  return cut;
}

}  // namespace

RequestOutput::RequestOutput(uint64_t id, const Tokenizer* tokenizer, bool skip_special_tokens,
                             std::vector<std::string> stop, EventCallback on_event,
                             int prompt_tokens, std::chrono::steady_clock::time_point submitted)
    : id_(id),
      stop_(std::move(stop)),
      on_event_(std::move(on_event)),
      prompt_tokens_(prompt_tokens),
      submitted_(submitted) {
  if (tokenizer != nullptr) {
    decoder_ = std::make_unique<StreamDecoder>(*tokenizer, skip_special_tokens);
  }
  for (const std::string& s : stop_) {
    longest_stop_ = std::max(longest_stop_, s.size());
  }
}

RequestOutput::~RequestOutput() = default;

std::string RequestOutput::release_text(bool final) {
  if (final || longest_stop_ == 0) {
    return std::exchange(pending_, std::string());
  }
  // A stop string may begin in the last longest_stop_ - 1 bytes and end in later text.
  size_t keep = std::min(pending_.size(), longest_stop_ - 1);
  size_t cut = utf8_safe_cut(pending_, pending_.size() - keep);
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return out;
}

bool RequestOutput::on_token(int32_t token, const TokenLogprob* logprob, FinishReason finish) {
  if (done_) {
    return false;
  }
  ++completion_tokens_;
  if (completion_tokens_ == 1) {
    first_token_ = std::chrono::steady_clock::now();
    time_to_first_token_s_ = std::chrono::duration<double>(first_token_ - submitted_).count();
  }
  GenerationEvent event;
  event.tokens.push_back(token);
  if (logprob != nullptr) {
    event.logprobs.push_back(*logprob);
  }
  bool stopped_by_string = false;
  if (decoder_) {
    pending_ += decoder_->push(token);
    if (finish != FinishReason::kNone) {
      pending_ += decoder_->finish();
    }
    for (const std::string& stop : stop_) {
      size_t at = pending_.find(stop);
      if (at != std::string::npos) {
        pending_.resize(at);  // the stop string itself is not returned, as in the OpenAI API
        stopped_by_string = true;
      }
    }
  }
  if (stopped_by_string) {
    finish = FinishReason::kStop;
  }
  event.text = release_text(finish != FinishReason::kNone);
  event.finish = finish;
  deliver(std::move(event));
  return stopped_by_string;
}

void RequestOutput::on_end(FinishReason finish, const std::string& error) {
  if (done_) {
    return;
  }
  GenerationEvent event;
  if (decoder_ && finish != FinishReason::kError) {
    pending_ += decoder_->finish();
    event.text = release_text(true);
  }
  event.finish = finish;
  event.error = error;
  deliver(std::move(event));
}

void RequestOutput::deliver(GenerationEvent&& event) {
  done_ = event.finish != FinishReason::kNone;
  event.prompt_tokens = prompt_tokens_;
  event.completion_tokens = completion_tokens_;
  event.time_to_first_token_s = time_to_first_token_s_;
  if (done_) {
    event.submitted = submitted_;
    event.scheduled = std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(scheduled_ns_.load(std::memory_order_relaxed)));
    event.first_token = first_token_;
  }
  on_event_(std::move(event));
}

}  // namespace flotilla::llm

// The output side of a request: detokenization, stop strings and the caller's callback. It runs
// on the engine's output thread (or inline on the engine thread with overlap off), never on the
// thread that runs the forward pass.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "llm/llm.h"

namespace flotilla::llm {

class StreamDecoder;

class RequestOutput {
 public:
  RequestOutput(uint64_t id, const Tokenizer* tokenizer, bool skip_special_tokens,
                std::vector<std::string> stop, EventCallback on_event, int prompt_tokens,
                std::chrono::steady_clock::time_point submitted);
  ~RequestOutput();

  // One generated token (with its logprob when asked), and the engine's finish reason for it
  // (kNone while it goes on). Returns true when a stop string ended the request here: the
  // engine must then stop generating for it. Nothing is delivered after the final event.
  bool on_token(int32_t token, const TokenLogprob* logprob, FinishReason finish);
  // The request ended without a new token (cancelled, or failed with `error`).
  void on_end(FinishReason finish, const std::string& error = "");

  uint64_t id() const { return id_; }
  // The engine's thread, at each step that computes the request: the first call is kept.
  void mark_scheduled(std::chrono::steady_clock::time_point now) {
    if (scheduled_ns_.load(std::memory_order_relaxed) == 0) {  // only this thread writes it
      scheduled_ns_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
    }
  }

 private:
  // Text that may still turn out to start a stop string is held back; returns what is safe.
  std::string release_text(bool final);
  void deliver(GenerationEvent&& event);

  uint64_t id_;
  std::unique_ptr<StreamDecoder> decoder_;
  std::vector<std::string> stop_;
  size_t longest_stop_ = 0;
  EventCallback on_event_;
  int prompt_tokens_;
  int completion_tokens_ = 0;
  std::chrono::steady_clock::time_point submitted_;
  double time_to_first_token_s_ = 0;
  std::chrono::steady_clock::time_point first_token_{};
  // Written by the engine's thread, read by the output thread: atomic.
  std::atomic<int64_t> scheduled_ns_{0};
  std::string pending_;  // decoded text not yet delivered
  bool done_ = false;
};

}  // namespace flotilla::llm

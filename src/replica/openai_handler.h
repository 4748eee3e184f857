// The OpenAI routes of a replica serving a language model: /v1/completions and
// /v1/chat/completions (whole or streamed as Server-Sent Events), /v1/models and
// /v1/models/{id}, plus the runtime's gauges in /metrics.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "common/common.h"
#include "http/http.h"
#include "replica/request_trace.h"
#include "runtime/runtime.h"

namespace flotilla::replica {

// A response with a JSON body (http::Response's default content type); the replica's routes
// and the OpenAI handler answer with it.
inline http::Response json_response(int status, std::string body) {
  http::Response response;
  response.status = status;
  response.body = std::move(body);
  return response;
}

class OpenAiHandler {
 public:
  // `generator` and `registry` must outlive the handler (and every request it started).
  OpenAiHandler(runtime::Generator& generator, std::string model_name, MetricsRegistry& registry);

  // Answers one completion request; `done(status)` runs once when the answer has been handed to
  // the socket (for a stream, after its last event), on any thread. A sampled request's
  // `traced` gets the engine's spans (queue, prefill, decode) and the token counts.
  void completions(http::Request&& request, std::shared_ptr<http::Responder> responder, bool chat,
                   std::shared_ptr<RequestTrace> traced, std::function<void(int status)> done);
  std::string models_json() const;
  // GET /v1/models/{id} of the served model.
  std::string model_json() const;

 private:
  runtime::Generator& generator_;
  const std::string model_name_;
  const int64_t created_;
  Histogram& time_to_first_token_;
  Histogram& inter_token_latency_;
};

}  // namespace flotilla::replica

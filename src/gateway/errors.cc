// The gateway's own error answers in the protocol of their route, and which failed attempts
// are sent again. The bodies are protocol's writers (shared with the replica and the API);
// docs/gateway.md ("Errors", "How a request flows") lists the mappings.
#include "gateway/gateway.h"
#include "protocol/protocol.h"

namespace flotilla::gateway {

ErrorShape error_shape_for(std::string_view target) {
  switch (protocol::parse_path(target).kind) {
    case protocol::PathKind::kOpenAi:
      return ErrorShape::kOpenAi;
    case protocol::PathKind::kServingEndpoint:
      return ErrorShape::kMlflow;
    default:
      return ErrorShape::kPlain;
  }
}

std::string error_body(ErrorShape shape, int status, std::string_view message,
                       std::string_view param) {
  // The gateway's answers carry U+FFFD itself for invalid bytes (a path as sent), as they
  // always have; the writers would escape it as \ufffd.
  const std::string text = protocol::valid_utf8(message);
  switch (shape) {
    case ErrorShape::kOpenAi:
      return protocol::encode_openai_error(status, text, param, protocol::OpenAiErrorCode::kOpenAi);
    case ErrorShape::kMlflow:
      return protocol::encode_mlflow_error(protocol::mlflow_error_code(status), text);
    case ErrorShape::kPlain:
      break;
  }
  return protocol::encode_oip_error(text);
}

bool should_retry(const FailedAttempt& attempt) {
  const bool nothing_passed_on = attempt.failure == http::UpstreamFailure::kConnect ||
                                 attempt.failure == http::UpstreamFailure::kClosedBeforeResponse ||
                                 attempt.failure == http::UpstreamFailure::kClosedDuringResponse;
  return nothing_passed_on && attempt.request_kept && !attempt.client_gone &&
         attempt.attempts < kMaxAttempts;
}

}  // namespace flotilla::gateway

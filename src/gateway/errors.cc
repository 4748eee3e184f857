// The gateway's own error answers in the protocol of their route, and which failed attempts
// are sent again. docs/gateway.md ("Errors", "How a request flows") lists the mappings.
#include <nlohmann/json.hpp>

#include "gateway/gateway.h"

namespace flotilla::gateway {
namespace {

// OpenAI's error types, as the openai-python client reads them (`APIError.type`), with the
// names vLLM and our replicas use for the statuses OpenAI has no type of its own for.
std::string_view openai_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "unavailable_error";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

// OpenAI's machine-readable codes where it has one for the case; null otherwise. A 404 about
// the request's "model" is OpenAI's model_not_found; one for an unknown path has no code.
nlohmann::json openai_code(int status, std::string_view param) {
  switch (status) {
    case 401:
      return "invalid_api_key";
    case 404:
      return param == "model" ? nlohmann::json("model_not_found") : nlohmann::json(nullptr);
    case 405:
      return "method_not_supported";
    case 429:
      return "rate_limit_exceeded";
    default:
      return nullptr;
  }
}

// MLflow's ErrorCode names (databricks.proto) for each status, as its scoring server and
// Databricks Model Serving answer them.
std::string_view mlflow_code(int status) {
  switch (status) {
    case 400:
    case 405:
      return "BAD_REQUEST";
    case 401:
      return "UNAUTHENTICATED";
    case 403:
      return "PERMISSION_DENIED";
    case 404:
      return "RESOURCE_DOES_NOT_EXIST";
    case 413:
      return "INVALID_PARAMETER_VALUE";
    case 429:
      return "REQUEST_LIMIT_EXCEEDED";
    case 503:
      return "TEMPORARILY_UNAVAILABLE";
    case 504:
      return "DEADLINE_EXCEEDED";
    default:
      return status >= 500 ? "INTERNAL_ERROR" : "BAD_REQUEST";
  }
}

}  // namespace

ErrorShape error_shape_for(std::string_view target) {
  if (target.starts_with("/v1/") || target == "/v1" || target.starts_with("/v1?")) {
    return ErrorShape::kOpenAi;
  }
  if (target.starts_with("/serving-endpoints/")) {
    return ErrorShape::kMlflow;
  }
  return ErrorShape::kPlain;
}

std::string error_body(ErrorShape shape, int status, std::string_view message,
                       std::string_view param) {
  nlohmann::json body;
  switch (shape) {
    case ErrorShape::kOpenAi:
      body = {{"error",
               {{"message", message},
                {"type", openai_type(status)},
                {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
                {"code", openai_code(status, param)}}}};
      break;
    case ErrorShape::kMlflow:
      body = {{"error_code", mlflow_code(status)}, {"message", message}};
      break;
    case ErrorShape::kPlain:
      body = {{"error", message}};
      break;
  }
  // Messages quote client bytes (a path, a model name): never throw on invalid UTF-8.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool should_retry(const FailedAttempt& attempt) {
  const bool nothing_passed_on = attempt.failure == http::UpstreamFailure::kConnect ||
                                 attempt.failure == http::UpstreamFailure::kClosedBeforeResponse ||
                                 attempt.failure == http::UpstreamFailure::kClosedDuringResponse;
  return nothing_passed_on && attempt.request_kept && !attempt.client_gone &&
         attempt.attempts < kMaxAttempts;
}

}  // namespace flotilla::gateway

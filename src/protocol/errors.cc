// The error bodies of each protocol, one writer per shape, for the replica, the gateway and the
// control plane's API. Messages quote client bytes (a path, a model name): append_json_string
// keeps every body valid JSON whatever they hold.
#include "protocol/json_util.h"
#include "protocol/protocol.h"

namespace flotilla::protocol {
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

// OpenAI's machine-readable codes where it has one for the case; "" (null) otherwise. A 404
// about the request's "model" is OpenAI's model_not_found; one for an unknown path has no code.
std::string_view openai_code(int status, std::string_view param) {
  switch (status) {
    case 401:
      return "invalid_api_key";
    case 404:
      return param == "model" ? "model_not_found" : "";
    case 405:
      return "method_not_supported";
    case 429:
      return "rate_limit_exceeded";
    default:
      return "";
  }
}

}  // namespace

std::string encode_oip_error(std::string_view message) {
  std::string out = "{\"error\":";
  append_json_string(message, out);
  out += '}';
  return out;
}

std::string encode_mlflow_error(std::string_view error_code, std::string_view message) {
  std::string out = "{\"error_code\":";
  append_json_string(error_code, out);
  out += ",\"message\":";
  append_json_string(message, out);
  out += '}';
  return out;
}

std::string encode_mlflow_error(StatusCode code, std::string_view message) {
  std::string_view error_code = "INTERNAL_ERROR";
  switch (code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
      error_code = "BAD_REQUEST";
      break;
    case StatusCode::kUnimplemented:
      error_code = "NOT_IMPLEMENTED";  // MLflow's ErrorCode for 501
      break;
    case StatusCode::kNotFound:
      error_code = "RESOURCE_DOES_NOT_EXIST";
      break;
    case StatusCode::kResourceExhausted:
      error_code = "RESOURCE_EXHAUSTED";
      break;
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
      error_code = "TEMPORARILY_UNAVAILABLE";
      break;
    default:
      break;
  }
  return encode_mlflow_error(error_code, message);
}

std::string_view mlflow_error_code(int http_status) {
  switch (http_status) {
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
      return http_status >= 500 ? "INTERNAL_ERROR" : "BAD_REQUEST";
  }
}

std::string encode_openai_error(int status, std::string_view message, std::string_view param,
                                OpenAiErrorCode code) {
  std::string out = "{\"error\":{\"message\":";
  append_json_string(message, out);
  out += ",\"type\":\"";
  out += openai_type(status);
  out += "\",\"param\":";
  if (param.empty()) {
    out += "null";
  } else {
    append_json_string(param, out);
  }
  out += ",\"code\":";
  if (code == OpenAiErrorCode::kStatus) {
    detail::append_int(status, out);
  } else if (const std::string_view name = openai_code(status, param); !name.empty()) {
    append_json_string(name, out);
  } else {
    out += "null";
  }
  out += "}}";
  return out;
}

std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t length = detail::utf8_sequence_length(text.substr(i));
    if (length == 0) {
      out += "\xef\xbf\xbd";  // U+FFFD for the byte that starts no valid sequence
      ++i;
    } else {
      out.append(text.substr(i, length));
      i += length;
    }
  }
  return out;
}

}  // namespace flotilla::protocol

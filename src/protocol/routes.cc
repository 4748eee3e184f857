// The route grammar of the inference APIs, parsed once for the gateway and the replica. A
// prefix compare or two and a find('/'): this runs for every proxied request.
#include "protocol/protocol.h"

namespace flotilla::protocol {
namespace {

constexpr std::string_view kOipModelsPrefix = "/v2/models/";
constexpr std::string_view kVersionsInfix = "/versions/";
constexpr std::string_view kServingEndpointsPrefix = "/serving-endpoints/";
constexpr std::string_view kOpenAiPrefix = "/v1";
constexpr std::string_view kOpenAiModelsInfix = "/models/";

// Splits "{segment}{rest}" at the first '/': the segment, and the rest from that '/' on ("" when
// there is none).
std::string_view take_segment(std::string_view& rest) {
  const size_t slash = rest.find('/');
  const std::string_view segment = rest.substr(0, slash);
  rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  return segment;
}

}  // namespace

ParsedPath parse_path(std::string_view target) {
  ParsedPath parsed;
  const size_t question = target.find('?');
  if (question != std::string_view::npos) {
    parsed.query = target.substr(question);
    target = target.substr(0, question);
  }
  parsed.path = target;
  if (target.starts_with(kOipModelsPrefix)) {
    parsed.kind = PathKind::kOipModel;
    std::string_view rest = target.substr(kOipModelsPrefix.size());
    parsed.name = take_segment(rest);
    if (rest.starts_with(kVersionsInfix)) {
      rest.remove_prefix(kVersionsInfix.size());
      parsed.version = take_segment(rest);
      parsed.malformed = parsed.version.empty();
    }
    parsed.malformed = parsed.malformed || parsed.name.empty();
    parsed.rest = rest;
  } else if (target.starts_with(kServingEndpointsPrefix)) {
    parsed.kind = PathKind::kServingEndpoint;
    std::string_view rest = target.substr(kServingEndpointsPrefix.size());
    parsed.name = take_segment(rest);
    parsed.malformed = parsed.name.empty();
    parsed.rest = rest;
  } else if (target.starts_with(kOpenAiPrefix) &&
             (target.size() == kOpenAiPrefix.size() || target[kOpenAiPrefix.size()] == '/')) {
    parsed.kind = PathKind::kOpenAi;
    parsed.rest = target.substr(kOpenAiPrefix.size());
    if (parsed.rest.starts_with(kOpenAiModelsInfix)) {
      // OpenAI's model ids may hold slashes ("org/model"): the id is the rest of the path.
      parsed.name = parsed.rest.substr(kOpenAiModelsInfix.size());
      parsed.malformed = parsed.name.empty();
    }
  }
  return parsed;
}

}  // namespace flotilla::protocol

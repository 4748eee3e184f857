// Trace context, ids, options from the environment and the OTLP/JSON encoding (trace.h).
#include "trace/trace.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <random>

#include "http/http.h"
#include "protocol/protocol.h"
#include "protocol/protocol_json_cursor.h"

namespace flotilla::trace {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') {
    return c - '0';
  }
  if (c >= 'a' && c <= 'f') {
    return c - 'a' + 10;
  }
  return -1;  // upper case is invalid in a traceparent
}

// `text`: at most 16 lower-case hex digits (false for anything else).
bool parse_hex(std::string_view text, uint64_t* out) {
  uint64_t value = 0;
  for (char c : text) {
    const int digit = hex_value(c);
    if (digit < 0) {
      return false;
    }
    value = (value << 4) | static_cast<uint64_t>(digit);
  }
  *out = value;
  return true;
}

using protocol::JsonCursor;

std::string percent_decode(std::string_view text) {
  const auto digit = [](char c) {
    return hex_value(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  };
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && digit(text[i + 1]) >= 0 &&
        digit(text[i + 2]) >= 0) {
      out.push_back(static_cast<char>(digit(text[i + 1]) * 16 + digit(text[i + 2])));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) {
    text.remove_prefix(1);
  }
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) {
    text.remove_suffix(1);
  }
  return text;
}

// "k=v,k2=v2" (W3C Baggage-like, as OpenTelemetry's *_HEADERS and RESOURCE_ATTRIBUTES are).
Result<std::vector<std::pair<std::string, std::string>>> parse_pairs(std::string_view text,
                                                                     const char* variable) {
  std::vector<std::pair<std::string, std::string>> pairs;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string_view item = trim(text.substr(start, end - start));
    start = end + 1;
    if (item.empty()) {
      continue;
    }
    const size_t equals = item.find('=');
    if (equals == std::string_view::npos || trim(item.substr(0, equals)).empty()) {
      return invalid_argument(std::string(variable) + ": '" + std::string(item) +
                              "' is not key=value");
    }
    pairs.emplace_back(percent_decode(trim(item.substr(0, equals))),
                       percent_decode(trim(item.substr(equals + 1))));
  }
  return pairs;
}

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    return std::nullopt;
  }
  return std::string(value);
}

Result<int64_t> env_positive_ms(const char* name, int64_t fallback) {
  const std::optional<std::string> text = env(name);
  if (!text) {
    return fallback;
  }
  char* end = nullptr;
  const long long value = std::strtoll(text->c_str(), &end, 10);
  if (end == text->c_str() || *end != '\0' || value <= 0) {
    return invalid_argument(std::string(name) + ": '" + *text + "' is not a positive integer");
  }
  return static_cast<int64_t>(value);
}

// Room for an attribute but its key and text: the punctuation, the type's name and a number.
constexpr size_t kAttributeBytes = 96;
// Room for a span but its strings and attributes: ids, times, kind, flags and the keys.
constexpr size_t kSpanBytes = 512;

size_t attribute_bound(std::string_view key, std::string_view text) {
  return kAttributeBytes + protocol::json_string_bound(key.size()) +
         protocol::json_string_bound(text.size());
}

// One OTLP KeyValue: {"key":...,"value":{"<type>Value":...}}.
void write_attribute(const Attribute& attribute, JsonCursor& out) {
  out.literal("{\"key\":");
  out.string(attribute.key);
  switch (attribute.type) {
    case Attribute::Type::kString:
      out.literal(",\"value\":{\"stringValue\":");
      out.string(attribute.text);
      break;
    case Attribute::Type::kInt:  // int64 is a string in protobuf-JSON
      out.literal(",\"value\":{\"intValue\":\"");
      out.integer(attribute.integer);
      out.literal("\"");
      break;
    case Attribute::Type::kDouble: {
      if (!std::isfinite(attribute.number)) {
        out.literal(",\"value\":{\"stringValue\":");
        out.string(std::isnan(attribute.number) ? "nan" : attribute.number > 0 ? "inf" : "-inf");
        break;
      }
      char digits[32];
      const auto written = std::to_chars(digits, digits + sizeof(digits), attribute.number);
      out.literal(",\"value\":{\"doubleValue\":");
      out.raw(std::string_view(digits, static_cast<size_t>(written.ptr - digits)));
      break;
    }
    case Attribute::Type::kBool:
      out.literal(",\"value\":{\"boolValue\":");
      out.boolean(attribute.integer != 0);
      break;
  }
  out.literal("}}");
}

// A resource attribute: a string KeyValue from the options.
void write_string_attribute(std::string_view key, std::string_view value, JsonCursor& out) {
  out.literal("{\"key\":");
  out.string(key);
  out.literal(",\"value\":{\"stringValue\":");
  out.string(value);
  out.literal("}}");
}

}  // namespace

std::string SpanContext::trace_id_hex() const {
  char text[32];
  JsonCursor out(text);
  out.hex(trace_hi, 16);
  out.hex(trace_lo, 16);
  return std::string(text, sizeof(text));
}

std::optional<SpanContext> parse_traceparent(std::string_view header) {
  header = trim(header);
  if (header.size() < 55 || header[2] != '-' || header[35] != '-' || header[52] != '-') {
    return std::nullopt;
  }
  uint64_t version = 0;
  if (!parse_hex(header.substr(0, 2), &version) || version == 0xff ||
      (version == 0 && header.size() != 55) ||
      (version != 0 && header.size() > 55 && header[55] != '-')) {
    return std::nullopt;
  }
  SpanContext context;
  uint64_t flags = 0;
  if (!parse_hex(header.substr(3, 16), &context.trace_hi) ||
      !parse_hex(header.substr(19, 16), &context.trace_lo) ||
      !parse_hex(header.substr(36, 16), &context.span_id) ||
      !parse_hex(header.substr(53, 2), &flags)) {
    return std::nullopt;
  }
  if ((context.trace_hi == 0 && context.trace_lo == 0) || context.span_id == 0) {
    return std::nullopt;
  }
  context.flags = static_cast<uint8_t>(flags);
  return context;
}

std::string format_traceparent(const SpanContext& context) {
  char text[55];
  JsonCursor out(text);
  out.literal("00-");
  out.hex(context.trace_hi, 16);
  out.hex(context.trace_lo, 16);
  out.literal("-");
  out.hex(context.span_id, 16);
  out.literal("-");
  out.hex(context.flags & 1, 2);  // only the sampled flag is defined
  return std::string(text, out.end());
}

uint64_t random_id() {
  // SplitMix64 seeded per thread from the system's entropy: ids need to be unique, not secret.
  thread_local SeededRandom random(std::random_device{}() ^
                                   (static_cast<uint64_t>(std::random_device{}()) << 32));
  uint64_t id = 0;
  while (id == 0) {
    id = random.next();
  }
  return id;
}

Span child_span(const SpanContext& parent, std::string name, SpanKind kind,
                SteadyClock::time_point start) {
  Span span;
  span.context = parent;
  span.context.span_id = random_id();
  span.parent_span_id = parent.span_id;
  span.name = std::move(name);
  span.kind = kind;
  span.start = start;
  span.end = start;
  return span;
}

Result<std::optional<TracerOptions>> tracer_options_from_env(const std::string& default_service,
                                                             const std::string& endpoint_flag,
                                                             double ratio_flag) {
  TracerOptions options;
  const char* endpoint_source = "--otlp-endpoint";
  if (!endpoint_flag.empty()) {
    options.endpoint = endpoint_flag;
  } else if (std::optional<std::string> traces = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) {
    options.endpoint = *traces;
    endpoint_source = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
  } else if (std::optional<std::string> base = env("OTEL_EXPORTER_OTLP_ENDPOINT")) {
    options.endpoint = *base;
    while (!options.endpoint.empty() && options.endpoint.back() == '/') {
      options.endpoint.pop_back();
    }
    options.endpoint += "/v1/traces";
    endpoint_source = "OTEL_EXPORTER_OTLP_ENDPOINT";
  } else {
    return std::optional<TracerOptions>();
  }
  if (Result<http::Url> url = http::parse_url(options.endpoint); !url.is_ok()) {
    return url.status().with_context(endpoint_source);
  }
  for (const char* variable : {"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"}) {
    if (std::optional<std::string> text = env(variable)) {
      FLOTILLA_ASSIGN_OR_RETURN(auto pairs, parse_pairs(*text, variable));
      for (auto& pair : pairs) {  // the traces-specific variable's value wins
        std::erase_if(options.headers,
                      [&](const auto& h) { return equals_ignore_case(h.first, pair.first); });
        options.headers.push_back(std::move(pair));
      }
    }
  }
  const bool ratio_given = ratio_flag >= 0;
  if (ratio_given) {
    options.sample_ratio = ratio_flag;
  } else if (std::optional<std::string> text = env("OTEL_TRACES_SAMPLER_ARG")) {
    char* end = nullptr;
    options.sample_ratio = std::strtod(text->c_str(), &end);
    if (end == text->c_str() || *end != '\0') {
      return invalid_argument("OTEL_TRACES_SAMPLER_ARG: '" + *text + "' is not a number");
    }
  }
  if (!(options.sample_ratio >= 0 && options.sample_ratio <= 1)) {
    return invalid_argument(
        std::string(ratio_given ? "--trace-sample-ratio" : "OTEL_TRACES_SAMPLER_ARG") +
        ": the sampling ratio must be in [0, 1]");
  }
  options.service_name = env("OTEL_SERVICE_NAME").value_or(default_service);
  if (std::optional<std::string> text = env("OTEL_RESOURCE_ATTRIBUTES")) {
    FLOTILLA_ASSIGN_OR_RETURN(options.resource_attributes,
                              parse_pairs(*text, "OTEL_RESOURCE_ATTRIBUTES"));
    std::erase_if(options.resource_attributes,
                  [](const auto& pair) { return pair.first == "service.name"; });
  }
  FLOTILLA_ASSIGN_OR_RETURN(int64_t delay, env_positive_ms("OTEL_BSP_SCHEDULE_DELAY", 5000));
  FLOTILLA_ASSIGN_OR_RETURN(int64_t queue, env_positive_ms("OTEL_BSP_MAX_QUEUE_SIZE", 2048));
  FLOTILLA_ASSIGN_OR_RETURN(int64_t batch, env_positive_ms("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512));
  FLOTILLA_ASSIGN_OR_RETURN(int64_t timeout, env_positive_ms("OTEL_BSP_EXPORT_TIMEOUT", 10000));
  options.schedule_delay = std::chrono::milliseconds(delay);
  options.max_queue_spans = static_cast<size_t>(queue);
  options.max_batch_spans = static_cast<size_t>(std::min(batch, queue));
  options.export_timeout = std::chrono::milliseconds(timeout);
  return std::optional<TracerOptions>(std::move(options));
}

std::string encode_otlp_json(const std::vector<Span>& spans, const TracerOptions& options,
                             std::chrono::nanoseconds unix_offset) {
  // Written by hand through a cursor: nlohmann::json's tree cost several microseconds a span,
  // and std::string appends half of what is left, on a core that serves requests.
  size_t bound = 512 + attribute_bound("service.name", options.service_name);
  for (const auto& [key, value] : options.resource_attributes) {
    bound += attribute_bound(key, value);
  }
  for (const Span& span : spans) {
    bound += kSpanBytes + protocol::json_string_bound(span.name.size()) +
             protocol::json_string_bound(span.status_message.size());
    for (const Attribute& attribute : span.attributes) {
      bound += attribute_bound(attribute.key, attribute.text);
    }
  }
  protocol::ByteBuffer buffer;
  JsonCursor out(buffer.room(bound));
  const auto unix_nanos = [&](SteadyClock::time_point at) {
    out.literal("\"");
    out.integer(
        (std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()) + unix_offset)
            .count());
    out.literal("\"");
  };
  out.literal("{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
  write_string_attribute("service.name", options.service_name, out);
  for (const auto& [key, value] : options.resource_attributes) {
    out.literal(",");
    write_string_attribute(key, value, out);
  }
  out.literal("]},\"scopeSpans\":[{\"scope\":{\"name\":\"flotilla\",\"version\":\"" FLOTILLA_VERSION
              "\"},\"spans\":[");
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& span = spans[i];
    if (i > 0) {
      out.literal(",");
    }
    out.literal("{\"traceId\":\"");
    out.hex(span.context.trace_hi, 16);
    out.hex(span.context.trace_lo, 16);
    out.literal("\",\"spanId\":\"");
    out.hex(span.context.span_id, 16);
    if (span.parent_span_id != 0) {
      out.literal("\",\"parentSpanId\":\"");
      out.hex(span.parent_span_id, 16);
    }
    out.literal("\",\"flags\":");
    out.integer(span.context.sampled() ? 1 : 0);
    out.literal(",\"name\":");
    out.string(span.name);
    out.literal(",\"kind\":");
    out.integer(static_cast<int>(span.kind));
    out.literal(",\"startTimeUnixNano\":");
    unix_nanos(span.start);
    out.literal(",\"endTimeUnixNano\":");
    unix_nanos(std::max(span.start, span.end));
    out.literal(",\"attributes\":[");
    for (size_t a = 0; a < span.attributes.size(); ++a) {
      if (a > 0) {
        out.literal(",");
      }
      write_attribute(span.attributes[a], out);
    }
    out.literal("]");
    if (span.error) {
      out.literal(",\"status\":{\"code\":2,\"message\":");  // STATUS_CODE_ERROR
      out.string(span.status_message);
      out.literal("}");
    }
    out.literal("}");
  }
  out.literal("]}]}]}");
  buffer.commit(out.end());
  return std::string(buffer.view());
}

}  // namespace flotilla::trace

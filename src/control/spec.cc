#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <memory>
#include <set>
#include <system_error>
#include <utility>

#include <yaml-cpp/yaml.h>

#include "common/common_sha256.h"
#include "control/control_spec.h"
#include "store/store.h"

namespace flotilla::control {
namespace {

constexpr size_t kMaxNameLength = 64;
constexpr int64_t kMaxPerReplicaConcurrency = 4096;
constexpr double kMaxCpus = 1024;
// Bounds that keep replica arithmetic far from overflow (1M concurrent requests, 1 PiB).
constexpr int64_t kMaxConcurrency = 1'000'000;
constexpr int64_t kMaxMemoryMb = int64_t{1} << 30;
constexpr int64_t kFullTraffic = 100;
constexpr ConcurrencyRange kDefaultPerReplicaBounds{1, 64};
constexpr std::array<std::string_view, 5> kRuntimes = {"auto", "xgboost", "llm", "synthetic",
                                                       "external"};
constexpr size_t kKeyHexDigits = 16;

// yaml-cpp tags a plain (unquoted) scalar "?" and a quoted one "!". Numbers and booleans must be
// plain or explicitly tagged, so `traffic: "50"` (or JSON "50") is refused as a string.
constexpr std::string_view kPlainTag = "?";
constexpr std::string_view kIntTag = "tag:yaml.org,2002:int";
constexpr std::string_view kFloatTag = "tag:yaml.org,2002:float";
constexpr std::string_view kBoolTag = "tag:yaml.org,2002:bool";

std::string index_where(const std::string& where, size_t i) {
  return where + "[" + std::to_string(i) + "]";
}

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.';
}

Status check_name(const std::string& name, const std::string& where) {
  if (name.empty() || name.size() > kMaxNameLength) {
    return invalid_argument(where + ": must be 1 to 64 characters");
  }
  for (char c : name) {
    if (!is_name_char(c)) {
      return invalid_argument(where + ": '" + name +
                              "' may hold only letters, digits, '-', '_' and '.'");
    }
  }
  const char first = name.front();
  if (first == '-' || first == '_' || first == '.') {
    return invalid_argument(where + ": '" + name + "' must start with a letter or digit");
  }
  return Status::ok();
}

// Well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF), so that the
// canonical JSON of a parsed spec can always be dumped: nlohmann::json throws on invalid UTF-8.
bool is_valid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto byte = static_cast<unsigned char>(text[i]);
    size_t extra = 0;
    uint32_t code = 0;
    if (byte < 0x80) {
      ++i;
      continue;
    }
    if ((byte & 0xE0) == 0xC0) {
      extra = 1;
      code = byte & 0x1F;
    } else if ((byte & 0xF0) == 0xE0) {
      extra = 2;
      code = byte & 0x0F;
    } else if ((byte & 0xF8) == 0xF0) {
      extra = 3;
      code = byte & 0x07;
    } else {
      return false;
    }
    if (i + extra >= text.size()) {
      return false;
    }
    for (size_t k = 1; k <= extra; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) {
        return false;
      }
      code = (code << 6) | (next & 0x3F);
    }
    constexpr std::array<uint32_t, 4> kMinCode = {0, 0x80, 0x800, 0x10000};
    if (code < kMinCode[extra] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

// `node` is a mapping whose keys are distinct strings, all in `known`.
Status check_keys(const YAML::Node& node, std::initializer_list<std::string_view> known,
                  const std::string& where) {
  if (!node.IsMap()) {
    return invalid_argument(where + ": must be a mapping");
  }
  std::set<std::string> seen;
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) {
      return invalid_argument(where + ": field names must be strings");
    }
    const std::string& key = entry.first.Scalar();
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return invalid_argument(where + ": unknown field '" + key + "'");
    }
    // yaml-cpp keeps both entries of a repeated key and lookups find the first; refuse it
    // rather than silently ignoring one of the two values.
    if (!seen.insert(key).second) {
      return invalid_argument(where + ": field '" + key + "' appears twice");
    }
  }
  return Status::ok();
}

bool has_tag(const YAML::Node& node, std::initializer_list<std::string_view> tags) {
  const std::string& tag = node.Tag();
  return std::find(tags.begin(), tags.end(), tag) != tags.end();
}

Result<std::string> read_string(const YAML::Node& node, const std::string& where) {
  if (!node.IsScalar()) {
    return invalid_argument(where + ": must be a string");
  }
  return node.Scalar();
}

// The message for an integer outside [min, max] or not an integer at all.
std::string integer_range_text(int64_t min, int64_t max) {
  if (max == std::numeric_limits<int64_t>::max()) {
    return "must be an integer >= " + std::to_string(min);
  }
  return "must be an integer from " + std::to_string(min) + " to " + std::to_string(max);
}

// A decimal integer in [min, max]. Refuses 1.5, "abc", "50" (quoted), 1e3 and 0x10.
Result<int64_t> read_int(const YAML::Node& node, const std::string& where, int64_t min,
                         int64_t max) {
  const std::string message = where + ": " + integer_range_text(min, max);
  if (!node.IsScalar() || !has_tag(node, {kPlainTag, kIntTag})) {
    return invalid_argument(message);
  }
  const std::string& text = node.Scalar();
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (begin != end && *begin == '+') {
    ++begin;
  }
  int64_t value = 0;
  const auto [ptr, ec] = std::from_chars(begin, end, value);
  if (begin == end || ec != std::errc() || ptr != end || value < min || value > max) {
    return invalid_argument(message);
  }
  return value;
}

// A finite decimal number in [min, max] (integers included).
Result<double> read_number(const YAML::Node& node, const std::string& where, double min,
                           double max) {
  char bounds[64];
  std::snprintf(bounds, sizeof(bounds), "must be a number from %g to %g", min, max);
  const std::string message = where + ": " + bounds;
  if (!node.IsScalar() || !has_tag(node, {kPlainTag, kIntTag, kFloatTag})) {
    return invalid_argument(message);
  }
  const std::string& text = node.Scalar();
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (begin != end && *begin == '+') {
    ++begin;
  }
  double value = 0;
  const auto [ptr, ec] = std::from_chars(begin, end, value);
  // The negated comparison also refuses NaN; from_chars accepts "nan" and "inf".
  if (begin == end || ec != std::errc() || ptr != end || !(value >= min && value <= max)) {
    return invalid_argument(message);
  }
  return value;
}

// YAML 1.2 core schema booleans only: yaml-cpp would also take yes/no/on/off/y/n, which read
// as strings elsewhere and make "booleans must be booleans" ambiguous.
Result<bool> read_bool(const YAML::Node& node, const std::string& where) {
  const std::string message = where + ": must be true or false";
  if (!node.IsScalar() || !has_tag(node, {kPlainTag, kBoolTag})) {
    return invalid_argument(message);
  }
  const std::string& text = node.Scalar();
  if (text == "true" || text == "True" || text == "TRUE") {
    return true;
  }
  if (text == "false" || text == "False" || text == "FALSE") {
    return false;
  }
  return invalid_argument(message);
}

// {min, max} with either key optional: a missing one keeps its value in `range`. `keys`: the
// fields the mapping may hold (the caller reads any besides min and max).
Status read_range(const YAML::Node& node, const std::string& where, int64_t lowest, int64_t highest,
                  ConcurrencyRange& range,
                  std::initializer_list<std::string_view> keys = {"min", "max"}) {
  FLOTILLA_RETURN_IF_ERROR(check_keys(node, keys, where));
  if (const YAML::Node min = node["min"]) {
    FLOTILLA_ASSIGN_OR_RETURN(range.min, read_int(min, where + ".min", lowest, highest));
  }
  if (const YAML::Node max = node["max"]) {
    FLOTILLA_ASSIGN_OR_RETURN(range.max,
                              read_int(max, where + ".max", std::max<int64_t>(lowest, 1), highest));
  }
  if (range.min > range.max) {
    return invalid_argument(where + ": min (" + std::to_string(range.min) +
                            ") must not exceed max (" + std::to_string(range.max) + ")");
  }
  return Status::ok();
}

Status check_model(const std::string& model, const std::string& where) {
  if (model.empty()) {
    return invalid_argument(where + ": must not be empty");
  }
  for (char c : model) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
      return invalid_argument(where + ": must not contain control characters");
    }
  }
  if (!is_valid_utf8(model)) {
    return invalid_argument(where + ": must be valid UTF-8");
  }
  if (store::is_url(model)) {
    if (Result<store::Url> url = store::parse_url(model); !url.is_ok()) {
      return invalid_argument(where + ": " + url.status().message());
    }
    return Status::ok();
  }
  if (model.front() != '/') {
    return invalid_argument(where + ": '" + model +
                            "' must be an absolute path or an http(s):// URL");
  }
  return Status::ok();
}

constexpr size_t kMaxCommandArgs = 256;
constexpr size_t kMaxExternalText = 4096;

// Text the external runtime hands to exec or the environment: no control characters (no NUL,
// which would cut it short), valid UTF-8, at most kMaxExternalText bytes.
Status check_external_text(const std::string& text, const std::string& where) {
  if (text.size() > kMaxExternalText) {
    return invalid_argument(where + ": must be at most 4096 bytes");
  }
  for (char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
      return invalid_argument(where + ": must not contain control characters");
    }
  }
  if (!is_valid_utf8(text)) {
    return invalid_argument(where + ": must be valid UTF-8");
  }
  return Status::ok();
}

bool is_env_name(const std::string& name) {
  if (name.empty() || (name.front() >= '0' && name.front() <= '9')) {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// served_models[i].external (common.h's ExternalCommand).
Result<ExternalCommand> read_external(const YAML::Node& node, const std::string& where) {
  FLOTILLA_RETURN_IF_ERROR(check_keys(node, {"command", "env", "workdir", "ready_path"}, where));
  ExternalCommand external;
  const YAML::Node command = node["command"];
  if (!command) {
    return invalid_argument(where + ".command: is required");
  }
  if (!command.IsSequence() || command.size() == 0 || command.size() > kMaxCommandArgs) {
    return invalid_argument(where +
                            ".command: must be a list of 1 to 256 strings (the program and its "
                            "arguments; no shell runs it)");
  }
  for (size_t i = 0; i < command.size(); ++i) {
    const std::string arg_where = index_where(where + ".command", i);
    FLOTILLA_ASSIGN_OR_RETURN(std::string arg, read_string(command[i], arg_where));
    FLOTILLA_RETURN_IF_ERROR(check_external_text(arg, arg_where));
    external.command.push_back(std::move(arg));
  }
  if (external.command.front().empty()) {
    return invalid_argument(where + ".command[0]: must name a program");
  }
  if (const YAML::Node env = node["env"]; env && !env.IsNull()) {
    if (!env.IsMap()) {
      return invalid_argument(where + ".env: must be a mapping of variable names to strings");
    }
    for (const auto& entry : env) {
      FLOTILLA_ASSIGN_OR_RETURN(std::string name, read_string(entry.first, where + ".env"));
      const std::string value_where = where + ".env." + name;
      if (!is_env_name(name)) {
        return invalid_argument(where + ".env: '" + name +
                                "' is not a variable name (letters, digits and '_', not "
                                "starting with a digit)");
      }
      if (name == "PORT") {
        return invalid_argument(value_where + ": is Flotilla's to set (the replica's port)");
      }
      FLOTILLA_ASSIGN_OR_RETURN(std::string value, read_string(entry.second, value_where));
      FLOTILLA_RETURN_IF_ERROR(check_external_text(value, value_where));
      if (!external.env.emplace(std::move(name), std::move(value)).second) {
        return invalid_argument(value_where + ": appears twice");
      }
    }
  }
  if (const YAML::Node workdir = node["workdir"]) {
    FLOTILLA_ASSIGN_OR_RETURN(external.workdir, read_string(workdir, where + ".workdir"));
    FLOTILLA_RETURN_IF_ERROR(check_external_text(external.workdir, where + ".workdir"));
    if (!external.workdir.starts_with('/')) {
      return invalid_argument(where + ".workdir: '" + external.workdir +
                              "' must be an absolute path");
    }
  }
  if (const YAML::Node ready_path = node["ready_path"]) {
    FLOTILLA_ASSIGN_OR_RETURN(external.ready_path, read_string(ready_path, where + ".ready_path"));
    const bool printable = std::all_of(external.ready_path.begin(), external.ready_path.end(),
                                       [](char c) { return c > 0x20 && c < 0x7F; });
    if (!external.ready_path.starts_with('/') || !printable ||
        external.ready_path.size() > kMaxExternalText) {
      return invalid_argument(where + ".ready_path: '" + external.ready_path +
                              "' must be a path starting with '/', without spaces");
    }
  }
  return external;
}

// One entry of served_models; `traffic_given` says whether the spec set its traffic.
Result<ServedModelSpec> read_served_model(const YAML::Node& node, const std::string& where,
                                          bool& traffic_given) {
  FLOTILLA_RETURN_IF_ERROR(
      check_keys(node,
                 {"name", "model", "runtime", "external", "concurrency", "per_replica_concurrency",
                  "scale_to_zero", "traffic", "resources"},
                 where));
  ServedModelSpec served;

  const YAML::Node name = node["name"];
  if (!name) {
    return invalid_argument(where + ".name: is required");
  }
  FLOTILLA_ASSIGN_OR_RETURN(served.name, read_string(name, where + ".name"));
  FLOTILLA_RETURN_IF_ERROR(check_name(served.name, where + ".name"));

  const YAML::Node model = node["model"];
  if (!model) {
    return invalid_argument(where + ".model: is required");
  }
  FLOTILLA_ASSIGN_OR_RETURN(served.model, read_string(model, where + ".model"));
  FLOTILLA_RETURN_IF_ERROR(check_model(served.model, where + ".model"));

  if (const YAML::Node runtime = node["runtime"]) {
    FLOTILLA_ASSIGN_OR_RETURN(served.runtime, read_string(runtime, where + ".runtime"));
    if (std::find(kRuntimes.begin(), kRuntimes.end(), served.runtime) == kRuntimes.end()) {
      return invalid_argument(where + ".runtime: unknown runtime '" + served.runtime +
                              "' (use auto, xgboost, llm, synthetic or external)");
    }
  }
  if (const YAML::Node external = node["external"]; external && !external.IsNull()) {
    if (served.runtime != "external") {
      return invalid_argument(where + ".external: only with runtime: external");
    }
    FLOTILLA_ASSIGN_OR_RETURN(served.external, read_external(external, where + ".external"));
  } else if (served.runtime == "external") {
    return invalid_argument(where +
                            ".external: is required with runtime: external (the command that "
                            "starts your server)");
  }
  if (served.runtime == "external" && store::is_url(served.model)) {
    return invalid_argument(where + ".model: '" + served.model +
                            "' must be a local path with runtime: external (your server reads "
                            "it)");
  }

  if (const YAML::Node concurrency = node["concurrency"]) {
    FLOTILLA_RETURN_IF_ERROR(
        read_range(concurrency, where + ".concurrency", 0, kMaxConcurrency, served.concurrency));
  }

  // An explicit null reads as absent, so a JSON client may send "per_replica_concurrency": null.
  if (const YAML::Node bounds = node["per_replica_concurrency"]; bounds && !bounds.IsNull()) {
    ConcurrencyRange range = kDefaultPerReplicaBounds;
    FLOTILLA_RETURN_IF_ERROR(read_range(bounds, where + ".per_replica_concurrency", 1,
                                        kMaxPerReplicaConcurrency, range,
                                        {"min", "max", "initial"}));
    served.per_replica_concurrency = range;
    if (const YAML::Node initial = bounds["initial"]; initial && !initial.IsNull()) {
      const std::string field = where + ".per_replica_concurrency.initial";
      FLOTILLA_ASSIGN_OR_RETURN(served.initial_per_replica_concurrency,
                                read_int(initial, field, 1, kMaxPerReplicaConcurrency));
      if (*served.initial_per_replica_concurrency < range.min ||
          *served.initial_per_replica_concurrency > range.max) {
        return invalid_argument(field + ": " +
                                std::to_string(*served.initial_per_replica_concurrency) +
                                " must be within min (" + std::to_string(range.min) +
                                ") and max (" + std::to_string(range.max) + ")");
      }
    }
  }

  if (const YAML::Node scale_to_zero = node["scale_to_zero"]) {
    FLOTILLA_ASSIGN_OR_RETURN(served.scale_to_zero,
                              read_bool(scale_to_zero, where + ".scale_to_zero"));
  }

  traffic_given = false;
  if (const YAML::Node traffic = node["traffic"]) {
    FLOTILLA_ASSIGN_OR_RETURN(served.traffic,
                              read_int(traffic, where + ".traffic", 0, kFullTraffic));
    traffic_given = true;
  }

  if (const YAML::Node resources = node["resources"]) {
    const std::string resources_where = where + ".resources";
    FLOTILLA_RETURN_IF_ERROR(check_keys(resources, {"cpus", "memory_mb"}, resources_where));
    if (const YAML::Node cpus = resources["cpus"]) {
      FLOTILLA_ASSIGN_OR_RETURN(served.resources.cpus,
                                read_number(cpus, resources_where + ".cpus", 0, kMaxCpus));
    }
    if (const YAML::Node memory = resources["memory_mb"]) {
      FLOTILLA_ASSIGN_OR_RETURN(served.resources.memory_mb,
                                read_int(memory, resources_where + ".memory_mb", 0, kMaxMemoryMb));
    }
  }
  return served;
}

constexpr int64_t kMaxLoggedBodyBytes = 16 * 1024 * 1024;
constexpr int64_t kMaxRetentionS = 365 * 86'400;

// "<n>m", "<n>h" or "<n>d" as seconds.
Result<int64_t> read_retention(const YAML::Node& node, const std::string& where) {
  FLOTILLA_ASSIGN_OR_RETURN(std::string text, read_string(node, where));
  const std::optional<int64_t> seconds =
      parse_duration_seconds(text, "mhd", /*bare_seconds=*/false, kMaxRetentionS);
  if (!seconds) {
    return invalid_argument(where +
                            ": must be minutes, hours or days (\"30m\", \"24h\", "
                            "\"7d\"), from 1 minute to 365 days");
  }
  return *seconds;
}

std::string retention_text(int64_t seconds) {
  if (seconds % 86'400 == 0) {
    return std::to_string(seconds / 86'400) + "d";
  }
  return seconds % 3'600 == 0 ? std::to_string(seconds / 3'600) + "h"
                              : std::to_string(seconds / 60) + "m";
}

Result<InferenceTableConfig> read_inference_table(const YAML::Node& node) {
  FLOTILLA_RETURN_IF_ERROR(check_keys(
      node, {"enabled", "sample_rate", "max_body_bytes", "retention"}, "inference_table"));
  InferenceTableConfig table;
  if (const YAML::Node enabled = node["enabled"]) {
    FLOTILLA_ASSIGN_OR_RETURN(table.enabled, read_bool(enabled, "inference_table.enabled"));
  }
  if (const YAML::Node rate = node["sample_rate"]) {
    FLOTILLA_ASSIGN_OR_RETURN(table.sample_rate,
                              read_number(rate, "inference_table.sample_rate", 0, 1));
    if (table.sample_rate <= 0) {
      return invalid_argument("inference_table.sample_rate: must be above 0 and at most 1");
    }
  }
  if (const YAML::Node bytes = node["max_body_bytes"]) {
    FLOTILLA_ASSIGN_OR_RETURN(
        table.max_body_bytes,
        read_int(bytes, "inference_table.max_body_bytes", 0, kMaxLoggedBodyBytes));
  }
  if (const YAML::Node retention = node["retention"]) {
    FLOTILLA_ASSIGN_OR_RETURN(table.retention_s,
                              read_retention(retention, "inference_table.retention"));
  }
  return table;
}

Result<EndpointSpec> read_spec(const YAML::Node& root, std::string_view name_from_path) {
  if (!root || root.IsNull()) {
    return invalid_argument("spec: is empty");
  }
  FLOTILLA_RETURN_IF_ERROR(
      check_keys(root, {"name", "served_models", "autoscaling", "inference_table"}, "spec"));
  EndpointSpec spec;

  if (const YAML::Node name = root["name"]) {
    FLOTILLA_ASSIGN_OR_RETURN(spec.name, read_string(name, "name"));
    FLOTILLA_RETURN_IF_ERROR(check_name(spec.name, "name"));
    if (!name_from_path.empty() && spec.name != name_from_path) {
      return invalid_argument("name: '" + spec.name + "' does not match the endpoint '" +
                              std::string(name_from_path) + "' in the request path");
    }
  } else if (!name_from_path.empty()) {
    spec.name = std::string(name_from_path);
    FLOTILLA_RETURN_IF_ERROR(check_name(spec.name, "name"));
  } else {
    return invalid_argument("name: is required");
  }

  const YAML::Node served_models = root["served_models"];
  if (!served_models) {
    return invalid_argument("served_models: is required");
  }
  if (!served_models.IsSequence() || served_models.size() == 0) {
    return invalid_argument("served_models: must be a non-empty list");
  }
  std::set<std::string> names;
  int64_t traffic_sum = 0;
  for (size_t i = 0; i < served_models.size(); ++i) {
    const std::string where = index_where("served_models", i);
    bool traffic_given = false;
    FLOTILLA_ASSIGN_OR_RETURN(ServedModelSpec served,
                              read_served_model(served_models[i], where, traffic_given));
    if (!traffic_given && served_models.size() > 1) {
      return invalid_argument(where + ".traffic: is required when there are several served models");
    }
    if (!names.insert(served.name).second) {
      return invalid_argument(where + ".name: '" + served.name + "' appears twice");
    }
    traffic_sum += served.traffic;
    spec.served_models.push_back(std::move(served));
  }
  if (traffic_sum != kFullTraffic) {
    return invalid_argument("served_models: traffic sums to " + std::to_string(traffic_sum) +
                            ", must be 100");
  }
  // An explicit null reads as absent, as per_replica_concurrency does.
  if (const YAML::Node autoscaling = root["autoscaling"]; autoscaling && !autoscaling.IsNull()) {
    FLOTILLA_RETURN_IF_ERROR(check_keys(autoscaling, {"forecast"}, "autoscaling"));
    if (const YAML::Node forecast = autoscaling["forecast"]) {
      FLOTILLA_ASSIGN_OR_RETURN(spec.autoscaling.forecast,
                                read_bool(forecast, "autoscaling.forecast"));
    }
  }
  if (const YAML::Node table = root["inference_table"]; table && !table.IsNull()) {
    FLOTILLA_ASSIGN_OR_RETURN(spec.inference_table, read_inference_table(table));
  }
  return spec;
}

nlohmann::json range_json(const ConcurrencyRange& range) {
  return {{"min", range.min}, {"max", range.max}};
}

// Appends `field` with its length in front, so no two different field lists give one string.
void append_field(std::string& out, std::string_view field) {
  out += std::to_string(field.size());
  out += ':';
  out += field;
  out += ';';
}

int64_t runtime_default_target(const std::string& runtime) {
  if (runtime == "synthetic") {
    return 8;
  }
  return 16;  // xgboost and auto
}

}  // namespace

Result<EndpointSpec> parse_endpoint_spec(std::string_view text, std::string_view name_from_path) {
  try {
    return read_spec(YAML::Load(std::string(text)), name_from_path);
  } catch (const std::exception& e) {
    // yaml-cpp throws on syntax errors (and on lookups in malformed trees).
    return invalid_argument(std::string("spec: invalid YAML or JSON: ") + e.what());
  }
}

nlohmann::json to_json(const ServedModelSpec& served) {
  nlohmann::json json = {
      {"name", served.name},
      {"model", served.model},
      {"runtime", served.runtime},
      {"concurrency", range_json(served.concurrency)},
      {"scale_to_zero", served.scale_to_zero},
      {"traffic", served.traffic},
      {"resources", {{"cpus", served.resources.cpus}, {"memory_mb", served.resources.memory_mb}}},
  };
  if (served.external) {
    const ExternalCommand& external = *served.external;
    json["external"] = {
        {"command", external.command}, {"env", external.env}, {"ready_path", external.ready_path}};
    if (!external.workdir.empty()) {
      json["external"]["workdir"] = external.workdir;
    }
  }
  if (served.per_replica_concurrency) {
    json["per_replica_concurrency"] = range_json(*served.per_replica_concurrency);
    if (served.initial_per_replica_concurrency) {
      json["per_replica_concurrency"]["initial"] = *served.initial_per_replica_concurrency;
    }
  }
  return json;
}

nlohmann::json to_json(const EndpointSpec& spec) {
  nlohmann::json served_models = nlohmann::json::array();
  for (const ServedModelSpec& served : spec.served_models) {
    served_models.push_back(to_json(served));
  }
  nlohmann::json json = {{"name", spec.name}, {"served_models", std::move(served_models)}};
  // Only when it differs from the default: a spec that never named it reads back as it was
  // sent, as before the field existed.
  if (spec.autoscaling != AutoscalingSpec{}) {
    json["autoscaling"] = {{"forecast", spec.autoscaling.forecast}};
  }
  if (spec.inference_table != InferenceTableConfig{}) {
    const InferenceTableConfig& table = spec.inference_table;
    json["inference_table"] = {{"enabled", table.enabled},
                               {"sample_rate", table.sample_rate},
                               {"max_body_bytes", table.max_body_bytes},
                               {"retention", retention_text(table.retention_s)}};
  }
  return json;
}

Status check_model_paths(const EndpointSpec& spec) {
  for (size_t i = 0; i < spec.served_models.size(); ++i) {
    const std::string& model = spec.served_models[i].model;
    if (store::is_url(model)) {
      continue;  // fetched by the replica; a failure shows as the replica's (docs/store.md)
    }
    const std::string where = index_where("served_models", i) + ".model";
    std::error_code ec;
    const bool exists = std::filesystem::exists(model, ec);
    if (ec) {
      return invalid_argument(where + ": '" + model + "' cannot be checked: " + ec.message());
    }
    if (!exists) {
      return invalid_argument(where + ": '" + model + "' does not exist");
    }
    if (const std::optional<ExternalCommand>& external = spec.served_models[i].external) {
      const std::string external_where = index_where("served_models", i) + ".external";
      const std::string workdir = external_workdir(*external, model);
      if (!std::filesystem::is_directory(workdir, ec)) {
        return invalid_argument(external_where + ".workdir: '" + workdir + "' is not a directory");
      }
      if (Result<std::string> program = find_program(*external, workdir); !program.is_ok()) {
        return invalid_argument(external_where + ".command[0]: " + program.status().message());
      }
    }
  }
  return Status::ok();
}

Status serve_mlflow_flavors(EndpointSpec& spec) {
  for (size_t i = 0; i < spec.served_models.size(); ++i) {
    ServedModelSpec& served = spec.served_models[i];
    const std::filesystem::path mlmodel = std::filesystem::path(served.model) / "MLmodel";
    std::error_code ec;
    if (served.runtime != "auto" || store::is_url(served.model) ||
        !std::filesystem::is_regular_file(mlmodel, ec)) {
      continue;
    }
    const std::string where = index_where("served_models", i) + ".model";
    std::vector<std::string> flavors;
    try {
      const YAML::Node root = YAML::LoadFile(mlmodel.string());
      if (root["flavors"] && root["flavors"].IsMap()) {
        for (const auto& flavor : root["flavors"]) {
          flavors.push_back(flavor.first.as<std::string>());
        }
      }
    } catch (const std::exception& e) {
      return invalid_argument(where + ": cannot read '" + mlmodel.string() + "': " + e.what());
    }
    auto has = [&](std::string_view name) {
      return std::find(flavors.begin(), flavors.end(), name) != flavors.end();
    };
    if (has("xgboost")) {
      continue;  // served natively
    }
    std::string listed;
    for (const std::string& flavor : flavors) {
      listed += (listed.empty() ? "" : ", ") + flavor;
    }
    if (!has("python_function")) {
      return invalid_argument(where + ": '" + served.model + "' is an MLflow model of flavors [" +
                              listed +
                              "], none of which Flotilla serves (xgboost natively, "
                              "python_function through MLflow's scoring server)");
    }
    ExternalCommand scoring_server;
    scoring_server.command = {"mlflow"};
    Result<std::string> mlflow = find_program(scoring_server, "/");
    if (!mlflow.is_ok()) {
      return invalid_argument(where + ": '" + served.model + "' is an MLflow model of flavors [" +
                              listed +
                              "], which Flotilla serves through MLflow's own scoring server, and "
                              "`mlflow` is not on flotilla up's PATH: install MLflow (pip "
                              "install mlflow), or give runtime: external with your server");
    }
    // `mlflow models serve` in the Python environment it is installed in (no conda, no new
    // virtualenv: what the team installed is what serves), on the replica's port.
    scoring_server.command = {*mlflow, "models",    "serve", "-m",     "{model}",
                              "-h",    "127.0.0.1", "-p",    "{port}", "--env-manager",
                              "local"};
    scoring_server.ready_path = "/ping";
    served.runtime = "external";
    served.external = std::move(scoring_server);
  }
  return Status::ok();
}

std::string deployment_key(std::string_view endpoint, const ServedModelSpec& served) {
  // Shortest round-trip form of cpus, so equal doubles always give equal text.
  char cpus[64];
  const auto [end, ec] = std::to_chars(cpus, cpus + sizeof(cpus), served.resources.cpus);
  const std::string_view cpus_text =
      ec == std::errc() ? std::string_view(cpus, end - cpus) : std::string_view();

  std::string canonical;
  append_field(canonical, endpoint);
  append_field(canonical, served.name);
  append_field(canonical, served.model);
  append_field(canonical, served.runtime);
  append_field(canonical, cpus_text);
  append_field(canonical, std::to_string(served.resources.memory_mb));
  if (served.external) {
    // Length-prefixed like every field, so no two commands share a canonical form.
    append_field(canonical, to_json(served).at("external").dump());
  }
  return std::string(endpoint) + "/" + served.name + "/" +
         sha256_hex(canonical).substr(0, kKeyHexDigits);
}

ConcurrencyRange per_replica_bounds(const ServedModelSpec& served) {
  return served.per_replica_concurrency.value_or(kDefaultPerReplicaBounds);
}

int64_t initial_target_concurrency(const ServedModelSpec& served) {
  const ConcurrencyRange bounds = per_replica_bounds(served);
  if (served.initial_per_replica_concurrency) {
    return std::min(std::max(*served.initial_per_replica_concurrency, bounds.min), bounds.max);
  }
  // Not std::clamp: it is undefined for min > max, which only a hand-built spec could hold.
  return std::min(std::max(runtime_default_target(served.runtime), bounds.min), bounds.max);
}

int64_t provisioned_replicas(const ServedModelSpec& served) {
  // A valid spec has bounds.min >= 1; the guard keeps a hand-built one from dividing by zero.
  const int64_t target = std::max<int64_t>(1, initial_target_concurrency(served));
  const int64_t min = std::max<int64_t>(0, served.concurrency.min);
  const int64_t replicas = min / target + (min % target != 0 ? 1 : 0);  // ceil, no overflow
  return std::max<int64_t>(1, replicas);
}

namespace {

// The largest per-replica target an endpoint may learn: its replicas share one target, within
// the bounds every served model allows.
int64_t largest_target(const EndpointSpec& spec) {
  int64_t largest = 4096;
  int64_t smallest = 1;
  for (const ServedModelSpec& served : spec.served_models) {
    largest = std::min(largest, per_replica_bounds(served).max);
    smallest = std::max(smallest, per_replica_bounds(served).min);
  }
  return std::max({largest, smallest, int64_t{1}});
}

}  // namespace

std::vector<int64_t> least_replicas(const EndpointSpec& spec, bool autoscaled) {
  const int64_t target = largest_target(spec);
  std::vector<int64_t> least;
  for (const ServedModelSpec& served : spec.served_models) {
    if (!autoscaled) {
      least.push_back(provisioned_replicas(served));
      continue;
    }
    const int64_t min = std::max<int64_t>(0, served.concurrency.min);
    const int64_t replicas = min / target + (min % target != 0 ? 1 : 0);
    least.push_back(served.scale_to_zero && min == 0 ? 0 : std::max<int64_t>(1, replicas));
  }
  return least;
}

Status check_replica_cap(const EndpointSpec& spec, int64_t cap, bool autoscaled) {
  if (cap <= 0 || spec.served_models.empty()) {
    return Status::ok();
  }
  const std::vector<int64_t> least = least_replicas(spec, autoscaled);
  int64_t total = 0;
  size_t largest = 0;
  for (size_t i = 0; i < least.size(); ++i) {
    total += least[i];
    largest = least[i] > least[largest] ? i : largest;
  }
  if (total <= cap) {
    return Status::ok();
  }
  const ServedModelSpec& served = spec.served_models[largest];
  const int64_t per_replica =
      autoscaled ? largest_target(spec) : initial_target_concurrency(served);
  std::string message = "served_models[" + std::to_string(largest) +
                        "].concurrency.min: " + std::to_string(served.concurrency.min) +
                        " needs at least " + std::to_string(least[largest]) + " replicas";
  message += autoscaled ? " (at most " + std::to_string(per_replica) +
                              " in flight each, per_replica_concurrency.max)"
                        : " (" + std::to_string(per_replica) + " in flight each)";
  if (total != least[largest]) {
    message += ", " + std::to_string(total) + " with the other served models";
  }
  message += ", more than this host's cap of " + std::to_string(cap) +
             " replicas (flotilla up --max-replicas)";
  return invalid_argument(message);
}

}  // namespace flotilla::control

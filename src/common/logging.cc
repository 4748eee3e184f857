#include <ctime>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "common/common_logging.h"

namespace flotilla {
namespace {

thread_local LogFields scope_fields;

// `over`'s non-empty fields, the others from `under`.
LogFields merged(LogFields over, const LogFields& under) {
  for (auto [field, fallback] :
       {std::pair{&over.component, &under.component}, std::pair{&over.endpoint, &under.endpoint},
        std::pair{&over.replica, &under.replica}, std::pair{&over.request_id, &under.request_id}}) {
    if (field->empty()) {
      *field = *fallback;
    }
  }
  return over;
}

// 2026-12-05T17:35:00.123Z
std::string rfc3339_utc(std::chrono::system_clock::time_point time) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  const size_t length = std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(text + length, sizeof(text) - length, ".%03dZ", static_cast<int>(ms % 1000));
  return text;
}

class JsonFormatter final : public spdlog::formatter {
 public:
  explicit JsonFormatter(LogFields process) : process_(std::move(process)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    nlohmann::ordered_json line;
    line["time"] = rfc3339_utc(msg.time);
    const spdlog::string_view_t level = spdlog::level::to_string_view(msg.level);
    line["level"] = std::string_view(level.data(), level.size());
    const LogFields fields = merged(scope_fields, process_);
    for (const auto& [key, value] :
         {std::pair{"component", &fields.component}, std::pair{"endpoint", &fields.endpoint},
          std::pair{"replica", &fields.replica}, std::pair{"request_id", &fields.request_id}}) {
      if (!value->empty()) {
        line[key] = *value;
      }
    }
    line["message"] = std::string_view(msg.payload.data(), msg.payload.size());
    std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    text.push_back('\n');
    dest.append(text.data(), text.data() + text.size());
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>(process_);
  }

 private:
  const LogFields process_;
};

}  // namespace

Status init_logging(std::string_view level, std::string_view format, LogFields process) {
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") {
    return invalid_argument("unknown log level '" + std::string(level) +
                            "' (use trace, debug, info, warn, error, critical or off)");
  }
  if (format != "json" && format != "text") {
    return invalid_argument("unknown log format '" + std::string(format) + "' (use json or text)");
  }
  // Logs go to stderr: stdout is kept for machine-readable lines (the replica's listen line).
  static const bool installed = [] {
    spdlog::set_default_logger(spdlog::stderr_color_mt("flotilla"));
    return true;
  }();
  (void)installed;
  spdlog::set_level(parsed);
  if (format == "json") {
    spdlog::set_formatter(make_json_log_formatter(std::move(process)));
  } else {
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  }
  return Status::ok();
}

LogScope::LogScope(LogFields fields) : previous_(scope_fields) {
  scope_fields = merged(std::move(fields), previous_);  // nested: an outer scope's fields stay
}

LogScope::~LogScope() {
  scope_fields = std::move(previous_);
}

std::unique_ptr<spdlog::formatter> make_json_log_formatter(LogFields process) {
  return std::make_unique<JsonFormatter>(std::move(process));
}

}  // namespace flotilla

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "common/common.h"

namespace flotilla {

Status check_name(const std::string& name, const std::string& where) {
  constexpr size_t kMaxNameLength = 128;
  if (name.empty() || name.size() > kMaxNameLength) {
    return invalid_argument(where + ": must be 1 to 128 characters");
  }
  for (char c : name) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                         (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!allowed) {
      return invalid_argument(where + ": '" + name +
                              "' may hold only letters, digits, '-', '_' and '.'");
    }
  }
  return Status::ok();
}

Status Status::with_context(std::string_view context) const {
  if (is_ok()) {
    return *this;
  }
  return Status(code_, std::string(context) + ": " + message_);
}

std::string Status::to_string() const {
  if (is_ok()) {
    return "ok";
  }
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status invalid_argument(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message));
}
Status not_found(std::string message) {
  return Status(StatusCode::kNotFound, std::move(message));
}
Status internal_error(std::string message) {
  return Status(StatusCode::kInternal, std::move(message));
}
Status unavailable(std::string message) {
  return Status(StatusCode::kUnavailable, std::move(message));
}

int http_status_for(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kFailedPrecondition:
      return 409;
    case StatusCode::kResourceExhausted:
      return 429;
    case StatusCode::kUnimplemented:
      return 501;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kDeadlineExceeded:
      return 504;
    case StatusCode::kInternal:
      return 500;
  }
  return 500;
}

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kFailedPrecondition:
      return "failed precondition";
    case StatusCode::kResourceExhausted:
      return "resource exhausted";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kDeadlineExceeded:
      return "deadline exceeded";
    case StatusCode::kUnimplemented:
      return "unimplemented";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

namespace detail {

void check_failed(const char* condition, const char* file, int line) {
  std::fprintf(stderr, "FLOTILLA_CHECK failed: %s at %s:%d\n", condition, file, line);
  std::fflush(stderr);
  std::abort();
}

void bug(const char* what, const char* file, int line) {
#ifndef NDEBUG
  check_failed(what, file, line);
#else
  static Counter& bugs = default_registry().counter(
      "flotilla_bug_total", "Internal invariants that failed but were survived.");
  // Log the first few and then every 1000th, so a hot bug cannot flood the log.
  uint64_t seen = bugs.value();
  bugs.inc();
  if (seen < 10 || seen % 1000 == 0) {
    spdlog::error("bug: {} at {}:{}", what, file, line);
  }
#endif
}

}  // namespace detail

namespace detail {
void value_of_error(const Status& status) {
  std::fprintf(stderr, "FLOTILLA_CHECK failed: value() of a Result holding an error: %s\n",
               status.to_string().c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

int64_t Clock::unix_ms() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(system_now().time_since_epoch())
      .count();
}

namespace {
class RealClock final : public Clock {
 public:
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
  std::chrono::system_clock::time_point system_now() const override {
    return std::chrono::system_clock::now();
  }
};
}  // namespace

Clock& real_clock() {
  static RealClock clock;
  return clock;
}

int64_t unix_time_ms() {
  return real_clock().unix_ms();
}

int64_t ceil_div(double value, double by) {
  return static_cast<int64_t>(std::ceil(value / std::max(by, 1e-9) - 1e-9));
}

std::optional<int64_t> parse_duration_seconds(std::string_view text, std::string_view units,
                                              bool bare_seconds, int64_t max_seconds) {
  int64_t unit_s = 1;
  if (!text.empty() && std::string_view("smhd").find(text.back()) != std::string_view::npos) {
    if (units.find(text.back()) == std::string_view::npos) {
      return std::nullopt;
    }
    const char unit = text.back();
    unit_s = unit == 's' ? 1 : unit == 'm' ? 60 : unit == 'h' ? 3'600 : 86'400;
    text.remove_suffix(1);
  } else if (!bare_seconds) {
    return std::nullopt;
  }
  int64_t count = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), count);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || count < 1 ||
      count > max_seconds / unit_s) {
    return std::nullopt;
  }
  return count * unit_s;
}

}  // namespace flotilla

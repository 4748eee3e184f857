// The common module's contract: Status and Result, assertion macros, logging set-up, and the
// metrics registry with its Prometheus text writer. Everything here is thread-safe unless a
// comment says otherwise.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/tensor.h"

namespace flotilla {

// ---------------------------------------------------------------------------------------------
// Status and Result

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kFailedPrecondition,
  kResourceExhausted,
  kUnavailable,
  kDeadlineExceeded,
  kUnimplemented,
  kInternal,
};

// A success or an error code with a lower-case message naming the object involved.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns a copy whose message is "context: message", for propagation up the stack.
  Status with_context(std::string_view context) const;
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

Status invalid_argument(std::string message);
Status not_found(std::string message);
Status internal_error(std::string message);
Status unavailable(std::string message);

// The HTTP status that answers a request failing with `code`: the one Status -> HTTP table of
// the code base (replica data plane, OpenAI and MLflow protocol answers, control REST API).
//   kOk                  200
//   kInvalidArgument     400  malformed or out-of-range input
//   kNotFound            404
//   kFailedPrecondition  409  the resource's state forbids it (already exists)
//   kResourceExhausted   429  a full queue; retry later
//   kInternal            500
//   kUnimplemented       501
//   kUnavailable         503  transient: not ready, disk or lock busy
//   kDeadlineExceeded    504
int http_status_for(StatusCode code);
std::string_view status_code_name(StatusCode code);

namespace detail {
[[noreturn]] void value_of_error(const Status& status);
}  // namespace detail

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : state_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(state_).is_ok()) {
      state_ = Status(StatusCode::kInternal, "result built from an ok status");
    }
  }

  bool is_ok() const { return std::holds_alternative<T>(state_); }
  const Status& status() const {
    static const Status kOkStatus;
    return is_ok() ? kOkStatus : std::get<Status>(state_);
  }
  // The value; a Result holding an error is a bug here (a CHECK failure naming the status),
  // never an exception.
  T& value() & {
    check_has_value();
    return *std::get_if<T>(&state_);
  }
  const T& value() const& {
    check_has_value();
    return *std::get_if<T>(&state_);
  }
  T&& value() && {
    check_has_value();
    return std::move(*std::get_if<T>(&state_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  void check_has_value() const;
  std::variant<T, Status> state_;
};

template <typename T>
void Result<T>::check_has_value() const {
  if (const Status* error = std::get_if<Status>(&state_)) {
    detail::value_of_error(*error);
  }
}

#define FLOTILLA_CONCAT_INNER(a, b) a##b
#define FLOTILLA_CONCAT(a, b) FLOTILLA_CONCAT_INNER(a, b)

#define FLOTILLA_RETURN_IF_ERROR(expr)           \
  do {                                           \
    ::flotilla::Status flotilla_status = (expr); \
    if (!flotilla_status.is_ok()) {              \
      return flotilla_status;                    \
    }                                            \
  } while (false)

#define FLOTILLA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.is_ok()) {                                  \
    return tmp.status();                               \
  }                                                    \
  lhs = std::move(tmp).value()

#define FLOTILLA_ASSIGN_OR_RETURN(lhs, expr) \
  FLOTILLA_ASSIGN_OR_RETURN_IMPL(FLOTILLA_CONCAT(flotilla_result_, __LINE__), lhs, expr)

// ---------------------------------------------------------------------------------------------
// Assertions (STYLE.md §3)

namespace detail {
[[noreturn]] void check_failed(const char* condition, const char* file, int line);
void bug(const char* what, const char* file, int line);
}  // namespace detail

// State we cannot continue from: always on, logs and aborts.
#define FLOTILLA_CHECK(cond)                                       \
  do {                                                             \
    if (!(cond)) {                                                 \
      ::flotilla::detail::check_failed(#cond, __FILE__, __LINE__); \
    }                                                              \
  } while (false)

#ifdef NDEBUG
#define FLOTILLA_DCHECK(cond) \
  do {                        \
  } while (false)
#else
#define FLOTILLA_DCHECK(cond) FLOTILLA_CHECK(cond)
#endif

// "Should not happen, but we can carry on": aborts in debug builds; release builds log at a
// limited rate and count it in flotilla_bug_total.
#define FLOTILLA_BUG(what) ::flotilla::detail::bug(what, __FILE__, __LINE__)

// ---------------------------------------------------------------------------------------------
// Locking, checked by clang's -Wthread-safety (the `clang` preset builds with it as an error):
// a member shared between threads is FLOTILLA_GUARDED_BY(its Mutex), a function that expects
// the lock held is FLOTILLA_REQUIRES(it). Other compilers see plain std::mutex code.

#if defined(__clang__)
#define FLOTILLA_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define FLOTILLA_THREAD_ANNOTATION(x)
#endif
#define FLOTILLA_CAPABILITY(name) FLOTILLA_THREAD_ANNOTATION(capability(name))
#define FLOTILLA_SCOPED_CAPABILITY FLOTILLA_THREAD_ANNOTATION(scoped_lockable)
#define FLOTILLA_GUARDED_BY(mutex) FLOTILLA_THREAD_ANNOTATION(guarded_by(mutex))
#define FLOTILLA_PT_GUARDED_BY(mutex) FLOTILLA_THREAD_ANNOTATION(pt_guarded_by(mutex))
#define FLOTILLA_REQUIRES(...) FLOTILLA_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define FLOTILLA_EXCLUDES(...) FLOTILLA_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define FLOTILLA_ACQUIRE(...) FLOTILLA_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define FLOTILLA_RELEASE(...) FLOTILLA_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define FLOTILLA_TRY_ACQUIRE(...) FLOTILLA_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define FLOTILLA_NO_THREAD_SAFETY_ANALYSIS FLOTILLA_THREAD_ANNOTATION(no_thread_safety_analysis)

// std::mutex with the annotations the checker needs (libstdc++'s has none).
class FLOTILLA_CAPABILITY("mutex") Mutex {
 public:
  void lock() FLOTILLA_ACQUIRE() { mutex_.lock(); }
  void unlock() FLOTILLA_RELEASE() { mutex_.unlock(); }
  bool try_lock() FLOTILLA_TRY_ACQUIRE(true) { return mutex_.try_lock(); }

 private:
  std::mutex mutex_;
};

// Holds a Mutex for its scope (std::lock_guard, checked).
class FLOTILLA_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) FLOTILLA_ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~MutexLock() FLOTILLA_RELEASE() { mutex_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mutex_;
};

// A condition variable over a Mutex the caller holds. Waits have no predicate argument (a
// lambda cannot say it holds the lock): callers loop, `while (!ready_) cv_.wait(mutex_);`.
class CondVar {
 public:
  void wait(Mutex& mutex) FLOTILLA_REQUIRES(mutex) { cv_.wait(mutex); }
  // False when `deadline` passed first.
  template <typename ClockType, typename Duration>
  bool wait_until(Mutex& mutex, const std::chrono::time_point<ClockType, Duration>& deadline)
      FLOTILLA_REQUIRES(mutex) {
    return cv_.wait_until(mutex, deadline) == std::cv_status::no_timeout;
  }
  template <typename Rep, typename Period>
  bool wait_for(Mutex& mutex, const std::chrono::duration<Rep, Period>& timeout)
      FLOTILLA_REQUIRES(mutex) {
    return cv_.wait_for(mutex, timeout) == std::cv_status::no_timeout;
  }
  void notify_one() { cv_.notify_one(); }
  void notify_all() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

// ---------------------------------------------------------------------------------------------
// Randomness for policies (STYLE.md §5): policy code takes a Random& so tests and the simulator
// can drive it with a seed or a script.

class Random {
 public:
  virtual ~Random() = default;
  // A uniformly distributed 64-bit value.
  virtual uint64_t next() = 0;
  // Uniform in [0, n); n must be > 0. Virtual so a test can script the draws.
  virtual uint64_t uniform(uint64_t n);
};

// A fast seeded generator (SplitMix64). Not thread-safe: one per thread or per owner.
class SeededRandom final : public Random {
 public:
  explicit SeededRandom(uint64_t seed) : state_(seed) {}
  uint64_t next() override;

 private:
  uint64_t state_;
};

// ---------------------------------------------------------------------------------------------
// Text

// ASCII case-insensitive equality (HTTP header names, auth schemes).
inline bool equals_ignore_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i];
    char y = b[i];
    x = (x >= 'A' && x <= 'Z') ? static_cast<char>(x + 32) : x;
    y = (y >= 'A' && y <= 'Z') ? static_cast<char>(y + 32) : y;
    if (x != y) {
      return false;
    }
  }
  return true;
}

// The rule for endpoint, version and replica names in the gateway's config and for the
// endpoints a token is scoped to: 1 to 128 of [A-Za-z0-9-_.]. Errors: kInvalidArgument naming
// `where` ("endpoints[1]: 'a b' may hold only letters, digits, '-', '_' and '.'").
Status check_name(const std::string& name, const std::string& where);

// ---------------------------------------------------------------------------------------------
// Clocks (STYLE.md §5): code whose behaviour depends on time takes a Clock& so tests and the
// simulator can drive it (tests/fakes/common/fake_clock.h).

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  // Monotonic time, for deadlines, periods and durations.
  virtual TimePoint now() const = 0;
  // Wall-clock time, for timestamps that leave the process (records, samples, logs).
  virtual std::chrono::system_clock::time_point system_now() const = 0;
  // Milliseconds since the Unix epoch of system_now().
  int64_t unix_ms() const;
};

// The process's real clocks. Thread-safe.
Clock& real_clock();

// Milliseconds since the Unix epoch: timestamps for events and records that outlive a process
// (real_clock().unix_ms()).
int64_t unix_time_ms();

// ceil(value / by), with a tolerance for floating-point error (16.0000001 / 16 is 1): replica
// counts from concurrencies. A `by` at or below 0 counts as 1e-9.
int64_t ceil_div(double value, double by);

// A duration written as a count and a unit ("90s", "15m", "2h", "7d"), in seconds: the unit one
// of `units` (letters of "smhd"); with `bare_seconds`, a count alone is seconds too. nullopt
// when the text is not one, or the duration is under 1 s or over `max_seconds`. The window of
// the metrics route, an inference table's retention and `flotilla logs --since` read this way.
std::optional<int64_t> parse_duration_seconds(std::string_view text, std::string_view units,
                                              bool bare_seconds, int64_t max_seconds);

// ---------------------------------------------------------------------------------------------
// Load

// The responses of a span of time, counted by HTTP status code and by latency bucket: counts,
// so that seconds and gateways merge by adding them. Latency buckets are 4 per octave from
// 50 µs (the last one open): a quantile read off them is within 9% of the true value.
struct ResponseCounts {
  static constexpr int kLatencyBuckets = 100;
  static constexpr double kFirstLatencyBound = 50e-6;  // seconds

  std::map<int, uint64_t> codes;    // status code → responses
  std::map<int, uint64_t> latency;  // latency bucket → responses

  // The bucket of a latency in seconds, 0 .. kLatencyBuckets - 1.
  static int latency_bucket(double seconds);
  // The geometric middle of a bucket, in seconds: what a quantile in it reads as.
  static double latency_bucket_middle(int bucket);

  void merge(const ResponseCounts& other);
  uint64_t responses() const;
  // The q-quantile (0 < q <= 1) of the latencies in seconds; 0 when there are none.
  double latency_quantile(double q) const;
  bool operator==(const ResponseCounts&) const = default;
};

// One second of an endpoint's load, as the gateway measures it and the autoscaler reads it
// (DESIGN.md §4).
struct LoadSample {
  int64_t unix_ms = 0;       // the end of the second
  double concurrency = 0;    // mean in-flight requests at the replicas over the second
  double queued = 0;         // mean requests waiting in the admission queue
  uint64_t arrivals = 0;     // requests admitted for the endpoint (after auth and routing)
  uint64_t completions = 0;  // responses sent, any code
  uint64_t rejected = 0;     // 429s from the queue
  // Mean time the replicas took to answer the requests completed in the second (upstream
  // time, retries included), 0 when none completed: the vertical autoscaler's latency signal.
  double latency_ms = 0;
  // The responses sent in the second (any code, 429s included) and their time from arrival:
  // what the dashboard and `flotilla top` plot.
  ResponseCounts responses;
};

// An endpoint's inference table (issue 23; docs/inference-tables.md): the spec's
// `inference_table`, which the gateway applies as it is (a change restarts no replica).
struct InferenceTableConfig {
  bool enabled = false;
  double sample_rate = 1;            // the share of requests recorded, (0, 1]
  int64_t max_body_bytes = 65'536;   // each body cut there (marked truncated), >= 0
  int64_t retention_s = 7 * 86'400;  // closed files older than this are deleted, > 0
  bool operator==(const InferenceTableConfig&) const = default;
};

// A user's own model server (`runtime: external`, issue 24; docs/external-runtime.md): what the
// orchestrator starts for each replica of such a served model, in place of `flotilla replica`.
// In `command` and in `env` values, per replica: {port} (the port it must serve HTTP on, also
// in $PORT), {port:NAME} (one more free port per distinct NAME, for a server that opens
// others), {model}, {endpoint}, {version} and {replica}.
struct ExternalCommand {
  std::vector<std::string> command;        // argv, command[0] the program; never through a shell
  std::map<std::string, std::string> env;  // added to the environment it inherits
  std::string workdir;                     // absolute; "": the model's directory
  // Probed for readiness, then for liveness; {endpoint} and {version} are replaced in it.
  std::string ready_path = "/v2/health/ready";
  bool operator==(const ExternalCommand&) const = default;
};

// The working directory of an external server: `external.workdir`, else the model's directory
// (`model` itself when it is a directory, else the one that holds it).
std::string external_workdir(const ExternalCommand& external, const std::string& model);

// The program `external.command[0]` names, as it will be executed: a name holding '/' is taken
// relative to `workdir`; a bare name is looked up in the PATH that `external.env` sets, else in
// this process's PATH. kNotFound ("'mlserver' is not an executable on PATH") when there is no
// such executable file. Reads the file system.
Result<std::string> find_program(const ExternalCommand& external, const std::string& workdir);

// ---------------------------------------------------------------------------------------------
// Metrics

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void inc(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Fixed upper bounds, lock-free observe().
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);

  const std::vector<double>& upper_bounds() const { return bounds_; }
  // Per-bucket (not cumulative) counts; the last one is the +Inf bucket.
  std::vector<uint64_t> bucket_counts() const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

// Bounds growing by `factor` from `start`, `count` of them.
std::vector<double> exponential_buckets(double start, double factor, int count);

// The value of the unlabelled sample `name` in the Prometheus text `text` (another process's
// /metrics), or nullopt when there is none or its value does not parse. Thread-safe.
std::optional<double> metric_value(std::string_view text, std::string_view name);

// Owns every metric of a process and renders them in the Prometheus text format (0.0.4).
// Registration takes a lock; keep the returned reference (valid for the registry's life) and
// update it on the hot path without locking.
class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help,
                       const std::vector<double>& upper_bounds, const Labels& labels = {});
  // A value computed at scrape time. `type` is "gauge" or "counter".
  void callback(const std::string& name, const std::string& help, const std::string& type,
                std::function<double()> read);

  // Stops rendering every series whose labels include all of `match` (a removed replica's,
  // say), so /metrics does not grow with churn. The objects stay valid for whoever still holds
  // them (their updates are no longer shown), at a few hundred bytes each; a later call for
  // the same labels creates a fresh series.
  void retire(const Labels& match);

  std::string render() const;

 private:
  struct Family {
    std::string help;
    std::string type;
    // Keyed by the rendered label set, e.g. `route="infer",code="200"`.
    std::map<std::string, std::unique_ptr<Counter>> counters;
    std::map<std::string, std::unique_ptr<Gauge>> gauges;
    std::map<std::string, std::unique_ptr<Histogram>> histograms;
    std::function<double()> read;
  };
  Family& family(const std::string& name, const std::string& help, const std::string& type)
      FLOTILLA_REQUIRES(mutex_);

  mutable Mutex mutex_;
  std::map<std::string, Family> families_ FLOTILLA_GUARDED_BY(mutex_);
  // Retired series, kept alive for references still held.
  std::vector<std::unique_ptr<Counter>> retired_counters_ FLOTILLA_GUARDED_BY(mutex_);
  std::vector<std::unique_ptr<Gauge>> retired_gauges_ FLOTILLA_GUARDED_BY(mutex_);
  std::vector<std::unique_ptr<Histogram>> retired_histograms_ FLOTILLA_GUARDED_BY(mutex_);
};

// Registers the standard process_* metrics (CPU seconds, resident and virtual memory, open
// file descriptors, start time), read from /proc at scrape time.
void register_process_metrics(MetricsRegistry& registry);

// The process-wide registry (bug counter, process metrics, and each module's metrics).
MetricsRegistry& default_registry();

}  // namespace flotilla

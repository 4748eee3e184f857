// The synthetic runtime: a model whose cost is configured, not learned — a service-time
// distribution, CPU burned per request and a saturation point — so the gateway and the
// autoscaler can be tested on replicas that behave as told (DESIGN.md §7). Its load time is
// configured too (load_ms), so the replica's loading phase can be tested without a network.
// With max_concurrency it serves that many requests at once and queues the rest inside the
// replica, as a batched engine with a full batch does: the in-replica queueing the vertical
// autoscaler watches (queue_wait_seconds).
#include <chrono>
#include <cmath>
#include <deque>
#include <random>
#include <thread>
#include <utility>  // Boost 1.74 asio uses std::exchange without including it

#include <boost/asio.hpp>
#include <time.h>
#include <yaml-cpp/yaml.h>

#include "runtime/runtime_internal.h"

namespace flotilla::runtime {
namespace {

namespace asio = boost::asio;

enum class Distribution { kFixed, kExponential, kLognormal };

struct SyntheticSpec {
  Distribution distribution = Distribution::kFixed;
  double mean_ms = 0;
  double sigma = 0.5;  // lognormal only
  int64_t cpu_us = 0;
  int64_t saturation = 0;       // 0: never saturates
  int64_t max_concurrency = 0;  // requests served at once, the rest queue; 0: no limit
  uint64_t seed = 1;
  double load_ms = 0;  // how long loading takes
};

Result<SyntheticSpec> parse_spec(const std::string& path) {
  SyntheticSpec spec;
  try {
    YAML::Node root = YAML::LoadFile(path);
    if (!root.IsMap()) {
      return invalid_argument("synthetic model '" + path + "' must be a YAML mapping");
    }
    for (const auto& entry : root) {
      const std::string key = entry.first.as<std::string>();
      if (key != "service_time" && key != "cpu_us" && key != "saturation" && key != "seed" &&
          key != "load_ms" && key != "max_concurrency" && key != "runtime") {
        return invalid_argument("synthetic model '" + path + "': unknown field '" + key + "'");
      }
    }
    if (YAML::Node service = root["service_time"]) {
      const std::string dist = service["dist"] ? service["dist"].as<std::string>() : "fixed";
      if (dist == "fixed") {
        spec.distribution = Distribution::kFixed;
      } else if (dist == "exponential") {
        spec.distribution = Distribution::kExponential;
      } else if (dist == "lognormal") {
        spec.distribution = Distribution::kLognormal;
      } else {
        return invalid_argument("synthetic model '" + path + "': service_time.dist '" + dist +
                                "' is not fixed, exponential or lognormal");
      }
      spec.mean_ms = service["mean_ms"] ? service["mean_ms"].as<double>() : 0;
      if (service["sigma"]) {
        spec.sigma = service["sigma"].as<double>();
      }
    }
    if (root["cpu_us"])
      spec.cpu_us = root["cpu_us"].as<int64_t>();
    if (root["saturation"])
      spec.saturation = root["saturation"].as<int64_t>();
    if (root["max_concurrency"])
      spec.max_concurrency = root["max_concurrency"].as<int64_t>();
    if (root["seed"])
      spec.seed = root["seed"].as<uint64_t>();
    if (YAML::Node load = root["load_ms"]) {
      // decode() rather than as<>(): a non-number must name the field, not "bad conversion".
      if (!load.IsScalar() || !YAML::convert<double>::decode(load, spec.load_ms)) {
        spec.load_ms = std::nan("");  // rejected below, with the range
      }
    }
  } catch (const std::exception& e) {
    return invalid_argument("cannot read synthetic model '" + path + "': " + e.what());
  }
  if (!(spec.mean_ms >= 0) || spec.mean_ms > 3'600'000) {
    return invalid_argument("synthetic model '" + path +
                            "': service_time.mean_ms must be in [0, 3600000]");
  }
  if (!(spec.sigma > 0) || spec.sigma > 10) {
    return invalid_argument("synthetic model '" + path +
                            "': service_time.sigma must be in (0, 10]");
  }
  if (spec.cpu_us < 0 || spec.cpu_us > 10'000'000) {
    return invalid_argument("synthetic model '" + path + "': cpu_us must be in [0, 10000000]");
  }
  if (spec.saturation < 0) {
    return invalid_argument("synthetic model '" + path + "': saturation must be >= 0");
  }
  if (spec.max_concurrency < 0) {
    return invalid_argument("synthetic model '" + path + "': max_concurrency must be >= 0");
  }
  if (!(spec.load_ms >= 0) || spec.load_ms > 3'600'000) {
    return invalid_argument("synthetic model '" + path +
                            "': load_ms must be a number in [0, 3600000]");
  }
  return spec;
}

int64_t thread_cpu_ns() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

void burn_cpu(int64_t microseconds) {
  const int64_t until = thread_cpu_ns() + microseconds * 1000;
  volatile uint64_t sink = 0;
  while (thread_cpu_ns() < until) {
    for (int i = 0; i < 1000; ++i) {
      sink = sink + i;
    }
  }
}

class SyntheticRuntime final : public Runtime {
 public:
  SyntheticRuntime(const SyntheticSpec& spec, const std::string& name)
      : spec_(spec), random_(spec.seed), timer_thread_([this] { context_.run(); }) {
    metadata_.name = name;
    metadata_.platform = "synthetic";
    metadata_.inputs.push_back({"input", DataType::kFp32, {-1, -1}});
    metadata_.outputs.push_back({"output", DataType::kFp32, {-1}});
  }
  ~SyntheticRuntime() override {
    guard_.reset();
    context_.stop();
    timer_thread_.join();
  }

  const ModelMetadata& metadata() const override { return metadata_; }
  bool can_batch() const override { return false; }

  Result<ModelInput> prepare(const InferRequest& request) const override {
    if (request.inputs.empty()) {
      return invalid_argument("the request has no inputs");
    }
    const Tensor& first = request.inputs[0];
    const int64_t rows = first.shape.size() >= 2 ? first.shape[0] : 1;
    if (rows == 0 || first.element_count() == 0) {
      return invalid_argument("the input has no rows");
    }
    return ModelInput{rows, 0, {}};
  }

  void run(ModelInput&& input, RunCallback done) override {
    {
      MutexLock lock(queue_mutex_);
      if (spec_.max_concurrency > 0 && serving_ >= spec_.max_concurrency) {
        account_waiting(Clock::now());
        queue_.push_back(Waiting{input.rows, std::move(done)});
        return;
      }
      ++serving_;
    }
    start(input.rows, std::move(done));
  }

  double queue_wait_seconds() const override {
    MutexLock lock(queue_mutex_);
    return queue_integral(Clock::now());
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Waiting {
    int64_t rows = 0;
    RunCallback done;
  };

  // The integral of the queue's length over time up to `now`: what was accounted, plus the
  // current length since it last changed.
  double queue_integral(Clock::time_point now) const FLOTILLA_REQUIRES(queue_mutex_) {
    return waited_seconds_ + static_cast<double>(queue_.size()) *
                                 std::chrono::duration<double>(now - counted_until_).count();
  }

  // Brings the integral up to `now`; called before each change of queue_.
  void account_waiting(Clock::time_point now) FLOTILLA_REQUIRES(queue_mutex_) {
    waited_seconds_ = queue_integral(now);
    counted_until_ = now;
  }

  // Serves one request that holds a slot (counted in serving_).
  void start(int64_t rows, RunCallback done) {
    const int64_t in_flight = in_flight_.fetch_add(1) + 1;
    burn_cpu(spec_.cpu_us);
    double wait_ms = draw_service_ms();
    if (spec_.saturation > 0 && in_flight > spec_.saturation) {
      wait_ms *= static_cast<double>(in_flight) / static_cast<double>(spec_.saturation);
    }
    // A lognormal tail can draw absurd values; an hour bounds the wait (and the cast).
    wait_ms = std::min(wait_ms, 3'600'000.0);
    auto timer = std::make_shared<asio::steady_timer>(
        context_, std::chrono::microseconds(static_cast<int64_t>(wait_ms * 1000)));
    timer->async_wait(
        [this, timer, rows, done = std::move(done)](const boost::system::error_code&) {
          in_flight_.fetch_sub(1);
          Tensor output{"output", DataType::kFp32, {rows}, {}};
          output.data.resize(static_cast<size_t>(rows) * sizeof(float));
          std::vector<Tensor> outputs;
          outputs.push_back(std::move(output));
          done(std::move(outputs));
          serve_next();
        });
  }

  // A slot freed: the longest-waiting request takes it.
  void serve_next() {
    Waiting next;
    {
      MutexLock lock(queue_mutex_);
      if (queue_.empty()) {
        --serving_;
        return;
      }
      account_waiting(Clock::now());
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    start(next.rows, std::move(next.done));
  }

  double draw_service_ms() {
    MutexLock lock(random_mutex_);
    switch (spec_.distribution) {
      case Distribution::kFixed:
        return spec_.mean_ms;
      case Distribution::kExponential:
        return spec_.mean_ms <= 0
                   ? 0
                   : std::exponential_distribution<double>(1.0 / spec_.mean_ms)(random_);
      case Distribution::kLognormal: {
        if (spec_.mean_ms <= 0) {
          return 0;
        }
        // Chosen so that the distribution's mean is mean_ms.
        const double mu = std::log(spec_.mean_ms) - spec_.sigma * spec_.sigma / 2;
        return std::lognormal_distribution<double>(mu, spec_.sigma)(random_);
      }
    }
    return spec_.mean_ms;
  }

  SyntheticSpec spec_;
  ModelMetadata metadata_;
  Mutex random_mutex_;
  std::mt19937_64 random_ FLOTILLA_GUARDED_BY(random_mutex_);
  std::atomic<int64_t> in_flight_{0};
  mutable Mutex queue_mutex_;
  int64_t serving_ FLOTILLA_GUARDED_BY(queue_mutex_) = 0;  // requests holding a slot
  // Waiting for a slot, oldest first.
  std::deque<Waiting> queue_ FLOTILLA_GUARDED_BY(queue_mutex_);
  // The queue length's integral up to counted_until_.
  double waited_seconds_ FLOTILLA_GUARDED_BY(queue_mutex_) = 0;
  Clock::time_point counted_until_ FLOTILLA_GUARDED_BY(queue_mutex_) = Clock::now();
  asio::io_context context_{1};
  asio::executor_work_guard<asio::io_context::executor_type> guard_{context_.get_executor()};
  std::thread timer_thread_;
};

}  // namespace

Result<std::unique_ptr<Runtime>> load_synthetic_runtime(const std::string& path,
                                                        const RuntimeOptions& options) {
  FLOTILLA_ASSIGN_OR_RETURN(SyntheticSpec spec, parse_spec(path));
  // Stands for a real model's load: blocks the loading thread, as XGBoost's load does.
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(spec.load_ms));
  return std::unique_ptr<Runtime>(std::make_unique<SyntheticRuntime>(spec, options.name));
}

}  // namespace flotilla::runtime

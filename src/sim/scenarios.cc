// The shipped scenarios, trace loading and policy names.
#include <cmath>
#include <fstream>
#include <map>

#include "sim/sim.h"

namespace flotilla::sim {

double LoadShape::rate_at(double seconds) const {
  if (!per_second.empty()) {
    const auto index = static_cast<size_t>(std::max(0.0, seconds));
    return index < per_second.size() ? per_second[index] : 0;
  }
  if (points.empty() || seconds <= points.front().first) {
    return points.empty() ? 0 : points.front().second;
  }
  for (size_t i = 1; i < points.size(); ++i) {
    if (seconds <= points[i].first) {
      const auto& [t0, r0] = points[i - 1];
      const auto& [t1, r1] = points[i];
      return t1 == t0 ? r1 : r0 + (r1 - r0) * (seconds - t0) / (t1 - t0);
    }
  }
  return points.back().second;
}

double LoadShape::end_seconds() const {
  return !per_second.empty() ? static_cast<double>(per_second.size())
                             : (points.empty() ? 0 : points.back().first);
}

namespace {

// Decision to ready of a new replica, per runtime, as bench/control/cold_start.py measures it on
// `flotilla up` (bench/RESULTS.md, "Cold start per runtime"): an XGBoost model's replica from the
// warm pool or as a fresh process, and a pod's start in Kubernetes mode (the *-pod variants).
constexpr double kXgboostColdStartS = 0.025;
constexpr double kLlmColdStartS = 0.6;  // the 50M-parameter bf16 benchmark model
constexpr double kPodColdStartS = 5;

// The 10 ms model of most scenarios is an XGBoost-sized one: it starts as fast as one.
Scenario base(std::string name, std::string description) {
  Scenario scenario;
  scenario.name = std::move(name);
  scenario.description = std::move(description);
  scenario.replica.cold_start_s = kXgboostColdStartS;
  return scenario;
}

// The same scenario with pods' cold starts, as in Kubernetes mode.
void add_with_pod_variant(std::map<std::string, Scenario>& all, Scenario scenario) {
  all[scenario.name] = scenario;
  scenario.name += "-pod";
  scenario.description += " (pods: 5 s cold starts)";
  scenario.replica.cold_start_s = kPodColdStartS;
  all[scenario.name] = scenario;
}

std::map<std::string, Scenario> all_scenarios() {
  std::map<std::string, Scenario> all;
  {
    Scenario s = base("spike", "1K req/s, then 10x within 5 s for 3 minutes, then back");
    s.load.points = {{0, 1000}, {120, 1000}, {125, 10000}, {300, 10000}, {305, 1000}, {600, 1000}};
    s.initial_replicas = 2;
    add_with_pod_variant(all, s);
  }
  {
    Scenario s = base("diurnal", "a day compressed to 24 minutes: 500 to 5K req/s and back");
    for (int minute = 0; minute <= 1440; minute += 10) {
      const double phase = 2 * 3.141592653589793 * minute / 1440;
      s.load.points.emplace_back(minute, 500 + 4500 * (1 - std::cos(phase)) / 2);
    }
    s.initial_replicas = 1;
    all[s.name] = s;
  }
  {
    // Issue 21's forecasting scenario: a pattern that repeats, with a peak no reactive policy
    // meets on time (a nightly batch job), five days (each compressed as `diurnal`'s).
    Scenario s = base("days",
                      "5 days, each compressed to 24 minutes: 500 to 5K req/s and back, and a "
                      "batch job at 02:00 adding 6K req/s for 30 s");
    constexpr double kDay = 1440;
    for (int day = 0; day < 5; ++day) {
      const double start = day * kDay;
      for (int minute = 0; minute < 1440; minute += 10) {
        const double phase = 2 * 3.141592653589793 * minute / 1440;
        const double rate = 500 + 4500 * (1 - std::cos(phase)) / 2;
        if (minute > 120 && minute <= 150) {
          continue;  // the job's own points below hold these minutes
        }
        s.load.points.emplace_back(start + minute, rate);
        if (minute == 120) {  // 02:00: the job starts within a second and runs 30 s
          s.load.points.emplace_back(start + 120.001, rate);
          s.load.points.emplace_back(start + 121, rate + 6000);
          s.load.points.emplace_back(start + 150, rate + 6000);
          s.load.points.emplace_back(start + 151, rate);
        }
      }
    }
    s.load.points.emplace_back(5 * kDay, 500);
    s.season_s = kDay;
    s.initial_replicas = 1;
    add_with_pod_variant(all, s);
  }
  {
    Scenario s = base("ramp", "10 to 10K req/s in 60 s, then held");
    s.load.points = {{0, 10}, {30, 10}, {90, 10000}, {300, 10000}};
    s.initial_replicas = 1;
    add_with_pod_variant(all, s);
  }
  {
    Scenario s = base("zero", "200 req/s, nothing for 8 minutes, then 200 req/s again");
    s.load.points = {{0, 200}, {120, 200}, {120.001, 0}, {600, 0}, {600.001, 200}, {720, 200}};
    s.min_replicas = 0;
    s.initial_replicas = 1;
    s.queue_timeout_s = 30;  // requests held while the first replica cold-starts
    add_with_pod_variant(all, s);
  }
  {
    Scenario s = base("unknown-capacity",
                      "replicas take 32 concurrent requests but are configured for 4: learn it "
                      "(10K req/s of 20 ms for 30 minutes)");
    s.load.points = {{0, 10000}, {1800, 10000}};
    s.replica.service_ms = 20;
    s.replica.saturation = 32;
    s.configured_concurrency = 4;
    s.slo_ms = 200;
    s.initial_replicas = 50;  // 200 in flight at 4 each
    all[s.name] = s;
  }
  {
    Scenario s = base("batched",
                      "continuous-batching replicas (batch 32, 50 steps a request) configured "
                      "for 64: 100 to 400 req/s and back");
    s.load.points = {{0, 100}, {120, 100}, {180, 400}, {480, 400}, {540, 100}, {900, 100}};
    s.replica.cold_start_s = kLlmColdStartS;
    s.replica.max_batch = 32;
    s.replica.step_ms = 20;
    s.replica.step_ms_per_item = 0.5;
    s.replica.steps_per_request = 50;  // alone 1.0 s, in a full batch 1.8 s
    s.configured_concurrency = 64;
    s.slo_ms = 3000;
    s.queue_timeout_s = 30;
    s.initial_replicas = 4;
    all[s.name] = s;
  }
  {
    Scenario s = base("crashes", "3K req/s; every replica crashes once every 2 minutes on average");
    s.load.points = {{0, 3000}, {600, 3000}};
    s.replica.crash_mtbf_s = 120;
    s.initial_replicas = 4;
    all[s.name] = s;
  }
  {
    Scenario s = base("steady", "1K req/s for 10 minutes (with --rate-scale: the scale test)");
    s.load.points = {{0, 1000}, {600, 1000}};
    s.initial_replicas = 2;
    all[s.name] = s;
  }
  {
    Scenario s = base("hetero", "3K req/s on a fleet where 30% of replicas are 3x slower");
    s.load.points = {{0, 3000}, {300, 3000}};
    s.replica.slow_fraction = 0.3;
    s.initial_replicas = 8;
    all[s.name] = s;
  }
  {
    // The balancer's study (issue #25): run-peers.sh MODE=hetero's fleet, where replicas queue
    // inside (one slot: n in flight share it) and the gateway does not cap them. Exponential
    // service times are a lognormal of the same mean and spread (sigma sqrt(ln 2): CV 1).
    Scenario s = base("slow-replica",
                      "300 req/s on 4 replicas of one slot, 2 ms each, one of them 5x slower "
                      "(run-peers.sh MODE=hetero's fleet; --policy static)");
    s.load.points = {{0, 300}, {120, 300}};
    s.replica.service_ms = 2;
    s.replica.service_sigma = std::sqrt(std::log(2.0));
    s.replica.exact_sharing = true;
    s.replica.saturation = 1;
    s.replica.slow_first = 1;
    s.replica.slow_factor = 5;
    s.configured_concurrency = 1000;  // no cap at the gateway, as in the benchmark
    s.initial_replicas = 4;
    s.min_replicas = 4;
    s.max_replicas = 4;
    all[s.name] = s;
  }
  {
    // The gateway-fleet study (docs/fleet.md, bench/sim/fleet.py): a fixed fleet (--policy
    // static --static-replicas 160: 1000 in flight on 1280 slots, 78%) behind --gateways N
    // that sample every --gateway-sample-ms.
    Scenario s = base("fleet",
                      "200K req/s for 20 s of 5 ms requests (lognormal, sigma 0.5) on 160 "
                      "replicas of 8 slots: the gateway-fleet study");
    s.load.points = {{0, 200'000}, {20, 200'000}};
    s.replica.service_ms = 5;
    s.replica.service_sigma = 0.5;
    s.replica.exact_sharing = true;  // stale views overshoot the cap: slowing must be exact
    s.replica.saturation = 8;
    s.configured_concurrency = 8;
    s.slo_ms = 50;
    s.queue_timeout_s = 1;
    s.min_replicas = 160;
    s.initial_replicas = 160;
    all[s.name] = s;
    // The same at 1M req/s per endpoint on 800 replicas, for 5 s (5M requests, as many as the
    // 200K run's: a bounded run time).
    s.name = "fleet-1m";
    s.description =
        "1M req/s for 5 s of the same requests on 800 replicas: the gateway-fleet study at 1M";
    s.load.points = {{0, 1'000'000}, {5, 1'000'000}};
    s.min_replicas = 800;
    s.initial_replicas = 800;
    all[s.name] = s;
  }
  return all;
}

// "YYYY-MM-DD HH:MM:SS[.fraction]" or plain seconds → seconds since an arbitrary epoch.
std::optional<double> parse_timestamp(const std::string& text) {
  int year, month, day, hour, minute;
  double second;
  if (std::sscanf(text.c_str(), "%d-%d-%d %d:%d:%lf", &year, &month, &day, &hour, &minute,
                  &second) == 6) {
    // Days from the civil date (Howard Hinnant's algorithm).
    year -= month <= 2;
    const int era = (year >= 0 ? year : year - 399) / 400;
    const int yoe = year - era * 400;
    const int doy = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1;
    const int doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    const double days = era * 146097.0 + doe - 719468;
    return days * 86400 + hour * 3600 + minute * 60 + second;
  }
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() && *end == '\0') {
    return value;
  }
  return std::nullopt;
}

}  // namespace

std::optional<Scenario> find_scenario(std::string_view name) {
  auto all = all_scenarios();
  auto it = all.find(std::string(name));
  if (it == all.end()) {
    return std::nullopt;
  }
  return it->second;
}

std::vector<std::string> scenario_names() {
  std::vector<std::string> names;
  for (const auto& [name, scenario] : all_scenarios()) {
    names.push_back(name);
  }
  return names;
}

Result<Scenario> trace_scenario(const std::string& path, double rate_scale) {
  if (!(rate_scale > 0)) {
    return invalid_argument("--rate-scale must be above 0");
  }
  std::ifstream file(path);
  if (!file) {
    return invalid_argument("cannot read trace '" + path + "'");
  }
  std::string line;
  std::vector<double> times;
  size_t line_number = 0;
  while (std::getline(file, line)) {
    ++line_number;
    const std::string first = line.substr(0, line.find(','));
    const auto time = parse_timestamp(first);
    if (!time) {
      if (line_number == 1) {
        continue;  // the header
      }
      return invalid_argument(path + ":" + std::to_string(line_number) + ": '" + first +
                              "' is not a timestamp");
    }
    times.push_back(*time);
  }
  if (times.empty()) {
    return invalid_argument("trace '" + path + "' has no requests");
  }
  std::sort(times.begin(), times.end());
  Scenario scenario = base("trace", "replay of " + path);
  const double start = times.front();
  const auto seconds = static_cast<size_t>(times.back() - start) + 1;
  scenario.load.per_second.assign(seconds, 0);
  for (double time : times) {
    scenario.load.per_second[static_cast<size_t>(time - start)] += rate_scale;
  }
  scenario.min_replicas = 1;
  scenario.initial_replicas = 1;
  return scenario;
}

void repeat_load(Scenario& scenario, int64_t times) {
  const double length = scenario.load.end_seconds();
  if (times <= 1 || length <= 0) {
    return;
  }
  LoadShape& load = scenario.load;
  if (!load.per_second.empty()) {
    const std::vector<double> once = load.per_second;
    for (int64_t play = 1; play < times; ++play) {
      load.per_second.insert(load.per_second.end(), once.begin(), once.end());
    }
  } else {
    const auto once = load.points;
    for (int64_t play = 1; play < times; ++play) {
      for (const auto& [time, rate] : once) {
        // Just after the play before it ends, so time stays sorted.
        load.points.emplace_back(
            std::max(time + length * static_cast<double>(play), load.points.back().first + 0.001),
            rate);
      }
    }
  }
  scenario.season_s = length;
  scenario.description += " (played " + std::to_string(times) + " times, each a day)";
}

void scale_rate(Scenario& scenario, double factor) {
  for (auto& [time, rate] : scenario.load.points) {
    rate *= factor;
  }
  for (double& rate : scenario.load.per_second) {
    rate *= factor;
  }
  scenario.initial_replicas = std::max<int64_t>(
      scenario.min_replicas,
      static_cast<int64_t>(std::ceil(static_cast<double>(scenario.initial_replicas) * factor)));
  scenario.max_replicas = std::max(
      scenario.max_replicas,
      static_cast<int64_t>(std::ceil(static_cast<double>(scenario.max_replicas) * factor)));
}

Result<PolicyKind> parse_policy_kind(std::string_view name) {
  if (name == "apa")
    return PolicyKind::kApa;
  if (name == "hpa")
    return PolicyKind::kHpa;
  if (name == "kpa")
    return PolicyKind::kKpa;
  if (name == "kpa-default")
    return PolicyKind::kKpaDefault;
  if (name == "ray")
    return PolicyKind::kRay;
  if (name == "ray-auto")
    return PolicyKind::kRayAuto;
  if (name == "static")
    return PolicyKind::kStatic;
  return invalid_argument("unknown policy '" + std::string(name) +
                          "' (use apa, hpa, kpa, kpa-default, ray, ray-auto or static)");
}

std::string_view policy_name(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kApa:
      return "apa";
    case PolicyKind::kHpa:
      return "hpa";
    case PolicyKind::kKpa:
      return "kpa";
    case PolicyKind::kKpaDefault:
      return "kpa-default";
    case PolicyKind::kRay:
      return "ray";
    case PolicyKind::kRayAuto:
      return "ray-auto";
    case PolicyKind::kStatic:
      return "static";
  }
  return "";
}

}  // namespace flotilla::sim

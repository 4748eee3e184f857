// The fleet simulator: one endpoint, its replicas, the gateway in front (balancer, per-replica
// caps, bounded queue with deadline) and an autoscaler policy, advanced event by event.
//
// Modelling choices (docs/sim.md):
// - Arrivals are Poisson at the load shape's current rate (the gap is drawn at the rate in
//   force when the previous request arrived).
// - A request's service time is fixed when it starts: service_ms x max(1, n / saturation) /
//   speed, n counting it. (Exact processor sharing would re-time every request at each change.)
// - Replicas start after a lognormal cold start; scale-down removes starting replicas first,
//   then drains ready ones (no new requests, gone when empty).
// - The policy sees what the live loop will: 1 s samples of mean in-flight and queue.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <queue>

#include "autoscaler/autoscaler.h"
#include "gateway/gateway.h"
#include "sim/sim.h"

namespace flotilla::sim {
namespace {

using autoscaler::Millis;

enum class EventKind : uint8_t { kArrival, kCompletion, kReady, kSecond, kDecide, kVertical };

struct Event {
  double time;
  uint64_t sequence;  // ties broken by creation order: deterministic
  EventKind kind;
  uint32_t replica;
  double arrival;  // completions: when the request arrived
  double service;  // completions: its time at the replica
  bool operator>(const Event& other) const {
    return time != other.time ? time > other.time : sequence > other.sequence;
  }
};

enum class ReplicaPhase : uint8_t { kStarting, kReady, kDraining, kGone };

struct Replica {
  ReplicaPhase phase = ReplicaPhase::kGone;
  double speed = 1;
  int64_t in_flight = 0;
  uint64_t generation = 0;  // a slot reused by a new replica ignores the old one's events
};

// Latencies in log buckets (5% wide) from 0.01 ms: percentiles within 5%.
class LatencyHistogram {
 public:
  void add(double ms) {
    const int bucket =
        ms <= kMin ? 0
                   : std::min<int>(kBuckets - 1,
                                   static_cast<int>(std::log(ms / kMin) / std::log(kRatio)) + 1);
    ++counts_[bucket];
    ++total_;
  }
  double percentile(double q) const {
    if (total_ == 0) {
      return 0;
    }
    const double rank = q * static_cast<double>(total_);
    uint64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
      seen += counts_[i];
      if (static_cast<double>(seen) >= rank) {
        return kMin * std::pow(kRatio, i);  // the bucket's upper bound
      }
    }
    return kMin * std::pow(kRatio, kBuckets - 1);
  }
  void clear() {
    std::fill(std::begin(counts_), std::end(counts_), 0);
    total_ = 0;
  }
  uint64_t total() const { return total_; }

 private:
  static constexpr double kMin = 0.01;
  static constexpr double kRatio = 1.05;
  static constexpr int kBuckets = 400;  // up to about 3e6 ms
  uint64_t counts_[kBuckets] = {};
  uint64_t total_ = 0;
};

class Simulator {
 public:
  Simulator(const Scenario& scenario, const SimOptions& options)
      : scenario_(scenario),
        options_(options),
        random_(options.seed),
        balancer_(gateway::make_balancer(options.round_robin ? gateway::BalancerKind::kRoundRobin
                                                             : gateway::BalancerKind::kPowerOfTwo)),
        vertical_(vertical_options(scenario)) {
    make_policy();
  }

  SimResult run() {
    const auto wall_start = std::chrono::steady_clock::now();
    const double end = scenario_.load.end_seconds();
    // Static provisioning is in place from the start; the others start from the scenario's.
    const int64_t initial =
        options_.policy == PolicyKind::kStatic ? static_replicas_ : scenario_.initial_replicas;
    for (int64_t i = 0; i < initial; ++i) {
      add_replica(/*cold=*/false);
    }
    desired_ = initial;
    schedule(0, EventKind::kArrival);
    schedule(1, EventKind::kSecond);
    schedule(seconds_of(policy_->period()), EventKind::kDecide);
    if (options_.policy == PolicyKind::kApa) {
      schedule(seconds_of(vertical_options(scenario_).period), EventKind::kVertical);
    }
    while (!events_.empty()) {
      const Event event = events_.top();
      if (event.time > end) {
        break;
      }
      events_.pop();
      advance(event.time);
      ++processed_;
      handle(event);
    }
    advance(end);
    result_.summary.events = processed_;
    result_.summary.wall_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    finish_summary();
    return std::move(result_);
  }

 private:
  static double seconds_of(Millis millis) { return static_cast<double>(millis.count()) / 1000; }

  static autoscaler::VerticalOptions vertical_options(const Scenario& scenario) {
    autoscaler::VerticalOptions options;
    options.initial_target = scenario.configured_concurrency;
    options.min_target = 1;
    options.max_target = 256;
    return options;
  }

  void make_policy() {
    const autoscaler::ReplicaRange range{scenario_.min_replicas, scenario_.max_replicas,
                                         scenario_.min_replicas == 0};
    const double per_replica = scenario_.configured_concurrency;
    switch (options_.policy) {
      case PolicyKind::kApa: {
        autoscaler::ApaOptions options;
        options.range = range;
        policy_ = autoscaler::make_apa_policy(options, vertical_.target_ptr());
        break;
      }
      case PolicyKind::kHpa: {
        autoscaler::HpaOptions options;
        options.range = range;
        options.target_per_replica = 0.7 * per_replica;
        policy_ = autoscaler::make_hpa_policy(options);
        break;
      }
      case PolicyKind::kKpa: {
        autoscaler::KpaOptions options;
        options.range = range;
        options.container_concurrency = per_replica;
        policy_ = autoscaler::make_kpa_policy(options);
        break;
      }
      case PolicyKind::kRay: {
        autoscaler::RayOptions options;
        options.range = range;
        policy_ = autoscaler::make_ray_policy(options);
        break;
      }
      case PolicyKind::kStatic: {
        int64_t replicas = options_.static_replicas;
        if (replicas <= 0) {
          // Provisioned for the peak at 70% of the configured concurrency (Little's law).
          double peak = 0;
          for (const auto& [t, rate] : scenario_.load.points) {
            peak = std::max(peak, rate);
          }
          for (double rate : scenario_.load.per_second) {
            peak = std::max(peak, rate);
          }
          replicas = std::max<int64_t>(
              1, static_cast<int64_t>(
                     std::ceil(peak * scenario_.replica.service_ms / 1000 / (0.7 * per_replica))));
        }
        static_replicas_ = replicas;
        policy_ = autoscaler::make_static_policy(replicas);
        break;
      }
    }
  }

  void schedule(double time, EventKind kind, uint32_t replica = 0, double arrival = 0,
                double service = 0) {
    events_.push(Event{time, sequence_++, kind, replica, arrival, service});
  }

  double uniform() {
    return (static_cast<double>(random_.next() >> 11) + 0.5) / 9007199254740992.0;
  }
  double exponential(double mean) { return -std::log(uniform()) * mean; }
  double normal() {
    return std::sqrt(-2 * std::log(uniform())) * std::cos(2 * 3.141592653589793 * uniform());
  }

  // Integrals for the per-second means and replica-seconds, up to `time`.
  void advance(double time) {
    const double dt = time - now_;
    if (dt > 0) {
      in_flight_area_ += static_cast<double>(in_flight_) * dt;
      queued_area_ += static_cast<double>(queue_.size()) * dt;
      result_.summary.replica_seconds += static_cast<double>(ready_ + starting_) * dt;
      now_ = time;
    }
  }

  void handle(const Event& event) {
    switch (event.kind) {
      case EventKind::kArrival:
        on_arrival(/*request=*/event.replica == 0);
        break;
      case EventKind::kCompletion:
        on_completion(event);
        break;
      case EventKind::kReady:
        // A slot cancelled while starting may hold a newer replica by now.
        if (replicas_[event.replica].generation == static_cast<uint64_t>(event.arrival)) {
          on_ready(event.replica);
        }
        break;
      case EventKind::kSecond:
        on_second();
        break;
      case EventKind::kDecide:
        on_decide();
        break;
      case EventKind::kVertical:
        on_vertical();
        break;
    }
  }

  // `request`: a request arrives; else it is only a look at the rate after an idle stretch.
  void on_arrival(bool request) {
    if (request) {
      ++arrivals_;
      ++second_arrivals_;
      // Behind a non-empty queue there is no free slot (freed slots go to waiters at once).
      if (!queue_.empty() || !try_start(now_)) {
        if (static_cast<int64_t>(queue_.size()) < scenario_.queue_capacity) {
          queue_.push_back(now_);
        } else {
          reject();
        }
      }
    }
    const double rate = scenario_.load.rate_at(now_);
    if (rate > 0) {
      schedule(now_ + exponential(1 / rate), EventKind::kArrival);
    } else {
      schedule(std::floor(now_) + 1, EventKind::kArrival, /*replica=*/1);  // look again
    }
  }

  bool try_start(double arrival) {
    const auto index = balancer_->pick(candidates_, random_);
    if (!index) {
      return false;
    }
    start_on(*index, arrival);
    return true;
  }

  void start_on(uint32_t slot, double arrival) {
    Replica& replica = replicas_[slot];
    ++replica.in_flight;
    ++in_flight_;
    candidates_[slot].in_flight = replica.in_flight;
    const double load =
        std::max(1.0, static_cast<double>(replica.in_flight) / scenario_.replica.saturation);
    const double service = scenario_.replica.service_ms / 1000 * load / replica.speed;
    schedule(now_ + service, EventKind::kCompletion, slot, arrival, service);
  }

  void on_completion(const Event& event) {
    Replica& replica = replicas_[event.replica];
    --replica.in_flight;
    --in_flight_;
    candidates_[event.replica].in_flight = replica.in_flight;
    const double latency_ms = (now_ - event.arrival) * 1000;
    second_latency_.add(latency_ms);
    total_latency_.add(latency_ms);
    ++completed_;
    ++second_completions_;
    if (latency_ms > scenario_.slo_ms) {
      ++over_slo_;
    }
    window_service_ms_ += event.service * 1000;
    ++window_completions_;
    if (replica.phase == ReplicaPhase::kDraining && replica.in_flight == 0) {
      replica.phase = ReplicaPhase::kGone;
      free_slots_.push_back(event.replica);
    }
    drain_queue_to(event.replica);
  }

  // The slot a completion freed (or a new replica's slots) go to the oldest waiters, as in the
  // gateway; O(1) per request where a balancer pick would scan a saturated fleet.
  void drain_queue_to(uint32_t slot) {
    const gateway::Candidate& candidate = candidates_[slot];
    while (!queue_.empty() && gateway::has_room(candidate)) {
      if (queue_.front() + scenario_.queue_timeout_s < now_) {
        queue_.pop_front();
        reject();
        continue;
      }
      start_on(slot, queue_.front());
      queue_.pop_front();
    }
  }

  void drain_queue() {
    while (!queue_.empty()) {
      if (queue_.front() + scenario_.queue_timeout_s < now_) {
        queue_.pop_front();
        reject();
        continue;
      }
      if (!try_start(queue_.front())) {
        return;
      }
      queue_.pop_front();
    }
  }

  void reject() {
    ++rejected_;
    ++second_rejected_;
  }

  uint32_t add_replica(bool cold) {
    uint32_t slot;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = static_cast<uint32_t>(replicas_.size());
      replicas_.emplace_back();
      candidates_.emplace_back();
    }
    Replica& replica = replicas_[slot];
    replica = Replica{ReplicaPhase::kStarting, 1, 0, replica.generation + 1};
    if (scenario_.replica.slow_fraction > 0 && uniform() < scenario_.replica.slow_fraction) {
      replica.speed = 1 / scenario_.replica.slow_factor;
    }
    candidates_[slot] = gateway::Candidate{false, 0, cap()};
    ++starting_;
    if (cold) {
      const double mean = scenario_.replica.cold_start_s;
      const double sigma = 0.25;
      const double delay = mean * std::exp(sigma * normal() - sigma * sigma / 2);
      starting_slots_.push_back(slot);
      schedule(now_ + delay, EventKind::kReady, slot, static_cast<double>(replica.generation));
    } else {
      on_ready(slot);
    }
    return slot;
  }

  void on_ready(uint32_t slot) {
    Replica& replica = replicas_[slot];
    if (replica.phase != ReplicaPhase::kStarting) {
      return;  // cancelled while starting
    }
    starting_slots_.erase(std::remove(starting_slots_.begin(), starting_slots_.end(), slot),
                          starting_slots_.end());
    replica.phase = ReplicaPhase::kReady;
    --starting_;
    ++ready_;
    ready_slots_.push_back(slot);
    candidates_[slot].ready = true;
    drain_queue_to(slot);
  }

  // Every policy runs behind the same gateway: the per-replica cap is APA's learned target,
  // and for the baselines the per-replica concurrency a user configured for them.
  int64_t cap() const {
    return std::max<int64_t>(
        1, std::llround(options_.policy == PolicyKind::kApa ? vertical_.target()
                                                            : scenario_.configured_concurrency));
  }

  void on_second() {
    SecondStats stats;
    stats.second = static_cast<int64_t>(std::llround(now_));
    stats.arrivals = second_arrivals_;
    stats.ready = ready_;
    stats.pending = starting_;
    stats.in_flight = in_flight_area_;  // the area over one second is the mean
    stats.queued = queued_area_;
    stats.p50_ms = second_latency_.percentile(0.5);
    stats.p99_ms = second_latency_.percentile(0.99);
    stats.rejected = second_rejected_;
    stats.target_concurrency = options_.policy == PolicyKind::kApa ? vertical_.target() : 0;
    result_.seconds.push_back(stats);
    window_.add(autoscaler::Sample{Millis(std::llround(now_ * 1000)), in_flight_area_, queued_area_,
                                   static_cast<double>(second_arrivals_),
                                   static_cast<double>(second_completions_)});
    window_in_flight_ += in_flight_area_;
    ++window_seconds_;
    in_flight_area_ = 0;
    queued_area_ = 0;
    second_arrivals_ = 0;
    second_completions_ = 0;
    second_rejected_ = 0;
    second_latency_.clear();
    drain_queue();  // answers what expired while nothing completed
    schedule(now_ + 1, EventKind::kSecond);
  }

  void on_decide() {
    const autoscaler::Decision decision = policy_->decide(
        Millis(std::llround(now_ * 1000)), window_, autoscaler::Fleet{ready_, starting_, desired_});
    if (decision.desired != desired_) {
      ++result_.summary.scale_events;
      desired_ = decision.desired;
    }
    while (ready_ + starting_ < desired_) {
      add_replica(/*cold=*/true);
    }
    while (ready_ + starting_ > desired_ && !starting_slots_.empty()) {
      const uint32_t slot = starting_slots_.back();
      starting_slots_.pop_back();
      replicas_[slot].phase = ReplicaPhase::kGone;
      free_slots_.push_back(slot);
      --starting_;
    }
    while (ready_ > desired_ && !ready_slots_.empty()) {
      const uint32_t slot = ready_slots_.back();  // the newest
      ready_slots_.pop_back();
      Replica& replica = replicas_[slot];
      candidates_[slot].ready = false;
      --ready_;
      if (replica.in_flight == 0) {
        replica.phase = ReplicaPhase::kGone;
        free_slots_.push_back(slot);
      } else {
        replica.phase = ReplicaPhase::kDraining;
      }
    }
    schedule(now_ + seconds_of(policy_->period()), EventKind::kDecide);
  }

  void on_vertical() {
    autoscaler::ReplicaSignals signals;
    const double per_replica =
        window_seconds_ > 0 && ready_ > 0
            ? window_in_flight_ / window_seconds_ / static_cast<double>(ready_)
            : 0;
    signals.latency_ms =
        window_completions_ > 0 ? window_service_ms_ / static_cast<double>(window_completions_) : 0;
    signals.concurrency = per_replica;
    signals.cpu_utilization = std::min(1.0, per_replica / scenario_.replica.saturation);
    vertical_.decide_target(signals);
    window_service_ms_ = 0;
    window_completions_ = 0;
    window_in_flight_ = 0;
    window_seconds_ = 0;
    const int64_t new_cap = cap();
    for (auto& candidate : candidates_) {
      candidate.cap = new_cap;
    }
    drain_queue();
    schedule(now_ + seconds_of(vertical_options(scenario_).period), EventKind::kVertical);
  }

  void finish_summary() {
    Summary& summary = result_.summary;
    summary.requests = arrivals_;
    const double total = static_cast<double>(std::max<uint64_t>(arrivals_, 1));
    summary.rejected_pct = 100.0 * static_cast<double>(rejected_) / total;
    summary.over_slo_pct = 100.0 * static_cast<double>(over_slo_ + rejected_) / total;
    summary.p99_ms = total_latency_.percentile(0.99);
    summary.final_target = options_.policy == PolicyKind::kApa ? vertical_.target() : 0;
  }

  const Scenario& scenario_;
  SimOptions options_;
  SeededRandom random_;
  std::unique_ptr<gateway::Balancer> balancer_;
  autoscaler::VerticalPolicy vertical_;
  std::unique_ptr<autoscaler::Policy> policy_;
  int64_t static_replicas_ = 0;  // the count of the static policy
  autoscaler::SampleWindow window_;

  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t sequence_ = 0;
  uint64_t processed_ = 0;
  double now_ = 0;

  std::vector<Replica> replicas_;
  std::vector<gateway::Candidate> candidates_;  // parallel to replicas_, for the balancer
  std::vector<uint32_t> free_slots_;
  std::vector<uint32_t> starting_slots_;
  std::vector<uint32_t> ready_slots_;
  int64_t ready_ = 0;
  int64_t starting_ = 0;
  int64_t desired_ = 0;
  int64_t in_flight_ = 0;
  std::deque<double> queue_;  // arrival times of waiting requests

  uint64_t arrivals_ = 0;
  uint64_t completed_ = 0;
  uint64_t rejected_ = 0;
  uint64_t over_slo_ = 0;
  uint64_t second_arrivals_ = 0;
  uint64_t second_completions_ = 0;
  uint64_t second_rejected_ = 0;
  double in_flight_area_ = 0;
  double queued_area_ = 0;
  LatencyHistogram second_latency_;
  LatencyHistogram total_latency_;
  double window_service_ms_ = 0;  // for the vertical policy, since its last cycle
  uint64_t window_completions_ = 0;
  double window_in_flight_ = 0;
  int64_t window_seconds_ = 0;

  SimResult result_;
};

}  // namespace

SimResult simulate(const Scenario& scenario, const SimOptions& options) {
  return Simulator(scenario, options).run();
}

std::string to_csv(const SimResult& result) {
  std::string out =
      "second,arrivals,ready,pending,in_flight,queued,p50_ms,p99_ms,rejected,target_concurrency\n";
  char line[256];
  for (const SecondStats& s : result.seconds) {
    std::snprintf(line, sizeof(line), "%lld,%llu,%lld,%lld,%.2f,%.2f,%.2f,%.2f,%llu,%.2f\n",
                  static_cast<long long>(s.second), static_cast<unsigned long long>(s.arrivals),
                  static_cast<long long>(s.ready), static_cast<long long>(s.pending), s.in_flight,
                  s.queued, s.p50_ms, s.p99_ms, static_cast<unsigned long long>(s.rejected),
                  s.target_concurrency);
    out += line;
  }
  return out;
}

}  // namespace flotilla::sim

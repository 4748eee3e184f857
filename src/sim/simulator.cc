// The fleet simulator: one endpoint, its replicas, the gateway in front (balancer, per-replica
// caps, bounded queue with deadline) and an autoscaler policy, advanced event by event.
//
// Modelling choices (docs/autoscaler.md "Simulator", docs/fleet.md):
// - Arrivals are Poisson at the load shape's current rate (the gap is drawn at the rate in
//   force when the previous request arrived).
// - Processor sharing: a request's service time is fixed when it starts: service_ms x
//   max(1, n / saturation) / speed, n counting it. (Exact processor sharing would re-time every
//   request at each change.)
//   With ReplicaModel::exact_sharing every running request is re-timed at each start and
//   completion there instead (one pending event per replica).
// - Batched engines step: the batch is formed at the start of each step from the requests
//   waiting at the replica, in arrival order; one event per step, not per request.
// - A crash loses the replica's requests; each is retried once (as the gateway retries a
//   request that got no response byte), then fails.
// - Replicas start after a lognormal cold start; scale-down removes starting replicas first,
//   then drains ready ones (no new requests, gone when empty).
// - Several gateways (Scenario::gateways, docs/fleet.md): each request arrives at one, drawn
//   uniformly; each picks and caps on its own view (its own in-flight per replica, exact, plus
//   the others' as last published) and queues on its own. A freed slot goes to the queue of the
//   gateway whose request freed it, then to the others' if their views show the room.
// - The policy sees what the live loop will: 1 s samples of mean in-flight and queue. APA runs
//   through autoscaler::EndpointAutoscaler, the glue `flotilla up` runs; the gateway's balancer
//   and admission queue are the gateway's own (gateway/gateway_policy.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>
#include <queue>
#include <span>

#include <fmt/format.h>

#include "autoscaler/autoscaler.h"
#include "gateway/gateway_policy.h"
#include "sim/sim.h"

namespace flotilla::sim {
namespace {

using autoscaler::Millis;

enum class EventKind : uint8_t {
  kArrival,
  kCompletion,
  kStep,
  kReady,
  kCrash,
  kSecond,
  kDecide,
  kVertical,
  kSharedDone,  // exact processor sharing: a replica's next completion (stamp: its sharing_stamp)
  kSample       // a gateway publishes its per-replica in-flight counts (replica: which gateway)
};

struct Event {
  double time;
  uint64_t sequence;  // ties broken by creation order: deterministic
  EventKind kind;
  uint32_t replica;
  uint32_t request;  // completions: which request
  uint64_t stamp;    // the generation (replica events) or attempt (completions) it belongs to
  bool operator>(const Event& other) const {
    return time != other.time ? time > other.time : sequence > other.sequence;
  }
};

struct Request {
  double arrival = 0;     // at the gateway
  double dispatched = 0;  // to its current replica
  uint64_t attempt = 0;   // a completion of an earlier attempt (lost in a crash) is stale
  uint32_t position = 0;  // processor sharing: its index in the replica's `running`
  int64_t steps_left = 0;
  double finish_work = 0;  // exact processor sharing: its replica's work when it is done
  uint32_t gateway = 0;    // the gateway it arrived at
  bool retried = false;
};

enum class ReplicaPhase : uint8_t { kStarting, kReady, kDraining, kGone };

struct Replica {
  ReplicaPhase phase = ReplicaPhase::kGone;
  double speed = 1;
  int64_t in_flight = 0;          // running + waiting
  uint64_t generation = 0;        // events of an earlier replica in this slot are stale
  std::vector<uint32_t> running;  // being served (processor sharing: all; batched: the batch)
  std::deque<uint32_t> waiting;   // batched: waiting for the next step (or room in the batch)
  bool stepping = false;
  // Exact processor sharing: the work (seconds alone) each running request has received since
  // the replica started, as of work_time; sharing_stamp: which completion event is current.
  double work = 0;
  double work_time = 0;
  uint64_t sharing_stamp = 0;
  double started_at = -1;  // when it was asked for; -1: it was there at the run's start
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

// Requests per second one replica of full speed completes with `concurrency` in flight.
double throughput_per_replica(const ReplicaModel& model, double concurrency) {
  if (model.max_batch > 0) {
    const double batch = std::min(concurrency, static_cast<double>(model.max_batch));
    return batch * 1000 /
           (static_cast<double>(model.steps_per_request) *
            (model.step_ms + model.step_ms_per_item * batch));
  }
  return concurrency * 1000 / (model.service_ms * std::max(1.0, concurrency / model.saturation));
}

}  // namespace

std::unique_ptr<autoscaler::EndpointAutoscaler> make_apa_autoscaler(const Scenario& scenario,
                                                                    const SimOptions& options) {
  const autoscaler::ReplicaRange range{scenario.min_replicas, scenario.max_replicas,
                                       scenario.min_replicas == 0};
  autoscaler::ApaOptions apa;
  if (options.apa_period_ms > 0) {
    apa.period = Millis(options.apa_period_ms);
  }
  if (options.apa_down_window_ms > 0) {
    apa.down_window = Millis(options.apa_down_window_ms);
  }
  if (options.apa_max_up_factor > 0) {
    apa.max_up_factor = options.apa_max_up_factor;
  }
  if (options.apa_no_fast_path) {
    apa.fast_period = Millis(0);
  }
  if (options.utilization > 0) {
    apa.utilization = options.utilization;
  }
  autoscaler::VerticalOptions vertical;
  vertical.initial_target = scenario.configured_concurrency;
  vertical.min_target = 1;
  vertical.max_target = 256;
  // The forecaster on the scenario's day (a bucket a second of a day compressed to 24 minutes),
  // the lead the live loop's.
  return std::make_unique<autoscaler::EndpointAutoscaler>(
      apa, vertical, [range](double) { return range; }, scenario.initial_replicas, Millis(0),
      autoscaler::forecast_options_for_day(Millis(std::llround(scenario.season_s * 1000)),
                                           !options.apa_no_forecast));
}

namespace {

class Simulator {
 public:
  Simulator(const Scenario& scenario, const SimOptions& options)
      : scenario_(scenario),
        options_(options),
        random_(options.seed),
        arrival_random_(options.seed ^ 0x9e3779b97f4a7c15ULL),
        stale_(scenario.gateways > 1 &&
               (scenario.gateway_sample_ms > 0 || scenario.gateway_own_view)) {
    const auto count = static_cast<size_t>(std::max<int64_t>(scenario.gateways, 1));
    for (size_t g = 0; g < count; ++g) {
      gateways_.emplace_back(gateway::make_balancer(options.balancer),
                             static_cast<size_t>(std::max<int64_t>(scenario.queue_capacity, 0)));
    }
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
    desired_ = autoscaler_ ? autoscaler_->replicas() : initial;
    schedule(0, EventKind::kArrival);
    schedule(1, EventKind::kSecond);
    if (stale_ && !scenario_.gateway_own_view) {
      // Each gateway on its own timer, their phases spread over the period.
      const double period = scenario_.gateway_sample_ms / 1000;
      for (size_t g = 0; g < gateways_.size(); ++g) {
        schedule(period * static_cast<double>(g + 1) / static_cast<double>(gateways_.size()),
                 EventKind::kSample, static_cast<uint32_t>(g));
      }
    }
    if (autoscaler_) {
      schedule(seconds_of(autoscaler_->next_horizontal()), EventKind::kDecide);
      schedule(seconds_of(autoscaler_->next_vertical()), EventKind::kVertical);
    } else {
      schedule(seconds_of(policy_->period()), EventKind::kDecide);
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

  void make_policy() {
    const autoscaler::ReplicaRange range{scenario_.min_replicas, scenario_.max_replicas,
                                         scenario_.min_replicas == 0};
    const double per_replica = scenario_.configured_concurrency;
    // The sweep's knob (SimOptions::utilization), or each policy's configured default.
    const auto utilization = [this](double configured) {
      return options_.utilization > 0 ? options_.utilization : configured;
    };
    switch (options_.policy) {
      case PolicyKind::kApa:
        autoscaler_ = make_apa_autoscaler(scenario_, options_);
        // The replicas there at the start were started as any other, in the scenario's time.
        autoscaler_->observe_start(Millis(std::llround(scenario_.replica.cold_start_s * 1000)));
        break;
      case PolicyKind::kHpa: {
        autoscaler::HpaOptions options;
        options.range = range;
        options.target_per_replica = utilization(0.7) * per_replica;
        policy_ = autoscaler::make_hpa_policy(options);
        break;
      }
      case PolicyKind::kKpa: {
        autoscaler::KpaOptions options;
        options.range = range;
        options.container_concurrency = per_replica;
        options.target_utilization = utilization(0.7);
        policy_ = autoscaler::make_kpa_policy(options);
        break;
      }
      case PolicyKind::kKpaDefault: {
        // config-autoscaler's defaults with containerConcurrency unset: a target of 100 x 70%,
        // min-scale 0 (scale to zero on), max-scale 0 (no bound).
        autoscaler::KpaOptions options;
        options.container_concurrency = 100;
        options.range = {0, 1'000'000, true};
        policy_ = autoscaler::make_kpa_policy(options);
        break;
      }
      case PolicyKind::kRay: {
        autoscaler::RayOptions options = autoscaler::ray_auto_options();
        options.target_ongoing_requests = utilization(1.0) * per_replica;
        options.range = range;
        policy_ = autoscaler::make_ray_policy(options);
        break;
      }
      case PolicyKind::kRayAuto:
        policy_ = autoscaler::make_ray_policy(autoscaler::ray_auto_options());
        break;
      case PolicyKind::kStatic: {
        int64_t replicas = options_.static_replicas;
        if (replicas <= 0) {
          // Provisioned for the peak at 70% (or the knob's share) of what a replica serves at the
          // configured concurrency.
          double peak = 0;
          for (const auto& [t, rate] : scenario_.load.points) {
            peak = std::max(peak, rate);
          }
          for (double rate : scenario_.load.per_second) {
            peak = std::max(peak, rate);
          }
          replicas = std::max<int64_t>(
              1, static_cast<int64_t>(
                     std::ceil(peak / (utilization(0.7) *
                                       throughput_per_replica(scenario_.replica, per_replica)))));
        }
        static_replicas_ = replicas;
        policy_ = autoscaler::make_static_policy(replicas);
        break;
      }
    }
  }

  void schedule(double time, EventKind kind, uint32_t replica = 0, uint32_t request = 0,
                uint64_t stamp = 0) {
    events_.push(Event{time, sequence_++, kind, replica, request, stamp});
  }

  static double uniform(SeededRandom& random) {
    return (static_cast<double>(random.next() >> 11) + 0.5) / 9007199254740992.0;
  }
  double uniform() { return uniform(random_); }
  double exponential(double mean) { return -std::log(uniform()) * mean; }
  double normal() {
    return std::sqrt(-2 * std::log(uniform())) * std::cos(2 * 3.141592653589793 * uniform());
  }

  bool batched() const { return scenario_.replica.max_batch > 0; }

  // Integrals for the per-second means and replica-seconds, up to `time`.
  void advance(double time) {
    const double dt = time - now_;
    if (dt > 0) {
      in_flight_area_ += static_cast<double>(in_flight_) * dt;
      queued_area_ += static_cast<double>(queued()) * dt;
      replica_queued_area_ += static_cast<double>(replica_queued_) * dt;
      result_.summary.replica_seconds += static_cast<double>(ready_ + starting_) * dt;
      now_ = time;
    }
  }

  bool current(const Event& event) const {
    return replicas_[event.replica].generation == event.stamp;
  }

  void handle(const Event& event) {
    switch (event.kind) {
      case EventKind::kArrival:
        on_arrival(/*request=*/event.replica == 0);
        break;
      case EventKind::kCompletion:
        if (requests_[event.request].attempt == event.stamp) {
          on_completion(event.replica, event.request);
        }
        break;
      case EventKind::kStep:
        if (current(event)) {
          on_step(event.replica);
        }
        break;
      case EventKind::kReady:
        // A slot cancelled while starting may hold a newer replica by now.
        if (current(event)) {
          on_ready(event.replica);
        }
        break;
      case EventKind::kCrash:
        if (current(event) && replicas_[event.replica].phase == ReplicaPhase::kReady) {
          on_crash(event.replica);
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
      case EventKind::kSample:
        on_sample(event.replica);
        break;
      case EventKind::kSharedDone:
        if (replicas_[event.replica].sharing_stamp == event.stamp) {
          on_shared_done(event.replica, event.request);
        }
        break;
    }
  }

  // `request`: a request arrives; else it is only a look at the rate after an idle stretch.
  void on_arrival(bool request) {
    if (request) {
      ++arrivals_;
      ++second_arrivals_;
      const auto g = gateways_.size() > 1
                         ? static_cast<uint32_t>(arrival_random_.uniform(gateways_.size()))
                         : uint32_t{0};
      auto& queue = gateways_[g].queue;
      // Behind a non-empty queue there is no free slot (freed slots go to waiters at once).
      const bool has_waiters = queue.size() > 0;
      if (has_waiters && queue.size() >= queue.capacity()) {
        reject();
      } else {
        const uint32_t id = new_request(g);
        if (has_waiters || !try_start(id)) {
          if (queue.push(uint32_t{id}, deadline(id))) {
            reject();  // no room and a queue of no capacity
            free_requests_.push_back(id);
          } else {
            ++queued_requests_;
            scale_from_zero();
          }
        }
      }
    }
    const double rate = scenario_.load.rate_at(now_);
    if (rate > 0) {
      schedule(now_ - std::log(uniform(arrival_random_)) / rate, EventKind::kArrival);
    } else {
      schedule(std::floor(now_) + 1, EventKind::kArrival, /*replica=*/1);  // look again
    }
  }

  uint32_t new_request(uint32_t gateway) {
    uint32_t id;
    if (!free_requests_.empty()) {
      id = free_requests_.back();
      free_requests_.pop_back();
    } else {
      id = static_cast<uint32_t>(requests_.size());
      requests_.emplace_back();
    }
    Request& request = requests_[id];
    request.arrival = now_;
    request.gateway = gateway;
    request.retried = false;
    return id;
  }

  // The balancer's clock.
  gateway::Millis millis() const { return static_cast<gateway::Millis>(now_ * 1000); }

  // What gateway `g` balances on: the exact counts, or its own view.
  std::span<const gateway::Candidate> view(uint32_t g) const {
    return stale_ ? std::span<const gateway::Candidate>(gateways_[g].view)
                  : std::span<const gateway::Candidate>(candidates_);
  }

  size_t queued() const {
    size_t total = 0;
    for (const Gateway& gateway : gateways_) {
      total += gateway.queue.size();
    }
    return total;
  }

  bool try_start(uint32_t id) {
    const uint32_t g = requests_[id].gateway;
    const auto index = gateways_[g].balancer->pick(view(g), random_, millis());
    if (!index) {
      return false;
    }
    start_on(*index, id);
    return true;
  }

  void set_in_flight(uint32_t slot, int64_t count) {
    Replica& replica = replicas_[slot];
    if (batched()) {
      const int64_t batch = scenario_.replica.max_batch;
      replica_queued_ +=
          std::max<int64_t>(0, count - batch) - std::max<int64_t>(0, replica.in_flight - batch);
    }
    in_flight_ += count - replica.in_flight;
    replica.in_flight = count;
    candidates_[slot].in_flight = count;
  }

  // Gateway `g`'s own count at `slot` changes: in its view at once, in the others' when it next
  // publishes.
  void count_own(uint32_t g, uint32_t slot, int64_t delta) {
    if (stale_) {
      gateways_[g].own[slot] += delta;
      gateways_[g].view[slot].in_flight += delta;
    }
  }

  // Gateway `h` publishes its counts; the others' views take them, and each that has waiters
  // dispatches them to what its view now shows free.
  void on_sample(uint32_t h) {
    Gateway& from = gateways_[h];
    for (size_t slot = 0; slot < from.own.size(); ++slot) {
      const int64_t delta = from.own[slot] - from.published[slot];
      if (delta != 0) {
        from.published[slot] = from.own[slot];
        for (size_t g = 0; g < gateways_.size(); ++g) {
          if (g != h) {
            gateways_[g].view[slot].in_flight += delta;
          }
        }
      }
    }
    for (size_t g = 0; g < gateways_.size(); ++g) {
      if (g != h) {
        drain_queue(static_cast<uint32_t>(g));
      }
    }
    schedule(now_ + scenario_.gateway_sample_ms / 1000, EventKind::kSample, h);
  }

  // Ready and cap are the same in every view: discovery and the target are not what is studied.
  void set_ready(uint32_t slot, bool ready) {
    candidates_[slot].ready = ready;
    if (stale_) {
      for (Gateway& gateway : gateways_) {
        gateway.view[slot].ready = ready;
      }
    }
  }

  void set_cap(uint32_t slot, int64_t cap) {
    candidates_[slot].cap = cap;
    if (stale_) {
      // Own views: each gateway holds its share of the cap (at least one request).
      const int64_t view_cap =
          scenario_.gateway_own_view
              ? std::max<int64_t>(1, cap / static_cast<int64_t>(gateways_.size()))
              : cap;
      for (Gateway& gateway : gateways_) {
        gateway.view[slot].cap = view_cap;
      }
    }
  }

  void start_on(uint32_t slot, uint32_t id) {
    Replica& replica = replicas_[slot];
    Request& request = requests_[id];
    request.dispatched = now_;
    ++request.attempt;
    if (replica.in_flight >= candidates_[slot].cap) {
      ++over_cap_;
    }
    set_in_flight(slot, replica.in_flight + 1);
    count_own(request.gateway, slot, 1);
    if (batched()) {
      request.steps_left = scenario_.replica.steps_per_request;
      replica.waiting.push_back(id);
      if (!replica.stepping) {
        start_step(slot);
      }
      return;
    }
    if (scenario_.replica.exact_sharing) {
      advance_work(replica);  // at the old count
      request.finish_work = replica.work + scenario_.replica.service_ms / 1000 * service_factor();
      request.position = static_cast<uint32_t>(replica.running.size());
      replica.running.push_back(id);
      schedule_next_done(slot);
      return;
    }
    request.position = static_cast<uint32_t>(replica.running.size());
    replica.running.push_back(id);
    const double load =
        std::max(1.0, static_cast<double>(replica.in_flight) / scenario_.replica.saturation);
    double service = scenario_.replica.service_ms / 1000 * load / replica.speed;
    if (scenario_.replica.service_sigma > 0) {
      service *= service_factor();
    }
    schedule(now_ + service, EventKind::kCompletion, slot, id, request.attempt);
  }

  // A request's own time alone, relative to service_ms: lognormal of mean 1, or 1.
  double service_factor() {
    const double sigma = scenario_.replica.service_sigma;
    return sigma > 0 ? std::exp(sigma * normal() - sigma * sigma / 2) : 1;
  }

  // Exact processor sharing: the work each running request has received, per second.
  double share_rate(const Replica& replica) const {
    return replica.speed / std::max(1.0, static_cast<double>(replica.running.size()) /
                                             scenario_.replica.saturation);
  }

  void advance_work(Replica& replica) {
    replica.work += (now_ - replica.work_time) * share_rate(replica);
    replica.work_time = now_;
  }

  // Exact processor sharing: times the next completion at the current rate (re-timed, and the
  // event before it made stale, at every start and completion there).
  void schedule_next_done(uint32_t slot) {
    Replica& replica = replicas_[slot];
    ++replica.sharing_stamp;
    if (replica.running.empty()) {
      return;
    }
    uint32_t next = replica.running.front();
    for (const uint32_t id : replica.running) {
      if (requests_[id].finish_work < requests_[next].finish_work) {
        next = id;
      }
    }
    const double left = std::max(0.0, requests_[next].finish_work - replica.work);
    schedule(now_ + left / share_rate(replica), EventKind::kSharedDone, slot, next,
             replica.sharing_stamp);
  }

  void on_shared_done(uint32_t slot, uint32_t id) {
    advance_work(replicas_[slot]);
    remove_running(slot, id);
    const uint32_t g = requests_[id].gateway;
    finish(slot, id);
    schedule_next_done(slot);
    after_completions(slot, g);
  }

  // Swap-remove from the running list.
  void remove_running(uint32_t slot, uint32_t id) {
    Replica& replica = replicas_[slot];
    const uint32_t position = requests_[id].position;
    const uint32_t moved = replica.running.back();
    replica.running[position] = moved;
    requests_[moved].position = position;
    replica.running.pop_back();
  }

  void on_completion(uint32_t slot, uint32_t id) {
    remove_running(slot, id);
    const uint32_t g = requests_[id].gateway;
    finish(slot, id);
    after_completions(slot, g);
  }

  // Forms the next batch from the requests waiting at the replica and times the step.
  void start_step(uint32_t slot) {
    Replica& replica = replicas_[slot];
    const auto batch = static_cast<size_t>(scenario_.replica.max_batch);
    while (!replica.waiting.empty() && replica.running.size() < batch) {
      replica.running.push_back(replica.waiting.front());
      replica.waiting.pop_front();
    }
    replica.stepping = !replica.running.empty();
    if (replica.stepping) {
      const double step_ms =
          scenario_.replica.step_ms +
          scenario_.replica.step_ms_per_item * static_cast<double>(replica.running.size());
      schedule(now_ + step_ms / 1000 / replica.speed, EventKind::kStep, slot, 0,
               replica.generation);
    }
  }

  void on_step(uint32_t slot) {
    Replica& replica = replicas_[slot];
    size_t kept = 0;
    for (const uint32_t id : replica.running) {
      if (--requests_[id].steps_left > 0) {
        replica.running[kept++] = id;
      } else {
        finish(slot, id);
      }
    }
    replica.running.resize(kept);
    after_completions(slot, 0);  // dispatches queued requests first: they join this next step
    if (replica.phase != ReplicaPhase::kGone) {
      start_step(slot);
    }
  }

  // A request done at a replica: counted, measured, its slot there freed.
  void finish(uint32_t slot, uint32_t id) {
    const Request& request = requests_[id];
    set_in_flight(slot, replicas_[slot].in_flight - 1);
    count_own(request.gateway, slot, -1);
    const double latency_ms = (now_ - request.arrival) * 1000;
    second_latency_.add(latency_ms);
    total_latency_.add(latency_ms);
    ++completed_;
    ++second_completions_;
    if (latency_ms > scenario_.slo_ms) {
      ++over_slo_;
    }
    second_replica_ms_ += (now_ - request.dispatched) * 1000;
    // The gateway that sent it learns the replica's response time.
    gateway::PeakEwma& latency =
        stale_ ? gateways_[request.gateway].view[slot].latency : candidates_[slot].latency;
    latency = latency.observe(now_ - request.dispatched, millis());
    free_requests_.push_back(id);
  }

  // `first`: the gateway that saw a completion there; its queue is served first.
  void after_completions(uint32_t slot, uint32_t first) {
    Replica& replica = replicas_[slot];
    if (replica.phase == ReplicaPhase::kDraining && replica.in_flight == 0) {
      release(slot);
    }
    drain_queues_to(slot, first);
  }

  void release(uint32_t slot) {
    Replica& replica = replicas_[slot];
    replica.phase = ReplicaPhase::kGone;
    replica.stepping = false;
    ++replica.generation;  // its pending events are stale from now on
    ++replica.sharing_stamp;
    free_slots_.push_back(slot);
  }

  // The slot a completion freed (or a new replica's slots) go to the oldest waiters, as in the
  // gateway; O(1) per request where a balancer pick would scan a saturated fleet. Several
  // gateways: each in turn from `first`, while its view shows room there.
  void drain_queues_to(uint32_t slot, uint32_t first) {
    for (size_t k = 0; k < gateways_.size(); ++k) {
      const auto g = static_cast<uint32_t>((first + k) % gateways_.size());
      auto& queue = gateways_[g].queue;
      while (queue.size() > 0 && gateway::has_room(view(g)[slot])) {
        const uint32_t id = *queue.pop();
        if (expired(id)) {
          continue;
        }
        start_on(slot, id);
      }
    }
  }

  void drain_queue() {
    for (size_t g = 0; g < gateways_.size(); ++g) {
      drain_queue(static_cast<uint32_t>(g));
    }
  }

  void drain_queue(uint32_t g) {
    auto& queue = gateways_[g].queue;
    while (const uint32_t* front = queue.front()) {
      const uint32_t id = *front;
      if (expired(id)) {
        queue.pop();
        continue;
      }
      if (!try_start(id)) {
        return;
      }
      queue.pop();
    }
  }

  double deadline(uint32_t id) const { return requests_[id].arrival + scenario_.queue_timeout_s; }

  // A queued request past its deadline is answered 429 (and forgotten). Checked as the queue is
  // served, so that a request is answered when a slot would have taken it, or at the latest
  // at the next second.
  bool expired(uint32_t id) {
    if (deadline(id) >= now_) {
      return false;
    }
    reject();
    free_requests_.push_back(id);
    return true;
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
      if (stale_) {
        for (Gateway& gateway : gateways_) {
          gateway.view.emplace_back();
          gateway.own.push_back(0);
          gateway.published.push_back(0);
        }
      }
    }
    Replica& replica = replicas_[slot];
    replica.phase = ReplicaPhase::kStarting;
    replica.speed = 1;
    replica.in_flight = 0;
    ++replica.generation;
    replica.running.clear();
    replica.waiting.clear();
    replica.stepping = false;
    replica.work = 0;
    replica.work_time = now_;
    if (started_++ < scenario_.replica.slow_first ||
        (scenario_.replica.slow_fraction > 0 && uniform() < scenario_.replica.slow_fraction)) {
      replica.speed = 1 / scenario_.replica.slow_factor;
    }
    candidates_[slot] = gateway::Candidate{false, 0, cap(), {}};
    if (stale_) {
      for (Gateway& gateway : gateways_) {
        gateway.view[slot].latency = {};
      }
    }
    set_ready(slot, false);
    set_cap(slot, cap());  // a view's count stays: what the others last published there
    ++starting_;
    replica.started_at = cold ? now_ : -1;
    if (cold) {
      const double mean = scenario_.replica.cold_start_s;
      const double sigma = 0.25;
      const double delay = mean * std::exp(sigma * normal() - sigma * sigma / 2);
      starting_slots_.push_back(slot);
      schedule(now_ + delay, EventKind::kReady, slot, 0, replica.generation);
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
    if (autoscaler_ && replica.started_at >= 0) {  // as the orchestrator reports it
      autoscaler_->observe_start(Millis(std::llround((now_ - replica.started_at) * 1000)));
    }
    --starting_;
    ++ready_;
    ready_slots_.push_back(slot);
    set_ready(slot, true);
    if (scenario_.replica.crash_mtbf_s > 0) {
      schedule(now_ + exponential(scenario_.replica.crash_mtbf_s), EventKind::kCrash, slot, 0,
               replica.generation);
    }
    drain_queues_to(slot, 0);
  }

  // The replica dies with its requests; the orchestrator starts a new one at once (same desired
  // count) and the gateway retries each lost request once.
  void on_crash(uint32_t slot) {
    ++result_.summary.crashes;
    Replica& replica = replicas_[slot];
    std::vector<uint32_t> lost = std::move(replica.running);
    lost.insert(lost.end(), replica.waiting.begin(), replica.waiting.end());
    replica.running.clear();
    replica.waiting.clear();
    for (const uint32_t id : lost) {
      count_own(requests_[id].gateway, slot, -1);
    }
    set_in_flight(slot, 0);
    set_ready(slot, false);
    ready_slots_.erase(std::find(ready_slots_.begin(), ready_slots_.end(), slot));
    --ready_;
    release(slot);
    add_replica(/*cold=*/true);
    // Oldest first, ahead of the queue: they were dispatched before anything waiting.
    std::sort(lost.begin(), lost.end(), [this](uint32_t a, uint32_t b) {
      return requests_[a].arrival > requests_[b].arrival;
    });
    for (const uint32_t id : lost) {
      Request& request = requests_[id];
      ++request.attempt;  // its pending completion is stale
      if (request.retried) {
        ++failed_;
        ++second_failed_;
        free_requests_.push_back(id);
      } else {
        request.retried = true;
        gateways_[request.gateway].queue.push_front(uint32_t{id}, deadline(id));
      }
    }
    drain_queue();
  }

  // Every policy runs behind the same gateway: the per-replica cap is APA's learned target,
  // and for the baselines the per-replica concurrency a user configured for them.
  int64_t cap() const {
    return autoscaler::gateway_cap(autoscaler_ ? autoscaler_->target()
                                               : scenario_.configured_concurrency);
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
    stats.failed = second_failed_;
    stats.target_concurrency = autoscaler_ ? autoscaler_->target() : 0;
    result_.seconds.push_back(stats);
    // The second as the gateway samples it.
    LoadSample sample;
    sample.unix_ms = std::llround(now_ * 1000);
    sample.concurrency = in_flight_area_;
    sample.queued = queued_area_;
    sample.arrivals = second_arrivals_;
    sample.completions = second_completions_;
    sample.rejected = second_rejected_;
    sample.latency_ms =
        second_completions_ > 0 ? second_replica_ms_ / static_cast<double>(second_completions_) : 0;
    if (autoscaler_) {
      autoscaler_->add_samples(std::span(&sample, 1), ready_);
    } else {
      window_.add(autoscaler::Sample{Millis(sample.unix_ms), sample.concurrency, sample.queued,
                                     static_cast<double>(sample.arrivals),
                                     static_cast<double>(sample.completions)});
    }
    window_in_flight_ += in_flight_area_;
    second_replica_ms_ = 0;
    window_replica_queued_ += replica_queued_area_;
    ++window_seconds_;
    in_flight_area_ = 0;
    queued_area_ = 0;
    replica_queued_area_ = 0;
    second_arrivals_ = 0;
    second_completions_ = 0;
    second_rejected_ = 0;
    second_failed_ = 0;
    second_latency_.clear();
    drain_queue();  // answers what expired while nothing completed
    schedule(now_ + 1, EventKind::kSecond);
  }

  // A request waits at a fleet of zero: a first replica starts at once, not at the next
  // decision. `flotilla up`'s gateway asks the control plane (EndpointAutoscaler::
  // request_capacity); Knative's activator pokes its autoscaler; Ray's policy scales 0 -> 1 on
  // its next 0.1 s loop.
  void scale_from_zero() {
    if (desired_ != 0 || (autoscaler_ && !autoscaler_->request_capacity())) {
      return;
    }
    ++result_.summary.scale_events;
    desired_ = 1;
    add_replica(/*cold=*/true);
  }

  // APA: the autoscaler runs whatever is due now.
  void tick_autoscaler() {
    autoscaler_->tick(Millis(std::llround(now_ * 1000)), ready_, starting_, result_.summary.crashes,
                      [this] { return replica_usage(); });
  }

  void on_decide() {
    int64_t desired = 0;
    if (autoscaler_) {
      tick_autoscaler();
      desired = autoscaler_->replicas();
    } else {
      desired =
          policy_
              ->decide(Millis(std::llround(now_ * 1000)), window_,
                       autoscaler::Fleet{ready_, starting_, desired_, result_.summary.crashes})
              .desired;
    }
    if (desired != desired_) {
      ++result_.summary.scale_events;
      desired_ = desired;
    }
    while (ready_ + starting_ < desired_) {
      add_replica(/*cold=*/true);
    }
    while (ready_ + starting_ > desired_ && !starting_slots_.empty()) {
      const uint32_t slot = starting_slots_.back();
      starting_slots_.pop_back();
      release(slot);
      --starting_;
    }
    while (ready_ > desired_ && !ready_slots_.empty()) {
      const uint32_t slot = ready_slots_.back();  // the newest
      ready_slots_.pop_back();
      set_ready(slot, false);
      --ready_;
      if (replicas_[slot].in_flight == 0) {
        release(slot);
      } else {
        replicas_[slot].phase = ReplicaPhase::kDraining;
      }
    }
    schedule(autoscaler_ ? seconds_of(autoscaler_->next_horizontal())
                         : now_ + seconds_of(policy_->period()),
             EventKind::kDecide);
  }

  // What the replicas' meters show since the last vertical cycle (what `flotilla up` reads from
  // /proc and each replica's /metrics): the model's CPU is busy in proportion to what it serves
  // at once, up to its saturation point (a batched engine: its batch); the queue is the
  // requests waiting inside replicas for room in the batch.
  autoscaler::ReplicaUsage replica_usage() const {
    const double replica_seconds =
        static_cast<double>(window_seconds_) * static_cast<double>(std::max<int64_t>(ready_, 1));
    const double per_replica = window_seconds_ > 0 ? window_in_flight_ / replica_seconds : 0;
    const double saturation =
        batched() ? static_cast<double>(scenario_.replica.max_batch) : scenario_.replica.saturation;
    autoscaler::ReplicaUsage usage;
    usage.cpu_utilization = std::min(1.0, per_replica / saturation);
    usage.queued = window_seconds_ > 0 ? window_replica_queued_ / replica_seconds : 0;
    return usage;
  }

  // APA's vertical cycle: the new target is every replica's cap at once.
  void on_vertical() {
    tick_autoscaler();
    window_in_flight_ = 0;
    window_replica_queued_ = 0;
    window_seconds_ = 0;
    const int64_t new_cap = cap();
    for (size_t slot = 0; slot < candidates_.size(); ++slot) {
      set_cap(static_cast<uint32_t>(slot), new_cap);
    }
    drain_queue();
    schedule(seconds_of(autoscaler_->next_vertical()), EventKind::kVertical);
  }

  void finish_summary() {
    Summary& summary = result_.summary;
    summary.requests = arrivals_;
    summary.completed = completed_;
    summary.rejected = rejected_;
    summary.failed = failed_;
    summary.unfinished = static_cast<uint64_t>(in_flight_) + queued();
    const double total = static_cast<double>(std::max<uint64_t>(arrivals_, 1));
    summary.rejected_pct = 100.0 * static_cast<double>(rejected_) / total;
    summary.failed_pct = 100.0 * static_cast<double>(failed_) / total;
    summary.over_slo_pct = 100.0 * static_cast<double>(over_slo_ + rejected_ + failed_) / total;
    summary.p99_ms = total_latency_.percentile(0.99);
    summary.p50_ms = total_latency_.percentile(0.5);
    summary.p999_ms = total_latency_.percentile(0.999);
    summary.queued = queued_requests_;
    summary.over_cap = over_cap_;
    summary.final_target = autoscaler_ ? autoscaler_->target() : 0;
  }

  const Scenario& scenario_;
  SimOptions options_;
  SeededRandom random_;
  // Arrivals (their times and gateways) draw from a stream of their own, so every policy meets
  // the same arrivals for a seed: the offline bound (sim.h) is computed on them.
  SeededRandom arrival_random_;
  // One gateway in front of the fleet, or several (Scenario::gateways).
  struct Gateway {
    Gateway(std::unique_ptr<gateway::Balancer> balancer, size_t queue_capacity)
        : balancer(std::move(balancer)), queue(queue_capacity) {}
    std::unique_ptr<gateway::Balancer> balancer;  // one each: round robin keeps a cursor
    // Request ids, with deadlines in simulated seconds.
    gateway::AdmissionQueue<uint32_t, double> queue;
    // With stale views only (parallel to replicas_): what it balances on, its own in flight
    // there, and that as of its last sample. view[r].in_flight == own[r] + the others'
    // published[r].
    std::vector<gateway::Candidate> view;
    std::vector<int64_t> own;
    std::vector<int64_t> published;
  };
  const bool stale_;  // several gateways on sampled views; else every one sees candidates_
  std::vector<Gateway> gateways_;
  std::unique_ptr<autoscaler::EndpointAutoscaler> autoscaler_;  // APA
  std::unique_ptr<autoscaler::Policy> policy_;                  // the others
  int64_t static_replicas_ = 0;                                 // the count of the static policy
  autoscaler::SampleWindow window_;                             // the others' samples

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
  int64_t started_ = 0;  // replicas started so far
  int64_t desired_ = 0;
  int64_t in_flight_ = 0;
  int64_t replica_queued_ = 0;     // batched: requests waiting inside replicas for a full batch
  std::vector<Request> requests_;  // in flight or queued; reused through free_requests_
  std::vector<uint32_t> free_requests_;

  uint64_t arrivals_ = 0;
  uint64_t completed_ = 0;
  uint64_t rejected_ = 0;
  uint64_t over_slo_ = 0;
  uint64_t failed_ = 0;
  uint64_t queued_requests_ = 0;
  uint64_t over_cap_ = 0;
  uint64_t second_arrivals_ = 0;
  uint64_t second_completions_ = 0;
  uint64_t second_rejected_ = 0;
  uint64_t second_failed_ = 0;
  double in_flight_area_ = 0;
  double queued_area_ = 0;
  double replica_queued_area_ = 0;
  LatencyHistogram second_latency_;
  LatencyHistogram total_latency_;
  double second_replica_ms_ = 0;  // summed replica-side latency of this second's completions
  // The replicas' meters (replica_usage()), since the last vertical cycle.
  double window_in_flight_ = 0;
  double window_replica_queued_ = 0;
  int64_t window_seconds_ = 0;

  SimResult result_;
};

}  // namespace

SimResult simulate(const Scenario& scenario, const SimOptions& options) {
  return Simulator(scenario, options).run();
}

std::string to_csv(const SimResult& result) {
  std::string out =
      "second,arrivals,ready,pending,in_flight,queued,p50_ms,p99_ms,rejected,failed,"
      "target_concurrency\n";
  char line[256];
  for (const SecondStats& s : result.seconds) {
    std::snprintf(line, sizeof(line), "%lld,%llu,%lld,%lld,%.2f,%.2f,%.2f,%.2f,%llu,%llu,%.2f\n",
                  static_cast<long long>(s.second), static_cast<unsigned long long>(s.arrivals),
                  static_cast<long long>(s.ready), static_cast<long long>(s.pending), s.in_flight,
                  s.queued, s.p50_ms, s.p99_ms, static_cast<unsigned long long>(s.rejected),
                  static_cast<unsigned long long>(s.failed), s.target_concurrency);
    out += line;
  }
  return out;
}

}  // namespace flotilla::sim

// `flotilla sim`: runs a fleet simulation of one scenario (or trace) under one policy.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "sim/sim.h"

namespace flotilla::cli {
namespace {

struct SimFlags {
  std::string scenario;
  std::string policy = "apa";
  std::string trace;
  double rate_scale = 1;
  uint64_t seed = 1;
  std::string balancer = "p2c";
  int64_t static_replicas = 0;
  double queue_timeout_s = 0;
  int64_t apa_period_ms = 0;
  int64_t apa_down_window_ms = 0;
  double apa_max_up_factor = 0;
  bool apa_no_fast_path = false;
  bool apa_no_forecast = false;
  int64_t repeat = 1;
  double utilization = 0;
  bool bound = false;
  // Replica model and SLO overrides (a trace's own model: 0 or unset keeps the scenario's).
  double service_ms = 0;
  double service_sigma = -1;
  double saturation = 0;
  double slo_ms = 0;
  double cold_start_s = -1;
  int64_t min_replicas = -1;
  int64_t gateways = 1;
  double gateway_sample_ms = 0;
  bool gateway_own_view = false;
  std::string csv;
  std::string output = "text";
  bool list = false;
  bool gateways_given = false;
};

int run_sim(const SimFlags& flags) {
  if (flags.list) {
    for (const std::string& name : sim::scenario_names()) {
      std::cout << name << ": " << sim::find_scenario(name)->description << "\n";
    }
    return 0;
  }
  auto policy = sim::parse_policy_kind(flags.policy);
  if (!policy.is_ok()) {
    std::cerr << "flotilla sim: " << policy.status().message() << "\n";
    return kExitBadInput;
  }
  sim::Scenario scenario;
  if (!flags.trace.empty()) {
    auto loaded = sim::trace_scenario(flags.trace, flags.rate_scale);
    if (!loaded.is_ok()) {
      std::cerr << "flotilla sim: " << loaded.status().message() << "\n";
      return kExitBadInput;
    }
    scenario = std::move(loaded).value();
  } else {
    auto found = sim::find_scenario(flags.scenario);
    if (!found) {
      std::cerr << "flotilla sim: unknown scenario '" << flags.scenario
                << "' (flotilla sim --list shows them)\n";
      return kExitBadInput;
    }
    scenario = *found;
    if (flags.rate_scale != 1) {
      if (!(flags.rate_scale > 0)) {
        std::cerr << "flotilla sim: --rate-scale must be above 0\n";
        return kExitBadInput;
      }
      sim::scale_rate(scenario, flags.rate_scale);
    }
  }
  if (flags.repeat > 1) {
    sim::repeat_load(scenario, flags.repeat);
  }
  if (flags.queue_timeout_s > 0) {
    scenario.queue_timeout_s = flags.queue_timeout_s;
  }
  if (flags.service_ms > 0) {
    scenario.replica.service_ms = flags.service_ms;
  }
  if (flags.service_sigma >= 0) {
    scenario.replica.service_sigma = flags.service_sigma;
  }
  if (flags.saturation > 0) {
    scenario.replica.saturation = flags.saturation;
    scenario.configured_concurrency = flags.saturation;
  }
  if (flags.slo_ms > 0) {
    scenario.slo_ms = flags.slo_ms;
  }
  if (flags.cold_start_s >= 0) {
    scenario.replica.cold_start_s = flags.cold_start_s;
  }
  if (flags.min_replicas >= 0) {
    scenario.min_replicas = flags.min_replicas;
    scenario.initial_replicas = std::max(flags.min_replicas, int64_t{0});
  }
  // The gateway-fleet figures are printed only when asked for, so the other runs print as before.
  const bool fleet = flags.gateways_given;
  scenario.gateways = flags.gateways;
  scenario.gateway_sample_ms = flags.gateway_sample_ms;
  scenario.gateway_own_view = flags.gateway_own_view;
  sim::SimOptions options;
  options.policy = *policy;
  options.apa_period_ms = flags.apa_period_ms;
  options.apa_down_window_ms = flags.apa_down_window_ms;
  options.apa_max_up_factor = flags.apa_max_up_factor;
  options.apa_no_fast_path = flags.apa_no_fast_path;
  options.apa_no_forecast = flags.apa_no_forecast;
  options.seed = flags.seed;
  options.balancer = gateway::parse_balancer_kind(flags.balancer).value();  // CLI checked it
  options.static_replicas = flags.static_replicas;
  options.utilization = flags.utilization;
  const sim::SimResult result = sim::simulate(scenario, options);
  std::vector<sim::BoundPoint> bound;
  if (flags.bound) {
    std::vector<uint64_t> arrivals;
    arrivals.reserve(result.seconds.size());
    for (const sim::SecondStats& second : result.seconds) {
      arrivals.push_back(second.arrivals);
    }
    bound = sim::offline_bound(sim::bound_input(scenario, arrivals));
  }
  if (!flags.csv.empty()) {
    std::ofstream out(flags.csv);
    out << sim::to_csv(result);
    if (!out) {
      std::cerr << "flotilla sim: cannot write '" << flags.csv << "'\n";
      return kExitBadInput;
    }
  }
  const sim::Summary& s = result.summary;
  if (flags.output == "json") {
    nlohmann::json summary = {{"scenario", scenario.name},
                              {"policy", sim::policy_name(*policy)},
                              {"requests", s.requests},
                              {"over_slo_pct", s.over_slo_pct},
                              {"rejected_pct", s.rejected_pct},
                              {"failed_pct", s.failed_pct},
                              {"crashes", s.crashes},
                              {"replica_seconds", s.replica_seconds},
                              {"scale_events", s.scale_events},
                              {"p99_ms", s.p99_ms},
                              {"final_target_concurrency", s.final_target},
                              {"events", s.events},
                              {"wall_seconds", s.wall_seconds}};
    if (flags.bound) {
      nlohmann::json points = nlohmann::json::array();
      for (const sim::BoundPoint& point : bound) {
        points.push_back({point.replica_seconds, point.bad_pct});
      }
      summary["bound"] = points;  // [replica-seconds, bad %], cheapest first
      summary["bound_bad_pct_at_cost"] = sim::bound_bad_pct_at(bound, s.replica_seconds);
    }
    if (fleet) {
      summary["gateways"] = scenario.gateways;
      summary["gateway_sample_ms"] = scenario.gateway_sample_ms;
      summary["gateway_own_view"] = scenario.gateway_own_view;
      summary["p50_ms"] = s.p50_ms;
      summary["p999_ms"] = s.p999_ms;
      summary["completed"] = s.completed;
      summary["rejected"] = s.rejected;
      summary["queued"] = s.queued;
      summary["over_cap"] = s.over_cap;
    }
    std::cout << summary.dump() << "\n";
  } else {
    std::printf(
        "%s/%s: %llu requests, %.3f%% over the %.0f ms SLO, rejected or failed, %.3f%% "
        "rejected, %.3f%% failed, %.0f replica-seconds, %lld scale events, p99 %.1f ms",
        scenario.name.c_str(), std::string(sim::policy_name(*policy)).c_str(),
        static_cast<unsigned long long>(s.requests), s.over_slo_pct, scenario.slo_ms,
        s.rejected_pct, s.failed_pct, s.replica_seconds, static_cast<long long>(s.scale_events),
        s.p99_ms);
    if (s.crashes > 0) {
      std::printf(", %lld crashes", static_cast<long long>(s.crashes));
    }
    if (fleet) {
      std::printf(
          ", %lld gateways sampling every %.0f ms: p50 %.2f ms, p99.9 %.1f ms, %llu queued, "
          "%llu dispatched over a cap",
          static_cast<long long>(scenario.gateways), scenario.gateway_sample_ms, s.p50_ms,
          s.p999_ms, static_cast<unsigned long long>(s.queued),
          static_cast<unsigned long long>(s.over_cap));
    }
    if (flags.bound) {
      std::printf(", the offline bound at this cost: %.3f%% bad",
                  sim::bound_bad_pct_at(bound, s.replica_seconds));
    }
    std::printf(" (%llu events in %.2f s)\n", static_cast<unsigned long long>(s.events),
                s.wall_seconds);
  }
  return 0;
}

}  // namespace

std::function<int()> add_sim_command(CLI::App& app) {
  auto flags = std::make_shared<SimFlags>();
  CLI::App* cmd = app.add_subcommand(
      "sim", "Simulate an endpoint's fleet under an autoscaling policy (discrete events).");
  cmd->add_option("scenario", flags->scenario, "Scenario name (--list shows them)");
  cmd->add_flag("--list", flags->list, "List the scenarios");
  cmd->add_option("--policy", flags->policy,
                  "apa, hpa, kpa, ray or static (configured for the scenario's model), or "
                  "kpa-default and ray-auto (their published defaults)")
      ->check(CLI::IsMember({"apa", "hpa", "kpa", "kpa-default", "ray", "ray-auto", "static"}))
      ->capture_default_str();
  cmd->add_option("--trace", flags->trace,
                  "Replay a CSV trace (first column: request timestamps) instead of a scenario");
  cmd->add_option("--rate-scale", flags->rate_scale,
                  "Multiply the offered rate (of the trace or the scenario)")
      ->capture_default_str();
  cmd->add_option("--repeat", flags->repeat,
                  "Play the scenario or trace this many times in a row, each a day (the "
                  "season APA's forecast learns)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  cmd->add_option("--seed", flags->seed, "Random seed (same seed, same result)")
      ->capture_default_str();
  cmd->add_option("--balancer", flags->balancer,
                  "The gateway's balancer: p2c (power of two choices weighed by response "
                  "time); p2c_in_flight, round_robin and least_request for comparisons")
      ->check(CLI::IsMember({"p2c", "p2c_in_flight", "round_robin", "least_request"}))
      ->capture_default_str();
  cmd->add_option("--static-replicas", flags->static_replicas,
                  "Replicas for --policy static (0: provision for the peak)")
      ->capture_default_str();
  // What-if knobs: what each of DESIGN.md §4's limits costs (bench/sim/spike_limits.py).
  cmd->add_option("--queue-timeout-s", flags->queue_timeout_s,
                  "The gateway queue's deadline instead of the scenario's")
      ->check(CLI::Range(0.001, 3600.0));
  cmd->add_option("--apa-period-ms", flags->apa_period_ms,
                  "APA's horizontal decision period instead of DESIGN.md's 5000")
      ->check(CLI::Range(int64_t{100}, int64_t{3'600'000}));
  cmd->add_option("--apa-down-window-ms", flags->apa_down_window_ms,
                  "APA's scale-down window instead of DESIGN.md's 300000")
      ->check(CLI::Range(int64_t{1'000}, int64_t{3'600'000}));
  cmd->add_option("--apa-max-up-factor", flags->apa_max_up_factor,
                  "APA's scale-up cap per decision instead of DESIGN.md's x2")
      ->check(CLI::Range(1.0, 1e6));
  cmd->add_flag("--apa-no-fast-path", flags->apa_no_fast_path,
                "APA scales up on its full period only (no 1 s fast path)");
  cmd->add_flag("--apa-no-forecast", flags->apa_no_forecast,
                "APA without its seasonal forecast (no floor raised ahead of a daily peak)");
  cmd->add_option("--utilization", flags->utilization,
                  "The share of the per-replica target each policy sizes for (a frontier "
                  "sweep's knob; default: each policy's own)")
      ->check(CLI::Range(0.01, 10.0));
  cmd->add_flag("--bound", flags->bound,
                "Also compute the offline bound on this run's arrivals (the fewest bad "
                "requests any schedule can have at each cost)");
  cmd->add_option("--service-ms", flags->service_ms, "A replica's mean service time")
      ->check(CLI::Range(0.001, 1e7));
  cmd->add_option("--service-sigma", flags->service_sigma,
                  "The lognormal spread of service times (0: fixed)")
      ->check(CLI::Range(0.0, 5.0));
  cmd->add_option("--saturation", flags->saturation,
                  "Requests a replica runs at once without slowing (also the configured "
                  "per-replica concurrency)")
      ->check(CLI::Range(1.0, 1e6));
  cmd->add_option("--slo-ms", flags->slo_ms, "The latency SLO")->check(CLI::Range(0.001, 1e8));
  cmd->add_option("--cold-start-s", flags->cold_start_s, "A replica's mean cold start")
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--min-replicas", flags->min_replicas,
                  "The endpoint's minimum (0: scale to zero); also the starting count")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000}));
  // The gateway-fleet study (docs/fleet.md, bench/sim/fleet.py).
  cmd->add_option("--gateways", flags->gateways,
                  "Gateways in front, each on its own view (prints the fleet figures)")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}))
      ->each([flags](const std::string&) { flags->gateways_given = true; });
  cmd->add_option("--gateway-sample-ms", flags->gateway_sample_ms,
                  "How often each gateway publishes its in-flight counts to the others (0: "
                  "exact shared views)")
      ->check(CLI::Range(0.0, 3'600'000.0));
  cmd->add_flag("--gateway-own-view", flags->gateway_own_view,
                "Gateways share nothing: each balances on its own counts, capped at cap / N");
  cmd->add_option("--csv", flags->csv, "Write per-second rows to this CSV file");
  cmd->add_option("-o,--output", flags->output, "text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  return [flags]() -> int {
    return run_sim(*flags);
  };
}

}  // namespace flotilla::cli

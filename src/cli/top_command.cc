// `flotilla top`: the endpoints live in a terminal, refreshed every second, like `kubectl top`
// meets `htop`: requests/s, p50/p99, errors/s, in-flight, queue, replicas and the autoscaler's
// target, from the control plane's 1 s history (GET .../metrics, docs/control-plane.md). With
// -o json, one JSON line per refresh for scripts.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <thread>

#include <unistd.h>

#include "cli/api_client.h"
#include "cli/commands.h"

namespace flotilla::cli {
namespace {

using nlohmann::json;

// Rates and quantiles over the last few seconds: one second alone is too noisy to read.
constexpr std::string_view kTopWindow = "5s";

struct TopFlags {
  ClientFlags client;
  std::vector<std::string> endpoints;  // empty: all
  double delay_s = 1;
  int64_t iterations = 0;  // 0: until interrupted
};

// One endpoint's row, from its view and its recent metrics.
json endpoint_row(const json& view, const json& metrics) {
  const json& summary = metrics["summary"];
  uint64_t errors = 0;
  for (const auto& [code, count] : summary["codes"].items()) {
    const int status = std::stoi(code);
    errors += status == 429 || status >= 500 || status == 0 ? count.get<uint64_t>() : 0;
  }
  int64_t ready = 0;
  int64_t replicas = 0;
  if (summary.contains("replicas")) {
    for (const auto& [version, states] : summary["replicas"].items()) {
      for (const auto& [state, count] : states.items()) {
        replicas += count.get<int64_t>();
        ready += state == "ready" ? count.get<int64_t>() : 0;
      }
    }
  }
  const auto seconds = std::max<double>(1, summary["seconds"].get<double>());
  json row = {{"name", view["name"]},
              {"state", view["state"]["ready"]},
              {"requests_per_second", summary["requests_per_second"]},
              {"errors_per_second", static_cast<double>(errors) / seconds},
              {"latency_p50_ms", summary["latency_p50_ms"]},
              {"latency_p99_ms", summary["latency_p99_ms"]},
              {"in_flight", summary.value("in_flight", 0.0)},
              {"queued", summary.value("queued", 0.0)},
              {"replicas_ready", ready},
              {"replicas", replicas}};
  if (summary.contains("target_concurrency")) {
    row["target_concurrency"] = summary["target_concurrency"];
    row["desired_replicas"] = summary["desired_replicas"];
  }
  return row;
}

std::string fixed(double value, int decimals) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", decimals, value);
  return text;
}

std::string latency_text(double ms) {
  return ms <= 0 ? "-" : ms < 10 ? fixed(ms, 2) : fixed(ms, 0);
}

void print_rows(const json& snapshot, bool terminal) {
  if (terminal) {
    std::cout << "\x1b[H\x1b[2J";  // home and clear: each refresh redraws the screen
  }
  std::vector<std::vector<std::string>> rows = {{"NAME", "STATE", "REQ/S", "ERR/S", "P50 MS",
                                                 "P99 MS", "IN-FLIGHT", "QUEUE", "REPLICAS",
                                                 "TARGET"}};
  for (const json& row : snapshot["endpoints"]) {
    std::string replicas = std::to_string(row["replicas_ready"].get<int64_t>()) + "/" +
                           std::to_string(row["replicas"].get<int64_t>());
    if (row.contains("desired_replicas")) {
      replicas += " (want " + std::to_string(row["desired_replicas"].get<int64_t>()) + ")";
    }
    rows.push_back(
        {row["name"], row["state"], fixed(row["requests_per_second"].get<double>(), 1),
         fixed(row["errors_per_second"].get<double>(), 1),
         latency_text(row["latency_p50_ms"].get<double>()),
         latency_text(row["latency_p99_ms"].get<double>()), fixed(row["in_flight"], 1),
         fixed(row["queued"], 1), replicas,
         row.contains("target_concurrency") ? fixed(row["target_concurrency"], 1) : "-"});
  }
  std::cout << "flotilla top: " << snapshot["endpoints"].size()
            << " endpoints, rates over the last " << kTopWindow << "\n\n";
  print_table(rows);
  if (!terminal) {
    std::cout << "\n";
  }
  std::cout.flush();
}

// One refresh: every endpoint (or the ones asked for) with its recent metrics.
Result<json> snapshot(const Connection& connection, const std::vector<std::string>& wanted) {
  std::vector<json> views;
  if (wanted.empty()) {
    FLOTILLA_ASSIGN_OR_RETURN(json list,
                              call(connection, http::Method::kGet, "/api/2.0/serving-endpoints"));
    for (json& view : list["endpoints"]) {
      views.push_back(std::move(view));
    }
  } else {
    for (const std::string& name : wanted) {
      FLOTILLA_ASSIGN_OR_RETURN(
          json view, call(connection, http::Method::kGet, "/api/2.0/serving-endpoints/" + name));
      views.push_back(std::move(view));
    }
  }
  json rows = json::array();
  for (const json& view : views) {
    const std::string name = view["name"];
    Result<json> metrics =
        call(connection, http::Method::kGet,
             "/api/2.0/serving-endpoints/" + name + "/metrics?window=" + std::string(kTopWindow));
    if (!metrics.is_ok() && metrics.status().code() == StatusCode::kNotFound && wanted.empty()) {
      continue;  // deleted between the list and this call
    }
    FLOTILLA_RETURN_IF_ERROR(metrics.status());
    rows.push_back(endpoint_row(view, *metrics));
  }
  return json{{"timestamp", unix_time_ms()}, {"endpoints", std::move(rows)}};
}

}  // namespace

std::function<int()> add_top_command(CLI::App& app) {
  auto flags = std::make_shared<TopFlags>();
  CLI::App* cmd = app.add_subcommand(
      "top",
      "Live view of the endpoints: requests/s, errors/s, p50/p99, in-flight, queue, replicas "
      "and the autoscaler's target, refreshed every second (Ctrl-C to stop).");
  cmd->add_option("endpoints", flags->endpoints, "Endpoints to show (default: all)");
  cmd->add_option("-d,--delay", flags->delay_s, "Seconds between refreshes")
      ->check(CLI::Range(0.2, 3600.0))
      ->capture_default_str();
  cmd->add_option("-n,--iterations", flags->iterations,
                  "Refreshes before exiting (0: until Ctrl-C)")
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000'000}))
      ->capture_default_str();
  add_client_flags(cmd, flags->client);
  return [cmd, flags]() -> int {
    if (!cmd->parsed()) {
      return -1;
    }
    Result<Connection> connection = connect_flags(flags->client);
    if (!connection.is_ok()) {
      return fail("top", connection.status());
    }
    const bool as_json = flags->client.output == "json";
    const bool terminal = !as_json && ::isatty(STDOUT_FILENO) == 1;
    const auto delay = std::chrono::duration<double>(flags->delay_s);
    for (int64_t i = 0; flags->iterations == 0 || i < flags->iterations; ++i) {
      if (i > 0) {
        std::this_thread::sleep_for(delay);
      }
      Result<json> taken = snapshot(*connection, flags->endpoints);
      if (!taken.is_ok()) {
        return fail("top", taken.status());
      }
      if (as_json) {
        std::cout << taken->dump() << std::endl;
      } else {
        print_rows(*taken, terminal);
      }
    }
    return 0;
  };
}

}  // namespace flotilla::cli

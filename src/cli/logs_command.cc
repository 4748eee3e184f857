// `flotilla logs ENDPOINT`: an endpoint's inference table (docs/inference-tables.md), read from
// the data directory's files, oldest first: a table, or the records as stored with -o json.
#include <algorithm>
#include <charconv>
#include <filesystem>
#include <iostream>
#include <limits>
#include <numeric>

#include <nlohmann/json.hpp>

#include "cli/api_client.h"
#include "cli/commands.h"
#include "gateway/gateway.h"

namespace flotilla::cli {
namespace {

using nlohmann::json;

struct LogsFlags {
  std::string endpoint;
  std::string data_dir = ".flotilla";
  std::string since;
  std::vector<std::string> statuses;
  int64_t tail = 0;
  std::string output = "table";
};

// "90s", "15m", "2h", "7d" as milliseconds.
Result<int64_t> parse_since(const std::string& text) {
  // Bounded so that the milliseconds fit.
  const std::optional<int64_t> seconds = parse_duration_seconds(
      text, "smhd", /*bare_seconds=*/false, std::numeric_limits<int64_t>::max() / 1'000);
  if (!seconds) {
    return invalid_argument("--since: a duration such as 90s, 15m, 2h or 7d; got '" + text + "'");
  }
  return *seconds * 1'000;
}

// --status: codes ("200", "429") or classes ("5xx"); a record matches any of them.
Result<std::function<bool(int)>> parse_statuses(const std::vector<std::string>& statuses) {
  std::vector<std::pair<int, int>> ranges;
  for (const std::string& status : statuses) {
    int value = 0;
    if (status.size() == 3 && status.ends_with("xx") && status[0] >= '1' && status[0] <= '5') {
      value = (status[0] - '0') * 100;
      ranges.emplace_back(value, value + 99);
      continue;
    }
    const auto [end, error] = std::from_chars(status.data(), status.data() + status.size(), value);
    if (error != std::errc() || end != status.data() + status.size() || value < 100 ||
        value > 599) {
      return invalid_argument("--status: a code (200, 429) or a class (4xx, 5xx); got '" + status +
                              "'");
    }
    ranges.emplace_back(value, value);
  }
  return std::function<bool(int)>([ranges](int code) {
    return ranges.empty() || std::any_of(ranges.begin(), ranges.end(), [code](const auto& r) {
             return code >= r.first && code <= r.second;
           });
  });
}

// A body for one table cell: its start, on one line.
std::string cell_text(const json& part) {
  if (!part.is_object() || !part.contains("body") || !part["body"].is_string()) {
    return "";
  }
  std::string text = part["body"].get<std::string>().substr(0, 60);
  std::replace_if(
      text.begin(), text.end(), [](char c) { return c == '\n' || c == '\r'; }, ' ');
  if (part.value("truncated", false) || part["body"].get<std::string>().size() > 60) {
    text += "…";
  }
  return text;
}

std::string time_text(int64_t unix_ms) {
  const auto seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm parts{};
  gmtime_r(&seconds, &parts);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &parts);
  char millis[8];
  std::snprintf(millis, sizeof(millis), ".%03dZ", static_cast<int>(unix_ms % 1000));
  return std::string(text) + millis;
}

int run_logs(const LogsFlags& flags) {
  int64_t since_ms = 0;
  if (!flags.since.empty()) {
    Result<int64_t> since = parse_since(flags.since);
    if (!since.is_ok()) {
      return fail("logs", since.status());
    }
    since_ms = unix_time_ms() - *since;
  }
  Result<std::function<bool(int)>> status_matches = parse_statuses(flags.statuses);
  if (!status_matches.is_ok()) {
    return fail("logs", status_matches.status());
  }
  const std::string dir = flags.data_dir + "/inference";
  const std::vector<std::string> files = gateway::inference_table_files(dir, flags.endpoint);
  if (files.empty()) {
    return fail("logs",
                not_found("endpoint '" + flags.endpoint + "' has no inference table in " + dir +
                          " (its spec enables one with inference_table.enabled; "
                          "--data-dir says where flotilla up keeps its data)"));
  }
  std::vector<json> records;
  std::vector<std::string> lines;  // as stored, for -o json
  for (const std::string& file : files) {
    Status read = gateway::read_inference_file(file, [&](std::string_view line) {
      json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!record.is_object() || record.value("timestamp_ms", int64_t{0}) < since_ms ||
          !(*status_matches)(record.value("status", 0))) {
        return true;
      }
      lines.emplace_back(line);
      records.push_back(std::move(record));
      return true;
    });
    if (!read.is_ok()) {
      return fail("logs", read);
    }
  }
  // By arrival: a file holds each gateway worker's records in the order they were answered,
  // and a period can have a file per gateway.
  std::vector<size_t> order(records.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&records](size_t a, size_t b) {
    return records[a].value("timestamp_ms", int64_t{0}) <
           records[b].value("timestamp_ms", int64_t{0});
  });
  const size_t first = flags.tail > 0 && order.size() > static_cast<size_t>(flags.tail)
                           ? order.size() - static_cast<size_t>(flags.tail)
                           : 0;
  if (flags.output == "json") {
    for (size_t i = first; i < order.size(); ++i) {
      std::cout << lines[order[i]] << "\n";
    }
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"TIME", "STATUS", "LATENCY MS", "VERSION", "REQUEST ID", "REQUEST", "RESPONSE"}};
  for (size_t i = first; i < order.size(); ++i) {
    const json& record = records[order[i]];
    char latency[32];
    std::snprintf(latency, sizeof(latency), "%.1f", record.value("latency_ms", 0.0));
    rows.push_back(
        {time_text(record.value("timestamp_ms", int64_t{0})),
         std::to_string(record.value("status", 0)), latency, record.value("version", std::string()),
         record.value("request_id", std::string()), cell_text(record.value("request", json())),
         cell_text(record.value("response", json()))});
  }
  print_table(rows);
  return 0;
}

}  // namespace

std::function<int()> add_logs_command(CLI::App& app) {
  auto flags = std::make_shared<LogsFlags>();
  CLI::App* cmd = app.add_subcommand(
      "logs",
      "Read an endpoint's inference table: one record per sampled request, with its bodies "
      "(docs/inference-tables.md).");
  cmd->add_option("endpoint", flags->endpoint, "Endpoint name")->required();
  cmd->add_option("--data-dir", flags->data_dir, "The data directory of flotilla up")
      ->capture_default_str();
  cmd->add_option("--since", flags->since, "Only records from the last 90s, 15m, 2h, 7d, ...");
  cmd->add_option("--status", flags->statuses,
                  "Only these codes or classes (repeat, or comma-separated: 5xx,429)")
      ->delimiter(',');
  cmd->add_option("--tail", flags->tail, "Only the newest N records")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000'000}));
  cmd->add_option("-o,--output", flags->output, "table or json (the records as stored)")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  return [cmd, flags]() -> int {
    return cmd->parsed() ? run_logs(*flags) : -1;
  };
}

}  // namespace flotilla::cli

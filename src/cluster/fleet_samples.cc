// Load samples from a fleet of gateways: the report's wire form and the controller's per-second
// sums over the gateways.
#include <algorithm>
#include <charconv>
#include <cmath>

#include "cluster/cluster.h"

namespace flotilla::cluster {
namespace {

using nlohmann::json;

// Beyond any clock's reading (2286-11-20): so that second_of() cannot overflow.
constexpr int64_t kLatestUnixMs = 9'999'999'999'999;
// A second further ahead of the controller's clock than this is dropped, not kept until it
// settles: a gateway's clock is that wrong, or the report is not a gateway's.
constexpr int64_t kFutureLimitMs = 60'000;

// The wall-clock second nearest a sample's end.
int64_t second_of(int64_t unix_ms) {
  return (unix_ms + 500) / 1000 * 1000;
}

json sample_to_json(const LoadSample& sample) {
  json codes = json::object();
  for (const auto& [code, count] : sample.responses.codes) {
    codes[std::to_string(code)] = count;
  }
  json latency = json::array();
  for (const auto& [bucket, count] : sample.responses.latency) {
    latency.push_back({bucket, count});
  }
  return {{"unix_ms", sample.unix_ms},
          {"concurrency", sample.concurrency},
          {"queued", sample.queued},
          {"arrivals", sample.arrivals},
          {"completions", sample.completions},
          {"rejected", sample.rejected},
          {"latency_ms", sample.latency_ms},
          {"codes", std::move(codes)},
          {"latency_buckets", std::move(latency)}};
}

// A count from a report: an integer >= 0.
bool is_count(const json& value) {
  return value.is_number_integer() && value.get<int64_t>() >= 0;
}

// The responses of a sample: "codes" ({"200": count}) and "latency_buckets" ([[bucket,
// count]]), both optional (a gateway from before they were reported sends neither).
Status responses_from_json(const json& object, const std::string& where, ResponseCounts& into) {
  const json& codes = kube::field(object, "codes");
  if (!codes.is_null()) {
    if (!codes.is_object()) {
      return invalid_argument(where + ".codes: an object of counts by status code");
    }
    for (const auto& [code, count] : codes.items()) {
      int value = 0;
      const auto [end, error] = std::from_chars(code.data(), code.data() + code.size(), value);
      if (error != std::errc() || end != code.data() + code.size() || value < 0 || value > 599 ||
          !is_count(count)) {
        return invalid_argument(where + ".codes." + code +
                                ": a status code (0-599) with a count >= 0");
      }
      into.codes[value] = count.get<uint64_t>();
    }
  }
  const json& latency = kube::field(object, "latency_buckets");
  if (!latency.is_null()) {
    if (!latency.is_array()) {
      return invalid_argument(where + ".latency_buckets: a list of [bucket, count]");
    }
    for (const json& entry : latency) {
      if (!entry.is_array() || entry.size() != 2 || !is_count(entry[0]) ||
          entry[0].get<int64_t>() >= ResponseCounts::kLatencyBuckets || !is_count(entry[1])) {
        return invalid_argument(where + ".latency_buckets: [bucket (0-" +
                                std::to_string(ResponseCounts::kLatencyBuckets - 1) +
                                "), count >= 0] pairs");
      }
      into.latency[entry[0].get<int>()] = entry[1].get<uint64_t>();
    }
  }
  return Status::ok();
}

Result<LoadSample> sample_from_json(const json& object, const std::string& where) {
  if (!object.is_object()) {
    return invalid_argument(where + ": not an object");
  }
  LoadSample sample;
  auto number = [&](const char* key, auto& into) -> Status {
    const json& value = kube::field(object, key);
    using Into = std::decay_t<decltype(into)>;
    if constexpr (std::is_floating_point_v<Into>) {
      if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 0) {
        return invalid_argument(where + "." + key + ": not a finite number >= 0");
      }
      into = value.get<double>();
    } else {
      if (!value.is_number_integer() || value.get<int64_t>() < 0) {
        return invalid_argument(where + "." + key + ": not an integer >= 0");
      }
      into = static_cast<Into>(value.get<int64_t>());
    }
    return Status::ok();
  };
  FLOTILLA_RETURN_IF_ERROR(number("unix_ms", sample.unix_ms));
  if (sample.unix_ms > kLatestUnixMs) {
    return invalid_argument(where + ".unix_ms: past the year 2286");
  }
  FLOTILLA_RETURN_IF_ERROR(number("concurrency", sample.concurrency));
  FLOTILLA_RETURN_IF_ERROR(number("queued", sample.queued));
  FLOTILLA_RETURN_IF_ERROR(number("arrivals", sample.arrivals));
  FLOTILLA_RETURN_IF_ERROR(number("completions", sample.completions));
  FLOTILLA_RETURN_IF_ERROR(number("rejected", sample.rejected));
  FLOTILLA_RETURN_IF_ERROR(number("latency_ms", sample.latency_ms));
  FLOTILLA_RETURN_IF_ERROR(responses_from_json(object, where, sample.responses));
  return sample;
}

}  // namespace

std::string sample_report_to_json(const SampleReport& report) {
  json endpoints = json::object();
  for (const auto& [name, samples] : report.endpoints) {
    json& list = endpoints[name] = json::array();
    for (const LoadSample& sample : samples) {
      list.push_back(sample_to_json(sample));
    }
  }
  return json{{"gateway", report.gateway}, {"endpoints", endpoints}, {"capacity", report.capacity}}
      .dump();
}

Result<SampleReport> parse_sample_report(std::string_view body) {
  const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return invalid_argument("a sample report is a JSON object");
  }
  SampleReport report;
  report.gateway = kube::string_field(parsed, "gateway");
  if (report.gateway.empty()) {
    return invalid_argument("gateway: a non-empty string is required");
  }
  const json& endpoints = kube::field(parsed, "endpoints");
  if (!endpoints.is_null() && !endpoints.is_object()) {
    return invalid_argument("endpoints: an object of sample lists by endpoint name");
  }
  if (endpoints.is_object()) {
    for (const auto& [name, samples] : endpoints.items()) {
      if (!samples.is_array()) {
        return invalid_argument("endpoints." + name + ": a list of samples");
      }
      std::vector<LoadSample>& into = report.endpoints[name];
      for (size_t i = 0; i < samples.size(); ++i) {
        FLOTILLA_ASSIGN_OR_RETURN(
            LoadSample sample,
            sample_from_json(samples[i], "endpoints." + name + "[" + std::to_string(i) + "]"));
        into.push_back(sample);
      }
    }
  }
  const json& capacity = kube::field(parsed, "capacity");
  if (!capacity.is_null()) {
    if (!capacity.is_array() || !std::all_of(capacity.begin(), capacity.end(),
                                             [](const json& e) { return e.is_string(); })) {
      return invalid_argument("capacity: a list of endpoint names");
    }
    report.capacity = capacity.get<std::vector<std::string>>();
  }
  return report;
}

void FleetSamples::add(const std::string& gateway, const std::string& endpoint,
                       const std::vector<LoadSample>& samples) {
  Seconds& seconds = endpoints_[endpoint];
  for (const LoadSample& sample : samples) {
    const int64_t second = second_of(sample.unix_ms);
    if (second > seconds.taken_until) {
      // Keyed by the sample's own end too: a resent sample replaces its copy, and two
      // samples of one gateway that round to the same second (its ticks drift) both count.
      seconds.by_second[second][gateway][sample.unix_ms] = sample;
    }
  }
}

std::vector<LoadSample> FleetSamples::take(const std::string& endpoint, int64_t now_unix_ms) {
  std::vector<LoadSample> taken;
  const auto found = endpoints_.find(endpoint);
  if (found == endpoints_.end()) {
    return taken;
  }
  Seconds& seconds = found->second;
  seconds.by_second.erase(seconds.by_second.upper_bound(now_unix_ms + kFutureLimitMs),
                          seconds.by_second.end());
  const int64_t settled = now_unix_ms - settle_.count();
  while (!seconds.by_second.empty() && seconds.by_second.begin()->first <= settled) {
    const auto& [second, by_gateway] = *seconds.by_second.begin();
    LoadSample sum;
    sum.unix_ms = second;
    double latency_weighted = 0;
    for (const auto& [gateway, samples] : by_gateway) {
      // One gateway's second: its counts summed, its gauges (in flight, queued) the mean of
      // its samples in the second.
      const auto count = static_cast<double>(samples.size());
      for (const auto& [end, sample] : samples) {
        sum.concurrency += sample.concurrency / count;
        sum.queued += sample.queued / count;
        sum.arrivals += sample.arrivals;
        sum.completions += sample.completions;
        sum.rejected += sample.rejected;
        latency_weighted += sample.latency_ms * static_cast<double>(sample.completions);
        sum.responses.merge(sample.responses);
      }
    }
    sum.latency_ms =
        sum.completions > 0 ? latency_weighted / static_cast<double>(sum.completions) : 0;
    taken.push_back(sum);
    seconds.taken_until = second;
    seconds.by_second.erase(seconds.by_second.begin());
  }
  return taken;
}

void FleetSamples::retain(const std::vector<std::string>& endpoints) {
  std::erase_if(endpoints_, [&](const auto& entry) {
    return std::find(endpoints.begin(), endpoints.end(), entry.first) == endpoints.end();
  });
}

}  // namespace flotilla::cluster

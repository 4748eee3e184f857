#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include <dirent.h>
#include <unistd.h>

#include "common/common.h"

namespace flotilla {
namespace {

std::string format_double(double value) {
  if (std::isinf(value)) {
    return value > 0 ? "+Inf" : "-Inf";
  }
  if (std::isnan(value)) {
    return "NaN";
  }
  char buffer[32];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return ec == std::errc() ? std::string(buffer, end) : std::string("0");
}

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string render_labels(const Labels& labels) {
  std::string out;
  for (const auto& [key, value] : labels) {
    if (!out.empty()) {
      out += ',';
    }
    out += key + "=\"" + escape_label_value(value) + "\"";
  }
  return out;
}

// "name{labels}" or "name" when there are none; `extra` is appended inside the braces.
std::string series(const std::string& name, const std::string& labels,
                   const std::string& extra = "") {
  std::string all = labels;
  if (!extra.empty()) {
    all += all.empty() ? extra : "," + extra;
  }
  return all.empty() ? name : name + "{" + all + "}";
}

}  // namespace

std::optional<double> metric_value(std::string_view text, std::string_view name) {
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (line.size() > name.size() && line.starts_with(name) && line[name.size()] == ' ') {
      line.remove_prefix(name.size() + 1);
      double value = 0;
      const auto [rest, error] = std::from_chars(line.data(), line.data() + line.size(), value);
      const bool ends = rest == line.data() + line.size() || *rest == ' ' || *rest == '\r';
      return error == std::errc() && ends ? std::optional(value) : std::nullopt;
    }
  }
  return std::nullopt;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)),
      buckets_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {
  FLOTILLA_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()));
}

void Histogram::observe(double value) {
  size_t index = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  buckets_[index].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::bucket_counts() const {
  std::vector<uint64_t> counts(bounds_.size() + 1);
  for (size_t i = 0; i < counts.size(); ++i) {
    counts[i] = buckets_[i].load(std::memory_order_relaxed);
  }
  return counts;
}

std::vector<double> exponential_buckets(double start, double factor, int count) {
  std::vector<double> bounds;
  double bound = start;
  for (int i = 0; i < count; ++i) {
    bounds.push_back(bound);
    bound *= factor;
  }
  return bounds;
}

int ResponseCounts::latency_bucket(double seconds) {
  if (!(seconds >= kFirstLatencyBound)) {  // NaN too
    return 0;
  }
  const double bucket = std::floor(4 * std::log2(seconds / kFirstLatencyBound)) + 1;
  return static_cast<int>(std::min<double>(bucket, kLatencyBuckets - 1));
}

double ResponseCounts::latency_bucket_middle(int bucket) {
  if (bucket <= 0) {
    return kFirstLatencyBound / 2;
  }
  return kFirstLatencyBound * std::exp2((bucket - 0.5) / 4);
}

void ResponseCounts::merge(const ResponseCounts& other) {
  for (const auto& [code, count] : other.codes) {
    codes[code] += count;
  }
  for (const auto& [bucket, count] : other.latency) {
    latency[bucket] += count;
  }
}

uint64_t ResponseCounts::responses() const {
  uint64_t total = 0;
  for (const auto& [code, count] : codes) {
    total += count;
  }
  return total;
}

double ResponseCounts::latency_quantile(double q) const {
  uint64_t total = 0;
  for (const auto& [bucket, count] : latency) {
    total += count;
  }
  if (total == 0) {
    return 0;
  }
  const auto rank = std::max<uint64_t>(
      1, static_cast<uint64_t>(std::ceil(std::clamp(q, 0.0, 1.0) * static_cast<double>(total))));
  uint64_t seen = 0;
  for (const auto& [bucket, count] : latency) {
    seen += count;
    if (seen >= rank) {
      return latency_bucket_middle(bucket);
    }
  }
  return latency_bucket_middle(latency.rbegin()->first);
}

MetricsRegistry::Family& MetricsRegistry::family(const std::string& name, const std::string& help,
                                                 const std::string& type) {
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.help = help;
    it->second.type = type;
  }
  FLOTILLA_CHECK(it->second.type == type);
  return it->second;
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help,
                                  const Labels& labels) {
  MutexLock lock(mutex_);
  auto& slot = family(name, help, "counter").counters[render_labels(labels)];
  if (!slot) {
    slot = std::make_unique<Counter>();
  }
  return *slot;
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help,
                              const Labels& labels) {
  MutexLock lock(mutex_);
  auto& slot = family(name, help, "gauge").gauges[render_labels(labels)];
  if (!slot) {
    slot = std::make_unique<Gauge>();
  }
  return *slot;
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                      const std::vector<double>& upper_bounds,
                                      const Labels& labels) {
  MutexLock lock(mutex_);
  auto& slot = family(name, help, "histogram").histograms[render_labels(labels)];
  if (!slot) {
    slot = std::make_unique<Histogram>(upper_bounds);
  }
  return *slot;
}

void MetricsRegistry::callback(const std::string& name, const std::string& help,
                               const std::string& type, std::function<double()> read) {
  FLOTILLA_CHECK(type == "gauge" || type == "counter");
  MutexLock lock(mutex_);
  family(name, help, type).read = std::move(read);
}

namespace {

// Whether a rendered label set (`a="1",b="2"`) holds the rendered pair `fragment` (`b="2"`) as
// one of its elements. An escaped value cannot contain an unescaped `"`, so a match inside a
// value is impossible.
bool has_label(std::string_view labels, std::string_view fragment) {
  for (size_t at = labels.find(fragment); at != std::string_view::npos;
       at = labels.find(fragment, at + 1)) {
    const size_t end = at + fragment.size();
    if ((at == 0 || labels[at - 1] == ',') && (end == labels.size() || labels[end] == ',')) {
      return true;
    }
  }
  return false;
}

template <typename Series>
void move_matching(std::map<std::string, std::unique_ptr<Series>>& from,
                   const std::vector<std::string>& fragments,
                   std::vector<std::unique_ptr<Series>>& to) {
  for (auto it = from.begin(); it != from.end();) {
    const bool matches = std::all_of(fragments.begin(), fragments.end(),
                                     [&](const auto& f) { return has_label(it->first, f); });
    if (matches) {
      to.push_back(std::move(it->second));
      it = from.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace

void MetricsRegistry::retire(const Labels& match) {
  std::vector<std::string> fragments;
  for (const auto& pair : match) {
    fragments.push_back(render_labels({pair}));
  }
  MutexLock lock(mutex_);
  for (auto& [name, family] : families_) {
    move_matching(family.counters, fragments, retired_counters_);
    move_matching(family.gauges, fragments, retired_gauges_);
    move_matching(family.histograms, fragments, retired_histograms_);
  }
}

std::string MetricsRegistry::render() const {
  MutexLock lock(mutex_);
  std::ostringstream out;
  for (const auto& [name, family] : families_) {
    out << "# HELP " << name << ' ' << family.help << '\n';
    out << "# TYPE " << name << ' ' << family.type << '\n';
    if (family.read) {
      out << name << ' ' << format_double(family.read()) << '\n';
    }
    for (const auto& [labels, counter] : family.counters) {
      out << series(name, labels) << ' ' << counter->value() << '\n';
    }
    for (const auto& [labels, gauge] : family.gauges) {
      out << series(name, labels) << ' ' << format_double(gauge->value()) << '\n';
    }
    for (const auto& [labels, histogram] : family.histograms) {
      auto counts = histogram->bucket_counts();
      const auto& bounds = histogram->upper_bounds();
      uint64_t cumulative = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        cumulative += counts[i];
        std::string le = i < bounds.size() ? format_double(bounds[i]) : "+Inf";
        out << series(name + "_bucket", labels, "le=\"" + le + "\"") << ' ' << cumulative << '\n';
      }
      out << series(name + "_sum", labels) << ' ' << format_double(histogram->sum()) << '\n';
      // The +Inf bucket is the count; read from it so the two always agree in one scrape.
      out << series(name + "_count", labels) << ' ' << cumulative << '\n';
    }
  }
  return out.str();
}

namespace {

// Fields of /proc/self/stat after the command name: state is field 3; utime 14, stime 15,
// starttime 22, vsize 23, rss 24 (1-based, as in proc(5)).
std::vector<std::string> read_proc_stat_fields() {
  std::ifstream file("/proc/self/stat");
  std::string content((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<std::string> fields;
  auto close_paren = content.rfind(')');
  if (close_paren == std::string::npos) {
    return fields;
  }
  std::istringstream rest(content.substr(close_paren + 2));
  fields.resize(2);  // pid and comm, so indices match proc(5) minus one
  std::string field;
  while (rest >> field) {
    fields.push_back(field);
  }
  return fields;
}

double proc_stat_field(size_t one_based_index) {
  auto fields = read_proc_stat_fields();
  if (fields.size() < one_based_index) {
    return 0;
  }
  return std::strtod(fields[one_based_index - 1].c_str(), nullptr);
}

double boot_time_seconds() {
  std::ifstream file("/proc/stat");
  std::string key;
  while (file >> key) {
    if (key == "btime") {
      double value = 0;
      file >> value;
      return value;
    }
  }
  return 0;
}

}  // namespace

void register_process_metrics(MetricsRegistry& registry) {
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page_size = static_cast<double>(sysconf(_SC_PAGESIZE));
  registry.callback("process_cpu_seconds_total", "Total user and system CPU time in seconds.",
                    "counter", [ticks] {
                      auto fields = read_proc_stat_fields();
                      if (fields.size() < 15) {
                        return 0.0;
                      }
                      return (std::strtod(fields[13].c_str(), nullptr) +
                              std::strtod(fields[14].c_str(), nullptr)) /
                             ticks;
                    });
  registry.callback("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge",
                    [page_size] { return proc_stat_field(24) * page_size; });
  registry.callback("process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge",
                    [] { return proc_stat_field(23); });
  registry.callback("process_open_fds", "Number of open file descriptors.", "gauge", [] {
    double count = 0;
    if (DIR* dir = opendir("/proc/self/fd")) {
      while (readdir(dir) != nullptr) {
        ++count;
      }
      closedir(dir);
      count -= 3;  // ".", ".." and the descriptor of the listing itself
    }
    return count;
  });
  const double start = boot_time_seconds() + proc_stat_field(22) / ticks;
  registry.callback("process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.", "gauge",
                    [start] { return start; });
}

MetricsRegistry& default_registry() {
  static MetricsRegistry* registry = new MetricsRegistry();  // never destroyed: used at exit
  return *registry;
}

}  // namespace flotilla

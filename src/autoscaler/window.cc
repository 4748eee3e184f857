#include <algorithm>
#include <cmath>
#include <vector>

#include "autoscaler/autoscaler.h"

namespace flotilla::autoscaler {
namespace {

// Mean or max of `value(sample)` over samples with time in (now - window, now].
template <typename Value>
std::optional<double> aggregate(const std::deque<Sample>& samples, Millis now, Millis window,
                                bool mean, Value value) {
  double sum = 0;
  std::optional<double> best;
  int count = 0;
  for (size_t i = samples.size(); i-- > 0 && samples[i].time > now - window;) {
    if (samples[i].time <= now) {
      const double v = value(i);
      sum += v;
      best = best ? std::max(*best, v) : v;
      ++count;
    }
  }
  if (count == 0) {
    return std::nullopt;
  }
  return mean ? sum / count : *best;
}

}  // namespace

namespace {

struct Line {
  double slope = 0;
  double at_zero = 0;  // the line's value at t = 0
};

double median(std::vector<double>& values) {
  std::nth_element(values.begin(), values.begin() + static_cast<ptrdiff_t>(values.size() / 2),
                   values.end());
  return values[values.size() / 2];
}

// Theil-Sen: the median of the pairwise slopes, and the median intercept; robust to outliers.
// Needs at least two distinct times.
Line theil_sen(const std::vector<std::pair<double, double>>& points) {
  std::vector<double> values;
  for (size_t i = 0; i < points.size(); ++i) {
    for (size_t j = i + 1; j < points.size(); ++j) {
      if (points[i].first != points[j].first) {
        values.push_back((points[j].second - points[i].second) /
                         (points[j].first - points[i].first));
      }
    }
  }
  Line line;
  line.slope = median(values);
  values.clear();
  for (const auto& [t, v] : points) {
    values.push_back(v - line.slope * t);
  }
  line.at_zero = median(values);
  return line;
}

}  // namespace

std::optional<double> SampleWindow::arrival_growth(Millis now, Millis window, Millis ahead) const {
  // (seconds relative to now, arrivals), oldest first.
  std::vector<std::pair<double, double>> points;
  for (const Sample& sample : samples_) {
    if (sample.time > now - window && sample.time <= now) {
      points.emplace_back(static_cast<double>((sample.time - now).count()) / 1000, sample.arrivals);
    }
  }
  if (points.size() < 6) {
    return std::nullopt;
  }
  // A trend is a slope both halves of the window show: a step (a spike some seconds old) lies
  // in one half only, or between them, and is not extrapolated.
  const auto middle = points.begin() + static_cast<ptrdiff_t>(points.size() / 2);
  const Line older = theil_sen({points.begin(), middle});
  const Line newer = theil_sen({middle, points.end()});
  const double slope = std::min(older.slope, newer.slope);
  if (newer.at_zero <= 0) {
    return std::nullopt;
  }
  const double rise = slope * static_cast<double>(ahead.count()) / 1000;
  // Bursty arrivals tilt a short line by chance: a rise within twice the spread of the
  // arrivals around their lines (a robust standard deviation, 1.4826 x the median absolute
  // residual) is not a trend.
  std::vector<double> residuals;
  for (auto it = points.begin(); it != points.end(); ++it) {
    const Line& line = it < middle ? older : newer;
    residuals.push_back(std::abs(it->second - (line.at_zero + line.slope * it->first)));
  }
  if (rise <= 2 * 1.4826 * median(residuals)) {
    return 1.0;
  }
  return (newer.at_zero + rise) / newer.at_zero;
}

std::optional<double> SampleWindow::standing_demand(Millis now, Millis window) const {
  std::optional<double> least;
  const Sample* newest = nullptr;
  const Sample* oldest = nullptr;
  for (auto it = samples_.rbegin(); it != samples_.rend() && it->time > now - window; ++it) {
    if (it->time <= now) {
      newest = newest ? newest : &*it;
      oldest = &*it;
      least = least ? std::min(*least, it->demand()) : it->demand();
    }
  }
  // A queue that drains (a backlog after a cold start) is not standing.
  if (!least || newest->queued <= 0 || newest->queued < oldest->queued) {
    return std::nullopt;
  }
  return least;
}

void SampleWindow::add(const Sample& sample) {
  samples_.push_back(sample);
  const Derived derived = newest_derived();
  offered_.push_back(derived.offered);
  newest_wait_over_service_ = derived.wait_over_service;
  while (samples_.size() > capacity_) {
    samples_.pop_front();
    offered_.pop_front();
  }
}

SampleWindow::Derived SampleWindow::newest_derived() const {
  const Sample& newest = samples_.back();
  // Without a queue every arrival is in flight already: what the replicas hold is the demand
  // (and a second's arrivals over its completions would be noise for requests longer than a
  // second: 70 arrivals against 1 completion).
  if (newest.queued <= 0) {
    return {newest.concurrency, 0};
  }
  // Little's law over the newest seconds that hold enough completions for a stable latency: one
  // second at high rates, up to a minute for long requests.
  constexpr double kLatencyCompletions = 100;
  constexpr size_t kLatencySeconds = 60;
  double concurrency = 0;
  double completions = 0;
  double arrivals = 0;
  size_t seconds = 0;
  for (size_t i = samples_.size();
       i-- > 0 && seconds < kLatencySeconds && completions < kLatencyCompletions;) {
    concurrency += samples_[i].concurrency;
    completions += samples_[i].completions;
    arrivals += samples_[i].arrivals;
    ++seconds;
  }
  if (completions <= 0) {
    // Nothing served yet (scale from zero): a waiting request asks for a first replica; how
    // many more are needed shows once it serves.
    return {newest.concurrency + 1.0, std::nullopt};
  }
  const double latency_s = concurrency / completions;
  const double arrival_rate = arrivals / static_cast<double>(seconds);
  // The replicas are full (requests wait): the arrivals need arrival rate x latency in flight,
  // so a queue that grows counts in proportion to the load it turns away, not by its length;
  // plus the backlog, served within kBacklogDrainSeconds (each waiting request needs a slot
  // for its latency, and never more than one slot).
  constexpr double kBacklogDrainSeconds = 5;
  const double offered = std::max(newest.concurrency, arrival_rate * latency_s) +
                         newest.queued * std::min(1.0, latency_s / kBacklogDrainSeconds);
  // The wait by Little's law too: the queue over the rate it is fed at.
  const std::optional<double> wait_over_service =
      arrival_rate > 0 ? std::optional(newest.queued / arrival_rate / latency_s) : std::nullopt;
  return {offered, wait_over_service};
}

std::optional<double> SampleWindow::mean_demand(Millis now, Millis window) const {
  return aggregate(samples_, now, window, true, [this](size_t i) { return samples_[i].demand(); });
}

std::optional<double> SampleWindow::max_demand(Millis now, Millis window) const {
  return aggregate(samples_, now, window, false, [this](size_t i) { return samples_[i].demand(); });
}

std::optional<double> SampleWindow::mean_offered(Millis now, Millis window) const {
  return aggregate(samples_, now, window, true, [this](size_t i) { return offered_[i]; });
}

std::optional<double> SampleWindow::max_offered(Millis now, Millis window) const {
  return aggregate(samples_, now, window, false, [this](size_t i) { return offered_[i]; });
}

std::optional<Sample> SampleWindow::newest(Millis now) const {
  if (samples_.empty() || samples_.back().time <= now - Millis(1'000)) {
    return std::nullopt;
  }
  return samples_.back();
}

std::optional<double> SampleWindow::wait_over_service(Millis now) const {
  return newest(now) ? newest_wait_over_service_ : std::nullopt;
}

bool SampleWindow::covers(Millis now, Millis window) const {
  return !samples_.empty() && samples_.front().time <= now - window + Millis(1'000);
}

}  // namespace flotilla::autoscaler

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
  for (auto it = samples.rbegin(); it != samples.rend() && it->time > now - window; ++it) {
    if (it->time <= now) {
      const double v = value(*it);
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

double Sample::offered() const {
  if (completions > 0) {
    // Plus the backlog, to be served within kBacklogDrainSeconds: each waiting request needs the
    // replicas' mean latency (concurrency / completions, Little's law).
    constexpr double kBacklogDrainSeconds = 5;
    return concurrency * std::max(1.0, arrivals / completions) +
           queued * (concurrency / completions) / kBacklogDrainSeconds;
  }
  // Nothing served yet (scale from zero): a waiting request asks for a first replica; how
  // many more are needed shows once it serves.
  return concurrency + (queued > 0 ? 1.0 : 0.0);
}

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
  while (samples_.size() > capacity_) {
    samples_.pop_front();
  }
}

std::optional<double> SampleWindow::mean_demand(Millis now, Millis window) const {
  return aggregate(samples_, now, window, true, [](const Sample& s) { return s.demand(); });
}

std::optional<double> SampleWindow::max_demand(Millis now, Millis window) const {
  return aggregate(samples_, now, window, false, [](const Sample& s) { return s.demand(); });
}

std::optional<double> SampleWindow::mean_offered(Millis now, Millis window) const {
  return aggregate(samples_, now, window, true, [](const Sample& s) { return s.offered(); });
}

std::optional<double> SampleWindow::max_offered(Millis now, Millis window) const {
  return aggregate(samples_, now, window, false, [](const Sample& s) { return s.offered(); });
}

bool SampleWindow::covers(Millis now, Millis window) const {
  return !samples_.empty() && samples_.front().time <= now - window + Millis(1'000);
}

}  // namespace flotilla::autoscaler

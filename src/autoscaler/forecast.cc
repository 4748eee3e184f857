// The seasonal forecaster: an endpoint's busiest second per bucket, and a quantile of the same
// time on past days (or weeks) as the floor to be ready for.
#include <algorithm>
#include <cmath>
#include <vector>

#include "autoscaler/autoscaler.h"

namespace flotilla::autoscaler {

ForecastOptions forecast_options_for_day(Millis day, bool enabled) {
  ForecastOptions options;
  options.enabled = enabled;
  options.season = day;
  options.bucket = std::max(Millis(1), day / 1440);
  return options;
}

Forecaster::Forecaster(const ForecastOptions& options) : options_(options) {
  FLOTILLA_CHECK(options_.bucket > Millis(0) && options_.season >= options_.bucket);
  options_.min_seasons = std::max<int64_t>(1, options_.min_seasons);
  options_.max_seasons = std::max(options_.min_seasons, options_.max_seasons);
  options_.seasons_per_week = std::max<int64_t>(1, options_.seasons_per_week);
}

int64_t Forecaster::index_of(Millis time) const {
  // Floor division: times before the epoch (a simulator's) land in the bucket below.
  const int64_t ms = time.count();
  const int64_t width = options_.bucket.count();
  return ms >= 0 ? ms / width : -((-ms + width - 1) / width);
}

void Forecaster::add(Millis time, double offered) {
  if (!std::isfinite(offered) || offered < 0) {
    return;
  }
  // The second (time - 1 s, time] belongs to the bucket of its start.
  const int64_t index = index_of(time - Millis(1'000) + Millis(1));
  double& peak = peaks_[index];
  peak = std::max(peak, offered);
  peaks_.erase(peaks_.begin(), peaks_.lower_bound(index_of(time - retention())));
}

Millis Forecaster::retention() const {
  return options_.season * (options_.max_seasons * options_.seasons_per_week + 1) + options_.lead +
         options_.bucket;
}

void Forecaster::restore(Millis bucket_start, double peak) {
  if (!std::isfinite(peak) || peak < 0) {
    return;
  }
  const int64_t index = index_of(bucket_start);
  double& kept = peaks_[index];
  kept = std::max(kept, peak);
  closed_through_ = std::max(closed_through_, index);  // already kept: not handed out again
}

std::vector<std::pair<Millis, double>> Forecaster::take_closed() {
  std::vector<std::pair<Millis, double>> closed;
  if (peaks_.empty()) {
    return closed;
  }
  // The newest bucket is still filling.
  const int64_t newest = peaks_.rbegin()->first;
  for (auto it = peaks_.upper_bound(closed_through_); it != peaks_.end() && it->first < newest;
       ++it) {
    closed.emplace_back(Millis(it->first * options_.bucket.count()), it->second);
    closed_through_ = it->first;
  }
  return closed;
}

std::optional<double> Forecaster::busiest(Millis from, Millis to) const {
  std::optional<double> most;
  for (auto it = peaks_.lower_bound(index_of(from));
       it != peaks_.end() && it->first <= index_of(to); ++it) {
    most = std::max(most.value_or(0), it->second);
  }
  return most;
}

std::optional<Forecast> Forecaster::forecast(Millis now) const {
  // The same span a `stride` of seasons back, for as many strides as have history there.
  const auto past = [&](int64_t stride) {
    std::vector<double> values;
    for (int64_t back = 1; back <= options_.max_seasons; ++back) {
      const Millis shift = options_.season * (back * stride);
      // The seconds that end in (now, now + lead], by their buckets as add() files them.
      const Millis from = now - shift + Millis(1);
      const Millis to = std::max(from, now - shift + options_.lead - Millis(1'000) + Millis(1));
      if (auto most = busiest(from, to)) {
        values.push_back(*most);
      }
    }
    return values;
  };
  // Once enough weeks are known, the same weekday is the better guide (weekends differ).
  bool weekly = options_.seasons_per_week > 1;
  std::vector<double> values = weekly ? past(options_.seasons_per_week) : std::vector<double>{};
  if (static_cast<int64_t>(values.size()) < options_.min_seasons) {
    weekly = false;
    values = past(1);
  }
  if (static_cast<int64_t>(values.size()) < options_.min_seasons) {
    return std::nullopt;
  }
  std::sort(values.begin(), values.end());
  const double rank =
      std::clamp(options_.quantile, 0.0, 1.0) * static_cast<double>(values.size() - 1);
  return Forecast{values[static_cast<size_t>(std::floor(rank))],
                  static_cast<int64_t>(values.size()), weekly};
}

}  // namespace flotilla::autoscaler

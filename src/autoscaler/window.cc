#include "autoscaler/autoscaler.h"

namespace flotilla::autoscaler {

void SampleWindow::add(const Sample& sample) {
  samples_.push_back(sample);
  while (samples_.size() > capacity_) {
    samples_.pop_front();
  }
}

std::optional<double> SampleWindow::mean_demand(Millis now, Millis window) const {
  double sum = 0;
  int count = 0;
  for (auto it = samples_.rbegin(); it != samples_.rend() && it->time > now - window; ++it) {
    if (it->time <= now) {
      sum += it->concurrency + it->queued;
      ++count;
    }
  }
  return count == 0 ? std::nullopt : std::optional<double>(sum / count);
}

std::optional<double> SampleWindow::max_demand(Millis now, Millis window) const {
  std::optional<double> best;
  for (auto it = samples_.rbegin(); it != samples_.rend() && it->time > now - window; ++it) {
    if (it->time <= now) {
      const double demand = it->concurrency + it->queued;
      best = best ? std::max(*best, demand) : demand;
    }
  }
  return best;
}

bool SampleWindow::covers(Millis now, Millis window) const {
  return !samples_.empty() && samples_.front().time <= now - window + Millis(1'000);
}

}  // namespace flotilla::autoscaler

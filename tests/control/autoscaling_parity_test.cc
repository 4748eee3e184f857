// `flotilla up` and `flotilla sim` make the same autoscaling decisions from the same samples
// (issue 19 item 2): one recorded sequence (steady, a spike, a long drop) fed to the control
// plane's EndpointScaler and to the autoscaler the simulator runs, compared step by step.
#include <gtest/gtest.h>

#include "control/control_scaling.h"
#include "sim/sim.h"

namespace flotilla::control {
namespace {

using autoscaler::Millis;

struct Phase {
  int seconds;
  double concurrency;  // at replicas
  double queued;       // at the gateway
  double latency_ms;
};

// The recording: 1-second samples of one endpoint.
constexpr Phase kRecording[] = {
    {60, 20, 0, 10},    // steady at 10 ms: the baseline
    {60, 120, 30, 25},  // a 6x spike, replicas slow down and requests queue
    {420, 4, 0, 10},    // the drop, longer than the down window
};

TEST(AutoscalingParityTest, ControlPlaneAndSimulatorDecideTheSame) {
  ServedModelSpec served;
  served.name = "v1";
  served.model = "/m/model.json";
  served.runtime = "xgboost";  // initial target 16
  served.concurrency = {1, 4096};
  served.traffic = 100;
  EndpointScaler control(EndpointSpec{"fraud", {served}, {}, {}}, AutoscalingOptions{}, 2,
                         Millis(0));

  sim::Scenario scenario;
  scenario.min_replicas = 1;
  scenario.initial_replicas = 2;
  scenario.configured_concurrency = 16;
  const auto simulated = sim::make_apa_autoscaler(scenario, sim::SimOptions{});

  const auto usage = [] {
    return ReplicaUsage{.cpu_utilization = 0.3, .queued = 0};
  };
  int64_t ready = 2;
  int64_t second = 0;
  int64_t horizontal_changes = 0;
  int64_t vertical_changes = 0;
  for (const Phase& phase : kRecording) {
    for (int i = 0; i < phase.seconds; ++i) {
      ++second;
      LoadSample sample;
      sample.unix_ms = second * 1'000;
      sample.concurrency = phase.concurrency;
      sample.queued = phase.queued;
      sample.arrivals = static_cast<uint64_t>(phase.concurrency * 1000 / phase.latency_ms);
      sample.completions = sample.arrivals;
      sample.latency_ms = phase.latency_ms;
      control.add_samples({sample}, ready);
      simulated->add_samples({&sample, 1}, ready);
      const Millis now(second * 1'000);
      const auto control_changes = control.tick(now, ready, 0, 0, usage);
      const auto simulated_changes = simulated->tick(now, ready, 0, 0, usage);
      ASSERT_EQ(control_changes, simulated_changes) << "second " << second;
      ASSERT_EQ(control.scale().replicas, simulated->replicas()) << "second " << second;
      ASSERT_EQ(control.scale().target, simulated->target()) << "second " << second;
      for (const std::string& change : control_changes) {
        (change.starts_with("horizontal") ? horizontal_changes : vertical_changes) += 1;
      }
      ready = control.scale().replicas;  // the fleet follows at once
    }
  }
  // The recording exercised both policies both ways.
  EXPECT_GE(horizontal_changes, 2);
  EXPECT_GE(vertical_changes, 1);
  EXPECT_LT(control.scale().replicas, 8);
}

}  // namespace
}  // namespace flotilla::control

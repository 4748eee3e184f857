#include "control/reconciler.h"

#include <gtest/gtest.h>

namespace flotilla::control {
namespace {

using orchestrator::Replica;
using orchestrator::ReplicaState;

std::string same_runtime(const ServedModelSpec& served) {
  return served.runtime;
}

ServedModelSpec served(std::string name, std::string model, int64_t traffic = 100,
                       int64_t min_concurrency = 1) {
  ServedModelSpec spec;
  spec.name = std::move(name);
  spec.model = std::move(model);
  spec.runtime = "xgboost";
  spec.traffic = traffic;
  spec.concurrency = {min_concurrency, 64};
  return spec;
}

EndpointSpec endpoint(std::vector<ServedModelSpec> versions) {
  return EndpointSpec{"fraud", std::move(versions), {}, {}};
}

Replica replica(const std::string& id, const ServedModelSpec& version,
                ReplicaState state = ReplicaState::kReady) {
  Replica result;
  result.id = id;
  result.deployment = make_deployment("fraud", version, same_runtime);
  result.host = "127.0.0.1";
  result.port = 9000;
  result.state = state;
  return result;
}

int wanted(const ReconcilePlan& plan, const ServedModelSpec& version) {
  const std::string key = deployment_key("fraud", version);
  for (const auto& [deployment, count] : plan.ensure) {
    if (deployment.key == key) {
      return count;
    }
  }
  return -1;  // not mentioned
}

TEST(ReconcilerTest, NewEndpointStartsItsVersionAndWaitsInTheTable) {
  const ServedModelSpec v1 = served("v1", "/m/a.json");
  const ReconcilePlan plan =
      reconcile({{endpoint({v1}), std::nullopt, std::nullopt}}, {}, same_runtime);
  EXPECT_EQ(wanted(plan, v1), 1);
  EXPECT_TRUE(plan.promoted.empty());
  ASSERT_EQ(plan.table.endpoints.size(), 1u);
  ASSERT_EQ(plan.table.endpoints[0].versions.size(), 1u);
  EXPECT_TRUE(plan.table.endpoints[0].versions[0].replicas.empty());
}

TEST(ReconcilerTest, PromotesOnceEveryProvisionedReplicaIsReady) {
  const ServedModelSpec v1 = served("v1", "/m/a.json", 100, 40);  // 40 / 16 → 3 replicas
  const EndpointState state{endpoint({v1}), std::nullopt, std::nullopt};
  std::vector<Replica> replicas = {replica("a", v1), replica("b", v1),
                                   replica("c", v1, ReplicaState::kLoading)};
  ReconcilePlan plan = reconcile({state}, replicas, same_runtime);
  EXPECT_EQ(wanted(plan, v1), 3);
  EXPECT_TRUE(plan.promoted.empty());
  // The two ready replicas already take the requests held for the endpoint.
  EXPECT_EQ(plan.table.endpoints[0].versions[0].replicas.size(), 2u);

  replicas[2].state = ReplicaState::kReady;
  plan = reconcile({state}, replicas, same_runtime);
  EXPECT_EQ(plan.promoted, std::vector<std::string>{"fraud"});
  ASSERT_EQ(plan.table.endpoints[0].versions[0].replicas.size(), 3u);
  EXPECT_EQ(plan.table.endpoints[0].versions[0].replicas[0].max_in_flight,
            initial_target_concurrency(v1));
}

TEST(ReconcilerTest, RolloutKeepsTheOldVersionServingUntilTheNewOneIsReady) {
  const ServedModelSpec v1 = served("v1", "/m/a.json");
  const ServedModelSpec v2 = served("v2", "/m/b.json");
  const EndpointState state{endpoint({v2}), endpoint({v1}), std::nullopt};

  ReconcilePlan plan = reconcile({state}, {replica("old", v1)}, same_runtime);
  EXPECT_EQ(wanted(plan, v1), 1);
  EXPECT_EQ(wanted(plan, v2), 1);
  EXPECT_TRUE(plan.promoted.empty());
  ASSERT_EQ(plan.table.endpoints[0].versions.size(), 1u);
  EXPECT_EQ(plan.table.endpoints[0].versions[0].name, "v1");
  EXPECT_EQ(plan.table.endpoints[0].versions[0].replicas[0].id, "old");

  plan = reconcile({state}, {replica("old", v1), replica("new", v2)}, same_runtime);
  EXPECT_EQ(plan.promoted, std::vector<std::string>{"fraud"});
  EXPECT_EQ(plan.table.endpoints[0].versions[0].name, "v2");
  EXPECT_EQ(plan.table.endpoints[0].versions[0].replicas[0].id, "new");
  EXPECT_EQ(wanted(plan, v1), 0);  // retired: drained, then stopped
  EXPECT_EQ(wanted(plan, v2), 1);
}

TEST(ReconcilerTest, SameVersionNameWithANewModelIsARollout) {
  const ServedModelSpec old_model = served("v1", "/m/a.json");
  const ServedModelSpec new_model = served("v1", "/m/b.json");
  const EndpointState state{endpoint({new_model}), endpoint({old_model}), std::nullopt};
  const ReconcilePlan plan = reconcile({state}, {replica("old", old_model)}, same_runtime);
  EXPECT_TRUE(plan.promoted.empty());
  EXPECT_EQ(wanted(plan, new_model), 1);
  EXPECT_EQ(plan.table.endpoints[0].versions[0].replicas[0].id, "old");
}

TEST(ReconcilerTest, TrafficChangeIsPromotedAtOnceWithoutNewReplicas) {
  const ServedModelSpec a = served("a", "/m/a.json", 50);
  const ServedModelSpec b = served("b", "/m/b.json", 50);
  ServedModelSpec a90 = a;
  a90.traffic = 90;
  ServedModelSpec b10 = b;
  b10.traffic = 10;
  const EndpointState state{endpoint({a90, b10}), endpoint({a, b}), std::nullopt};
  const ReconcilePlan plan = reconcile({state}, {replica("ra", a), replica("rb", b)}, same_runtime);
  EXPECT_EQ(plan.promoted, std::vector<std::string>{"fraud"});
  EXPECT_EQ(wanted(plan, a), 1);  // the same deployment keys: nothing restarts
  EXPECT_EQ(wanted(plan, b), 1);
  EXPECT_EQ(plan.ensure.size(), 2u);
  EXPECT_EQ(plan.table.endpoints[0].versions[0].traffic, 90);
  EXPECT_EQ(plan.table.endpoints[0].versions[1].traffic, 10);
}

TEST(ReconcilerTest, ConcurrencyChangeScalesTheSameDeployment) {
  const ServedModelSpec small = served("v1", "/m/a.json", 100, 1);
  const ServedModelSpec large = served("v1", "/m/a.json", 100, 33);  // 3 replicas
  ASSERT_EQ(deployment_key("fraud", small), deployment_key("fraud", large));
  const EndpointState state{endpoint({large}), endpoint({small}), std::nullopt};
  const ReconcilePlan plan = reconcile({state}, {replica("r", small)}, same_runtime);
  EXPECT_EQ(wanted(plan, large), 3);
  EXPECT_EQ(plan.ensure.size(), 1u);
  EXPECT_TRUE(plan.promoted.empty());  // promoted once all three are ready
  EXPECT_EQ(plan.table.endpoints[0].versions[0].replicas.size(), 1u);
}

TEST(ReconcilerTest, DeletedEndpointsReplicasAreRetired) {
  const ServedModelSpec v1 = served("v1", "/m/a.json");
  const ReconcilePlan plan = reconcile({}, {replica("r", v1)}, same_runtime);
  EXPECT_TRUE(plan.table.endpoints.empty());
  EXPECT_EQ(wanted(plan, v1), 0);
}

TEST(ReconcilerTest, FailedAndDrainingReplicasNeverServe) {
  const ServedModelSpec v1 = served("v1", "/m/a.json");
  const EndpointState state{endpoint({v1}), endpoint({v1}), std::nullopt};
  const ReconcilePlan plan =
      reconcile({state},
                {replica("f", v1, ReplicaState::kFailed), replica("d", v1, ReplicaState::kDraining),
                 replica("s", v1, ReplicaState::kStarting)},
                same_runtime);
  EXPECT_TRUE(plan.table.endpoints[0].versions[0].replicas.empty());
  EXPECT_EQ(wanted(plan, v1), 1);
}

TEST(ReconcilerTest, PlanIsTheSameWhenRunAgain) {
  const ServedModelSpec v1 = served("v1", "/m/a.json");
  const ServedModelSpec v2 = served("v2", "/m/b.json");
  const std::vector<EndpointState> states = {{endpoint({v2}), endpoint({v1}), std::nullopt}};
  const std::vector<Replica> replicas = {replica("old", v1)};
  const ReconcilePlan first = reconcile(states, replicas, same_runtime);
  const ReconcilePlan second = reconcile(states, replicas, same_runtime);
  EXPECT_EQ(first.table, second.table);
  EXPECT_EQ(first.ensure, second.ensure);
  EXPECT_EQ(first.promoted, second.promoted);
}

TEST(ReconcilerTest, AutoscalerScaleSplitsByTrafficAndSetsTheCap) {
  const ServedModelSpec a = served("a", "/m/a.json", 70);
  const ServedModelSpec b = served("b", "/m/b.json", 30);
  const EndpointState state{endpoint({a, b}), endpoint({a, b}), Scale{10, 6.4}};
  const ReconcilePlan plan = reconcile({state}, {replica("ra", a)}, same_runtime);
  EXPECT_EQ(wanted(plan, a), 7);
  EXPECT_EQ(wanted(plan, b), 3);
  EXPECT_EQ(plan.table.endpoints[0].versions[0].replicas[0].max_in_flight, 6);
}

TEST(ReconcilerTest, TrafficShiftKeepsTheServingCountsUntilPromotion) {
  // Regression (review of #4): the target's smaller count drained a version the table still
  // sent half the traffic to.
  const ServedModelSpec a50 = served("a", "/m/a.json", 50);
  const ServedModelSpec b50 = served("b", "/m/b.json", 50);
  ServedModelSpec a90 = a50;
  a90.traffic = 90;
  ServedModelSpec b10 = b50;
  b10.traffic = 10;
  const EndpointState state{endpoint({a90, b10}), endpoint({a50, b50}), Scale{10, 16}};
  std::vector<Replica> replicas;
  for (int i = 0; i < 5; ++i) {
    replicas.push_back(replica("a" + std::to_string(i), a50));
    replicas.push_back(replica("b" + std::to_string(i), b50));
  }
  const ReconcilePlan plan = reconcile({state}, replicas, same_runtime);
  EXPECT_TRUE(plan.promoted.empty());  // a needs 9 ready
  EXPECT_EQ(wanted(plan, a90), 9);
  EXPECT_EQ(wanted(plan, b50), 5);  // not 1 while b still takes 50%
}

TEST(ReconcilerTest, TableValidatesForTheGateway) {
  const ServedModelSpec a = served("a", "/m/a.json", 30);
  const ServedModelSpec b = served("b", "/m/b.json", 70);
  const ReconcilePlan plan = reconcile({{endpoint({a, b}), endpoint({a, b}), std::nullopt}},
                                       {replica("ra", a), replica("rb", b)}, same_runtime);
  EXPECT_TRUE(gateway::validate_endpoint_table(plan.table).is_ok());
}

// Issue 18 item 15: the gateway lists only generative endpoints in /v1/models, with their
// max_model_len; the table carries both from the spec (runtime) and the model (context length).
TEST(ReconcilerTest, TableCarriesRuntimeAndContextLengthOfLlmVersions) {
  ServedModelSpec chat = served("chat", "/m/llama", 50);
  chat.runtime = "llm";
  const ServedModelSpec tree = served("tree", "/m/a.json", 50);
  const auto context_length = [](const ServedModelSpec& spec) {
    return spec.model == "/m/llama" ? int64_t{4096} : int64_t{-1};
  };
  const ReconcilePlan plan = reconcile({{endpoint({chat, tree}), std::nullopt, std::nullopt}}, {},
                                       same_runtime, context_length);
  ASSERT_EQ(plan.table.endpoints[0].versions.size(), 2u);
  EXPECT_EQ(plan.table.endpoints[0].versions[0].runtime, "llm");
  EXPECT_EQ(plan.table.endpoints[0].versions[0].max_model_len, 4096);
  EXPECT_EQ(plan.table.endpoints[0].versions[1].runtime, "xgboost");
  EXPECT_EQ(plan.table.endpoints[0].versions[1].max_model_len, 0);  // not asked for non-llm
}

}  // namespace
}  // namespace flotilla::control

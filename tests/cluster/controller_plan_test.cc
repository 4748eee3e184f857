// The controller's plan, as a pure function of a ServingEndpoint and the Deployments it owns:
// the objects it makes, a rollout step by step, a rollback, and an invalid spec.
#include <gtest/gtest.h>

#include "cluster/cluster.h"
#include "fakes/common/fake_clock.h"

namespace flotilla::cluster {
namespace {

using nlohmann::json;

json serving_endpoint(json served_models, json status = nullptr, int64_t generation = 1) {
  json object = {{"apiVersion", "flotilla.dev/v1"},
                 {"kind", "ServingEndpoint"},
                 {"metadata", {{"name", "fraud"}, {"uid", "uid-1"}, {"generation", generation}}},
                 {"spec", {{"served_models", std::move(served_models)}}}};
  if (!status.is_null()) {
    object["status"] = std::move(status);
  }
  return object;
}

json model(const std::string& version, int64_t traffic = 100, int64_t min_concurrency = 1) {
  return {{"name", version},
          {"model", "https://models.example/" + version + ".json"},
          {"runtime", "xgboost"},
          {"traffic", traffic},
          {"concurrency", {{"min", min_concurrency}, {"max", 64}}}};
}

// A Deployment as the API server holds it after the Deployment controller reported `ready` of
// its pods ready and updated.
json observed(const json& desired, int64_t ready) {
  json deployment = desired;
  deployment["metadata"]["generation"] = 1;
  deployment["status"] = {{"observedGeneration", 1},
                          {"replicas", desired["spec"]["replicas"]},
                          {"updatedReplicas", ready},
                          {"readyReplicas", ready}};
  return deployment;
}

std::string condition(const json& status, const std::string& type) {
  for (const json& c : status["conditions"]) {
    if (c["type"] == type) {
      return c["status"].get<std::string>() + " " + c["reason"].get<std::string>();
    }
  }
  return "absent";
}

TEST(ControllerPlanTest, MakesEachVersionsDeploymentAndServiceOwnedAndLabelled) {
  testing::FakeClock clock;
  const json se = serving_endpoint({model("v1", 100, 40)});  // 40 / 16 per replica → 3
  const EndpointPlan plan = plan_endpoint(se, {}, std::nullopt, ReplicaTemplate{}, clock);
  ASSERT_EQ(plan.deployments.size(), 1u);
  const json& d = plan.deployments[0];
  EXPECT_EQ(d["metadata"]["name"], "fraud-v1");
  EXPECT_EQ(d["metadata"]["labels"]["flotilla.dev/endpoint"], "fraud");
  EXPECT_EQ(d["metadata"]["labels"]["flotilla.dev/version"], "v1");
  EXPECT_EQ(d["metadata"]["ownerReferences"][0]["uid"], "uid-1");
  EXPECT_EQ(d["metadata"]["ownerReferences"][0]["controller"], true);
  EXPECT_EQ(d["spec"]["replicas"], 3);
  EXPECT_EQ(d["spec"]["selector"]["matchLabels"]["flotilla.dev/version"], "v1");
  const json& pod = d["spec"]["template"]["spec"];
  EXPECT_EQ(pod["terminationGracePeriodSeconds"], 65);
  EXPECT_EQ(pod["automountServiceAccountToken"], false);
  const json& container = pod["containers"][0];
  EXPECT_EQ(container["readinessProbe"]["httpGet"]["path"], "/v2/health/ready");
  EXPECT_EQ(container["livenessProbe"]["httpGet"]["path"], "/v2/health/live");
  EXPECT_EQ(container["lifecycle"]["preStop"]["exec"]["command"][1], "5");
  const std::vector<std::string> args = container["args"];
  EXPECT_EQ(args, (std::vector<std::string>{"replica", "--model", "https://models.example/v1.json",
                                            "--runtime", "xgboost", "--name", "fraud",
                                            "--model-version", "v1", "--host", "0.0.0.0", "--port",
                                            "8000", "--cache-dir", "/cache"}));
  ASSERT_EQ(plan.services.size(), 1u);
  EXPECT_EQ(plan.services[0]["metadata"]["name"], "fraud-v1");
  EXPECT_EQ(plan.services[0]["spec"]["selector"], d["spec"]["selector"]["matchLabels"]);
  EXPECT_EQ(plan.services[0]["metadata"]["labels"]["flotilla.dev/endpoint"], "fraud");

  EXPECT_EQ(plan.status["observedGeneration"], 1);
  EXPECT_EQ(plan.status["versions"][0]["traffic"], 100);
  EXPECT_EQ(plan.status["desiredReplicas"], 3);
  EXPECT_EQ(condition(plan.status, "Ready"), "False ReplicasNotReady");
  EXPECT_EQ(condition(plan.status, "Progressing"), "True ScalingUp");
  EXPECT_FALSE(container.contains("env"));

  // The controller's tracing settings reach the replica containers.
  ReplicaTemplate traced;
  traced.env = {{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"}};
  const EndpointPlan with_env = plan_endpoint(se, {}, std::nullopt, traced, clock);
  EXPECT_EQ(with_env.deployments[0]["spec"]["template"]["spec"]["containers"][0]["env"],
            json::parse(R"([{"name": "OTEL_EXPORTER_OTLP_ENDPOINT",
                             "value": "http://collector:4318"}])"));

  // The autoscaler's count and target win over the provisioned ones.
  // (6 replicas at 10 each: above the version's own minimum of 40 / 10.)
  const EndpointPlan scaled =
      plan_endpoint(se, {}, control::Scale{6, 10}, ReplicaTemplate{}, clock);
  EXPECT_EQ(scaled.deployments[0]["spec"]["replicas"], 6);
  EXPECT_EQ(scaled.status["versions"][0]["targetConcurrencyPerReplica"], 10);
}

TEST(ControllerPlanTest, ARolloutKeepsTheOldVersionServingUntilTheNewOneIsReady) {
  testing::FakeClock clock;
  // v1 serves; the spec now asks for v2.
  const json v1_serving = {{"versions", {{{"name", "v1"}, {"traffic", 100}}}}};
  const json se = serving_endpoint({model("v2")}, v1_serving, 2);
  kube::Reflector::Objects owned = {
      {"fraud-v1", observed(plan_endpoint(serving_endpoint({model("v1")}), {}, std::nullopt,
                                          ReplicaTemplate{}, clock)
                                .deployments[0],
                            1)}};

  // Step 1: v2's Deployment is made; v1 keeps all the traffic and its Deployment.
  EndpointPlan plan = plan_endpoint(se, owned, std::nullopt, ReplicaTemplate{}, clock);
  ASSERT_EQ(plan.deployments.size(), 1u);
  EXPECT_EQ(plan.deployments[0]["metadata"]["name"], "fraud-v2");
  EXPECT_TRUE(plan.scale_to_zero.empty());
  EXPECT_TRUE(plan.remove.empty());
  ASSERT_EQ(plan.status["versions"].size(), 2u);
  EXPECT_EQ(plan.status["versions"][0]["name"], "v2");
  EXPECT_EQ(plan.status["versions"][0]["traffic"], 0);
  EXPECT_EQ(plan.status["versions"][1]["name"], "v1");
  EXPECT_EQ(plan.status["versions"][1]["traffic"], 100);
  EXPECT_EQ(condition(plan.status, "Progressing"), "True RollingOut");

  // Step 2: v2 exists but is not ready: nothing moves.
  owned["fraud-v2"] = observed(plan.deployments[0], 0);
  plan = plan_endpoint(se, owned, std::nullopt, ReplicaTemplate{}, clock);
  EXPECT_EQ(plan.status["versions"][1]["traffic"], 100);
  EXPECT_TRUE(plan.scale_to_zero.empty());

  // Step 3: v2 ready: the traffic moves to it, v1 is scaled to zero.
  owned["fraud-v2"] = observed(plan.deployments[0], 1);
  json status = plan.status;
  plan = plan_endpoint(serving_endpoint({model("v2")}, status, 2), owned, std::nullopt,
                       ReplicaTemplate{}, clock);
  ASSERT_EQ(plan.status["versions"].size(), 1u);
  EXPECT_EQ(plan.status["versions"][0]["name"], "v2");
  EXPECT_EQ(plan.status["versions"][0]["traffic"], 100);
  EXPECT_EQ(plan.scale_to_zero, std::vector<std::string>{"fraud-v1"});
  EXPECT_EQ(condition(plan.status, "Ready"), "True AllReplicasReady");

  // Step 4: v1 at zero with no pods left: deleted.
  owned["fraud-v1"]["spec"]["replicas"] = 0;
  owned["fraud-v1"]["status"]["replicas"] = 0;
  plan = plan_endpoint(serving_endpoint({model("v2")}, plan.status, 2), owned, std::nullopt,
                       ReplicaTemplate{}, clock);
  EXPECT_TRUE(plan.scale_to_zero.empty());
  EXPECT_EQ(plan.remove, std::vector<std::string>{"fraud-v1"});
  EXPECT_EQ(condition(plan.status, "Progressing"), "False Stable");
}

TEST(ControllerPlanTest, AChangedModelIsNotReadyUntilItsPodsRunTheNewKey) {
  testing::FakeClock clock;
  const json before = serving_endpoint({model("v1")});
  const json deployment =
      observed(plan_endpoint(before, {}, {}, ReplicaTemplate{}, clock).deployments[0], 1);
  json changed_model = model("v1");
  changed_model["model"] = "https://models.example/v1-retrained.json";
  const EndpointPlan plan = plan_endpoint(serving_endpoint({changed_model}),
                                          {{"fraud-v1", deployment}}, {}, ReplicaTemplate{}, clock);
  EXPECT_NE(plan.deployments[0]["metadata"]["annotations"]["flotilla.dev/deployment-key"],
            deployment["metadata"]["annotations"]["flotilla.dev/deployment-key"]);
  EXPECT_EQ(condition(plan.status, "Ready"), "False ReplicasNotReady");
}

TEST(ControllerPlanTest, AnInvalidSpecChangesNothingAndSaysWhy) {
  testing::FakeClock clock;
  const json serving = {{"versions", {{{"name", "v1"}, {"traffic", 100}}}}};
  json bad = model("V_1");  // valid for flotilla up, not a Kubernetes name
  EndpointPlan plan =
      plan_endpoint(serving_endpoint({bad}, serving, 3), {}, {}, ReplicaTemplate{}, clock);
  EXPECT_TRUE(plan.deployments.empty());
  EXPECT_TRUE(plan.scale_to_zero.empty());
  EXPECT_EQ(plan.status["versions"], serving["versions"]);  // what served keeps serving
  EXPECT_EQ(plan.status["observedGeneration"], 3);
  EXPECT_EQ(condition(plan.status, "Degraded"), "True InvalidSpec");
  const std::string message = plan.status["conditions"][1]["message"];
  EXPECT_NE(message.find("'fraud-V_1', not a Kubernetes name"), std::string::npos) << message;

  json traffic = model("v1", 90);
  plan = plan_endpoint(serving_endpoint({traffic}), {}, {}, ReplicaTemplate{}, clock);
  EXPECT_EQ(condition(plan.status, "Degraded"), "True InvalidSpec");

  // A user's own server: a pod runs `flotilla replica`, so Kubernetes mode refuses it.
  json external = model("v1");
  external["model"] = "/models/iris";
  external["runtime"] = "external";
  external["external"] = {{"command", {"mlserver", "start", "."}}};
  plan = plan_endpoint(serving_endpoint({external}), {}, {}, ReplicaTemplate{}, clock);
  EXPECT_TRUE(plan.deployments.empty());
  EXPECT_EQ(condition(plan.status, "Degraded"), "True InvalidSpec");
  const std::string why = plan.status["conditions"][1]["message"];
  EXPECT_NE(why.find("external runs only under `flotilla up` for now"), std::string::npos) << why;
}

}  // namespace
}  // namespace flotilla::cluster

// Kubernetes mode's REST API, as pure functions: token ConfigMaps written and read back, and the
// view of a ServingEndpoint and its pods in the shape `flotilla up`'s API gives.
#include <gtest/gtest.h>

#include "auth/auth.h"
#include "cluster/cluster.h"

namespace flotilla::cluster {
namespace {

using nlohmann::json;

TEST(TokenObjectTest, WhatIsWrittenReadsBackAndThePlaintextGoesOnlyToTheAdminSecret) {
  Result<auth::NewToken> minted = auth::generate_token("ci", {"fraud", "llm"});
  ASSERT_TRUE(minted.is_ok());
  const TokenObject token{"flotilla-token-ci", minted->record, false, "the CI job", 1234};
  const json config_map = token_config_map_object(token);
  EXPECT_EQ(config_map["kind"], "ConfigMap");
  EXPECT_EQ(config_map["metadata"]["labels"]["flotilla.dev/token"], "true");
  EXPECT_EQ(config_map["data"]["endpoints"], "fraud,llm");  // text, as kubectl shows it
  EXPECT_FALSE(config_map["data"].contains("token"));
  Result<TokenObject> back = token_from_config_map("flotilla-token-ci", config_map);
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ(back->record, minted->record);
  EXPECT_FALSE(back->admin);
  EXPECT_EQ(back->comment, "the CI job");
  EXPECT_EQ(back->created_unix_ms, 1234);

  const json secret = admin_token_secret_object(minted->token);
  EXPECT_EQ(secret["kind"], "Secret");
  EXPECT_EQ(secret["metadata"]["name"], kAdminTokenSecret);
  // Not a token object: the gateways neither watch nor may read it.
  EXPECT_FALSE(secret["metadata"].contains("labels"));
  Result<std::string> plaintext =
      kube::decode_base64(secret["data"]["token"].get<std::string>(), "data.token");
  ASSERT_TRUE(plaintext.is_ok());
  EXPECT_EQ(*plaintext, minted->token);
}

TEST(TokenObjectTest, RefusesAnAdminFlagThatIsNotOneAndAnAdminWithAScope) {
  Result<auth::NewToken> minted = auth::generate_token("ci", {"fraud"});
  ASSERT_TRUE(minted.is_ok());
  json config_map = token_config_map_object({"s", minted->record, true, "", 0});
  Result<TokenObject> scoped_admin = token_from_config_map("s", config_map);
  ASSERT_FALSE(scoped_admin.is_ok());
  EXPECT_NE(scoped_admin.status().message().find("drop data.endpoints"), std::string::npos);
  config_map["data"]["admin"] = "yes";
  Result<TokenObject> bad = token_from_config_map("s", config_map);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("ConfigMap 's': data.admin"), std::string::npos);
}

json served(const std::string& name, int traffic) {
  return {{"name", name},
          {"model", "https://models.example/" + name + ".json"},
          {"runtime", "xgboost"},
          {"traffic", traffic},
          {"concurrency", {{"min", 1}, {"max", 8}}}};
}

json pod(const std::string& name, const std::string& version, bool ready, bool deleting) {
  json object = {
      {"metadata",
       {{"name", name},
        {"labels", {{"flotilla.dev/endpoint", "fraud"}, {"flotilla.dev/version", version}}}}},
      {"spec", {{"containers", {{{"name", "replica"}, {"ports", {{{"containerPort", 8000}}}}}}}}},
      {"status",
       {{"podIP", "10.0.0.7"},
        {"conditions", {{{"type", "Ready"}, {"status", ready ? "True" : "False"}}}},
        {"containerStatuses",
         {{{"restartCount", 2},
           {"state", ready ? json{{"running", json::object()}}
                           : json{{"waiting", {{"reason", "CrashLoopBackOff"}}}}}}}}}}};
  if (deleting) {
    object["metadata"]["deletionTimestamp"] = "2026-12-03T05:00:00Z";
  }
  return object;
}

TEST(EndpointViewTest, ARolloutShowsTheTargetAndThePreviousVersionWithTheirTraffic) {
  const json se = {{"metadata",
                    {{"name", "fraud"},
                     {"generation", 2},
                     {"creationTimestamp", "2026-12-03T05:00:00Z"},
                     {"annotations", {{"flotilla.dev/updated-unix-ms", "1796274060000"}}}}},
                   {"spec", {{"served_models", {served("v2", 100)}}}},
                   {"status",
                    {{"observedGeneration", 2},
                     {"desiredReplicas", 3},
                     {"versions",
                      {{{"name", "v2"},
                        {"deployment", "fraud-v2"},
                        {"traffic", 0},
                        {"desiredReplicas", 2},
                        {"readyReplicas", 1},
                        {"updatedReplicas", 1},
                        {"targetConcurrencyPerReplica", 4}},
                       {{"name", "v1"},
                        {"deployment", "fraud-v1"},
                        {"traffic", 100},
                        {"desiredReplicas", 1},
                        {"readyReplicas", 1}}}},
                     {"autoscaler", {{"target", 4.0}}},
                     {"conditions",
                      {{{"type", "Ready"},
                        {"status", "False"},
                        {"reason", "ReplicasNotReady"},
                        {"message", "2 of 3 replicas ready"},
                        {"lastTransitionTime", "2026-12-03T05:01:00.250Z"}}}}}}};
  const kube::Reflector::Objects pods = {{"fraud-v1-a", pod("fraud-v1-a", "v1", true, false)},
                                         {"fraud-v2-a", pod("fraud-v2-a", "v2", true, true)},
                                         {"fraud-v2-b", pod("fraud-v2-b", "v2", false, false)}};
  const json view = endpoint_view_of(se, pods);
  EXPECT_EQ(view["state"], json({{"ready", "NOT_READY"}, {"config_update", "IN_PROGRESS"}}));
  ASSERT_EQ(view["versions"].size(), 2u);
  const json& target = view["versions"][0];
  EXPECT_EQ(target["name"], "v2");
  EXPECT_EQ(target["role"], "target");
  EXPECT_EQ(target["traffic"], 0);
  EXPECT_EQ(target["serving"], false);
  EXPECT_EQ(target["replicas_wanted"], 2);
  EXPECT_EQ(target["replicas_ready"], 1);
  EXPECT_EQ(target["target_concurrency_per_replica"], 4);
  EXPECT_EQ(target["model"], "https://models.example/v2.json");
  const json& previous = view["versions"][1];
  EXPECT_EQ(previous["role"], "previous");
  EXPECT_EQ(previous["traffic"], 100);
  EXPECT_EQ(previous["serving"], true);
  ASSERT_EQ(view["replicas"].size(), 3u);
  EXPECT_EQ(view["replicas"][0]["address"], "10.0.0.7:8000");
  EXPECT_EQ(view["replicas"][0]["state"], "ready");
  EXPECT_EQ(view["replicas"][0]["restarts"], 2);
  EXPECT_EQ(view["replicas"][1]["state"], "draining");
  EXPECT_EQ(view["replicas"][2]["state"], "starting");
  EXPECT_EQ(view["replicas"][2]["reason"], "CrashLoopBackOff");
  EXPECT_EQ(view["autoscaler"], json({{"replicas", 3}, {"target_concurrency", 4.0}}));
  EXPECT_EQ(view["creation_timestamp"], 1796274000000);  // 2026-12-03T05:00:00Z
  EXPECT_EQ(view["last_updated_timestamp"], 1796274060000);
}

TEST(EndpointViewTest, AGenerationTheControllerHasNotSeenIsNotReadyYet) {
  json se = {{"metadata", {{"name", "fraud"}, {"generation", 3}}},
             {"spec", {{"served_models", {served("v1", 100)}}}},
             {"status",
              {{"observedGeneration", 2},
               {"versions", {{{"name", "v1"}, {"traffic", 100}, {"readyReplicas", 1}}}},
               {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
  EXPECT_EQ(endpoint_view_of(se, {})["state"],
            json({{"ready", "NOT_READY"}, {"config_update", "IN_PROGRESS"}}));
  se["status"]["observedGeneration"] = 3;
  EXPECT_EQ(endpoint_view_of(se, {})["state"],
            json({{"ready", "READY"}, {"config_update", "NOT_UPDATING"}}));
  // A spec the controller refuses: the raw spec and what serves are still shown.
  se["spec"]["served_models"][0]["name"] = "V_1";
  const json view = endpoint_view_of(se, {});
  EXPECT_EQ(view["config"]["served_models"][0]["name"], "V_1");
  ASSERT_EQ(view["versions"].size(), 1u);
  EXPECT_EQ(view["versions"][0]["role"], "previous");
}

TEST(ReadyPodTargetsTest, OnlyReadyPodsNotTerminatingWithAnAddressAndAPort) {
  json no_ip = pod("fraud-v1-c", "v1", true, false);
  no_ip["status"].erase("podIP");
  const json list = {{"items",
                      {pod("fraud-v1-a", "v1", true, false), pod("fraud-v1-b", "v1", false, false),
                       pod("fraud-v2-a", "v2", true, true), no_ip}}};
  const std::vector<PodTarget> targets = ready_pod_targets(list);
  ASSERT_EQ(targets.size(), 1u);
  EXPECT_EQ(targets[0].name, "fraud-v1-a");
  EXPECT_EQ(targets[0].version, "v1");
  EXPECT_EQ(targets[0].host, "10.0.0.7");
  EXPECT_EQ(targets[0].port, 8000);
  EXPECT_TRUE(ready_pod_targets(json::object()).empty());
}

}  // namespace
}  // namespace flotilla::cluster

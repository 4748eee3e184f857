// The gateway's discovery in Kubernetes mode, as pure functions: ServingEndpoints and
// EndpointSlices (as the API server returns them) into the endpoint table, token Secrets into
// the gateway's auth.
#include <gtest/gtest.h>

#include "auth/auth.h"
#include "cluster/cluster.h"

namespace flotilla::cluster {
namespace {

using nlohmann::json;

json serving_endpoint(const std::string& name, json served_models, json status = nullptr) {
  json object = {{"apiVersion", "flotilla.dev/v1"},
                 {"kind", "ServingEndpoint"},
                 {"metadata", {{"name", name}, {"namespace", "ns"}, {"resourceVersion", "7"}}},
                 {"spec", {{"served_models", std::move(served_models)}}}};
  if (!status.is_null()) {
    object["status"] = std::move(status);
  }
  return object;
}

json slice(const std::string& service, json endpoints, int port = 8000) {
  return {{"apiVersion", "discovery.k8s.io/v1"},
          {"kind", "EndpointSlice"},
          {"metadata",
           {{"name", service + "-abcde"},
            {"labels", {{"kubernetes.io/service-name", service}, {"flotilla.dev/endpoint", "x"}}}}},
          {"addressType", "IPv4"},
          {"ports", {{{"name", "http"}, {"port", port}, {"protocol", "TCP"}}}},
          {"endpoints", std::move(endpoints)}};
}

json pod(const std::string& name, const std::string& ip, json conditions) {
  return {{"addresses", {ip}},
          {"conditions", std::move(conditions)},
          {"targetRef", {{"kind", "Pod"}, {"name", name}, {"namespace", "ns"}}}};
}

TEST(TableFromObjectsTest, VersionsFromTheSpecAndReplicasFromTheirServicesSlices) {
  const kube::Reflector::Objects endpoints = {
      {"fraud",
       serving_endpoint("fraud", {{{"name", "v1"}, {"model", "/m"}, {"runtime", "xgboost"}}})}};
  const kube::Reflector::Objects slices = {
      {"fraud-v1-abcde",
       slice("fraud-v1", {pod("fraud-v1-0", "10.0.0.1", {{"ready", true}}),
                          pod("fraud-v1-1", "10.0.0.2", {{"ready", false}}),
                          pod("fraud-v1-2", "10.0.0.3", {{"ready", false}, {"terminating", true}}),
                          pod("fraud-v1-3", "10.0.0.4", json::object())})},
      {"other-v1-xyz", slice("other-v1", {pod("other-v1-0", "10.0.0.9", {{"ready", true}})})}};
  std::vector<std::string> problems;
  const gateway::EndpointTable table = table_from_objects(endpoints, slices, &problems);
  EXPECT_TRUE(problems.empty());
  ASSERT_EQ(table.endpoints.size(), 1u);
  const gateway::VersionEntry& v1 = table.endpoints[0].versions.at(0);
  EXPECT_EQ(v1.name, "v1");
  EXPECT_EQ(v1.traffic, 100);
  EXPECT_EQ(v1.runtime, "xgboost");
  ASSERT_EQ(v1.replicas.size(), 4u);
  EXPECT_EQ(v1.replicas[0].id, "fraud-v1-0");
  EXPECT_EQ(v1.replicas[0].host, "10.0.0.1");
  EXPECT_EQ(v1.replicas[0].port, 8000);
  EXPECT_EQ(v1.replicas[0].state, gateway::ReplicaState::kReady);
  EXPECT_EQ(v1.replicas[1].state, gateway::ReplicaState::kStarting);
  EXPECT_EQ(v1.replicas[2].state, gateway::ReplicaState::kDraining);
  EXPECT_EQ(v1.replicas[3].state, gateway::ReplicaState::kReady);  // unset ready is ready
  EXPECT_EQ(v1.replicas[0].max_in_flight, 0);                      // no learned target yet: no cap
}

TEST(TableFromObjectsTest, TheControllersServingStateWinsOverTheSpec) {
  // Mid-rollout: the spec asks for v2 alone, the controller still sends 100% to v1.
  const json status = {{"versions",
                        {{{"name", "v1"}, {"traffic", 100}, {"targetConcurrencyPerReplica", 12}},
                         {{"name", "v2"}, {"traffic", 0}, {"targetConcurrencyPerReplica", 16}}}}};
  const kube::Reflector::Objects endpoints = {
      {"fraud", serving_endpoint("fraud", {{{"name", "v2"}, {"model", "/m2"}}}, status)}};
  const kube::Reflector::Objects slices = {
      {"a", slice("fraud-v1", {pod("p1", "10.0.0.1", {{"ready", true}})})},
      {"b", slice("fraud-v2", {pod("p2", "10.0.0.2", {{"ready", true}})}, 9000)},
      // The same pod in a second slice of its Service, as while it moves between slices.
      {"c", slice("fraud-v2", {pod("p2", "10.0.0.2", {{"ready", true}})}, 9000)}};
  const gateway::EndpointTable table = table_from_objects(endpoints, slices, nullptr);
  ASSERT_EQ(table.endpoints.size(), 1u);
  const auto& versions = table.endpoints[0].versions;
  ASSERT_EQ(versions.size(), 2u);
  EXPECT_EQ(versions[0].traffic, 100);
  EXPECT_EQ(versions[0].replicas.at(0).max_in_flight, 12);
  EXPECT_EQ(versions[1].traffic, 0);
  ASSERT_EQ(versions[1].replicas.size(), 1u);
  EXPECT_EQ(versions[1].replicas[0].port, 9000);
  EXPECT_EQ(versions[1].replicas[0].max_in_flight, 16);
}

TEST(TableFromObjectsTest, AnEndpointThatMakesNoValidEntryIsLeftOutAndNamed) {
  const kube::Reflector::Objects endpoints = {
      {"good", serving_endpoint("good", {{{"name", "v1"}, {"model", "/m"}}})},
      // Two versions whose traffic does not sum to 100.
      {"split", serving_endpoint(
                    "split", {{{"name", "a"}, {"traffic", 30}}, {{"name", "b"}, {"traffic", 30}}})},
      {"empty", serving_endpoint("empty", json::array())}};
  std::vector<std::string> problems;
  const gateway::EndpointTable table = table_from_objects(endpoints, {}, &problems);
  ASSERT_EQ(table.endpoints.size(), 1u);
  EXPECT_EQ(table.endpoints[0].name, "good");
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_NE(problems[0].find("ServingEndpoint 'empty'"), std::string::npos) << problems[0];
  EXPECT_NE(problems[1].find("ServingEndpoint 'split'"), std::string::npos) << problems[1];
  EXPECT_NE(problems[1].find("traffic"), std::string::npos) << problems[1];
}

TEST(TableFromObjectsTest, ObjectsOfTheWrongShapeAreSkippedNotFatal) {
  json odd_spec = serving_endpoint("odd", json::array());
  odd_spec["spec"] = 5;
  json odd_status = serving_endpoint("ok", {{{"name", "v1"}}});
  odd_status["status"] = {{"versions", "v1"}};
  json no_metadata = slice("ok-v1", json::array());
  no_metadata["metadata"] = "x";
  json bad_endpoints = slice("ok-v1", "x");
  json bad_port = slice("ok-v1", {pod("p", "10.0.0.1", {{"ready", true}})});
  bad_port["ports"] = {{{"port", "80"}}};
  json bad_pod = slice("ok-v1", {5, {{"addresses", {7}}}, {{"addresses", json::array()}}});
  const kube::Reflector::Objects endpoints = {{"odd", odd_spec}, {"ok", odd_status}};
  const kube::Reflector::Objects slices = {
      {"a", no_metadata}, {"b", bad_endpoints}, {"c", bad_port}, {"d", bad_pod}};
  std::vector<std::string> problems;
  const gateway::EndpointTable table = table_from_objects(endpoints, slices, &problems);
  ASSERT_EQ(table.endpoints.size(), 1u);
  EXPECT_EQ(table.endpoints[0].name, "ok");
  EXPECT_TRUE(table.endpoints[0].versions.at(0).replicas.empty());
  EXPECT_EQ(problems.size(), 1u);  // "odd": no versions
}

// A token ConfigMap as written by hand (kubectl apply) from `flotilla gateway mint-token`.
json token_config_map(const std::string& name, const auth::TokenRecord& record,
                      const std::string& endpoints = "") {
  json data = {{"id", record.id}, {"salt", record.salt}, {"sha256", record.sha256}};
  if (!endpoints.empty()) {
    data["endpoints"] = endpoints;
  }
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", name}, {"labels", {{"flotilla.dev/token", "true"}}}}},
          {"data", std::move(data)}};
}

TEST(AuthFromConfigMapsTest, TokensCheckAsTheirConfigMapsSayAndBadOnesAreNamed) {
  Result<auth::NewToken> ci = auth::generate_token("ci", {"fraud", "llm"});
  Result<auth::NewToken> admin = auth::generate_token("admin", {});
  ASSERT_TRUE(ci.is_ok() && admin.is_ok());
  json bad_salt = token_config_map("bad", ci->record);
  bad_salt["data"]["salt"] = "xyz";
  const kube::Reflector::Objects config_maps = {
      {"token-ci", token_config_map("token-ci", ci->record, "fraud,llm")},
      {"token-admin", token_config_map("token-admin", admin->record)},
      {"token-bad", bad_salt},
      {"token-ci-again", token_config_map("token-ci-again", ci->record)},
      {"token-empty", {{"metadata", {{"name", "token-empty"}}}}}};
  std::vector<std::string> problems;
  const gateway::AuthConfig auth = auth_from_config_maps(config_maps, {"health"}, &problems);
  EXPECT_TRUE(auth.enabled);
  EXPECT_EQ(auth.open_routes, std::vector<std::string>{"health"});
  ASSERT_EQ(auth.tokens.size(), 2u);
  EXPECT_EQ(auth.tokens[0], admin->record);
  EXPECT_EQ(auth.tokens[1], ci->record);
  EXPECT_EQ(auth.tokens[1].endpoints, (std::vector<std::string>{"fraud", "llm"}));
  ASSERT_EQ(problems.size(), 3u) << ::testing::PrintToString(problems);
  EXPECT_NE(problems[0].find("ConfigMap 'token-bad': salt"), std::string::npos) << problems[0];
  EXPECT_NE(problems[1].find("'token-ci-again': token id 'ci' is already used"), std::string::npos)
      << problems[1];
  EXPECT_NE(problems[2].find("'token-empty': data.id is missing"), std::string::npos)
      << problems[2];

  // The tokens the ConfigMaps describe let their holders in, each within its scope.
  const auth::Authenticator authenticator(auth.tokens);
  EXPECT_EQ(authenticator.check("Bearer " + ci->token, "fraud"), auth::AuthResult::kAllowed);
  EXPECT_EQ(authenticator.check("Bearer " + ci->token, "other"), auth::AuthResult::kForbidden);
  EXPECT_EQ(authenticator.check("Bearer " + admin->token, "other"), auth::AuthResult::kAllowed);
}

TEST(AuthFromConfigMapsTest, NoTokenMeansNoRequestPasses) {
  const gateway::AuthConfig auth = auth_from_config_maps({}, {}, nullptr);
  EXPECT_TRUE(auth.enabled);
  EXPECT_TRUE(auth.tokens.empty());
}

}  // namespace
}  // namespace flotilla::cluster

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gateway/gateway.h"

namespace flotilla::gateway {
namespace {

using ::testing::HasSubstr;

constexpr const char* kValid = R"(
endpoints:
  - name: fraud
    versions:
      - name: v1
        traffic: 90
        replicas:
          - {id: r1, address: "127.0.0.1:9001", max_in_flight: 16}
          - {id: r2, address: "localhost:9002", state: draining}
      - name: v2
        traffic: 10
        replicas:
          - {id: r3, address: "127.0.0.1:9003"}
  - name: llm
    versions:
      - name: base
        replicas: []
)";

TEST(EndpointTableTest, ParsesTheYamlForm) {
  auto table = parse_endpoint_table_yaml(kValid);
  ASSERT_TRUE(table.is_ok()) << table.status().message();
  ASSERT_EQ(table->endpoints.size(), 2u);
  const EndpointEntry* fraud = table->find("fraud");
  ASSERT_NE(fraud, nullptr);
  ASSERT_EQ(fraud->versions.size(), 2u);
  EXPECT_EQ(fraud->versions[0].traffic, 90);
  const ReplicaEntry& r1 = fraud->versions[0].replicas[0];
  EXPECT_EQ(r1.host, "127.0.0.1");
  EXPECT_EQ(r1.port, 9001);
  EXPECT_EQ(r1.max_in_flight, 16);
  EXPECT_EQ(r1.state, ReplicaState::kReady);
  EXPECT_EQ(fraud->versions[0].replicas[1].state, ReplicaState::kDraining);
  EXPECT_EQ(table->find("llm")->versions[0].traffic, 100);  // one version: all traffic
  EXPECT_EQ(table->find("nope"), nullptr);
}

TEST(EndpointTableTest, RejectsBadConfigsNamingTheField) {
  struct Case {
    const char* yaml;
    const char* error;
  };
  const Case cases[] = {
      {"endpoints: [", "invalid endpoint config"},
      {"endpoints: {}", "endpoints: must be a list"},
      {"other: 1", "unknown field 'other'"},
      {"endpoints: [{name: a}]", "endpoints[0].versions: must be a list"},
      {"endpoints: [{name: a, versions: []}]", "needs at least one version"},
      {"endpoints: [{name: 'a b', versions: [{name: v}]}]", "endpoints[0].name"},
      {"endpoints: [{name: a, versions: [{name: v, traffic: 60}]}]", "sums to 60, not 100"},
      {"endpoints: [{name: a, versions: [{name: v, traffic: 120}]}]",
       "traffic: must be a percentage"},
      {"endpoints: [{name: a, versions: [{name: v, traffic: lots}]}]", "invalid endpoint config"},
      {"endpoints: [{name: a, versions: [{name: v}, {name: v, traffic: 0}]}]", "appears twice"},
      {"endpoints: [{name: a, versions: [{name: v}]}, {name: a, versions: [{name: v}]}]",
       "endpoint 'a' appears twice"},
      {"endpoints: [{name: a, versions: [{name: v, replicas: [{id: r}]}]}]",
       "address: is required"},
      {"endpoints: [{name: a, versions: [{name: v, replicas: [{id: r, address: 'x'}]}]}]",
       "is not host:port"},
      {"endpoints: [{name: a, versions: [{name: v, replicas: [{id: r, address: 'x:99999'}]}]}]",
       "must be 1 to 65535"},
      {"endpoints: [{name: a, versions: [{name: v, replicas: [{id: r, address: 'x:1', state: "
       "gone}]}]}]",
       "unknown state 'gone'"},
      {"endpoints: [{name: a, versions: [{name: v, replicas: [{id: r, address: 'x:1', "
       "max_in_flight: -1}]}]}]",
       "max_in_flight: must be >= 0"},
      {"endpoints: [{name: a, versions: [{name: v, replicas: [{id: r, address: 'x:1'}, {id: r, "
       "address: 'x:2'}]}]}]",
       "replica 'r' appears twice"},
  };
  for (const Case& c : cases) {
    auto table = parse_endpoint_table_yaml(c.yaml);
    ASSERT_FALSE(table.is_ok()) << c.yaml;
    EXPECT_EQ(table.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(table.status().message(), HasSubstr(c.error)) << c.yaml;
  }
}

TEST(EndpointTableTest, VersionsMayNameTheirRuntimeAndContextLength) {
  auto table = parse_endpoint_table_yaml(R"(
endpoints:
  - name: chat
    versions:
      - {name: v1, runtime: llm, max_model_len: 2048, replicas: []}
)");
  ASSERT_TRUE(table.is_ok()) << table.status().message();
  EXPECT_EQ(table->endpoints[0].versions[0].runtime, "llm");
  EXPECT_EQ(table->endpoints[0].versions[0].max_model_len, 2048);
  auto bad = parse_endpoint_table_yaml(R"(
endpoints:
  - name: chat
    versions:
      - {name: v1, runtime: llm, max_model_len: -1}
)");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("endpoints[0].versions[0].max_model_len"));
}

}  // namespace
}  // namespace flotilla::gateway

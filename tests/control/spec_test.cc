#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include "control/control_spec.h"

namespace flotilla::control {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::StartsWith;

ServedModelSpec served_model(std::string name, std::string model) {
  ServedModelSpec served;
  served.name = std::move(name);
  served.model = std::move(model);
  return served;
}

// ---- Parsing valid specs ----------------------------------------------------------------------

TEST(ParseEndpointSpecTest, FillsDefaultsForAMinimalYamlSpec) {
  Result<EndpointSpec> spec = parse_endpoint_spec(R"(
name: fraud-scorer
served_models:
  - name: v1
    model: /models/fraud
)");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->name, "fraud-scorer");
  ASSERT_EQ(spec->served_models.size(), 1u);
  const ServedModelSpec& served = spec->served_models[0];
  EXPECT_EQ(served.name, "v1");
  EXPECT_EQ(served.model, "/models/fraud");
  EXPECT_EQ(served.runtime, "auto");
  EXPECT_EQ(served.concurrency, (ConcurrencyRange{1, 64}));
  EXPECT_EQ(served.per_replica_concurrency, std::nullopt);
  EXPECT_FALSE(served.scale_to_zero);
  EXPECT_EQ(served.traffic, 100);
  EXPECT_EQ(served.resources, (Resources{0, 0}));
}

TEST(ParseEndpointSpecTest, ReadsEveryFieldFromYaml) {
  Result<EndpointSpec> spec = parse_endpoint_spec(R"(
name: fraud
served_models:
  - name: v1
    model: /models/fraud-v1
    runtime: xgboost
    concurrency: {min: 4, max: 256}
    per_replica_concurrency: {min: 2, max: 32}
    scale_to_zero: true
    traffic: 80
    resources: {cpus: 1.5, memory_mb: 2048}
  - name: v2
    model: /models/fraud-v2
    runtime: synthetic
    concurrency: {min: 0, max: 8}
    traffic: 20
)");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  ServedModelSpec v1 = served_model("v1", "/models/fraud-v1");
  v1.runtime = "xgboost";
  v1.concurrency = {4, 256};
  v1.per_replica_concurrency = ConcurrencyRange{2, 32};
  v1.scale_to_zero = true;
  v1.traffic = 80;
  v1.resources = {1.5, 2048};
  ServedModelSpec v2 = served_model("v2", "/models/fraud-v2");
  v2.runtime = "synthetic";
  v2.concurrency = {0, 8};
  v2.traffic = 20;
  EXPECT_EQ(*spec, (EndpointSpec{"fraud", {v1, v2}, {}, {}}));
}

TEST(ParseEndpointSpecTest, JsonAndYamlGiveTheSameSpec) {
  Result<EndpointSpec> from_yaml = parse_endpoint_spec(R"(
name: fraud
served_models:
  - {name: a, model: /m/a, traffic: 30, scale_to_zero: false, resources: {cpus: 2}}
  - {name: b, model: /m/b, traffic: 70, concurrency: {min: 3, max: 9}}
)");
  Result<EndpointSpec> from_json = parse_endpoint_spec(R"({
  "name": "fraud",
  "served_models": [
    {"name": "a", "model": "/m/a", "traffic": 30, "scale_to_zero": false,
     "resources": {"cpus": 2}},
    {"name": "b", "model": "/m/b", "traffic": 70, "concurrency": {"min": 3, "max": 9}}
  ]
})");
  ASSERT_TRUE(from_yaml.is_ok()) << from_yaml.status().to_string();
  ASSERT_TRUE(from_json.is_ok()) << from_json.status().to_string();
  EXPECT_EQ(*from_yaml, *from_json);
  EXPECT_EQ(from_json->served_models[0].resources.cpus, 2.0);
  EXPECT_EQ(from_json->served_models[1].concurrency, (ConcurrencyRange{3, 9}));
}

struct ValidCase {
  std::string label;
  std::string text;
  // Checks one field of the parsed spec.
  std::function<void(const EndpointSpec&)> check;
};

TEST(ParseEndpointSpecTest, AcceptsEdgeValues) {
  const std::string name64(64, 'a');
  const std::vector<ValidCase> cases = {
      {"name of 64 characters", "{name: " + name64 + ", served_models: [{name: v, model: /m}]}",
       [&](const EndpointSpec& s) {
         EXPECT_EQ(s.name, name64);
       }},
      {"name starting with a digit", "{name: 9lives, served_models: [{name: 1, model: /m}]}",
       [](const EndpointSpec& s) {
         EXPECT_EQ(s.name, "9lives");
         EXPECT_EQ(s.served_models[0].name, "1");
       }},
      {"names with '-', '_' and '.'",
       "{name: a-b_c.d, served_models: [{name: v1.2_x-y, model: /m}]}",
       [](const EndpointSpec& s) {
         EXPECT_EQ(s.served_models[0].name, "v1.2_x-y");
       }},
      {"traffic 0 for one version",
       "{name: e, served_models: [{name: a, model: /a, traffic: 0}, "
       "{name: b, model: /b, traffic: 100}]}",
       [](const EndpointSpec& s) {
         EXPECT_EQ(s.served_models[0].traffic, 0);
       }},
      {"explicit traffic 100 for a single version",
       "{name: e, served_models: [{name: a, model: /a, traffic: 100}]}",
       [](const EndpointSpec& s) {
         EXPECT_EQ(s.served_models[0].traffic, 100);
       }},
      {"a plus sign on an integer",
       "{name: e, served_models: [{name: a, model: /a, traffic: +100}]}",
       [](const EndpointSpec& s) {
         EXPECT_EQ(s.served_models[0].traffic, 100);
       }},
      {"concurrency min 0 and max 1",
       "{name: e, served_models: [{name: a, model: /a, concurrency: {min: 0, max: 1}}]}",
       [](const EndpointSpec& s) {
         EXPECT_EQ(s.served_models[0].concurrency, (ConcurrencyRange{0, 1}));
       }},
      {"concurrency with only min keeps the default max",
       "{name: e, served_models: [{name: a, model: /a, concurrency: {min: 5}}]}",
       [](const EndpointSpec& s) {
         EXPECT_EQ(s.served_models[0].concurrency, (ConcurrencyRange{5, 64}));
       }},
      {"concurrency with only max keeps the default min",
       "{name: e, served_models: [{name: a, model: /a, concurrency: {max: 1000}}]}",
       [](const EndpointSpec& s) {
         EXPECT_EQ(s.served_models[0].concurrency, (ConcurrencyRange{1, 1000}));
       }},
      {"per_replica_concurrency at its limits",
       "{name: e, served_models: [{name: a, model: /a, "
       "per_replica_concurrency: {min: 1, max: 4096}}]}",
       [](const EndpointSpec& s) {
         EXPECT_EQ(s.served_models[0].per_replica_concurrency, (ConcurrencyRange{1, 4096}));
       }},
      {"per_replica_concurrency with an initial target",
       "{name: e, served_models: [{name: a, model: /a, "
       "per_replica_concurrency: {min: 2, max: 128, initial: 4}}]}",
       [](const EndpointSpec& s) {
         EXPECT_EQ(s.served_models[0].per_replica_concurrency, (ConcurrencyRange{2, 128}));
         EXPECT_EQ(s.served_models[0].initial_per_replica_concurrency, 4);
         EXPECT_EQ(initial_target_concurrency(s.served_models[0]), 4);
       }},
      {"per_replica_concurrency initial at the default bounds' max",
       "{name: e, served_models: [{name: a, model: /a, "
       "per_replica_concurrency: {initial: 64}}]}",
       [](const EndpointSpec& s) {
         EXPECT_EQ(s.served_models[0].per_replica_concurrency, (ConcurrencyRange{1, 64}));
         EXPECT_EQ(initial_target_concurrency(s.served_models[0]), 64);
       }},
      {"per_replica_concurrency null means absent",
       R"({"name": "e", "served_models": [{"name": "a", "model": "/a",
           "per_replica_concurrency": null}]})",
       [](const EndpointSpec& s) {
         EXPECT_EQ(s.served_models[0].per_replica_concurrency, std::nullopt);
       }},
      {"upper-case boolean",
       "{name: e, served_models: [{name: a, model: /a, scale_to_zero: TRUE}]}",
       [](const EndpointSpec& s) {
         EXPECT_TRUE(s.served_models[0].scale_to_zero);
       }},
      {"cpus at its limits and fractional",
       "{name: e, served_models: [{name: a, model: /a, traffic: 100, resources: {cpus: 1024}}, "
       "{name: b, model: /b, traffic: 0, resources: {cpus: 0.25}}, "
       "{name: c, model: /c, traffic: 0, resources: {cpus: 0}}]}",
       [](const EndpointSpec& s) {
         ASSERT_EQ(s.served_models.size(), 3u);
         EXPECT_EQ(s.served_models[0].resources.cpus, 1024.0);
         EXPECT_EQ(s.served_models[1].resources.cpus, 0.25);
         EXPECT_EQ(s.served_models[2].resources.cpus, 0.0);
       }},
      {"a large memory limit",
       "{name: e, served_models: [{name: a, model: /a, resources: {memory_mb: 1048576}}]}",
       [](const EndpointSpec& s) {
         EXPECT_EQ(s.served_models[0].resources.memory_mb, 1048576);
       }},
      {"model path with spaces and UTF-8", "{name: e, served_models: [{name: a, model: '/m/é x'}]}",
       [](const EndpointSpec& s) {
         EXPECT_EQ(s.served_models[0].model, "/m/é x");
       }},
  };
  for (const ValidCase& c : cases) {
    SCOPED_TRACE(c.label);
    Result<EndpointSpec> spec = parse_endpoint_spec(c.text);
    ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
    c.check(*spec);
  }
}

// ---- Validation errors ------------------------------------------------------------------------

struct InvalidCase {
  std::string label;
  std::string text;
  std::string expected;  // the whole message, or its start when `prefix_only`
  bool prefix_only = false;
};

// A one-version spec with `fields` added to the served model.
std::string one_version(const std::string& fields) {
  return "{name: e, served_models: [{name: v1, model: /m" + (fields.empty() ? "" : ", " + fields) +
         "}]}";
}

TEST(ParseEndpointSpecTest, RefusesInvalidSpecsNamingTheField) {
  const std::string name65(65, 'a');
  const std::string kTraffic1 = "served_models[1].traffic: must be an integer from 0 to 100";
  const std::string kCpus = "served_models[0].resources.cpus: must be a number from 0 to 1024";
  const std::vector<InvalidCase> cases = {
      // Document level.
      {"syntax error", "name: [e", "spec: invalid YAML or JSON: ", true},
      {"syntax error in JSON", R"({"name": "e",)", "spec: invalid YAML or JSON: ", true},
      {"empty text", "", "spec: is empty"},
      {"a list", "[1, 2]", "spec: must be a mapping"},
      {"a scalar", "hello", "spec: must be a mapping"},
      {"unknown top-level field", "{name: e, version: 2, served_models: [{name: v, model: /m}]}",
       "spec: unknown field 'version'"},
      {"repeated field", "name: e\nname: f\nserved_models: [{name: v, model: /m}]\n",
       "spec: field 'name' appears twice"},
      {"non-scalar field name", "{[a]: 1}", "spec: field names must be strings"},
      // autoscaling.
      {"autoscaling a list", "{name: e, autoscaling: [1], served_models: [{name: v, model: /m}]}",
       "autoscaling: must be a mapping"},
      {"autoscaling unknown field",
       "{name: e, autoscaling: {forcast: false}, served_models: [{name: v, model: /m}]}",
       "autoscaling: unknown field 'forcast'"},
      {"forecast not a boolean",
       "{name: e, autoscaling: {forecast: sometimes}, served_models: [{name: v, model: /m}]}",
       "autoscaling.forecast: must be true or false"},
      // inference_table.
      {"inference_table unknown field",
       "{name: e, inference_table: {enable: true}, served_models: [{name: v, model: /m}]}",
       "inference_table: unknown field 'enable'"},
      {"inference_table enabled not a boolean",
       "{name: e, inference_table: {enabled: yes}, served_models: [{name: v, model: /m}]}",
       "inference_table.enabled: must be true or false"},
      {"sample_rate 0",
       "{name: e, inference_table: {sample_rate: 0}, served_models: [{name: v, model: /m}]}",
       "inference_table.sample_rate: must be above 0 and at most 1"},
      {"sample_rate above 1",
       "{name: e, inference_table: {sample_rate: 1.5}, served_models: [{name: v, model: /m}]}",
       "inference_table.sample_rate: must be a number from 0 to 1"},
      {"max_body_bytes too large",
       "{name: e, inference_table: {max_body_bytes: 16777217}, served_models: [{name: v, "
       "model: /m}]}",
       "inference_table.max_body_bytes: must be an integer from 0 to 16777216"},
      {"retention without a unit",
       "{name: e, inference_table: {retention: '7'}, served_models: [{name: v, model: /m}]}",
       "inference_table.retention: must be minutes, hours or days (\"30m\", \"24h\", \"7d\"), "
       "from 1 minute to 365 days"},
      {"retention in seconds",
       "{name: e, inference_table: {retention: 90s}, served_models: [{name: v, model: /m}]}",
       "inference_table.retention: must be minutes, hours or days (\"30m\", \"24h\", \"7d\"), "
       "from 1 minute to 365 days"},
      {"retention over a year",
       "{name: e, inference_table: {retention: 366d}, served_models: [{name: v, model: /m}]}",
       "inference_table.retention: must be minutes, hours or days (\"30m\", \"24h\", \"7d\"), "
       "from 1 minute to 365 days"},
      {"retention zero",
       "{name: e, inference_table: {retention: 0h}, served_models: [{name: v, model: /m}]}",
       "inference_table.retention: must be minutes, hours or days (\"30m\", \"24h\", \"7d\"), "
       "from 1 minute to 365 days"},
      // name.
      {"missing name", "{served_models: [{name: v, model: /m}]}", "name: is required"},
      {"empty name", "{name: '', served_models: [{name: v, model: /m}]}",
       "name: must be 1 to 64 characters"},
      {"name too long", "{name: " + name65 + ", served_models: [{name: v, model: /m}]}",
       "name: must be 1 to 64 characters"},
      {"name with a space", "{name: 'fraud scorer', served_models: [{name: v, model: /m}]}",
       "name: 'fraud scorer' may hold only letters, digits, '-', '_' and '.'"},
      {"name with a slash", "{name: 'a/b', served_models: [{name: v, model: /m}]}",
       "name: 'a/b' may hold only letters, digits, '-', '_' and '.'"},
      {"name starting with '-'", "{name: '-e', served_models: [{name: v, model: /m}]}",
       "name: '-e' must start with a letter or digit"},
      {"name starting with '.'", "{name: .e, served_models: [{name: v, model: /m}]}",
       "name: '.e' must start with a letter or digit"},
      {"name a list", "{name: [a], served_models: [{name: v, model: /m}]}",
       "name: must be a string"},
      {"name null", "{name: null, served_models: [{name: v, model: /m}]}",
       "name: must be a string"},
      // served_models.
      {"missing served_models", "{name: e}", "served_models: is required"},
      {"empty served_models", "{name: e, served_models: []}",
       "served_models: must be a non-empty list"},
      {"served_models a mapping", "{name: e, served_models: {name: v, model: /m}}",
       "served_models: must be a non-empty list"},
      {"served model a scalar", "{name: e, served_models: [v1]}",
       "served_models[0]: must be a mapping"},
      {"unknown served model field", one_version("modle: /x"),
       "served_models[0]: unknown field 'modle'"},
      {"missing version name", "{name: e, served_models: [{model: /m}]}",
       "served_models[0].name: is required"},
      {"bad version name", "{name: e, served_models: [{name: 'v 1', model: /m}]}",
       "served_models[0].name: 'v 1' may hold only letters, digits, '-', '_' and '.'"},
      {"version name starting with '_'", "{name: e, served_models: [{name: _v, model: /m}]}",
       "served_models[0].name: '_v' must start with a letter or digit"},
      {"repeated version name",
       "{name: e, served_models: [{name: v1, model: /a, traffic: 50}, "
       "{name: v1, model: /b, traffic: 50}]}",
       "served_models[1].name: 'v1' appears twice"},
      // model.
      {"missing model", "{name: e, served_models: [{name: v1}]}",
       "served_models[0].model: is required"},
      {"empty model", "{name: e, served_models: [{name: v1, model: ''}]}",
       "served_models[0].model: must not be empty"},
      {"relative model path", "{name: e, served_models: [{name: v1, model: models/fraud}]}",
       "served_models[0].model: 'models/fraud' must be an absolute path or an http(s):// URL"},
      {"URL without a host", "{name: e, served_models: [{name: v1, model: 'http:///m'}]}",
       "served_models[0].model: URL 'http:///m' has no host"},
      {"URL with a bad digest", "{name: e, served_models: [{name: v1, model: 'https://h/m#x'}]}",
       "served_models[0].model: URL fragment '#x' must be sha256=<64 lowercase hex digits>"},
      {"model a mapping", "{name: e, served_models: [{name: v1, model: {path: /m}}]}",
       "served_models[0].model: must be a string"},
      {"model with a control character", "{name: e, served_models: [{name: v1, model: \"/m\\t\"}]}",
       "served_models[0].model: must not contain control characters"},
      {"model that is not UTF-8", "{name: e, served_models: [{name: v1, model: \"/m\xC3(\"}]}",
       "served_models[0].model: must be valid UTF-8"},
      // runtime.
      {"unknown runtime", one_version("runtime: tensorrt"),
       "served_models[0].runtime: unknown runtime 'tensorrt' (use auto, xgboost, llm, synthetic "
       "or external)"},
      {"runtime in upper case", one_version("runtime: XGBoost"),
       "served_models[0].runtime: unknown runtime 'XGBoost' (use auto, xgboost, llm, synthetic "
       "or external)"},
      // external.
      {"external without its command", one_version("runtime: external"),
       "served_models[0].external: is required with runtime: external (the command that starts "
       "your server)"},
      {"external with another runtime", one_version("external: {command: [srv]}"),
       "served_models[0].external: only with runtime: external"},
      {"external not a mapping", one_version("runtime: external, external: [srv]"),
       "served_models[0].external: must be a mapping"},
      {"external unknown field",
       one_version("runtime: external, external: {command: [srv], shell: true}"),
       "served_models[0].external: unknown field 'shell'"},
      {"external command missing", one_version("runtime: external, external: {env: {A: b}}"),
       "served_models[0].external.command: is required"},
      {"external command a string", one_version("runtime: external, external: {command: srv}"),
       "served_models[0].external.command: must be a list of 1 to 256 strings (the program and "
       "its arguments; no shell runs it)"},
      {"external command empty", one_version("runtime: external, external: {command: []}"),
       "served_models[0].external.command: must be a list of 1 to 256 strings (the program and "
       "its arguments; no shell runs it)"},
      {"external program empty", one_version("runtime: external, external: {command: ['', x]}"),
       "served_models[0].external.command[0]: must name a program"},
      {"external argument a list",
       one_version("runtime: external, external: {command: [srv, [a]]}"),
       "served_models[0].external.command[1]: must be a string"},
      {"external argument with a newline",
       one_version("runtime: external, external: {command: [srv, \"a\\nb\"]}"),
       "served_models[0].external.command[1]: must not contain control characters"},
      {"external env a list",
       one_version("runtime: external, external: {command: [srv], env: [A]}"),
       "served_models[0].external.env: must be a mapping of variable names to strings"},
      {"external env bad name",
       one_version("runtime: external, external: {command: [srv], env: {1A: b}}"),
       "served_models[0].external.env: '1A' is not a variable name (letters, digits and '_', "
       "not starting with a digit)"},
      {"external env PORT",
       one_version("runtime: external, external: {command: [srv], env: {PORT: '80'}}"),
       "served_models[0].external.env.PORT: is Flotilla's to set (the replica's port)"},
      {"external env value a mapping",
       one_version("runtime: external, external: {command: [srv], env: {A: {b: c}}}"),
       "served_models[0].external.env.A: must be a string"},
      {"external relative workdir",
       one_version("runtime: external, external: {command: [srv], workdir: srv}"),
       "served_models[0].external.workdir: 'srv' must be an absolute path"},
      {"external ready path without a slash",
       one_version("runtime: external, external: {command: [srv], ready_path: health}"),
       "served_models[0].external.ready_path: 'health' must be a path starting with '/', "
       "without spaces"},
      {"external ready path with a space",
       one_version("runtime: external, external: {command: [srv], ready_path: '/a b'}"),
       "served_models[0].external.ready_path: '/a b' must be a path starting with '/', without "
       "spaces"},
      {"external model a URL",
       "{name: e, served_models: [{name: v1, model: 'http://h/m', runtime: external, "
       "external: {command: [srv]}}]}",
       "served_models[0].model: 'http://h/m' must be a local path with runtime: external (your "
       "server reads it)"},
      // concurrency.
      {"concurrency a number", one_version("concurrency: 5"),
       "served_models[0].concurrency: must be a mapping"},
      {"concurrency unknown field", one_version("concurrency: {min: 1, target: 3}"),
       "served_models[0].concurrency: unknown field 'target'"},
      {"negative concurrency min", one_version("concurrency: {min: -1}"),
       "served_models[0].concurrency.min: must be an integer from 0 to 1000000"},
      {"fractional concurrency min", one_version("concurrency: {min: 1.5}"),
       "served_models[0].concurrency.min: must be an integer from 0 to 1000000"},
      {"textual concurrency min", one_version("concurrency: {min: abc}"),
       "served_models[0].concurrency.min: must be an integer from 0 to 1000000"},
      {"exponent concurrency max", one_version("concurrency: {max: 1e3}"),
       "served_models[0].concurrency.max: must be an integer from 1 to 1000000"},
      {"hex concurrency max", one_version("concurrency: {max: 0x10}"),
       "served_models[0].concurrency.max: must be an integer from 1 to 1000000"},
      {"concurrency max 0", one_version("concurrency: {min: 0, max: 0}"),
       "served_models[0].concurrency.max: must be an integer from 1 to 1000000"},
      {"concurrency min above max", one_version("concurrency: {min: 8, max: 4}"),
       "served_models[0].concurrency: min (8) must not exceed max (4)"},
      {"concurrency min above the default max", one_version("concurrency: {min: 65}"),
       "served_models[0].concurrency: min (65) must not exceed max (64)"},
      {"concurrency beyond int64", one_version("concurrency: {max: 99999999999999999999}"),
       "served_models[0].concurrency.max: must be an integer from 1 to 1000000"},
      // per_replica_concurrency.
      {"per-replica min 0", one_version("per_replica_concurrency: {min: 0, max: 4}"),
       "served_models[0].per_replica_concurrency.min: must be an integer from 1 to 4096"},
      {"per-replica max above 4096", one_version("per_replica_concurrency: {max: 4097}"),
       "served_models[0].per_replica_concurrency.max: must be an integer from 1 to 4096"},
      {"per-replica min above max", one_version("per_replica_concurrency: {min: 9, max: 8}"),
       "served_models[0].per_replica_concurrency: min (9) must not exceed max (8)"},
      {"per-replica initial below min",
       one_version("per_replica_concurrency: {min: 4, max: 8, initial: 2}"),
       "served_models[0].per_replica_concurrency.initial: 2 must be within min (4) and max (8)"},
      {"per-replica initial above max",
       one_version("per_replica_concurrency: {min: 4, max: 8, initial: 9}"),
       "served_models[0].per_replica_concurrency.initial: 9 must be within min (4) and max (8)"},
      {"per-replica initial 0", one_version("per_replica_concurrency: {initial: 0}"),
       "served_models[0].per_replica_concurrency.initial: must be an integer from 1 to 4096"},
      {"per-replica initial a string", one_version("per_replica_concurrency: {initial: many}"),
       "served_models[0].per_replica_concurrency.initial: must be an integer from 1 to 4096"},
      {"per-replica a list", one_version("per_replica_concurrency: [1, 8]"),
       "served_models[0].per_replica_concurrency: must be a mapping"},
      // scale_to_zero.
      {"scale_to_zero yes", one_version("scale_to_zero: yes"),
       "served_models[0].scale_to_zero: must be true or false"},
      {"scale_to_zero quoted", one_version("scale_to_zero: 'true'"),
       "served_models[0].scale_to_zero: must be true or false"},
      {"scale_to_zero 1", one_version("scale_to_zero: 1"),
       "served_models[0].scale_to_zero: must be true or false"},
      // traffic.
      {"traffic above 100",
       "{name: e, served_models: [{name: a, model: /a, traffic: 0}, "
       "{name: b, model: /b, traffic: 101}]}",
       kTraffic1},
      {"negative traffic",
       "{name: e, served_models: [{name: a, model: /a, traffic: 100}, "
       "{name: b, model: /b, traffic: -1}]}",
       kTraffic1},
      {"fractional traffic",
       "{name: e, served_models: [{name: a, model: /a, traffic: 50}, "
       "{name: b, model: /b, traffic: 49.5}]}",
       kTraffic1},
      {"textual traffic",
       "{name: e, served_models: [{name: a, model: /a, traffic: 50}, "
       "{name: b, model: /b, traffic: abc}]}",
       kTraffic1},
      {"traffic as a JSON string",
       R"({"name": "e", "served_models": [{"name": "a", "model": "/a", "traffic": 50},
           {"name": "b", "model": "/b", "traffic": "50"}]})",
       kTraffic1},
      {"traffic left out with two versions",
       "{name: e, served_models: [{name: a, model: /a}, {name: b, model: /b, traffic: 100}]}",
       "served_models[0].traffic: is required when there are several served models"},
      {"traffic sums below 100",
       "{name: e, served_models: [{name: a, model: /a, traffic: 40}, "
       "{name: b, model: /b, traffic: 50}]}",
       "served_models: traffic sums to 90, must be 100"},
      {"traffic sums above 100",
       "{name: e, served_models: [{name: a, model: /a, traffic: 60}, "
       "{name: b, model: /b, traffic: 50}]}",
       "served_models: traffic sums to 110, must be 100"},
      {"single version with partial traffic", one_version("traffic: 50"),
       "served_models: traffic sums to 50, must be 100"},
      // resources.
      {"resources unknown field", one_version("resources: {gpus: 1}"),
       "served_models[0].resources: unknown field 'gpus'"},
      {"resources a number", one_version("resources: 4"),
       "served_models[0].resources: must be a mapping"},
      {"negative cpus", one_version("resources: {cpus: -1}"), kCpus},
      {"cpus above 1024", one_version("resources: {cpus: 1024.5}"), kCpus},
      {"textual cpus", one_version("resources: {cpus: four}"), kCpus},
      {"nan cpus", one_version("resources: {cpus: nan}"), kCpus},
      {"infinite cpus", one_version("resources: {cpus: inf}"), kCpus},
      {"quoted cpus", one_version("resources: {cpus: '2'}"), kCpus},
      {"negative memory", one_version("resources: {memory_mb: -1}"),
       "served_models[0].resources.memory_mb: must be an integer from 0 to 1073741824"},
      {"huge concurrency", one_version("concurrency: {min: 1, max: 100000000}"),
       "served_models[0].concurrency.max: must be an integer from 1 to 1000000"},
      {"fractional memory", one_version("resources: {memory_mb: 1.5}"),
       "served_models[0].resources.memory_mb: must be an integer from 0 to 1073741824"},
  };
  for (const InvalidCase& c : cases) {
    SCOPED_TRACE(c.label + ": " + c.text);
    Result<EndpointSpec> spec = parse_endpoint_spec(c.text);
    ASSERT_FALSE(spec.is_ok());
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
    if (c.prefix_only) {
      EXPECT_THAT(spec.status().message(), StartsWith(c.expected));
    } else {
      EXPECT_EQ(spec.status().message(), c.expected);
    }
  }
}

// ---- name_from_path -----------------------------------------------------------------------------

TEST(ParseEndpointSpecTest, ReadsAnExternalServer) {
  auto spec = parse_endpoint_spec(R"(
name: e
served_models:
  - name: v1
    model: /models/iris
    runtime: external
    external:
      command: [mlserver, start, "{model}"]
      env: {MLSERVER_HTTP_PORT: "{port}", MLSERVER_GRPC_PORT: "{port:grpc}", WORKERS: 2}
      workdir: /srv
      ready_path: /v2/health/ready?x=1
)");
  ASSERT_TRUE(spec.is_ok()) << spec.status().message();
  const ServedModelSpec& served = spec->served_models[0];
  ASSERT_TRUE(served.external.has_value());
  EXPECT_EQ(served.external->command, (std::vector<std::string>{"mlserver", "start", "{model}"}));
  EXPECT_EQ(served.external->env,
            (std::map<std::string, std::string>{{"MLSERVER_GRPC_PORT", "{port:grpc}"},
                                                {"MLSERVER_HTTP_PORT", "{port}"},
                                                {"WORKERS", "2"}}));
  EXPECT_EQ(served.external->workdir, "/srv");
  EXPECT_EQ(served.external->ready_path, "/v2/health/ready?x=1");
  // Back through its JSON form, and the defaults of what was left out.
  EXPECT_EQ(parse_endpoint_spec(to_json(*spec).dump()).value(), *spec);
  auto minimal = parse_endpoint_spec(one_version("runtime: external, external: {command: [srv]}"));
  ASSERT_TRUE(minimal.is_ok()) << minimal.status().message();
  EXPECT_EQ(minimal->served_models[0].external->ready_path, "/v2/health/ready");
  EXPECT_EQ(minimal->served_models[0].external->workdir, "");
  EXPECT_TRUE(minimal->served_models[0].external->env.empty());
  EXPECT_EQ(parse_endpoint_spec(to_json(*minimal).dump()).value(), *minimal);
}

TEST(ParseEndpointSpecTest, TakesTheNameFromThePathWhenTheSpecLeavesItOut) {
  Result<EndpointSpec> spec =
      parse_endpoint_spec("served_models: [{name: v1, model: /m}]", "fraud");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->name, "fraud");
}

TEST(ParseEndpointSpecTest, AcceptsANameEqualToThePath) {
  Result<EndpointSpec> spec =
      parse_endpoint_spec("{name: fraud, served_models: [{name: v1, model: /m}]}", "fraud");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_EQ(spec->name, "fraud");
}

TEST(ParseEndpointSpecTest, RefusesANameDifferentFromThePath) {
  Result<EndpointSpec> spec =
      parse_endpoint_spec("{name: other, served_models: [{name: v1, model: /m}]}", "fraud");
  ASSERT_FALSE(spec.is_ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(),
            "name: 'other' does not match the endpoint 'fraud' in the request path");
}

TEST(ParseEndpointSpecTest, ValidatesTheNameTakenFromThePath) {
  Result<EndpointSpec> spec =
      parse_endpoint_spec("served_models: [{name: v1, model: /m}]", "bad name");
  ASSERT_FALSE(spec.is_ok());
  EXPECT_EQ(spec.status().message(),
            "name: 'bad name' may hold only letters, digits, '-', '_' and '.'");
}

// ---- Canonical JSON -----------------------------------------------------------------------------

TEST(SpecToJsonTest, WritesEveryFieldWithDefaults) {
  EndpointSpec spec{"fraud", {served_model("v1", "/models/fraud")}, {}, {}};
  EXPECT_EQ(to_json(spec).dump(),
            R"({"name":"fraud","served_models":[{"concurrency":{"max":64,"min":1},)"
            R"("model":"/models/fraud","name":"v1","resources":{"cpus":0.0,"memory_mb":0},)"
            R"("runtime":"auto","scale_to_zero":false,"traffic":100}]})");
}

TEST(SpecToJsonTest, WritesAutoscalingOnlyWhenNotTheDefault) {
  EndpointSpec spec{"fraud", {served_model("v1", "/models/fraud")}, {}, {}};
  EXPECT_FALSE(to_json(spec).contains("autoscaling"));
  spec.autoscaling.forecast = false;
  EXPECT_EQ(to_json(spec)["autoscaling"], nlohmann::json({{"forecast", false}}));
}

TEST(SpecToJsonTest, WritesTheInferenceTableOnlyWhenNotTheDefaultAndReadsItBack) {
  EndpointSpec spec{"fraud", {served_model("v1", "/models/fraud")}, {}, {}};
  EXPECT_FALSE(to_json(spec).contains("inference_table"));
  for (const auto& [retention, seconds] : std::vector<std::pair<std::string, int64_t>>{
           {"90m", 5'400}, {"36h", 129'600}, {"7d", 604'800}}) {
    Result<EndpointSpec> parsed = parse_endpoint_spec(
        "{name: fraud, served_models: [{name: v1, model: /models/fraud}], inference_table: "
        "{enabled: true, sample_rate: 0.25, max_body_bytes: 0, retention: " +
        retention + "}}");
    ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
    EXPECT_TRUE(parsed->inference_table.enabled);
    EXPECT_DOUBLE_EQ(parsed->inference_table.sample_rate, 0.25);
    EXPECT_EQ(parsed->inference_table.max_body_bytes, 0);
    EXPECT_EQ(parsed->inference_table.retention_s, seconds);
    EXPECT_EQ(to_json(*parsed)["inference_table"]["retention"], retention);
    Result<EndpointSpec> again = parse_endpoint_spec(to_json(*parsed).dump());
    ASSERT_TRUE(again.is_ok()) << again.status().message();
    EXPECT_EQ(*again, *parsed);
  }
  Result<EndpointSpec> defaults = parse_endpoint_spec(
      "{name: fraud, served_models: [{name: v1, model: /m}], inference_table: {enabled: true}}");
  ASSERT_TRUE(defaults.is_ok()) << defaults.status().message();
  EXPECT_EQ(defaults->inference_table.max_body_bytes, 65'536);
  EXPECT_EQ(defaults->inference_table.retention_s, 7 * 86'400);
  EXPECT_EQ(to_json(*defaults)["inference_table"]["retention"], "7d");
}

TEST(SpecToJsonTest, WritesPerReplicaConcurrencyOnlyWhenSet) {
  ServedModelSpec served = served_model("v1", "/m");
  EXPECT_FALSE(to_json(served).contains("per_replica_concurrency"));
  served.per_replica_concurrency = ConcurrencyRange{2, 8};
  EXPECT_EQ(to_json(served)["per_replica_concurrency"], nlohmann::json({{"min", 2}, {"max", 8}}));
  served.initial_per_replica_concurrency = 3;
  EXPECT_EQ(to_json(served)["per_replica_concurrency"],
            nlohmann::json({{"min", 2}, {"max", 8}, {"initial", 3}}));
}

TEST(SpecToJsonTest, ParsingTheJsonGivesTheSameSpec) {
  ServedModelSpec full = served_model("v1", "/models/a b/é");
  full.runtime = "xgboost";
  full.concurrency = {0, 1000};
  full.per_replica_concurrency = ConcurrencyRange{3, 4096};
  full.initial_per_replica_concurrency = 100;
  full.scale_to_zero = true;
  full.traffic = 35;
  full.resources = {0.1, 512};
  ServedModelSpec other = served_model("v2", "/models/b");
  other.runtime = "synthetic";
  other.traffic = 65;
  other.resources = {1024, 0};
  ServedModelSpec third = served_model("v3", "/models/c");
  third.traffic = 0;
  third.resources.cpus = 1.0 / 3.0;  // needs every digit to come back equal

  const std::vector<EndpointSpec> specs = {
      {"fraud", {served_model("v1", "/models/fraud")}, {}, {}},
      {"multi", {full, other, third}, {.forecast = false}, {.enabled = true, .sample_rate = 0.5}},
      {"quoted", {served_model("v1", "/path/with \"quotes\", \\ and: {yaml} [chars] #")}, {}, {}},
  };
  for (const EndpointSpec& spec : specs) {
    SCOPED_TRACE(spec.name);
    const std::string text = to_json(spec).dump();
    Result<EndpointSpec> parsed = parse_endpoint_spec(text);
    ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string() << "\n" << text;
    EXPECT_EQ(*parsed, spec);
    EXPECT_EQ(to_json(*parsed).dump(), text);
  }
}

TEST(SpecToJsonTest, ParsedSpecsAlwaysDump) {
  // nlohmann::json throws on invalid UTF-8; the parser refuses it, so dump() of a parsed spec
  // never throws.
  Result<EndpointSpec> spec =
      parse_endpoint_spec("{name: e, served_models: [{name: v, model: \"/\xE2\x82\xAC\"}]}");
  ASSERT_TRUE(spec.is_ok()) << spec.status().to_string();
  EXPECT_NO_THROW(to_json(*spec).dump());
}

// ---- check_model_paths --------------------------------------------------------------------------

class CheckModelPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/flotilla_spec_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    model_ = (dir_ / "model.json").string();
    std::ofstream(model_) << "{}";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::filesystem::path dir_;
  std::string model_;
};

TEST_F(CheckModelPathsTest, AcceptsExistingFilesAndDirectories) {
  const EndpointSpec spec{
      "e", {served_model("a", model_), served_model("b", dir_.string())}, {}, {}};
  EXPECT_TRUE(check_model_paths(spec).is_ok());
}

TEST_F(CheckModelPathsTest, NamesTheMissingModel) {
  const std::string missing = (dir_ / "missing.json").string();
  const EndpointSpec spec{"e", {served_model("a", model_), served_model("b", missing)}, {}, {}};
  const Status status = check_model_paths(spec);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "served_models[1].model: '" + missing + "' does not exist");
}

TEST_F(CheckModelPathsTest, FindsAnExternalServersProgramAndWorkdir) {
  const std::string script = (dir_ / "serve.sh").string();
  std::ofstream(script) << "#!/bin/sh\n";
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  auto with = [&](ExternalCommand external) {
    ServedModelSpec served = served_model("a", model_);
    served.runtime = "external";
    served.external = std::move(external);
    return EndpointSpec{"e", {served}, {}, {}};
  };
  // A bare name on PATH, a path relative to the workdir (by default the model's directory),
  // an absolute one.
  EXPECT_TRUE(check_model_paths(with({{"sh"}, {}, "", "/r"})).is_ok());
  EXPECT_TRUE(check_model_paths(with({{"./serve.sh"}, {}, "", "/r"})).is_ok());
  EXPECT_TRUE(check_model_paths(with({{script}, {}, "/", "/r"})).is_ok());
  EXPECT_TRUE(check_model_paths(with({{"serve.sh"}, {{"PATH", dir_.string()}}, "", "/r"})).is_ok());

  Status status = check_model_paths(with({{"no-such-server-x"}, {}, "", "/r"}));
  EXPECT_EQ(status.message(),
            "served_models[0].external.command[0]: 'no-such-server-x' is not an executable on "
            "PATH");
  status = check_model_paths(with({{"./serve.sh"}, {}, "/", "/r"}));
  EXPECT_EQ(status.message(),
            "served_models[0].external.command[0]: '/serve.sh' is not an executable file");
  std::ofstream((dir_ / "plain.txt").string()) << "not a program";
  status = check_model_paths(with({{"./plain.txt"}, {}, "", "/r"}));
  EXPECT_EQ(status.message(), "served_models[0].external.command[0]: '" +
                                  (dir_ / "plain.txt").string() + "' is not an executable file");
  status = check_model_paths(with({{"sh"}, {}, (dir_ / "nowhere").string(), "/r"}));
  EXPECT_EQ(status.message(), "served_models[0].external.workdir: '" + (dir_ / "nowhere").string() +
                                  "' is not a directory");
}

TEST_F(CheckModelPathsTest, ServesMlflowFlavorsItDoesNotRunThroughMlflowsScoringServer) {
  const std::filesystem::path model = dir_ / "iris-sklearn";
  std::filesystem::create_directories(model);
  std::ofstream(model / "MLmodel") << "flavors:\n  python_function: {loader_module: "
                                      "mlflow.sklearn}\n  sklearn: {pickled_model: model.pkl}\n";
  const std::filesystem::path bin = dir_ / "bin";
  std::filesystem::create_directories(bin);
  const std::filesystem::path mlflow = bin / "mlflow";
  std::ofstream(mlflow) << "#!/bin/sh\n";
  std::filesystem::permissions(mlflow, std::filesystem::perms::owner_all);
  const char* saved = std::getenv("PATH");
  const std::string path = saved ? saved : "";
  auto resolved = [&](const std::string& search_path, EndpointSpec spec) {
    ::setenv("PATH", search_path.c_str(), 1);
    const Status status = serve_mlflow_flavors(spec);
    ::setenv("PATH", path.c_str(), 1);
    return std::make_pair(status, spec);
  };

  auto [status, spec] =
      resolved(bin.string() + ":" + path, EndpointSpec{"e", {served_model("a", model)}, {}, {}});
  ASSERT_TRUE(status.is_ok()) << status.message();
  const ServedModelSpec& served = spec.served_models[0];
  EXPECT_EQ(served.runtime, "external");
  ASSERT_TRUE(served.external.has_value());
  EXPECT_EQ(served.external->command,
            (std::vector<std::string>{mlflow.string(), "models", "serve", "-m", "{model}", "-h",
                                      "127.0.0.1", "-p", "{port}", "--env-manager", "local"}));
  EXPECT_EQ(served.external->ready_path, "/ping");

  // Without mlflow on PATH: what to install, naming the field.
  std::tie(status, spec) =
      resolved(dir_.string(), EndpointSpec{"e", {served_model("a", model)}, {}, {}});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("served_models[0].model: '" + model.string() +
                        "' is an MLflow model of flavors [python_function, sklearn], which "
                        "Flotilla serves through MLflow's own scoring server, and `mlflow` is "
                        "not on flotilla up's PATH: install MLflow"));
  // An explicit runtime, an xgboost flavor and a plain model file are left as they are.
  ServedModelSpec xgboost = served_model("b", model_);
  ServedModelSpec pinned = served_model("c", model);
  pinned.runtime = "xgboost";
  std::tie(status, spec) = resolved(dir_.string(), EndpointSpec{"e", {xgboost, pinned}, {}, {}});
  EXPECT_TRUE(status.is_ok()) << status.message();
  EXPECT_EQ(spec.served_models[0], xgboost);
  EXPECT_EQ(spec.served_models[1], pinned);
  // A flavor no server here runs.
  std::ofstream(model / "MLmodel") << "flavors:\n  onnx: {data: model.onnx}\n";
  std::tie(status, spec) =
      resolved(bin.string(), EndpointSpec{"e", {served_model("a", model)}, {}, {}});
  EXPECT_THAT(status.message(), HasSubstr("is an MLflow model of flavors [onnx], none of which "
                                          "Flotilla serves"));
}

// ---- Derived numbers ----------------------------------------------------------------------------

TEST(DeploymentKeyTest, HasTheDocumentedFormAndAStableHash) {
  // python3 -c "import hashlib; print(hashlib.sha256(
  //     b'5:fraud;2:v1;13:/models/fraud;4:auto;1:0;1:0;').hexdigest()[:16])"
  EXPECT_EQ(deployment_key("fraud", served_model("v1", "/models/fraud")),
            "fraud/v1/2723a02302d9842e");
  ServedModelSpec served = served_model("v2", "/models/fraud v2");
  served.runtime = "xgboost";
  served.resources = {0.5, 2048};
  // The same with b'5:fraud;2:v2;16:/models/fraud v2;7:xgboost;3:0.5;4:2048;'.
  EXPECT_EQ(deployment_key("fraud", served), "fraud/v2/1548b4b3178d0b85");
  EXPECT_THAT(deployment_key("a", served), MatchesRegex("a/v2/[0-9a-f]{16}"));
}

TEST(DeploymentKeyTest, ChangesOnlyWithFieldsThatNeedARestart) {
  ServedModelSpec base = served_model("v1", "/models/fraud");
  base.resources = {2, 1024};
  const std::string key = deployment_key("fraud", base);

  struct Change {
    std::string label;
    std::function<void(ServedModelSpec&)> apply;
    bool changes_key;
  };
  const std::vector<Change> changes = {
      {"model", [](ServedModelSpec& s) { s.model = "/models/fraud2"; }, true},
      {"runtime", [](ServedModelSpec& s) { s.runtime = "xgboost"; }, true},
      {"cpus", [](ServedModelSpec& s) { s.resources.cpus = 2.5; }, true},
      {"memory", [](ServedModelSpec& s) { s.resources.memory_mb = 1025; }, true},
      {"traffic", [](ServedModelSpec& s) { s.traffic = 10; }, false},
      {"concurrency",
       [](ServedModelSpec& s) {
         s.concurrency = {10, 20};
       },
       false},
      {"per-replica bounds",
       [](ServedModelSpec& s) {
         s.per_replica_concurrency = ConcurrencyRange{2, 3};
       },
       false},
      {"scale to zero", [](ServedModelSpec& s) { s.scale_to_zero = true; }, false},
      {"external command",
       [](ServedModelSpec& s) {
         s.runtime = "external";
         s.external = ExternalCommand{{"srv"}, {}, "", "/ready"};
       },
       true},
  };
  for (const Change& change : changes) {
    SCOPED_TRACE(change.label);
    ServedModelSpec changed = base;
    change.apply(changed);
    if (change.changes_key) {
      EXPECT_NE(deployment_key("fraud", changed), key);
    } else {
      EXPECT_EQ(deployment_key("fraud", changed), key);
    }
  }
  // The endpoint and version names are in the key, hash included.
  EXPECT_NE(deployment_key("fraud2", base), key);
  ServedModelSpec renamed = base;
  renamed.name = "v2";
  const std::string renamed_key = deployment_key("fraud", renamed);
  EXPECT_NE(renamed_key.substr(renamed_key.rfind('/')), key.substr(key.rfind('/')));
  // Each part of an external command is in the key.
  ServedModelSpec external = base;
  external.runtime = "external";
  external.external = ExternalCommand{{"srv", "-p", "{port}"}, {{"A", "1"}}, "/srv", "/ready"};
  const std::string external_key = deployment_key("fraud", external);
  for (auto change : std::vector<std::function<void(ExternalCommand&)>>{
           [](ExternalCommand& c) { c.command[2] = "{port:x}"; },
           [](ExternalCommand& c) { c.env["A"] = "2"; },
           [](ExternalCommand& c) { c.workdir = "/srv2"; },
           [](ExternalCommand& c) {
             c.ready_path = "/ping";
           }}) {
    ServedModelSpec changed = external;
    change(*changed.external);
    EXPECT_NE(deployment_key("fraud", changed), external_key);
  }
  // Field boundaries are unambiguous: moving a character from one field to the next changes it.
  EXPECT_NE(deployment_key("ab", served_model("c", "/m")),
            deployment_key("a", served_model("bc", "/m")));
}

TEST(PerReplicaBoundsTest, UsesTheSpecElseTheRuntimeDefaults) {
  ServedModelSpec served = served_model("v1", "/m");
  EXPECT_EQ(per_replica_bounds(served), (ConcurrencyRange{1, 64}));
  served.runtime = "synthetic";
  EXPECT_EQ(per_replica_bounds(served), (ConcurrencyRange{1, 64}));
  served.per_replica_concurrency = ConcurrencyRange{4, 12};
  EXPECT_EQ(per_replica_bounds(served), (ConcurrencyRange{4, 12}));
}

struct TargetCase {
  std::string runtime;
  std::optional<ConcurrencyRange> bounds;
  int64_t concurrency_min;
  int64_t expected_target;
  int64_t expected_replicas;
};

TEST(ProvisionedReplicasTest, DividesTheMinimumByTheInitialTarget) {
  const std::vector<TargetCase> cases = {
      // runtime, per-replica bounds, concurrency.min, target, replicas
      {"auto", std::nullopt, 0, 16, 1},
      {"auto", std::nullopt, 1, 16, 1},
      {"auto", std::nullopt, 16, 16, 1},
      {"auto", std::nullopt, 17, 16, 2},
      {"auto", std::nullopt, 100, 16, 7},
      {"xgboost", std::nullopt, 32, 16, 2},
      {"xgboost", std::nullopt, 33, 16, 3},
      {"synthetic", std::nullopt, 8, 8, 1},
      {"synthetic", std::nullopt, 17, 8, 3},
      {"xgboost", ConcurrencyRange{1, 4}, 10, 4, 3},         // clamped down to max
      {"synthetic", ConcurrencyRange{32, 128}, 100, 32, 4},  // clamped up to min
      {"auto", ConcurrencyRange{16, 16}, 48, 16, 3},
      {"auto", ConcurrencyRange{1, 1}, 5, 1, 5},
  };
  for (const TargetCase& c : cases) {
    SCOPED_TRACE(c.runtime + " min=" + std::to_string(c.concurrency_min));
    ServedModelSpec served = served_model("v1", "/m");
    served.runtime = c.runtime;
    served.per_replica_concurrency = c.bounds;
    served.concurrency = {c.concurrency_min, std::max<int64_t>(c.concurrency_min, 1)};
    EXPECT_EQ(initial_target_concurrency(served), c.expected_target);
    EXPECT_EQ(provisioned_replicas(served), c.expected_replicas);
  }
}

TEST(ProvisionedReplicasTest, KeepsOneReadyEvenWithScaleToZero) {
  ServedModelSpec served = served_model("v1", "/m");
  served.scale_to_zero = true;
  served.concurrency = {0, 10};
  EXPECT_EQ(provisioned_replicas(served), 1);
}

// Issue 18: {min: 100000, max: 100000} at one request per replica started processes without
// bound; such a spec is refused, naming the field and the cap.
TEST(ReplicaCapTest, RefusesASpecWhoseMinimumNeedsMoreReplicasThanTheCap) {
  Result<EndpointSpec> spec = parse_endpoint_spec(R"(
name: huge
served_models:
  - name: v1
    model: /m
    concurrency: {min: 100000, max: 100000}
    per_replica_concurrency: {min: 1, max: 1}
)");
  ASSERT_TRUE(spec.is_ok()) << spec.status().message();
  EXPECT_EQ(least_replicas(*spec, true), std::vector<int64_t>{100000});
  const Status refused = check_replica_cap(*spec, 64, /*autoscaled=*/true);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(),
              StartsWith("served_models[0].concurrency.min: 100000 needs at least 100000 "
                         "replicas (at most 1 in flight each, per_replica_concurrency.max)"));
  EXPECT_THAT(refused.message(), HasSubstr("cap of 64 replicas (flotilla up --max-replicas)"));
  EXPECT_FALSE(check_replica_cap(*spec, 64, /*autoscaled=*/false).is_ok());
  EXPECT_TRUE(check_replica_cap(*spec, 0, true).is_ok());  // no cap
  EXPECT_TRUE(check_replica_cap(*spec, 100000, true).is_ok());
}

// The least count the autoscaler may reach: concurrency.min over the largest target the
// endpoint's per-replica bounds allow (its served models share one target); the same spec
// without the autoscaler keeps min / the runtime's default target.
TEST(ReplicaCapTest, CountsTheLeastReplicasOfEveryServedModel) {
  EndpointSpec spec;
  spec.name = "two";
  spec.served_models = {served_model("a", "/m"), served_model("b", "/m")};
  spec.served_models[0].concurrency = {640, 1000};  // default bounds {1, 64}: 10 replicas
  spec.served_models[0].traffic = 50;
  spec.served_models[1].concurrency = {0, 10};
  spec.served_models[1].scale_to_zero = true;  // may run none
  spec.served_models[1].traffic = 50;
  EXPECT_EQ(least_replicas(spec, true), (std::vector<int64_t>{10, 0}));
  EXPECT_EQ(least_replicas(spec, false), (std::vector<int64_t>{40, 1}));  // 640 / 16
  EXPECT_TRUE(check_replica_cap(spec, 10, true).is_ok());
  EXPECT_THAT(check_replica_cap(spec, 9, true).message(),
              StartsWith("served_models[0].concurrency.min: 640 needs at least 10 replicas"));
  EXPECT_THAT(check_replica_cap(spec, 40, false).message(),
              HasSubstr("41 with the other served models"));
  // A tighter bound on one served model bounds the shared target of both.
  spec.served_models[1].per_replica_concurrency = ConcurrencyRange{1, 8};
  EXPECT_EQ(least_replicas(spec, true), (std::vector<int64_t>{80, 0}));
}

}  // namespace
}  // namespace flotilla::control

// The gateway config's `auth:` section (auth_config.cc).
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "auth/auth.h"
#include "gateway/gateway.h"

namespace flotilla::gateway {
namespace {

using auth::Authenticator;
using auth::AuthResult;
using auth::generate_token;
using auth::TokenRecord;
using ::testing::HasSubstr;

// A fixed salt and secret whose digest was computed outside the code under test:
//   python3 -c "import hashlib; print(hashlib.sha256(bytes.fromhex('a1'*16) +
//               ('0123456789abcdef'*4).encode()).hexdigest())"
const std::string kFixedSalt = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
const std::string kFixedSecret = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const std::string kFixedDigest = "395b56873a25ffaade25319cf46ef10bc442fd2ffc26610b5edbb6a3004757f4";

const std::string kDigest(64, 'd');

std::string one_token(const std::string& fields) {
  return "auth:\n  tokens:\n    - {" + fields + "}\n";
}

TEST(AuthConfigTest, ParsesTheAuthSectionAndIgnoresTheRest) {
  const std::string yaml = R"(
endpoints:
  - name: fraud
    versions: [{name: v1, replicas: [{id: r1, address: "127.0.0.1:9001"}]}]
auth:
  tokens:
    - {id: ci, salt: ")" + kFixedSalt +
                           R"(", sha256: ")" + kFixedDigest + R"(", endpoints: [fraud]}
    - id: Ops-2
      salt: "A1A1A1A1A1A1A1A1A1A1A1A1A1A1A1A1"
      sha256: ")" + std::string(64, 'F') +
                           R"("
  open_routes: [health, metrics]
)";
  auto config = parse_auth_config_yaml(yaml);
  ASSERT_TRUE(config.is_ok()) << config.status().message();
  EXPECT_TRUE(config->enabled);
  ASSERT_EQ(config->tokens.size(), 2u);
  EXPECT_EQ(config->tokens[0],
            (TokenRecord{"ci", kFixedSalt, kFixedDigest, std::vector<std::string>{"fraud"}}));
  EXPECT_EQ(config->tokens[1].id, "Ops-2");
  EXPECT_EQ(config->tokens[1].salt, kFixedSalt);              // hex is stored lower case
  EXPECT_EQ(config->tokens[1].sha256, std::string(64, 'f'));  //
  EXPECT_TRUE(config->tokens[1].endpoints.empty());
  EXPECT_EQ(config->open_routes, (std::vector<std::string>{"health", "metrics"}));

  const Authenticator auth(config->tokens);
  EXPECT_EQ(auth.check("Bearer flt_ci_" + kFixedSecret, "fraud"), AuthResult::kAllowed);
}

TEST(AuthConfigTest, AbsentSectionMeansDisabled) {
  for (const char* yaml : {"", "endpoints: []", "# nothing\n"}) {
    auto config = parse_auth_config_yaml(yaml);
    ASSERT_TRUE(config.is_ok()) << yaml << ": " << config.status().message();
    EXPECT_FALSE(config->enabled) << yaml;
    EXPECT_TRUE(config->tokens.empty());
    EXPECT_TRUE(config->open_routes.empty());
  }
  for (const char* yaml : {"auth: {}", "auth: {tokens: [], open_routes: []}"}) {
    auto config = parse_auth_config_yaml(yaml);
    ASSERT_TRUE(config.is_ok()) << yaml << ": " << config.status().message();
    EXPECT_TRUE(config->enabled) << yaml;
    EXPECT_TRUE(config->tokens.empty());
  }
}

TEST(AuthConfigTest, RejectsBadConfigsNamingTheField) {
  const std::string salt = "salt: \"" + kFixedSalt + "\"";
  const std::string digest = "sha256: \"" + kDigest + "\"";
  const std::string valid = "id: ci, " + salt + ", " + digest;
  struct Case {
    std::string yaml;
    const char* error;
  };
  const Case cases[] = {
      {"auth: [", "invalid auth config"},
      {"[1, 2]", "config: must be a mapping"},
      {"auth:", "auth: must be a mapping"},
      {"auth: 1", "auth: must be a mapping"},
      {"auth: {tokenz: []}", "auth: unknown field 'tokenz'"},
      {"auth: {tokens: {}}", "auth.tokens: must be a list"},
      {"auth: {tokens: ci}", "auth.tokens: must be a list"},
      {"auth: {tokens: [ci]}", "auth.tokens[0]: must be a mapping"},
      {one_token(valid + ", scope: [fraud]"), "auth.tokens[0]: unknown field 'scope'"},
      // id
      {one_token(salt + ", " + digest), "auth.tokens[0].id: is required"},
      {one_token("id: [ci], " + salt + ", " + digest), "auth.tokens[0].id: must be a string"},
      {one_token("id: , " + salt + ", " + digest), "auth.tokens[0].id: must be a string"},
      {one_token("id: c_i, " + salt + ", " + digest),
       "auth.tokens[0].id: 'c_i' must be 1 to 64 letters, digits or '-'"},
      {one_token("id: '', " + salt + ", " + digest), "auth.tokens[0].id: '' must be"},
      // salt
      {one_token("id: ci, " + digest), "auth.tokens[0].salt: is required"},
      {one_token("id: ci, salt: \"" + kFixedSalt.substr(2) + "\", " + digest),
       "auth.tokens[0].salt: must be 32 hex characters"},
      {one_token("id: ci, salt: \"" + kFixedSalt + "00\", " + digest),
       "auth.tokens[0].salt: must be 32 hex characters"},
      {one_token("id: ci, salt: \"zz" + kFixedSalt.substr(2) + "\", " + digest),
       "auth.tokens[0].salt: must be 32 hex characters"},
      {one_token("id: ci, salt: {a: 1}, " + digest), "auth.tokens[0].salt: must be a string"},
      // sha256
      {one_token("id: ci, " + salt), "auth.tokens[0].sha256: is required"},
      {one_token("id: ci, " + salt + ", sha256: \"" + kDigest.substr(1) + "g\""),
       "auth.tokens[0].sha256: must be 64 hex characters"},
      {one_token("id: ci, " + salt + ", sha256: \"" + kDigest.substr(1) + "\""),
       "auth.tokens[0].sha256: must be 64 hex characters"},
      {one_token("id: ci, " + salt + ", sha256: 12"),
       "auth.tokens[0].sha256: must be 64 hex characters"},
      // endpoints
      {one_token(valid + ", endpoints: fraud"), "auth.tokens[0].endpoints: must be a list"},
      {one_token(valid + ", endpoints: [{a: 1}]"), "auth.tokens[0].endpoints[0]: must be a string"},
      {one_token(valid + ", endpoints: [fraud, 'a b']"),
       "auth.tokens[0].endpoints[1]: 'a b' may hold only"},
      // duplicate ids, and the index in a longer list
      {"auth:\n  tokens:\n    - {" + valid + "}\n    - {id: ops, " + salt + ", " + digest +
           "}\n    - {" + valid + "}\n",
       "auth.tokens[2].id: token 'ci' appears twice"},
      {"auth:\n  tokens:\n    - {" + valid + "}\n    - {id: ops, " + salt + ", sha256: x}\n",
       "auth.tokens[1].sha256: must be 64 hex characters"},
      // open_routes
      {"auth: {open_routes: health}", "auth.open_routes: must be a list"},
      {"auth: {open_routes: [health, admin]}",
       "auth.open_routes[1]: unknown route 'admin' (use health, metrics, stats or models)"},
      {"auth: {open_routes: [[health]]}", "auth.open_routes[0]: must be a string"},
  };
  for (const Case& c : cases) {
    auto config = parse_auth_config_yaml(c.yaml);
    ASSERT_FALSE(config.is_ok()) << c.yaml;
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_THAT(config.status().message(), HasSubstr(c.error)) << c.yaml;
  }
  auto all_routes = parse_auth_config_yaml("auth: {open_routes: [health, metrics, stats, models]}");
  ASSERT_TRUE(all_routes.is_ok()) << all_routes.status().message();
  EXPECT_EQ(all_routes->open_routes.size(), 4u);
}

TEST(TokenRecordYamlTest, WritesOneFlowMapping) {
  EXPECT_EQ(token_record_yaml({"ci", kFixedSalt, kFixedDigest, {"fraud", "llm"}}),
            "{id: \"ci\", salt: \"" + kFixedSalt + "\", sha256: \"" + kFixedDigest +
                "\", endpoints: [\"fraud\", \"llm\"]}");
  EXPECT_EQ(token_record_yaml({"ci", kFixedSalt, kFixedDigest, {}}),
            "{id: \"ci\", salt: \"" + kFixedSalt + "\", sha256: \"" + kFixedDigest + "\"}");
}

TEST(TokenRecordYamlTest, RoundTripsThroughTheParser) {
  auto minted = generate_token("minted", {"fraud"});
  ASSERT_TRUE(minted.is_ok()) << minted.status().message();
  const std::vector<TokenRecord> records = {
      {"ci", kFixedSalt, kFixedDigest, {"fraud", "fraud-v2", "a.b_c"}},
      {"no-scope", kFixedSalt, kFixedDigest, {}},
      // Ids and names YAML would otherwise read as numbers, booleans or null.
      {"123", kFixedSalt, kFixedDigest, {"true", "null", "1.0"}},
      minted->record,
  };
  std::string yaml = "auth:\n  tokens:\n";
  for (const TokenRecord& record : records) {
    yaml += "    - " + token_record_yaml(record) + "\n";
  }
  auto config = parse_auth_config_yaml(yaml);
  ASSERT_TRUE(config.is_ok()) << config.status().message() << "\n" << yaml;
  EXPECT_EQ(config->tokens, records);

  const Authenticator auth(config->tokens);
  EXPECT_EQ(auth.check("Bearer " + minted->token, "fraud"), AuthResult::kAllowed);
}

}  // namespace
}  // namespace flotilla::gateway

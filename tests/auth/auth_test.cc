#include "auth/auth.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flotilla::auth {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

// A fixed salt and secret whose digest was computed outside the code under test:
//   python3 -c "import hashlib; print(hashlib.sha256(bytes.fromhex('a1'*16) +
//               ('0123456789abcdef'*4).encode()).hexdigest())"
const std::string kFixedSalt = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
const std::string kFixedSecret = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const std::string kFixedDigest = "395b56873a25ffaade25319cf46ef10bc442fd2ffc26610b5edbb6a3004757f4";

TEST(TokenHashTest, MatchesKnownSha256Vectors) {
  // printf '\x00\x01...\x0fabc' | sha256sum
  EXPECT_EQ(hash_secret("000102030405060708090a0b0c0d0e0f", "abc"),
            "f9b234fe3638bdd7671503b81bda6e249f96aea7e0d8ca758c8f5ab13096de90");
  // Upper-case salt hex decodes to the same bytes.
  EXPECT_EQ(hash_secret("000102030405060708090A0B0C0D0E0F", "abc"),
            "f9b234fe3638bdd7671503b81bda6e249f96aea7e0d8ca758c8f5ab13096de90");
  // The SHA-256 of no bytes at all.
  EXPECT_EQ(hash_secret("", ""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hash_secret(kFixedSalt, kFixedSecret), kFixedDigest);
}

TEST(TokenHashTest, SaltThatIsNotHexGivesNoDigest) {
  EXPECT_EQ(hash_secret("zz", "abc"), "");
  EXPECT_EQ(hash_secret("abc", "abc"), "");  // odd length
}

TEST(GenerateTokenTest, MintsATokenThatChecksOut) {
  auto minted = generate_token("ci-2", {"fraud"});
  ASSERT_TRUE(minted.is_ok()) << minted.status().message();
  EXPECT_THAT(minted->token, MatchesRegex("flt_ci-2_[0-9a-f]{64}"));
  EXPECT_EQ(minted->record.id, "ci-2");
  EXPECT_THAT(minted->record.salt, MatchesRegex("[0-9a-f]{32}"));
  EXPECT_THAT(minted->record.sha256, MatchesRegex("[0-9a-f]{64}"));
  EXPECT_EQ(minted->record.endpoints, std::vector<std::string>{"fraud"});
  const std::string secret = minted->token.substr(std::string("flt_ci-2_").size());
  EXPECT_EQ(hash_secret(minted->record.salt, secret), minted->record.sha256);
  EXPECT_EQ(minted->token.find(minted->record.sha256), std::string::npos);

  const Authenticator auth({minted->record});
  EXPECT_EQ(auth.check("Bearer " + minted->token, "fraud"), AuthResult::kAllowed);
  EXPECT_EQ(auth.check("Bearer " + minted->token, ""), AuthResult::kAllowed);
  EXPECT_EQ(auth.check("Bearer " + minted->token, "llm"), AuthResult::kForbidden);
}

TEST(TokenIdTest, ReadsTheIdOfABearerTokenAndNothingElse) {
  Result<NewToken> token = generate_token("ci-job-2", {});
  ASSERT_TRUE(token.is_ok());
  EXPECT_EQ(token_id_of("Bearer " + token->token), "ci-job-2");
  EXPECT_EQ(token_id_of(""), "");
  EXPECT_EQ(token_id_of("Bearer flt_"), "");
  EXPECT_EQ(token_id_of("Basic dXNlcjpwYXNz"), "");
}

TEST(GenerateTokenTest, DrawsAFreshSaltAndSecretEachTime) {
  auto a = generate_token("ci", {});
  auto b = generate_token("ci", {});
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_NE(a->token, b->token);
  EXPECT_NE(a->record.salt, b->record.salt);
  EXPECT_NE(a->record.sha256, b->record.sha256);
  // The first token does not pass for the second record, though the ids are equal.
  EXPECT_EQ(Authenticator({b->record}).check("Bearer " + a->token, ""), AuthResult::kInvalid);
}

TEST(GenerateTokenTest, RejectsBadIdsAndEndpointsNamingThem) {
  struct Case {
    std::string id;
    std::vector<std::string> endpoints;
    const char* error;
  };
  const Case cases[] = {
      {"", {}, "id: '' must be 1 to 64"},
      {"a_b", {}, "id: 'a_b'"},
      {"a b", {}, "id: 'a b'"},
      {"flt.1", {}, "id: 'flt.1'"},
      {std::string(65, 'a'), {}, "must be 1 to 64 letters"},
      {"ci", {"fraud", "bad name"}, "endpoints[1]: 'bad name'"},
      {"ci", {""}, "endpoints[0]: must be 1 to 128 characters"},
  };
  for (const Case& c : cases) {
    auto minted = generate_token(c.id, c.endpoints);
    ASSERT_FALSE(minted.is_ok()) << c.id;
    EXPECT_EQ(minted.status().code(), StatusCode::kInvalidArgument) << c.id;
    EXPECT_THAT(minted.status().message(), HasSubstr(c.error)) << c.id;
  }
  EXPECT_TRUE(generate_token(std::string(64, 'Z'), {}).is_ok());
}

class AuthenticatorTest : public ::testing::Test {
 protected:
  static TokenRecord record(std::string id, const std::string& secret,
                            std::vector<std::string> endpoints) {
    return TokenRecord{std::move(id), kFixedSalt, hash_secret(kFixedSalt, secret),
                       std::move(endpoints)};
  }

  const std::string other_secret_ = std::string(64, '7');
  const Authenticator auth_{
      {record("ci", kFixedSecret, {"fraud", "fraud-v2"}), record("any", other_secret_, {})}};
};

TEST_F(AuthenticatorTest, ChecksHeaders) {
  const std::string ci = "flt_ci_" + kFixedSecret;
  const std::string any = "flt_any_" + other_secret_;
  std::string wrong_secret = ci;
  wrong_secret.back() = wrong_secret.back() == '0' ? '1' : '0';
  std::string upper_secret = kFixedSecret;
  for (char& c : upper_secret) {
    c = (c >= 'a' && c <= 'f') ? static_cast<char>(c - 'a' + 'A') : c;
  }
  upper_secret = "flt_ci_" + upper_secret;

  struct Case {
    std::string authorization;
    std::string endpoint;
    AuthResult expected;
  };
  const Case cases[] = {
      // Allowed.
      {"Bearer " + ci, "fraud", AuthResult::kAllowed},
      {"Bearer " + ci, "fraud-v2", AuthResult::kAllowed},
      {"Bearer " + ci, "", AuthResult::kAllowed},  // a route not tied to an endpoint
      {"bearer " + ci, "fraud", AuthResult::kAllowed},
      {"BEARER " + ci, "fraud", AuthResult::kAllowed},
      {"bEaReR " + ci, "fraud", AuthResult::kAllowed},
      {"Bearer    " + ci, "fraud", AuthResult::kAllowed},
      {"Bearer " + any, "llm", AuthResult::kAllowed},  // no scope: every endpoint
      {"Bearer " + any, "", AuthResult::kAllowed},
      // Valid token, other endpoint.
      {"Bearer " + ci, "llm", AuthResult::kForbidden},
      {"Bearer " + ci, "Fraud", AuthResult::kForbidden},
      {"Bearer " + ci, "frau", AuthResult::kForbidden},
      // No header.
      {"", "fraud", AuthResult::kMissing},
      {"", "", AuthResult::kMissing},
      // Wrong or unknown credentials.
      {"Bearer " + wrong_secret, "fraud", AuthResult::kInvalid},
      {"Bearer " + wrong_secret, "", AuthResult::kInvalid},
      {"Bearer flt_nobody_" + kFixedSecret, "fraud", AuthResult::kInvalid},
      {"Bearer flt_any_" + kFixedSecret, "fraud", AuthResult::kInvalid},  // ci's secret
      {"Bearer " + upper_secret, "fraud", AuthResult::kInvalid},
      // Another scheme.
      {"Basic Y2k6c2VjcmV0", "fraud", AuthResult::kInvalid},
      {"Basic " + ci, "fraud", AuthResult::kInvalid},
      {ci, "fraud", AuthResult::kInvalid},
      {"Token " + ci, "fraud", AuthResult::kInvalid},
      // Malformed.
      {"Bearer", "fraud", AuthResult::kInvalid},
      {"Bearer ", "fraud", AuthResult::kInvalid},
      {"Bearer    ", "fraud", AuthResult::kInvalid},
      {"Bearer" + ci, "fraud", AuthResult::kInvalid},
      {"Bearer\t" + ci, "fraud", AuthResult::kInvalid},
      {" Bearer " + ci, "fraud", AuthResult::kInvalid},
      {"Bearer " + ci + " ", "fraud", AuthResult::kInvalid},
      {"Bearer " + ci + "0", "fraud", AuthResult::kInvalid},
      {"Bearer " + ci.substr(0, ci.size() - 1), "fraud", AuthResult::kInvalid},
      {"Bearer flt_", "fraud", AuthResult::kInvalid},
      {"Bearer flt__x", "fraud", AuthResult::kInvalid},
      {"Bearer flt__" + kFixedSecret, "", AuthResult::kInvalid},
      {"Bearer flt_ci", "fraud", AuthResult::kInvalid},
      {"Bearer flt_ci_", "fraud", AuthResult::kInvalid},
      {"Bearer flt_ci__" + kFixedSecret, "fraud", AuthResult::kInvalid},
      {"Bearer flt_x_ci_" + kFixedSecret, "fraud", AuthResult::kInvalid},
      {"Bearer Flt_ci_" + kFixedSecret, "fraud", AuthResult::kInvalid},
      {"Bearer flt_ci_" + kFixedSecret + "_", "fraud", AuthResult::kInvalid},
      {"Bearer flt_" + std::string(65, 'a') + "_" + kFixedSecret, "", AuthResult::kInvalid},
      {"Bearer " + ci + ", Bearer " + ci, "fraud", AuthResult::kInvalid},
      {std::string("Bearer flt_ci_\0", 15) + kFixedSecret, "fraud", AuthResult::kInvalid},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(auth_.check(c.authorization, c.endpoint), c.expected)
        << "'" << c.authorization << "' for '" << c.endpoint << "'";
  }
}

TEST_F(AuthenticatorTest, IndexesOneRecordPerId) {
  EXPECT_EQ(auth_.size(), 2u);
  // For a duplicate id the first record wins.
  const Authenticator auth(
      {record("ci", kFixedSecret, {"fraud"}), record("ci", other_secret_, {})});
  EXPECT_EQ(auth.size(), 1u);
  EXPECT_EQ(auth.check("Bearer flt_ci_" + kFixedSecret, "fraud"), AuthResult::kAllowed);
  EXPECT_EQ(auth.check("Bearer flt_ci_" + other_secret_, "fraud"), AuthResult::kInvalid);
  EXPECT_EQ(Authenticator({}).size(), 0u);
  EXPECT_EQ(Authenticator({}).check("Bearer flt_ci_" + kFixedSecret, ""), AuthResult::kInvalid);
  EXPECT_EQ(Authenticator({}).check("", ""), AuthResult::kMissing);
}

// check() remembers the tokens a thread verified (auth.h): what it remembers must never let a
// request through that a fresh Authenticator would refuse.
TEST_F(AuthenticatorTest, RemembersOnlyWhatPassedAndOnlyForItsOwnTokens) {
  const std::string ci = "Bearer flt_ci_" + kFixedSecret;
  std::string wrong_secret = ci;
  wrong_secret.back() = wrong_secret.back() == '0' ? '1' : '0';
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(auth_.check(ci, "fraud"), AuthResult::kAllowed) << round;
    EXPECT_EQ(auth_.check(wrong_secret, "fraud"), AuthResult::kInvalid) << round;
    EXPECT_EQ(auth_.check(ci, "llm"), AuthResult::kForbidden) << round;
  }
  // The token revoked: a new set without it refuses it, though this thread verified it above.
  const Authenticator revoked({record("any", other_secret_, {})});
  EXPECT_EQ(revoked.check(ci, "fraud"), AuthResult::kInvalid);
  // Re-scoped: the new record's endpoints decide.
  const Authenticator rescoped({record("ci", kFixedSecret, {"llm"})});
  EXPECT_EQ(rescoped.check(ci, "fraud"), AuthResult::kForbidden);
  EXPECT_EQ(rescoped.check(ci, "llm"), AuthResult::kAllowed);
  // The same id with another secret: the remembered token does not pass for it.
  const Authenticator rotated({record("ci", other_secret_, {})});
  EXPECT_EQ(rotated.check(ci, "fraud"), AuthResult::kInvalid);
  EXPECT_EQ(rotated.check("Bearer flt_ci_" + other_secret_, "fraud"), AuthResult::kAllowed);
  EXPECT_EQ(auth_.check(ci, "fraud"), AuthResult::kAllowed);

  // More tokens than a thread remembers, from several threads at once: each still passes, and
  // each with one wrong character still fails.
  std::vector<TokenRecord> records;
  std::vector<std::string> headers;
  for (int i = 0; i < 40; ++i) {
    auto minted = generate_token("client-" + std::to_string(i), {"fraud"});
    ASSERT_TRUE(minted.is_ok());
    records.push_back(minted->record);
    headers.push_back("Bearer " + minted->token);
  }
  const Authenticator many(std::move(records));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 3; ++round) {
        for (const std::string& header : headers) {
          std::string tampered = header;
          tampered.back() = tampered.back() == 'a' ? 'b' : 'a';
          wrong += many.check(header, "fraud") != AuthResult::kAllowed;
          wrong += many.check(tampered, "fraud") != AuthResult::kInvalid;
        }
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(AuthenticatorTest, NormalizesDigestCaseAndNeverMatchesMalformedRecords) {
  TokenRecord upper = record("ci", kFixedSecret, {});
  for (char& c : upper.sha256) {
    c = (c >= 'a' && c <= 'f') ? static_cast<char>(c - 'a' + 'A') : c;
  }
  EXPECT_EQ(Authenticator({upper}).check("Bearer flt_ci_" + kFixedSecret, ""),
            AuthResult::kAllowed);

  TokenRecord bad_salt = record("ci", kFixedSecret, {});
  bad_salt.salt = "not hex";
  EXPECT_EQ(Authenticator({bad_salt}).check("Bearer flt_ci_" + kFixedSecret, ""),
            AuthResult::kInvalid);
  TokenRecord short_digest = record("ci", kFixedSecret, {});
  short_digest.sha256.resize(32);
  EXPECT_EQ(Authenticator({short_digest}).check("Bearer flt_ci_" + kFixedSecret, ""),
            AuthResult::kInvalid);
  TokenRecord empty_digest = record("ci", kFixedSecret, {});
  empty_digest.sha256.clear();
  EXPECT_EQ(Authenticator({empty_digest}).check("Bearer flt_ci_" + kFixedSecret, ""),
            AuthResult::kInvalid);
}

TEST(RecordRulesTest, CheckAndNormalizeEachFieldNamingIt) {
  EXPECT_TRUE(check_token_id("ci-2", "id").is_ok());
  EXPECT_EQ(check_token_id("c_i", "auth.tokens[0].id").message(),
            "auth.tokens[0].id: 'c_i' must be 1 to 64 letters, digits or '-'");
  EXPECT_FALSE(check_token_id(std::string(65, 'a'), "id").is_ok());

  Result<std::string> salt = normalize_salt("A1A1A1A1A1A1A1A1A1A1A1A1A1A1A1A1", "salt");
  ASSERT_TRUE(salt.is_ok());
  EXPECT_EQ(*salt, kFixedSalt);
  EXPECT_EQ(normalize_salt("a1", "x.salt").status().message(), "x.salt: must be 32 hex characters");
  EXPECT_FALSE(normalize_salt(std::string(32, 'g'), "salt").is_ok());

  Result<std::string> digest = normalize_digest(std::string(64, 'D'), "sha256");
  ASSERT_TRUE(digest.is_ok());
  EXPECT_EQ(*digest, std::string(64, 'd'));
  EXPECT_EQ(normalize_digest(kFixedSalt, "x.sha256").status().message(),
            "x.sha256: must be 64 hex characters");

  EXPECT_TRUE(check_scope_names({}, "endpoints").is_ok());
  EXPECT_TRUE(check_scope_names({"fraud", "llm.v2_a-b"}, "endpoints").is_ok());
  EXPECT_THAT(check_scope_names({"fraud", "a b"}, "endpoints").message(),
              HasSubstr("endpoints[1]: 'a b' may hold only"));
}

// Issue 18, item 12: /metrics and /gateway/stats by a token's scope.
TEST(CheckScopeTest, GivesAValidTokensEndpoints) {
  auto scoped = generate_token("scoped", {"a", "c"});
  auto every = generate_token("every", {});
  ASSERT_TRUE(scoped.is_ok() && every.is_ok());
  const Authenticator auth({scoped->record, every->record});
  std::vector<std::string> scope = {"stale"};
  EXPECT_EQ(auth.check_scope("Bearer " + scoped->token, &scope), AuthResult::kAllowed);
  EXPECT_EQ(scope, (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(auth.check_scope("Bearer " + every->token, &scope), AuthResult::kAllowed);
  EXPECT_TRUE(scope.empty());
  EXPECT_EQ(auth.check_scope("", &scope), AuthResult::kMissing);
  EXPECT_EQ(auth.check_scope("Bearer flt_every_" + std::string(64, '0'), &scope),
            AuthResult::kInvalid);
  EXPECT_EQ(auth.check_scope("Basic x", &scope), AuthResult::kInvalid);
}

TEST(ScopeMetricsTest, KeepsOnlyTheScopedEndpointsSeriesUnderTheirFamilies) {
  const std::string exposition =
      "# HELP flotilla_gateway_requests_total Requests\n"
      "# TYPE flotilla_gateway_requests_total counter\n"
      "flotilla_gateway_requests_total{endpoint=\"a\",replica=\"a-1\"} 3\n"
      "flotilla_gateway_requests_total{endpoint=\"b\",replica=\"b-1\"} 4\n"
      "flotilla_gateway_requests_total{replica=\"x\",endpoint=\"c\"} 5\n"
      "# HELP flotilla_gateway_unrouted_total Unrouted\n"
      "# TYPE flotilla_gateway_unrouted_total counter\n"
      "flotilla_gateway_unrouted_total{code=\"404\"} 9\n"
      "# HELP process_open_fds Fds\n"
      "# TYPE process_open_fds gauge\n"
      "process_open_fds 12\n"
      "# HELP flotilla_gateway_latency_seconds Latency\n"
      "# TYPE flotilla_gateway_latency_seconds histogram\n"
      "flotilla_gateway_latency_seconds_bucket{endpoint=\"b\",le=\"+Inf\"} 4\n"
      "flotilla_gateway_latency_seconds_bucket{endpoint=\"a\",le=\"0.1\"} 1\n"
      "flotilla_gateway_latency_seconds_bucket{endpoint=\"a\",le=\"+Inf\"} 3\n"
      "flotilla_gateway_latency_seconds_sum{endpoint=\"a\"} 0.2\n"
      "flotilla_gateway_latency_seconds_count{endpoint=\"a\"} 3\n"
      // A label value that only looks like the label, and an escaped quote before it.
      "# HELP odd Odd\n"
      "# TYPE odd gauge\n"
      "odd{path=\"endpoint=\\\"a\\\"\"} 1\n"
      "odd{path=\"x\\\"y\",endpoint=\"a\"} 2\n";
  EXPECT_EQ(scope_metrics(exposition, {"a", "c"}),
            "# HELP flotilla_gateway_requests_total Requests\n"
            "# TYPE flotilla_gateway_requests_total counter\n"
            "flotilla_gateway_requests_total{endpoint=\"a\",replica=\"a-1\"} 3\n"
            "flotilla_gateway_requests_total{replica=\"x\",endpoint=\"c\"} 5\n"
            "# HELP flotilla_gateway_latency_seconds Latency\n"
            "# TYPE flotilla_gateway_latency_seconds histogram\n"
            "flotilla_gateway_latency_seconds_bucket{endpoint=\"a\",le=\"0.1\"} 1\n"
            "flotilla_gateway_latency_seconds_bucket{endpoint=\"a\",le=\"+Inf\"} 3\n"
            "flotilla_gateway_latency_seconds_sum{endpoint=\"a\"} 0.2\n"
            "flotilla_gateway_latency_seconds_count{endpoint=\"a\"} 3\n"
            "# HELP odd Odd\n"
            "# TYPE odd gauge\n"
            "odd{path=\"x\\\"y\",endpoint=\"a\"} 2\n");
  EXPECT_EQ(scope_metrics(exposition, {}), exposition) << "an unscoped token sees everything";
  EXPECT_EQ(scope_metrics(exposition, {"nothing-here"}), "");
  // Malformed lines are left out, never read past their end.
  EXPECT_EQ(scope_metrics("x{endpoint=\"a\n"
                          "y{endpoint=a} 1\n"
                          "z{endpoint=\"a\\",
                          {"a"}),
            "");
}

TEST(CheckAdminTest, AnAdminPassesAValidOtherTokenIsForbiddenTheRestInvalid) {
  Result<NewToken> admin = generate_token("root", {});
  Result<NewToken> user = generate_token("ci", {"fraud"});
  ASSERT_TRUE(admin.is_ok() && user.is_ok());
  const Authenticator admins({admin->record});
  const Authenticator everyone({admin->record, user->record});
  int asked = 0;
  const auto any_token = [&](std::string_view presented) {
    ++asked;
    return everyone.check(presented, "") == AuthResult::kAllowed;
  };
  std::string id;
  EXPECT_EQ(check_admin(admins, "Bearer " + admin->token, any_token, &id), AuthResult::kAllowed);
  EXPECT_EQ(id, "root");
  EXPECT_EQ(asked, 0);  // every token is read only when the admin check fails
  id.clear();
  EXPECT_EQ(check_admin(admins, "Bearer " + user->token, any_token, &id), AuthResult::kForbidden);
  EXPECT_EQ(id, "");
  EXPECT_EQ(check_admin(admins, "Bearer flt_ci_" + std::string(64, '0'), any_token, &id),
            AuthResult::kInvalid);
  EXPECT_EQ(check_admin(admins, "", any_token, nullptr), AuthResult::kMissing);
}

}  // namespace
}  // namespace flotilla::auth

// The auth module's contract: API tokens (minted, salted and hashed, scoped to endpoints) and
// the per-request check, used by the gateway for its routes and by the control plane for its
// REST API (issue #3; DESIGN.md §3). The gateway config's `auth:` section, which carries these
// records, is the gateway's (gateway.h).
//
// A client sends `Authorization: Bearer flt_<id>_<secret>`. The gateway stores only a salted
// SHA-256 of the secret (TokenRecord), finds the record by its public id, and compares digests in
// constant time, so a request costs one map lookup and at most one SHA-256 however many tokens
// exist.
// Everything here is a value type or immutable after construction; nothing throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/common.h"

namespace flotilla::auth {

// A stored API token: never the token itself, only a salted SHA-256.
struct TokenRecord {
  std::string id;                      // public part, [A-Za-z0-9-]{1,64}
  std::string salt;                    // lowercase hex, 16 random bytes
  std::string sha256;                  // lowercase hex of SHA-256(salt bytes || secret text)
  std::vector<std::string> endpoints;  // the endpoints it may call; empty = all

  bool operator==(const TokenRecord&) const = default;
};

// A freshly minted token: `token` is shown to the user once and then forgotten; only `record`
// is stored. Token text: "flt_<id>_<secret>", the secret being 32 random bytes as 64 lowercase
// hex characters.
struct NewToken {
  std::string token;
  TokenRecord record;
};

// Mints a token for `id` scoped to `endpoints` (empty: all), drawing salt and secret from
// OpenSSL's RAND_bytes. Errors: kInvalidArgument naming `id` or `endpoints[i]` when one is not a
// valid name; kInternal when the RNG fails. Thread-safe; does not block beyond RAND_bytes.
Result<NewToken> generate_token(std::string id, std::vector<std::string> endpoints);

// The lowercase hex SHA-256 of the bytes that `salt_hex` encodes followed by the bytes of
// `secret` as given (for a token, the 64 hex characters after "flt_<id>_"). Returns "" when
// `salt_hex` is not hex (so it can never equal a stored digest) or OpenSSL fails. Thread-safe.
std::string hash_secret(std::string_view salt_hex, std::string_view secret);

// The outcome of checking one request; the HTTP status to answer with follows each value.
enum class AuthResult {
  kAllowed,    // 200: go on
  kMissing,    // 401: no Authorization header
  kInvalid,    // 401: a header that is not a well-formed bearer token we know (wrong scheme,
               //      malformed token, unknown id, wrong secret)
  kForbidden,  // 403: a valid token that is not scoped to the requested endpoint
};

// Checks bearer tokens against a fixed set of records. Immutable after construction: check() is
// thread-safe and lock-free, so one instance may be shared by all workers (for example as a
// std::shared_ptr<const Authenticator> snapshot swapped on reload).
class Authenticator {
 public:
  // Indexes `tokens` by id. The records are expected to be valid (checked as above, or from
  // generate_token): for a duplicate id the first record wins, and a record whose salt or
  // digest is malformed never matches.
  explicit Authenticator(std::vector<TokenRecord> tokens);
  // Not copied: what a thread remembers of a verification points into this instance's records.
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  // `authorization`: the raw Authorization header value, "" when absent. `endpoint`: the
  // endpoint the request targets, or "" for routes not tied to one (any valid token passes).
  // The scheme "Bearer" is matched case-insensitively and followed by one or more spaces; the
  // token must be the rest of the value. Costs one SHA-256 for a known id the first time a
  // thread sees the token (each thread remembers the last tokens it verified, one per id slot,
  // until this Authenticator is replaced), none for an unknown id; digests and remembered
  // tokens are compared in constant time.
  AuthResult check(std::string_view authorization, std::string_view endpoint) const;

  // check() for a route that is no one endpoint's (/metrics, /gateway/stats): on kAllowed,
  // `*endpoints` is set to the token's scope, the endpoints it may call (empty: all).
  AuthResult check_scope(std::string_view authorization, std::vector<std::string>* endpoints) const;

  // The number of distinct token ids indexed.
  size_t size() const { return tokens_.size(); }

 private:
  // Lets find() take a string_view without building a std::string per request.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
  };
  // The record a well-formed, known token with the right secret names; nullptr (and why in
  // `*result`) for any other.
  const TokenRecord* verify(std::string_view authorization, AuthResult* result) const;

  std::unordered_map<std::string, TokenRecord, Hash, std::equal_to<>> tokens_;
  // Distinct per instance for the life of the process: tags the tokens verify() remembers.
  uint64_t generation_;
};

// What a token scoped to `endpoints` may see of the Prometheus text `exposition` (/metrics on
// the gateway's and the control plane's ports): the samples labelled endpoint="<one of them>",
// under their families' HELP and TYPE lines. Every other sample is left out (the process's, and
// the gateway-wide and control-plane series, which sum over every endpoint), and so is a family
// left with none. `endpoints` empty (a token for every endpoint): the exposition as it is.
std::string scope_metrics(std::string_view exposition, const std::vector<std::string>& endpoints);

// The id in an Authorization header "Bearer flt_<id>_<secret>" (the actor an event log names),
// "" when the header holds no token of that shape. Says nothing of whether the token is valid.
std::string token_id_of(std::string_view authorization);

// The control plane API's check (`flotilla up`'s and Kubernetes mode's): kAllowed for a token of
// `admins`; kForbidden for one that `any_token` (every token, admin or not; asked only then)
// finds valid, so its holder learns that the API wants an admin token; else what `admins` said.
// On kAllowed, `*token_id` (when given) is the caller's id, the actor the event log names.
AuthResult check_admin(const Authenticator& admins, std::string_view authorization,
                       const std::function<bool(std::string_view)>& any_token,
                       std::string* token_id);

// The rules a token record's fields follow, for readers of stored records (the gateway config's
// `auth:` section). Each error is kInvalidArgument naming `where`. Thread-safe.
// `id`: 1 to 64 letters, digits or '-'.
Status check_token_id(const std::string& id, const std::string& where);
// `salt`: 32 hex characters, either case; returns it lower case.
Result<std::string> normalize_salt(std::string salt, const std::string& where);
// `digest`: 64 hex characters, either case; returns it lower case.
Result<std::string> normalize_digest(std::string digest, const std::string& where);
// `endpoints`: each one a valid endpoint name (common's check_name), named "<where>[i]".
Status check_scope_names(const std::vector<std::string>& endpoints, const std::string& where);

}  // namespace flotilla::auth

// API tokens: minting, hashing, the rules of a record, and the per-request check.
#include "auth/auth.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "common/common_sha256.h"

namespace flotilla::auth {
namespace {

constexpr std::string_view kTokenPrefix = "flt_";
constexpr std::string_view kBearer = "bearer";
constexpr size_t kMaxIdLength = 64;
constexpr size_t kSaltBytes = 16;
constexpr size_t kSecretBytes = 32;
constexpr size_t kDigestHexLength = 64;

char ascii_lower(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

std::string lower(std::string text) {
  for (char& c : text) {
    c = ascii_lower(c);
  }
  return text;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') {
    return c - '0';
  }
  c = ascii_lower(c);
  if (c >= 'a' && c <= 'f') {
    return c - 'a' + 10;
  }
  return -1;
}

bool is_hex(std::string_view text, size_t length) {
  if (text.size() != length) {
    return false;
  }
  for (char c : text) {
    if (hex_value(c) < 0) {
      return false;
    }
  }
  return true;
}

bool is_lower_hex(std::string_view text, size_t length) {
  if (text.size() != length) {
    return false;
  }
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return false;
    }
  }
  return true;
}

// False when `hex` has an odd length or a character that is not a hex digit.
bool hex_decode(std::string_view hex, std::string& bytes) {
  if (hex.size() % 2 != 0) {
    return false;
  }
  bytes.resize(hex.size() / 2);
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int high = hex_value(hex[2 * i]);
    const int low = hex_value(hex[2 * i + 1]);
    if (high < 0 || low < 0) {
      return false;
    }
    bytes[i] = static_cast<char>((high << 4) | low);
  }
  return true;
}

bool is_valid_id(std::string_view id) {
  if (id.empty() || id.size() > kMaxIdLength) {
    return false;
  }
  for (char c : id) {
    const bool allowed =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    if (!allowed) {
      return false;
    }
  }
  return true;
}

Result<std::string> random_hex(size_t size) {
  std::array<unsigned char, kSecretBytes> bytes{};
  FLOTILLA_CHECK(size <= bytes.size());
  if (RAND_bytes(bytes.data(), static_cast<int>(size)) != 1) {
    return internal_error("generating token: RAND_bytes failed");
  }
  std::string hex = hex_encode(bytes.data(), size);
  OPENSSL_cleanse(bytes.data(), bytes.size());
  return hex;
}

// "Bearer <token>" → the token, or an empty view when the value does not have that form.
std::string_view bearer_token(std::string_view authorization) {
  if (authorization.size() <= kBearer.size() || authorization[kBearer.size()] != ' ') {
    return {};
  }
  for (size_t i = 0; i < kBearer.size(); ++i) {
    if (ascii_lower(authorization[i]) != kBearer[i]) {
      return {};
    }
  }
  const size_t start = authorization.find_first_not_of(' ', kBearer.size());
  return start == std::string_view::npos ? std::string_view() : authorization.substr(start);
}

}  // namespace

std::string token_id_of(std::string_view authorization) {
  const size_t start = authorization.find("flt_");
  const size_t end = authorization.rfind('_');
  if (start == std::string_view::npos || end == std::string_view::npos || end <= start + 4) {
    return "";
  }
  return std::string(authorization.substr(start + 4, end - start - 4));
}

AuthResult check_admin(const Authenticator& admins, std::string_view authorization,
                       const std::function<bool(std::string_view)>& any_token,
                       std::string* token_id) {
  const AuthResult result = admins.check(authorization, "");
  if (result == AuthResult::kInvalid && any_token(authorization)) {
    return AuthResult::kForbidden;
  }
  if (result == AuthResult::kAllowed && token_id != nullptr) {
    *token_id = token_id_of(authorization);
  }
  return result;
}

Status check_token_id(const std::string& id, const std::string& where) {
  if (!is_valid_id(id)) {
    return invalid_argument(where + ": '" + id + "' must be 1 to 64 letters, digits or '-'");
  }
  return Status::ok();
}

Result<std::string> normalize_salt(std::string salt, const std::string& where) {
  if (!is_hex(salt, 2 * kSaltBytes)) {
    return invalid_argument(where + ": must be 32 hex characters");
  }
  return lower(std::move(salt));
}

Result<std::string> normalize_digest(std::string digest, const std::string& where) {
  if (!is_hex(digest, kDigestHexLength)) {
    return invalid_argument(where + ": must be 64 hex characters");
  }
  return lower(std::move(digest));
}

Status check_scope_names(const std::vector<std::string>& endpoints, const std::string& where) {
  for (size_t i = 0; i < endpoints.size(); ++i) {
    FLOTILLA_RETURN_IF_ERROR(check_name(endpoints[i], where + "[" + std::to_string(i) + "]"));
  }
  return Status::ok();
}

Result<NewToken> generate_token(std::string id, std::vector<std::string> endpoints) {
  FLOTILLA_RETURN_IF_ERROR(check_token_id(id, "id"));
  FLOTILLA_RETURN_IF_ERROR(check_scope_names(endpoints, "endpoints"));
  NewToken minted;
  FLOTILLA_ASSIGN_OR_RETURN(minted.record.salt, random_hex(kSaltBytes));
  FLOTILLA_ASSIGN_OR_RETURN(std::string secret, random_hex(kSecretBytes));
  minted.record.sha256 = hash_secret(minted.record.salt, secret);
  if (minted.record.sha256.empty()) {
    return internal_error("generating token '" + id + "': sha-256 failed");
  }
  minted.token = std::string(kTokenPrefix) + id + "_" + secret;
  OPENSSL_cleanse(secret.data(), secret.size());
  minted.record.id = std::move(id);
  minted.record.endpoints = std::move(endpoints);
  return minted;
}

std::string hash_secret(std::string_view salt_hex, std::string_view secret) {
  std::string salt;
  if (!hex_decode(salt_hex, salt)) {
    return "";
  }
  Sha256 sha;
  sha.update(salt);
  sha.update(secret);
  return sha.hex_digest();
}

namespace {

// Tokens a thread has verified lately, so that a client's every request after its first costs a
// constant-time compare instead of a SHA-256 (about 0.3 us, a few percent of a proxied request).
// Entries are tagged with the Authenticator's generation: a new set of tokens (a revoke, a
// reload) is a new Authenticator, whose generation no entry holds. Direct-mapped by the token's
// public id; only tokens that passed are remembered.
struct VerifiedToken {
  uint64_t generation = 0;  // 0: empty
  std::string token;        // "<id>_<secret>", as verify() read it
  const TokenRecord* record = nullptr;
};
constexpr size_t kVerifiedSlots = 8;
thread_local std::array<VerifiedToken, kVerifiedSlots> verified_tokens;

uint64_t next_generation() {
  static std::atomic<uint64_t> last{0};
  return last.fetch_add(1, std::memory_order_relaxed) + 1;
}

}  // namespace

Authenticator::Authenticator(std::vector<TokenRecord> tokens) : generation_(next_generation()) {
  tokens_.reserve(tokens.size());
  for (TokenRecord& record : tokens) {
    // Digests are compared byte for byte with hash_secret's lowercase output.
    record.sha256 = lower(std::move(record.sha256));
    std::string id = record.id;
    tokens_.try_emplace(std::move(id), std::move(record));
  }
}

const TokenRecord* Authenticator::verify(std::string_view authorization, AuthResult* result) const {
  *result = AuthResult::kInvalid;
  if (authorization.empty()) {
    *result = AuthResult::kMissing;
    return nullptr;
  }
  std::string_view token = bearer_token(authorization);
  if (!token.starts_with(kTokenPrefix)) {
    return nullptr;
  }
  token.remove_prefix(kTokenPrefix.size());
  // Neither the id nor the secret may hold '_', so the first one separates them.
  const size_t separator = token.find('_');
  if (separator == std::string_view::npos) {
    return nullptr;
  }
  const std::string_view id = token.substr(0, separator);
  const std::string_view secret = token.substr(separator + 1);
  // A token equal to one that passed is well formed: no need to check its characters again.
  VerifiedToken& seen = verified_tokens[std::hash<std::string_view>{}(id) % kVerifiedSlots];
  if (seen.generation == generation_ && seen.token.size() == token.size() &&
      CRYPTO_memcmp(seen.token.data(), token.data(), token.size()) == 0) {
    *result = AuthResult::kAllowed;
    return seen.record;
  }
  if (!is_valid_id(id) || !is_lower_hex(secret, 2 * kSecretBytes)) {
    return nullptr;
  }
  // Ids are public, so answering an unknown one without hashing leaks nothing.
  const auto it = tokens_.find(id);
  if (it == tokens_.end()) {
    return nullptr;
  }
  const TokenRecord& record = it->second;
  const std::string digest = hash_secret(record.salt, secret);
  if (digest.size() != kDigestHexLength || record.sha256.size() != kDigestHexLength ||
      CRYPTO_memcmp(digest.data(), record.sha256.data(), kDigestHexLength) != 0) {
    return nullptr;
  }
  seen.generation = generation_;
  seen.token.assign(token);
  seen.record = &record;
  *result = AuthResult::kAllowed;
  return &record;
}

AuthResult Authenticator::check(std::string_view authorization, std::string_view endpoint) const {
  AuthResult result;
  const TokenRecord* record = verify(authorization, &result);
  if (record == nullptr || endpoint.empty() || record->endpoints.empty()) {
    return result;
  }
  for (const std::string& allowed : record->endpoints) {
    if (allowed == endpoint) {
      return AuthResult::kAllowed;
    }
  }
  return AuthResult::kForbidden;
}

AuthResult Authenticator::check_scope(std::string_view authorization,
                                      std::vector<std::string>* endpoints) const {
  AuthResult result;
  const TokenRecord* record = verify(authorization, &result);
  if (record != nullptr) {
    *endpoints = record->endpoints;
  }
  return result;
}

namespace {

// The value of label `name` in the label set of the sample line `line` (unescaped), or nullopt
// when it has no such label or its label set is malformed.
std::optional<std::string> label_value(std::string_view line, std::string_view name) {
  const size_t open = line.find('{');
  if (open == std::string_view::npos || line.substr(0, open).find(' ') != std::string_view::npos) {
    return std::nullopt;
  }
  size_t at = open + 1;
  while (at < line.size() && line[at] != '}') {
    const size_t equals = line.find('=', at);
    if (equals == std::string_view::npos || equals + 1 >= line.size() || line[equals + 1] != '"') {
      return std::nullopt;
    }
    const std::string_view key = line.substr(at, equals - at);
    std::string value;
    size_t end = equals + 2;
    for (; end < line.size() && line[end] != '"'; ++end) {
      if (line[end] == '\\' && end + 1 < line.size()) {
        ++end;
        value += line[end] == 'n' ? '\n' : line[end];
      } else {
        value += line[end];
      }
    }
    if (end >= line.size()) {
      return std::nullopt;  // an unterminated value
    }
    if (key == name) {
      return value;
    }
    at = end + 1;
    if (at < line.size() && line[at] == ',') {
      ++at;
    }
  }
  return std::nullopt;
}

}  // namespace

std::string scope_metrics(std::string_view exposition, const std::vector<std::string>& endpoints) {
  if (endpoints.empty()) {
    return std::string(exposition);
  }
  std::string out;
  std::string header;  // the current family's comment lines, written before its first sample
  size_t start = 0;
  while (start < exposition.size()) {
    const size_t end = std::min(exposition.find('\n', start), exposition.size());
    const std::string_view line = exposition.substr(start, end - start);
    start = end + 1;
    if (line.starts_with("#")) {
      if (line.starts_with("# HELP ")) {
        header.clear();  // a new family
      }
      header.append(line).push_back('\n');
      continue;
    }
    const std::optional<std::string> endpoint = label_value(line, "endpoint");
    if (!endpoint || std::find(endpoints.begin(), endpoints.end(), *endpoint) == endpoints.end()) {
      continue;
    }
    out += header;
    header.clear();
    out.append(line).push_back('\n');
  }
  return out;
}

}  // namespace flotilla::auth

// Bearer tokens: minting, hashing, the per-request check and the `auth:` config section.
#include "gateway/auth.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <yaml-cpp/yaml.h>

#include "common/common_sha256.h"
#include "gateway/config_util.h"

namespace flotilla::gateway {
namespace {

using detail::check_keys;
using detail::check_name;

constexpr std::string_view kTokenPrefix = "flt_";
constexpr std::string_view kBearer = "bearer";
constexpr size_t kMaxIdLength = 64;
constexpr size_t kSaltBytes = 16;
constexpr size_t kSecretBytes = 32;
constexpr size_t kDigestHexLength = 64;
constexpr std::string_view kOpenRoutes[] = {"health", "metrics", "stats", "models"};

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

Status check_id(const std::string& id, const std::string& where) {
  if (!is_valid_id(id)) {
    return invalid_argument(where + ": '" + id + "' must be 1 to 64 letters, digits or '-'");
  }
  return Status::ok();
}

Status check_endpoints(const std::vector<std::string>& endpoints, const std::string& where) {
  for (size_t i = 0; i < endpoints.size(); ++i) {
    FLOTILLA_RETURN_IF_ERROR(check_name(endpoints[i], where + "[" + std::to_string(i) + "]"));
  }
  return Status::ok();
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

// ---- YAML ----------------------------------------------------------------------------------

Result<std::string> read_string(const YAML::Node& node, const std::string& where) {
  if (!node) {
    return invalid_argument(where + ": is required");
  }
  if (!node.IsScalar()) {
    return invalid_argument(where + ": must be a string");
  }
  return node.Scalar();
}

Result<std::vector<std::string>> read_string_list(const YAML::Node& node,
                                                  const std::string& where) {
  if (!node.IsSequence()) {
    return invalid_argument(where + ": must be a list");
  }
  std::vector<std::string> values;
  for (size_t i = 0; i < node.size(); ++i) {
    FLOTILLA_ASSIGN_OR_RETURN(std::string value,
                              read_string(node[i], where + "[" + std::to_string(i) + "]"));
    values.push_back(std::move(value));
  }
  return values;
}

Result<TokenRecord> read_token(const YAML::Node& node, const std::string& where) {
  FLOTILLA_RETURN_IF_ERROR(check_keys(node, {"id", "salt", "sha256", "endpoints"}, where));
  TokenRecord record;
  FLOTILLA_ASSIGN_OR_RETURN(record.id, read_string(node["id"], where + ".id"));
  FLOTILLA_RETURN_IF_ERROR(check_id(record.id, where + ".id"));
  FLOTILLA_ASSIGN_OR_RETURN(record.salt, read_string(node["salt"], where + ".salt"));
  if (!is_hex(record.salt, 2 * kSaltBytes)) {
    return invalid_argument(where + ".salt: must be 32 hex characters");
  }
  record.salt = lower(std::move(record.salt));
  FLOTILLA_ASSIGN_OR_RETURN(record.sha256, read_string(node["sha256"], where + ".sha256"));
  if (!is_hex(record.sha256, kDigestHexLength)) {
    return invalid_argument(where + ".sha256: must be 64 hex characters");
  }
  record.sha256 = lower(std::move(record.sha256));
  if (node["endpoints"]) {
    FLOTILLA_ASSIGN_OR_RETURN(record.endpoints,
                              read_string_list(node["endpoints"], where + ".endpoints"));
    FLOTILLA_RETURN_IF_ERROR(check_endpoints(record.endpoints, where + ".endpoints"));
  }
  return record;
}

Result<AuthConfig> read_auth(const YAML::Node& root) {
  AuthConfig config;
  if (!root || root.IsNull()) {
    return config;  // an empty file
  }
  if (!root.IsMap()) {
    return invalid_argument("config: must be a mapping");
  }
  const YAML::Node auth = root["auth"];
  if (!auth) {
    return config;
  }
  config.enabled = true;
  FLOTILLA_RETURN_IF_ERROR(check_keys(auth, {"tokens", "open_routes"}, "auth"));
  if (const YAML::Node tokens = auth["tokens"]) {
    if (!tokens.IsSequence()) {
      return invalid_argument("auth.tokens: must be a list");
    }
    std::set<std::string> ids;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string where = "auth.tokens[" + std::to_string(i) + "]";
      FLOTILLA_ASSIGN_OR_RETURN(TokenRecord record, read_token(tokens[i], where));
      if (!ids.insert(record.id).second) {
        return invalid_argument(where + ".id: token '" + record.id + "' appears twice");
      }
      config.tokens.push_back(std::move(record));
    }
  }
  if (const YAML::Node routes = auth["open_routes"]) {
    FLOTILLA_ASSIGN_OR_RETURN(config.open_routes, read_string_list(routes, "auth.open_routes"));
    for (size_t i = 0; i < config.open_routes.size(); ++i) {
      const std::string& route = config.open_routes[i];
      bool known = false;
      for (std::string_view name : kOpenRoutes) {
        known = known || route == name;
      }
      if (!known) {
        return invalid_argument("auth.open_routes[" + std::to_string(i) + "]: unknown route '" +
                                route + "' (use health, metrics, stats or models)");
      }
    }
  }
  return config;
}

// A double-quoted YAML scalar. Validated ids, hex and endpoint names need no escaping; the
// escapes keep the output parseable for any record.
std::string quoted(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      const unsigned char byte = static_cast<unsigned char>(c);
      out += "\\x" + hex_encode(&byte, 1);
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

}  // namespace

Result<NewToken> generate_token(std::string id, std::vector<std::string> endpoints) {
  FLOTILLA_RETURN_IF_ERROR(check_id(id, "id"));
  FLOTILLA_RETURN_IF_ERROR(check_endpoints(endpoints, "endpoints"));
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

Authenticator::Authenticator(std::vector<TokenRecord> tokens) {
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

Result<AuthConfig> parse_auth_config_yaml(std::string_view text) {
  try {
    return read_auth(YAML::Load(std::string(text)));
  } catch (const std::exception& e) {
    // yaml-cpp throws on syntax errors and on keys that are not scalars.
    return invalid_argument(std::string("invalid auth config: ") + e.what());
  }
}

std::string token_record_yaml(const TokenRecord& record) {
  std::string out = "{id: " + quoted(record.id) + ", salt: " + quoted(record.salt) +
                    ", sha256: " + quoted(record.sha256);
  if (!record.endpoints.empty()) {
    out += ", endpoints: [";
    for (size_t i = 0; i < record.endpoints.size(); ++i) {
      out += (i == 0 ? "" : ", ") + quoted(record.endpoints[i]);
    }
    out += "]";
  }
  out += "}";
  return out;
}

}  // namespace flotilla::gateway

// The gateway config's `auth:` section: its YAML form, read and written. The rules of a token
// record's fields are the auth module's.
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "auth/auth.h"
#include "common/common_sha256.h"
#include "gateway/config_util.h"
#include "gateway/gateway.h"

namespace flotilla::gateway {
namespace {

using detail::check_keys;

constexpr std::string_view kOpenRoutes[] = {"health", "metrics", "stats", "models"};

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

Result<auth::TokenRecord> read_token(const YAML::Node& node, const std::string& where) {
  FLOTILLA_RETURN_IF_ERROR(check_keys(node, {"id", "salt", "sha256", "endpoints"}, where));
  auth::TokenRecord record;
  FLOTILLA_ASSIGN_OR_RETURN(record.id, read_string(node["id"], where + ".id"));
  FLOTILLA_RETURN_IF_ERROR(auth::check_token_id(record.id, where + ".id"));
  FLOTILLA_ASSIGN_OR_RETURN(std::string salt, read_string(node["salt"], where + ".salt"));
  FLOTILLA_ASSIGN_OR_RETURN(record.salt, auth::normalize_salt(std::move(salt), where + ".salt"));
  FLOTILLA_ASSIGN_OR_RETURN(std::string digest, read_string(node["sha256"], where + ".sha256"));
  FLOTILLA_ASSIGN_OR_RETURN(record.sha256,
                            auth::normalize_digest(std::move(digest), where + ".sha256"));
  if (node["endpoints"]) {
    FLOTILLA_ASSIGN_OR_RETURN(record.endpoints,
                              read_string_list(node["endpoints"], where + ".endpoints"));
    FLOTILLA_RETURN_IF_ERROR(auth::check_scope_names(record.endpoints, where + ".endpoints"));
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
      FLOTILLA_ASSIGN_OR_RETURN(auth::TokenRecord record, read_token(tokens[i], where));
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

Result<AuthConfig> parse_auth_config_yaml(std::string_view text) {
  try {
    return read_auth(YAML::Load(std::string(text)));
  } catch (const std::exception& e) {
    // yaml-cpp throws on syntax errors and on keys that are not scalars.
    return invalid_argument(std::string("invalid auth config: ") + e.what());
  }
}

std::string token_record_yaml(const auth::TokenRecord& record) {
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

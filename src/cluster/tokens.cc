// API tokens as ConfigMaps of salted hashes (what the gateways read and the controller's API
// writes), and the admin token's plaintext as a Secret only the controller writes.
#include <charconv>
#include <sstream>

#include "cluster/cluster.h"

namespace flotilla::cluster {
namespace {

using kube::field;
using nlohmann::json;

}  // namespace

Result<TokenObject> token_from_config_map(const std::string& name, const json& config_map) {
  const std::string where = "ConfigMap '" + name + "'";
  auto read = [&](const char* key, bool required) -> Result<std::string> {
    const json& value = field(field(config_map, "data"), key);
    if (!value.is_string()) {
      if (required) {
        return invalid_argument(where + ": data." + key + " is missing");
      }
      return std::string();
    }
    return value.get<std::string>();
  };
  TokenObject token;
  token.name = name;
  FLOTILLA_ASSIGN_OR_RETURN(token.record.id, read("id", true));
  FLOTILLA_RETURN_IF_ERROR(auth::check_token_id(token.record.id, where + ": id"));
  FLOTILLA_ASSIGN_OR_RETURN(std::string salt, read("salt", true));
  FLOTILLA_ASSIGN_OR_RETURN(token.record.salt,
                            auth::normalize_salt(std::move(salt), where + ": salt"));
  FLOTILLA_ASSIGN_OR_RETURN(std::string digest, read("sha256", true));
  FLOTILLA_ASSIGN_OR_RETURN(token.record.sha256,
                            auth::normalize_digest(std::move(digest), where + ": sha256"));
  FLOTILLA_ASSIGN_OR_RETURN(std::string scope, read("endpoints", false));
  std::stringstream names(scope);
  for (std::string endpoint; std::getline(names, endpoint, ',');) {
    if (!endpoint.empty()) {
      token.record.endpoints.push_back(endpoint);
    }
  }
  FLOTILLA_RETURN_IF_ERROR(auth::check_scope_names(token.record.endpoints, where + ": endpoints"));
  FLOTILLA_ASSIGN_OR_RETURN(std::string admin, read("admin", false));
  if (admin != "" && admin != "true" && admin != "false") {
    return invalid_argument(where + ": data.admin must be \"true\" or \"false\"");
  }
  token.admin = admin == "true";
  if (token.admin && !token.record.endpoints.empty()) {
    return invalid_argument(where +
                            ": an admin token may call every endpoint; drop data.endpoints");
  }
  const json& annotations = field(field(config_map, "metadata"), "annotations");
  token.comment = kube::string_field(annotations, kCommentAnnotation);
  const std::string created = kube::string_field(annotations, kCreatedAnnotation);
  // An unreadable creation time is only a display: 0.
  std::from_chars(created.data(), created.data() + created.size(), token.created_unix_ms);
  return token;
}

json token_config_map_object(const TokenObject& token) {
  std::string scope;
  for (const std::string& endpoint : token.record.endpoints) {
    scope += (scope.empty() ? "" : ",") + endpoint;
  }
  json data = {{"id", token.record.id},
               {"salt", token.record.salt},
               {"sha256", token.record.sha256},
               {"admin", token.admin ? "true" : "false"}};
  if (!scope.empty()) {
    data["endpoints"] = scope;
  }
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata",
           {{"name", token.name},
            {"labels", {{std::string(kTokenLabel), "true"}}},
            {"annotations",
             {{std::string(kCommentAnnotation), token.comment},
              {std::string(kCreatedAnnotation), std::to_string(token.created_unix_ms)}}}}},
          {"data", std::move(data)}};
}

json admin_token_secret_object(const std::string& plaintext) {
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", {{"name", std::string(kAdminTokenSecret)}}},
          {"type", "Opaque"},
          {"data", {{"token", kube::encode_base64(plaintext)}}}};
}

}  // namespace flotilla::cluster

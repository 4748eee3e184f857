// Kubernetes mode's REST API: the routes of `flotilla up` (control::ApiRoutes) over
// ServingEndpoint objects and token ConfigMaps in the API server.
#include <algorithm>
#include <charconv>

#include <spdlog/spdlog.h>

#include "cluster/cluster.h"
#include "common/common_sha256.h"

namespace flotilla::cluster {
namespace {

using kube::field;
using nlohmann::json;

// Who last changed an endpoint through the API, and when (unix ms).
constexpr std::string_view kUpdatedByAnnotation = "flotilla.dev/updated-by";
constexpr std::string_view kUpdatedAnnotation = "flotilla.dev/updated-unix-ms";
// An update that keeps meeting a newer resourceVersion gives up after this many tries.
constexpr int kUpdateAttempts = 5;

// One pod of a version in the shape of `flotilla up`'s replicas.
json replica_view(const json& pod) {
  const json& status = field(pod, "status");
  std::string address = kube::string_field(status, "podIP");
  const json& containers = field(field(pod, "spec"), "containers");
  if (containers.is_array() && !containers.empty()) {
    const json& ports = field(containers[0], "ports");
    if (ports.is_array() && !ports.empty() && !address.empty()) {
      address += ":" + std::to_string(kube::integer_field(ports[0], "containerPort", 0));
    }
  }
  std::string state = "starting";
  if (!kube::string_field(field(pod, "metadata"), "deletionTimestamp").empty()) {
    state = "draining";
  } else if (pod_ready(pod)) {
    state = "ready";
  }
  std::string reason;
  const json& container_statuses = field(status, "containerStatuses");
  if (container_statuses.is_array()) {
    for (const json& container : container_statuses) {
      const std::string waiting =
          kube::string_field(field(field(container, "state"), "waiting"), "reason");
      reason = reason.empty() ? waiting : reason;
    }
  }
  return {{"id", kube::string_field(field(pod, "metadata"), "name")},
          {"version", kube::label(pod, kVersionLabel)},
          {"address", address},
          {"state", state},
          {"pid", 0},
          {"from_warm_pool", false},
          {"restarts", pod_restarts(pod)},
          {"reason", reason}};
}

json token_view(const TokenObject& token) {
  return {{"id", token.record.id},
          {"endpoints", token.record.endpoints},
          {"admin", token.admin},
          {"comment", token.comment},
          {"creation_timestamp", token.created_unix_ms},
          {"config_map", token.name}};
}

// A reply as a Status for the API's callers: the API server refusing the controller itself
// (401, 403: its service account or RBAC) is the controller's fault, not the caller's.
Status api_server_status(const kube::Reply& reply) {
  if (reply.status == 401 || reply.status == 403) {
    return Status(
        StatusCode::kInternal,
        "the Kubernetes API server refused the controller (" + std::to_string(reply.status) +
            "): check its service account and RBAC: " + kube::reply_status(reply).message());
  }
  return kube::reply_status(reply);
}

// The objects of `resource` in the client's namespace that match `label_selector` ("": all), by
// name.
Result<kube::Reflector::Objects> list_objects(kube::Client& client, const kube::Resource& resource,
                                              const std::string& label_selector = "") {
  FLOTILLA_ASSIGN_OR_RETURN(
      kube::Reply reply,
      client.get(
          kube::collection_path(resource, client.config().namespace_name),
          label_selector.empty() ? "" : "labelSelector=" + kube::query_escape(label_selector)));
  FLOTILLA_RETURN_IF_ERROR(api_server_status(reply));
  kube::Reflector::Objects objects;
  const json& items = field(reply.body, "items");
  if (items.is_array()) {
    for (const json& item : items) {
      objects[kube::string_field(field(item, "metadata"), "name")] = item;
    }
  }
  return objects;
}

// A ConfigMap name for a token id: DNS-1123 (lower case; ends with a letter or digit). An id that
// lower-casing would change (or that ends with '-') gets a digest of itself appended, so that
// ids differing only in case name different ConfigMaps.
std::string token_object_name(const std::string& id) {
  std::string name = "flotilla-token-";
  bool changed = id.empty() || id.back() == '-';
  for (char c : id) {
    const char lower = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    changed = changed || lower != c;
    name += lower;
  }
  if (changed) {
    name += "-" + sha256_hex(id).substr(0, 8);
  }
  return name;
}

}  // namespace

json endpoint_view_of(const json& serving_endpoint, const kube::Reflector::Objects& pods) {
  const json& metadata = field(serving_endpoint, "metadata");
  const json& status = field(serving_endpoint, "status");
  const std::string name = kube::string_field(metadata, "name");
  const bool observed = kube::integer_field(status, "observedGeneration", 0) >=
                        kube::integer_field(metadata, "generation", 1);
  Result<control::EndpointSpec> spec = spec_of(serving_endpoint);

  std::map<std::string, const json*> serving;  // status.versions by name
  const json& status_versions = field(status, "versions");
  if (status_versions.is_array()) {
    for (const json& version : status_versions) {
      serving[kube::string_field(version, "name")] = &version;
    }
  }
  json versions = json::array();
  auto add_status = [](json& version, const json* state) {
    version["traffic"] = state != nullptr ? kube::integer_field(*state, "traffic", 0) : 0;
    version["serving"] = version["traffic"].get<int64_t>() > 0;
    if (state != nullptr) {
      version["deployment"] = kube::string_field(*state, "deployment");
      version["replicas_wanted"] = kube::integer_field(*state, "desiredReplicas", 0);
      version["replicas_ready"] = kube::integer_field(*state, "readyReplicas", 0);
      version["replicas_updated"] = kube::integer_field(*state, "updatedReplicas", 0);
      version["target_concurrency_per_replica"] =
          field(*state, "targetConcurrencyPerReplica").is_number()
              ? field(*state, "targetConcurrencyPerReplica")
              : json(nullptr);
    }
  };
  std::set<std::string> in_spec;
  if (spec.is_ok()) {
    for (const control::ServedModelSpec& served : spec->served_models) {
      in_spec.insert(served.name);
      json version = control::to_json(served);
      version["role"] = "target";
      version["deployment"] = version_object_name(name, served.name);
      version["replicas_wanted"] = control::version_replicas(served, std::nullopt);
      version["replicas_ready"] = 0;
      version["replicas_updated"] = 0;
      version["target_concurrency_per_replica"] = control::replica_cap(served, std::nullopt);
      const auto it = serving.find(served.name);
      add_status(version, it != serving.end() ? it->second : nullptr);
      versions.push_back(std::move(version));
    }
  }
  bool rolling = false;
  for (const auto& [version_name, state] : serving) {
    if (in_spec.contains(version_name)) {
      continue;
    }
    rolling = true;
    json version = {{"name", version_name}, {"role", "previous"}, {"runtime", ""}, {"model", ""}};
    add_status(version, state);
    versions.push_back(std::move(version));
  }

  json view;
  view["name"] = name;
  const bool ready =
      observed && kube::string_field(kube::condition(status, "Ready"), "status") == "True";
  view["state"] = {{"ready", ready ? "READY" : "NOT_READY"},
                   {"config_update", !observed || rolling ? "IN_PROGRESS" : "NOT_UPDATING"}};
  view["config"] = spec.is_ok() ? control::to_json(*spec) : field(serving_endpoint, "spec");
  view["pending_config"] = nullptr;
  view["versions"] = std::move(versions);
  json replicas = json::array();
  for (const auto& [pod_name, pod] : pods) {
    if (kube::label(pod, kEndpointLabel) == name) {
      replicas.push_back(replica_view(pod));
    }
  }
  view["replicas"] = std::move(replicas);
  const json& learned = field(status, "autoscaler");
  if (learned.is_object()) {
    view["autoscaler"] = {{"replicas", kube::integer_field(status, "desiredReplicas", 0)},
                          {"target_concurrency", field(learned, "target")}};
  }
  view["conditions"] =
      field(status, "conditions").is_array() ? field(status, "conditions") : json::array();
  view["generation"] = kube::integer_field(metadata, "generation", 1);
  view["observed_generation"] = kube::integer_field(status, "observedGeneration", 0);
  const int64_t created = kube::unix_ms_of(kube::string_field(metadata, "creationTimestamp"));
  view["creation_timestamp"] = created;
  const std::string updated =
      kube::string_field(field(metadata, "annotations"), kUpdatedAnnotation);
  int64_t updated_ms = created;  // written by hand (kubectl apply): the creation time
  std::from_chars(updated.data(), updated.data() + updated.size(), updated_ms);
  view["last_updated_timestamp"] = updated_ms;
  return view;
}

ClusterApi::ClusterApi(kube::Client& client, Options options)
    : client_(client), options_(std::move(options)) {}

Result<std::vector<TokenObject>> ClusterApi::token_objects(bool first_of_each_id) {
  // As the gateways read them: by name, the first of a duplicated id wins.
  FLOTILLA_ASSIGN_OR_RETURN(
      kube::Reflector::Objects config_maps,
      list_objects(client_, kube::kConfigMaps, std::string(kTokenLabel) + "=true"));
  std::vector<TokenObject> tokens;
  for (const auto& [name, config_map] : config_maps) {
    Result<TokenObject> token = token_from_config_map(name, config_map);
    const bool taken =
        token.is_ok() && first_of_each_id &&
        std::any_of(tokens.begin(), tokens.end(), [&token](const TokenObject& other) {
          return other.record.id == token->record.id;
        });
    if (token.is_ok() && !taken) {
      tokens.push_back(std::move(token).value());
    }
  }
  return tokens;
}

Status ClusterApi::ensure_admin_token() {
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<TokenObject> tokens, token_objects());
  return ensure_admin_token(tokens);
}

Status ClusterApi::ensure_admin_token(const std::vector<TokenObject>& tokens) {
  if (std::any_of(tokens.begin(), tokens.end(), [](const TokenObject& t) { return t.admin; })) {
    return Status::ok();
  }
  FLOTILLA_ASSIGN_OR_RETURN(auth::NewToken minted, auth::generate_token("admin", {}));
  TokenObject token{std::string(kAdminTokenSecret), minted.record, true,
                    "minted by the first start of flotilla controller", unix_time_ms()};
  const std::string& ns = client_.config().namespace_name;
  FLOTILLA_ASSIGN_OR_RETURN(
      kube::Reply reply,
      client_.create(kube::collection_path(kube::kConfigMaps, ns), token_config_map_object(token)));
  if (reply.reason() == "AlreadyExists") {
    return Status::ok();  // another controller made it first
  }
  FLOTILLA_RETURN_IF_ERROR(api_server_status(reply));
  // The winner of the ConfigMap writes the plaintext, over a Secret left by an earlier admin
  // token (deleting the ConfigMap is how an operator resets it).
  const json secret = admin_token_secret_object(minted.token);
  FLOTILLA_ASSIGN_OR_RETURN(reply,
                            client_.create(kube::collection_path(kube::kSecrets, ns), secret));
  if (reply.reason() == "AlreadyExists") {
    FLOTILLA_ASSIGN_OR_RETURN(
        reply, client_.replace(kube::object_path(kube::kSecrets, ns, token.name), secret));
  }
  if (Status written = api_server_status(reply); !written.is_ok()) {
    // Nobody can learn this token: take its ConfigMap back so that the next check mints anew.
    (void)client_.remove(kube::object_path(kube::kConfigMaps, ns, token.name));
    return written.with_context("writing the admin token's Secret");
  }
  spdlog::info("minted the admin token into the Secret {} (data.token)", kAdminTokenSecret);
  return Status::ok();
}

Status ClusterApi::move_token_secrets() {
  const std::string& ns = client_.config().namespace_name;
  FLOTILLA_ASSIGN_OR_RETURN(
      kube::Reflector::Objects secrets,
      list_objects(client_, kube::kSecrets, std::string(kTokenLabel) + "=true"));
  for (const auto& [name, secret] : secrets) {
    // Its data as a ConfigMap holds it (text, not base64), but the plaintext.
    json config_map = {
        {"metadata", {{"annotations", field(field(secret, "metadata"), "annotations")}}},
        {"data", json::object()}};
    std::string plaintext;
    Status readable = Status::ok();
    const json& data = field(secret, "data");
    for (const auto& [key, value] : data.items()) {  // none unless an object
      if (!value.is_string()) {
        continue;  // read as missing
      }
      Result<std::string> text =
          kube::decode_base64(value.get<std::string>(), "Secret '" + name + "': data." + key);
      if (!text.is_ok()) {
        readable = text.status();
        break;
      }
      if (key == "token") {
        plaintext = std::move(text).value();
      } else {
        config_map["data"][key] = std::move(text).value();
      }
    }
    Result<TokenObject> token =
        readable.is_ok() ? token_from_config_map(name, config_map) : Result<TokenObject>(readable);
    if (!token.is_ok()) {
      spdlog::warn("token Secret {} left as it is: {}", name, token.status().message());
      continue;
    }
    FLOTILLA_ASSIGN_OR_RETURN(kube::Reply reply,
                              client_.create(kube::collection_path(kube::kConfigMaps, ns),
                                             token_config_map_object(*token)));
    if (reply.reason() != "AlreadyExists") {
      FLOTILLA_RETURN_IF_ERROR(api_server_status(reply));
    }
    // The admin token's plaintext stays, in a Secret the gateways do not watch; the rest goes.
    const std::string path = kube::object_path(kube::kSecrets, ns, name);
    const bool keep = name == kAdminTokenSecret && !plaintext.empty();
    FLOTILLA_ASSIGN_OR_RETURN(
        reply,
        keep ? client_.replace(path, admin_token_secret_object(plaintext)) : client_.remove(path));
    if (reply.status != 404) {
      FLOTILLA_RETURN_IF_ERROR(api_server_status(reply));
    }
    spdlog::info("moved token {} from the Secret {} to a ConfigMap", token->record.id, name);
  }
  return Status::ok();
}

Result<auth::AuthResult> ClusterApi::check_admin(std::string_view authorization,
                                                 std::string* token_id) {
  Result<std::vector<TokenObject>> tokens = token_objects();
  if (!tokens.is_ok()) {
    return tokens.status().with_context("reading the token ConfigMaps");
  }
  if (Status minted = ensure_admin_token(*tokens); !minted.is_ok()) {
    spdlog::warn("api: no admin token, and minting one failed: {}", minted.message());
  }
  std::vector<auth::TokenRecord> admins;
  std::vector<auth::TokenRecord> all;
  for (const TokenObject& token : *tokens) {
    all.push_back(token.record);
    if (token.admin) {
      admins.push_back(token.record);
    }
  }
  return auth::check_admin(
      auth::Authenticator(std::move(admins)), authorization,
      [&all](std::string_view presented) {
        return auth::Authenticator(std::move(all)).check(presented, "") ==
               auth::AuthResult::kAllowed;
      },
      token_id);
}

Result<auth::AuthResult> ClusterApi::check_token(std::string_view authorization,
                                                 std::vector<std::string>* scope) {
  Result<std::vector<TokenObject>> tokens = token_objects();
  if (!tokens.is_ok()) {
    return tokens.status().with_context("reading the token ConfigMaps");
  }
  std::vector<auth::TokenRecord> records;
  for (const TokenObject& token : *tokens) {
    records.push_back(token.record);
  }
  return auth::Authenticator(std::move(records)).check_scope(authorization, scope);
}

std::string ClusterApi::render_metrics() {
  MetricsRegistry registry;
  if (options_.leading) {
    registry.gauge("flotilla_controller_leading", "1 while this controller holds the Lease")
        .set(options_.leading() ? 1 : 0);
  }
  Result<kube::Reflector::Objects> listed = list_objects(client_, kube::kServingEndpoints);
  registry.gauge("flotilla_controller_api_server_up", "1 when the API server answered the list")
      .set(listed.is_ok() ? 1 : 0);
  if (listed.is_ok()) {
    for (const auto& [endpoint, item] : *listed) {
      const json& versions = field(field(item, "status"), "versions");
      for (const json& version : versions.is_array() ? versions : json::array()) {
        const Labels labels = {{"endpoint", endpoint},
                               {"version", kube::string_field(version, "name")}};
        registry
            .gauge("flotilla_version_desired_replicas",
                   "Replicas a version's Deployment asks for (the controller's status)", labels)
            .set(static_cast<double>(kube::integer_field(version, "desiredReplicas", 0)));
        registry.gauge("flotilla_version_ready_replicas", "Ready replicas of a version", labels)
            .set(static_cast<double>(kube::integer_field(version, "readyReplicas", 0)));
        registry
            .gauge("flotilla_version_traffic_percent",
                   "The share of an endpoint's requests a version gets now", labels)
            .set(static_cast<double>(kube::integer_field(version, "traffic", 0)));
      }
    }
  }
  return registry.render();
}

json ClusterApi::info() {
  return {{"gateway", options_.gateway_url},
          {"api", options_.api_url},
          {"kubernetes", client_.config().server.text()},
          {"namespace", client_.config().namespace_name},
          {"version", FLOTILLA_VERSION}};
}

Result<json> ClusterApi::get_endpoint(const std::string& name) {
  FLOTILLA_ASSIGN_OR_RETURN(kube::Reply reply,
                            client_.get(kube::object_path(kube::kServingEndpoints,
                                                          client_.config().namespace_name, name)));
  if (reply.status == 404) {
    return not_found("endpoint '" + name + "' does not exist");
  }
  FLOTILLA_RETURN_IF_ERROR(api_server_status(reply));
  return std::move(reply.body);
}

Result<json> ClusterApi::create_endpoint(std::string_view body, const std::string& actor) {
  FLOTILLA_ASSIGN_OR_RETURN(control::EndpointSpec spec, control::parse_endpoint_spec(body));
  const json object = {{"apiVersion", "flotilla.dev/v1"},
                       {"kind", "ServingEndpoint"},
                       {"metadata",
                        {{"name", spec.name},
                         {"annotations",
                          {{std::string(kUpdatedByAnnotation), actor},
                           {std::string(kUpdatedAnnotation), std::to_string(unix_time_ms())}}}}},
                       {"spec", control::to_json(spec)}};
  FLOTILLA_RETURN_IF_ERROR(spec_of(object).status());  // the Kubernetes name rules
  FLOTILLA_ASSIGN_OR_RETURN(
      kube::Reply reply,
      client_.create(
          kube::collection_path(kube::kServingEndpoints, client_.config().namespace_name), object));
  if (reply.reason() == "AlreadyExists") {
    return Status(StatusCode::kFailedPrecondition, "endpoint '" + spec.name + "' already exists");
  }
  FLOTILLA_RETURN_IF_ERROR(api_server_status(reply));
  return endpoint_view_of(reply.body, {});
}

Result<json> ClusterApi::update_endpoint(const std::string& name, std::string_view body,
                                         const std::string& actor) {
  FLOTILLA_ASSIGN_OR_RETURN(control::EndpointSpec spec, control::parse_endpoint_spec(body, name));
  for (int attempt = 0; attempt < kUpdateAttempts; ++attempt) {
    FLOTILLA_ASSIGN_OR_RETURN(json object, get_endpoint(name));
    Result<control::EndpointSpec> current = spec_of(object);
    if (current.is_ok() && *current == spec) {
      return endpoint_view(name);  // nothing to change: no new generation
    }
    object["spec"] = control::to_json(spec);
    object["metadata"]["annotations"][std::string(kUpdatedByAnnotation)] = actor;
    object["metadata"]["annotations"][std::string(kUpdatedAnnotation)] =
        std::to_string(unix_time_ms());
    FLOTILLA_RETURN_IF_ERROR(spec_of(object).status());
    FLOTILLA_ASSIGN_OR_RETURN(
        kube::Reply reply, client_.replace(kube::object_path(kube::kServingEndpoints,
                                                             client_.config().namespace_name, name),
                                           object));
    if (reply.status == 409) {
      continue;  // changed since we read it: read it again
    }
    if (reply.status == 404) {
      return not_found("endpoint '" + name + "' does not exist");
    }
    FLOTILLA_RETURN_IF_ERROR(api_server_status(reply));
    return endpoint_view(name);
  }
  return Status(StatusCode::kUnavailable,
                "endpoint '" + name + "' kept changing under the " + "update; try again");
}

Status ClusterApi::delete_endpoint(const std::string& name, const std::string& actor) {
  FLOTILLA_ASSIGN_OR_RETURN(
      kube::Reply reply, client_.remove(kube::object_path(kube::kServingEndpoints,
                                                          client_.config().namespace_name, name)));
  if (reply.status == 404) {
    return not_found("endpoint '" + name + "' does not exist");
  }
  FLOTILLA_RETURN_IF_ERROR(api_server_status(reply));
  spdlog::info("api: {} deleted endpoint {}", actor, name);
  return Status::ok();
}

Result<json> ClusterApi::endpoint_view(const std::string& name) {
  FLOTILLA_ASSIGN_OR_RETURN(json object, get_endpoint(name));
  return endpoint_view_of(object, replica_pods(std::string(kEndpointLabel) + "=" + name));
}

Result<std::vector<json>> ClusterApi::endpoint_views() {
  FLOTILLA_ASSIGN_OR_RETURN(kube::Reflector::Objects endpoints,
                            list_objects(client_, kube::kServingEndpoints));
  const kube::Reflector::Objects pods = replica_pods(std::string(kEndpointLabel));
  std::vector<json> views;  // in order: the map's
  for (const auto& [name, endpoint] : endpoints) {
    views.push_back(endpoint_view_of(endpoint, pods));
  }
  return views;
}

kube::Reflector::Objects ClusterApi::replica_pods(const std::string& label_selector) {
  // The view without its pods when they cannot be read: the endpoint still shows.
  Result<kube::Reflector::Objects> pods = list_objects(client_, kube::kPods, label_selector);
  return pods.is_ok() ? std::move(pods).value() : kube::Reflector::Objects();
}

Result<json> ClusterApi::endpoint_metrics(const std::string& name, int64_t seconds) {
  FLOTILLA_RETURN_IF_ERROR(get_endpoint(name).status());
  if (!options_.metrics) {
    return unavailable("this controller keeps no endpoint metrics");
  }
  return options_.metrics(name, seconds);
}

Result<std::vector<control::EventRow>> ClusterApi::list_events(const std::string& endpoint,
                                                               size_t limit) {
  FLOTILLA_ASSIGN_OR_RETURN(json object, get_endpoint(endpoint));
  std::vector<control::EventRow> events;
  const json& conditions = field(field(object, "status"), "conditions");
  if (conditions.is_array()) {
    for (const json& condition : conditions) {
      const std::string reason = kube::string_field(condition, "reason");
      const std::string message = kube::string_field(condition, "message");
      events.push_back(
          {static_cast<int64_t>(events.size()) + 1,
           kube::unix_ms_of(kube::string_field(condition, "lastTransitionTime")), endpoint,
           kube::string_field(condition, "type") + "=" + kube::string_field(condition, "status"),
           "controller", reason + (message.empty() ? "" : ": " + message)});
    }
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const auto& a, const auto& b) { return a.unix_ms > b.unix_ms; });
  events.resize(std::min(events.size(), limit));
  return events;
}

Result<json> ClusterApi::create_token(const std::string& id, std::vector<std::string> endpoints,
                                      bool admin, const std::string& comment,
                                      const std::string& actor) {
  FLOTILLA_ASSIGN_OR_RETURN(auth::NewToken minted, auth::generate_token(id, std::move(endpoints)));
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<TokenObject> tokens, token_objects());
  if (std::any_of(tokens.begin(), tokens.end(),
                  [&id](const TokenObject& token) { return token.record.id == id; })) {
    return Status(StatusCode::kFailedPrecondition, "token '" + id + "' already exists");
  }
  const TokenObject token{token_object_name(id), minted.record, admin, comment, unix_time_ms()};
  FLOTILLA_ASSIGN_OR_RETURN(
      kube::Reply reply,
      client_.create(kube::collection_path(kube::kConfigMaps, client_.config().namespace_name),
                     token_config_map_object(token)));
  if (reply.reason() == "AlreadyExists") {
    return Status(StatusCode::kFailedPrecondition,
                  "token '" + id + "': the ConfigMap " + token.name + " already exists");
  }
  FLOTILLA_RETURN_IF_ERROR(api_server_status(reply));
  spdlog::info("api: {} created token {} (ConfigMap {})", actor, id, token.name);
  return json{{"token", minted.token}, {"token_info", token_view(token)}};
}

Status ClusterApi::revoke_token(const std::string& id, const std::string& actor) {
  // Every ConfigMap holding the id, not only the one the gateways use now: a second one would
  // take its place.
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<TokenObject> holding,
                            token_objects(/*first_of_each_id=*/false));
  std::erase_if(holding, [&id](const TokenObject& token) { return token.record.id != id; });
  if (holding.empty()) {
    return not_found("token '" + id + "' does not exist");
  }
  for (const TokenObject& token : holding) {
    FLOTILLA_ASSIGN_OR_RETURN(kube::Reply reply,
                              client_.remove(kube::object_path(
                                  kube::kConfigMaps, client_.config().namespace_name, token.name)));
    if (reply.status != 404) {
      FLOTILLA_RETURN_IF_ERROR(api_server_status(reply));
    }
    spdlog::info("api: {} revoked token {} (ConfigMap {})", actor, id, token.name);
  }
  return Status::ok();
}

Result<json> ClusterApi::list_tokens() {
  FLOTILLA_ASSIGN_OR_RETURN(std::vector<TokenObject> tokens, token_objects());
  json list = json::array();
  for (const TokenObject& token : tokens) {
    list.push_back(token_view(token));
  }
  return list;
}

}  // namespace flotilla::cluster

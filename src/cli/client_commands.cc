// The CLI's control-plane commands: deploy, ls, get, predict, rm, tokens, events. Each talks to
// the REST API of `flotilla up` (docs/control-plane.md) and prints a table, or the API's JSON
// with -o json. Every failure exits non-zero with one line on stderr (DESIGN.md §7a).
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "cli/api_client.h"
#include "cli/commands.h"
#include "control/control.h"
#include "http/http.h"

namespace flotilla::cli {
namespace {

using nlohmann::json;

constexpr std::chrono::milliseconds kApiTimeout{30'000};

std::string format_time(int64_t unix_ms) {
  const std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm parts{};
  gmtime_r(&seconds, &parts);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

std::string versions_summary(const json& view) {
  std::string text;
  for (const json& version : view["versions"]) {
    if (!version["serving"].get<bool>() && version["role"] != "target") {
      continue;
    }
    text += (text.empty() ? "" : ", ") + version["name"].get<std::string>() + " " +
            std::to_string(version["traffic"].get<int64_t>()) + "% (" +
            std::to_string(version["replicas_ready"].get<int64_t>()) + "/" +
            std::to_string(version["replicas_wanted"].get<int64_t>()) + " ready)";
  }
  return text;
}

void print_endpoint(const json& view) {
  std::cout << "endpoint " << view["name"].get<std::string>() << ": "
            << view["state"]["ready"].get<std::string>() << ", config update "
            << view["state"]["config_update"].get<std::string>() << "\n\n";
  std::vector<std::vector<std::string>> versions = {
      {"VERSION", "ROLE", "SERVING", "TRAFFIC", "READY", "RUNTIME", "MODEL"}};
  for (const json& version : view["versions"]) {
    versions.push_back({version["name"], version["role"],
                        version["serving"].get<bool>() ? "yes" : "no",
                        std::to_string(version["traffic"].get<int64_t>()) + "%",
                        std::to_string(version["replicas_ready"].get<int64_t>()) + "/" +
                            std::to_string(version["replicas_wanted"].get<int64_t>()),
                        version["runtime"], version["model"]});
  }
  print_table(versions);
  std::cout << "\n";
  std::vector<std::vector<std::string>> replicas = {
      {"REPLICA", "VERSION", "ADDRESS", "STATE", "PID", "WARM POOL", "REASON"}};
  for (const json& replica : view["replicas"]) {
    replicas.push_back({replica["id"], replica["version"], replica["address"], replica["state"],
                        std::to_string(replica["pid"].get<int64_t>()),
                        replica["from_warm_pool"].get<bool>() ? "yes" : "no", replica["reason"]});
  }
  print_table(replicas);
  if (view.contains("events")) {
    std::cout << "\nrecent events:\n";
    for (const json& event : view["events"]) {
      std::cout << "  " << format_time(event["timestamp"].get<int64_t>()) << "  "
                << event["kind"].get<std::string>() << "  " << event["message"].get<std::string>()
                << "\n";
    }
  }
}

// ---- deploy ------------------------------------------------------------------------------------

struct DeployFlags {
  std::string file;
  std::string name;
  std::string model;
  std::string version = "v1";
  std::string runtime = "auto";
  int64_t min_concurrency = 1;
  int64_t max_concurrency = 64;
  bool no_wait = false;
  int64_t timeout_s = 120;
};

// The spec to send: the file with relative model paths and external workdirs made absolute
// against the file's directory (the control plane runs elsewhere), or one built from the flags.
Result<std::string> deploy_body(const DeployFlags& flags) {
  if (!flags.file.empty()) {
    const std::string text = read_text_file(flags.file);
    if (text.empty()) {
      return invalid_argument("cannot read '" + flags.file + "'");
    }
    YAML::Node spec;
    try {
      spec = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      return invalid_argument(flags.file + ": " + e.what());
    }
    const std::filesystem::path base = std::filesystem::absolute(flags.file).parent_path();
    if (spec.IsMap() && spec["served_models"] && spec["served_models"].IsSequence()) {
      for (YAML::Node served : spec["served_models"]) {
        if (served.IsMap() && served["model"] && served["model"].IsScalar()) {
          const std::string model = served["model"].as<std::string>();
          if (!model.empty() && model.front() != '/' && model.find("://") == std::string::npos) {
            served["model"] = (base / model).lexically_normal().string();
          }
        }
        if (served.IsMap() && served["external"] && served["external"].IsMap()) {
          YAML::Node external = served["external"];
          if (external["workdir"] && external["workdir"].IsScalar()) {
            const std::string workdir = external["workdir"].as<std::string>();
            if (!workdir.empty() && workdir.front() != '/') {
              external["workdir"] = (base / workdir).lexically_normal().string();
            }
          }
        }
      }
    }
    if (!spec.IsMap()) {
      return invalid_argument(flags.file + ": an endpoint spec must be a mapping");
    }
    if (!flags.name.empty()) {
      spec["name"] = flags.name;
    }
    YAML::Emitter out;
    out << spec;
    return std::string(out.c_str());
  }
  if (flags.name.empty() || flags.model.empty()) {
    return invalid_argument("give -f SPEC.yaml, or --name and --model");
  }
  const std::string model =
      flags.model.find("://") != std::string::npos
          ? flags.model  // a URL, as it is
          : std::filesystem::absolute(flags.model).lexically_normal().string();
  json served = {{"name", flags.version},
                 {"model", model},
                 {"runtime", flags.runtime},
                 {"concurrency", {{"min", flags.min_concurrency}, {"max", flags.max_concurrency}}},
                 {"traffic", 100}};
  return json{{"name", flags.name}, {"served_models", json::array({served})}}.dump();
}

// The endpoint's name from the body we send (the API checks the rest).
std::string spec_name(const std::string& body) {
  try {
    YAML::Node spec = YAML::Load(body);
    return spec["name"] ? spec["name"].as<std::string>() : "";
  } catch (const YAML::Exception&) {
    return "";
  }
}

// Waits until the endpoint serves its latest config. On timeout, the newest failure explains.
Result<json> wait_until_serving(const Connection& connection, const std::string& name,
                                std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    FLOTILLA_ASSIGN_OR_RETURN(
        json view, call(connection, http::Method::kGet, "/api/2.0/serving-endpoints/" + name));
    if (view["state"]["ready"] == "READY" && view["state"]["config_update"] == "NOT_UPDATING") {
      return view;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::string why;
      for (const json& event : view["events"]) {
        if (event["kind"] == "replica_failed" || event["kind"] == "replica_timeout") {
          why = event["message"].get<std::string>();
        }
      }
      return Status(StatusCode::kDeadlineExceeded,
                    "endpoint '" + name + "' is not serving its latest config after " +
                        std::to_string(timeout.count()) + " s" +
                        (why.empty() ? "" : "; last replica failure: " + why));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

int run_deploy(const ClientFlags& client, const DeployFlags& flags) {
  auto connection = connect_flags(client);
  if (!connection.is_ok()) {
    return fail("deploy", connection.status());
  }
  auto body = deploy_body(flags);
  if (!body.is_ok()) {
    return fail("deploy", body.status());
  }
  const std::string name = spec_name(*body);
  const std::string content_type = flags.file.empty() ? "application/json" : "application/yaml";
  Result<json> view =
      call(*connection, http::Method::kPost, "/api/2.0/serving-endpoints", *body, content_type);
  if (!view.is_ok() && view.status().code() == StatusCode::kFailedPrecondition && !name.empty()) {
    view = call(*connection, http::Method::kPut, "/api/2.0/serving-endpoints/" + name + "/config",
                *body, content_type);
  }
  if (!view.is_ok()) {
    return fail("deploy", view.status());
  }
  if (!flags.no_wait) {
    view = wait_until_serving(*connection, name, std::chrono::seconds(flags.timeout_s));
    if (!view.is_ok()) {
      return fail("deploy", view.status());
    }
  }
  if (client.output == "json") {
    std::cout << view->dump(2) << "\n";
  } else {
    std::cout << "endpoint " << name << ": " << (flags.no_wait ? "accepted; " : "serving ")
              << versions_summary(*view) << "\n";
  }
  return 0;
}

// ---- predict -----------------------------------------------------------------------------------

struct PredictFlags {
  std::string name;
  std::string json_body;
  std::string csv_file;
  std::string gateway;
};

int run_predict(const ClientFlags& client, const PredictFlags& flags) {
  auto connection = connect_flags(client);
  if (!connection.is_ok()) {
    return fail("predict", connection.status());
  }
  if (flags.json_body.empty() == flags.csv_file.empty()) {
    return fail("predict", invalid_argument("give exactly one of --json and --csv"));
  }
  std::string gateway = flags.gateway;
  if (gateway.empty()) {
    auto info = call(*connection, http::Method::kGet, "/api/2.0/info");
    if (!info.is_ok()) {
      return fail("predict", info.status());
    }
    gateway = (*info)["gateway"].get<std::string>();
  }
  if (gateway.starts_with("http://")) {
    gateway = gateway.substr(7);
  }
  auto address = split_address(gateway);
  if (!address.is_ok()) {
    return fail("predict", address.status());
  }
  http::ClientRequest request;
  request.method = http::Method::kPost;
  request.target = "/serving-endpoints/" + flags.name + "/invocations";
  request.headers.emplace_back("Authorization", "Bearer " + connection->token);
  if (!flags.csv_file.empty()) {
    request.body = read_text_file(flags.csv_file);
    if (request.body.empty()) {
      return fail("predict", invalid_argument("cannot read '" + flags.csv_file + "'"));
    }
    request.headers.emplace_back("Content-Type", "text/csv");
  } else {
    request.body = flags.json_body.starts_with("@") ? read_text_file(flags.json_body.substr(1))
                                                    : flags.json_body;
    request.headers.emplace_back("Content-Type", "application/json");
  }
  http::ClientResponse response =
      http::fetch(address->first, address->second, std::move(request), kApiTimeout);
  if (response.failure != http::UpstreamFailure::kNone) {
    return fail("predict",
                unavailable("cannot reach the gateway at " + gateway + ": " + response.error));
  }
  if (response.status != 200) {
    json error = json::parse(response.body, nullptr, false);
    std::string message = response.body;
    if (error.is_object()) {
      message = error.contains("message") ? error["message"].dump()
                : error.contains("error") ? error["error"].dump()
                                          : response.body;
    }
    return fail("predict",
                invalid_argument("HTTP " + std::to_string(response.status) + ": " + message));
  }
  std::cout << response.body << (response.body.ends_with("\n") ? "" : "\n");
  return 0;
}

// ---- the rest ----------------------------------------------------------------------------------

struct TokenFlags {
  std::string id;
  std::vector<std::string> endpoints;
  bool admin = false;
  std::string comment;
};

int print_or_fail(const std::string& command, const ClientFlags& client, Result<json> result,
                  const std::function<void(const json&)>& print_table_view) {
  if (!result.is_ok()) {
    return fail(command, result.status());
  }
  if (client.output == "json") {
    std::cout << result->dump(2) << "\n";
  } else {
    print_table_view(*result);
  }
  return 0;
}

}  // namespace

std::function<int()> add_client_commands(CLI::App& app) {
  auto client = std::make_shared<ClientFlags>();
  auto deploy = std::make_shared<DeployFlags>();
  auto predict = std::make_shared<PredictFlags>();
  auto token = std::make_shared<TokenFlags>();
  auto name = std::make_shared<std::string>();
  auto limit = std::make_shared<int>(50);

  CLI::App* deploy_cmd = app.add_subcommand(
      "deploy",
      "Create an endpoint or update it to a spec (idempotent); waits until it serves the spec. "
      "An update that changes a model rolls out with zero downtime.");
  deploy_cmd->add_option("-f,--file", deploy->file,
                         "Endpoint spec, YAML or JSON (model paths relative to the file)");
  deploy_cmd->add_option("--name", deploy->name, "Endpoint name (with --model, or overrides -f)");
  deploy_cmd->add_option("--model", deploy->model, "Model path, for a one-version endpoint");
  deploy_cmd->add_option("--version", deploy->version, "Version name with --model")
      ->capture_default_str();
  deploy_cmd->add_option("--runtime", deploy->runtime, "auto, xgboost or synthetic, with --model")
      ->capture_default_str();
  deploy_cmd
      ->add_option("--min-concurrency", deploy->min_concurrency,
                   "Concurrent requests always provisioned, with --model")
      ->capture_default_str();
  deploy_cmd
      ->add_option("--max-concurrency", deploy->max_concurrency,
                   "Most concurrent requests, with --model")
      ->capture_default_str();
  deploy_cmd->add_flag("--no-wait", deploy->no_wait, "Return once the spec is accepted");
  deploy_cmd->add_option("--timeout-s", deploy->timeout_s, "How long to wait for serving")
      ->check(CLI::Range(int64_t{1}, int64_t{3600}))
      ->capture_default_str();
  add_client_flags(deploy_cmd, *client);

  CLI::App* ls_cmd = app.add_subcommand("ls", "List endpoints.");
  add_client_flags(ls_cmd, *client);

  CLI::App* get_cmd =
      app.add_subcommand("get", "Show an endpoint: versions, replicas, recent events.");
  get_cmd->add_option("name", *name, "Endpoint name")->required();
  add_client_flags(get_cmd, *client);

  CLI::App* predict_cmd = app.add_subcommand(
      "predict", "Send one prediction request through the gateway (MLflow /invocations format).");
  predict_cmd->add_option("name", predict->name, "Endpoint name")->required();
  predict_cmd->add_option("--json", predict->json_body,
                          "Request body, e.g. '{\"instances\": [[1, 2, 3, 4]]}', or @FILE");
  predict_cmd->add_option("--csv", predict->csv_file, "CSV file with a header row");
  predict_cmd->add_option("--gateway", predict->gateway,
                          "Gateway host:port (default: asked from the control plane)");
  add_client_flags(predict_cmd, *client);

  CLI::App* rm_cmd = app.add_subcommand("rm", "Delete an endpoint; its replicas drain and stop.");
  rm_cmd->add_option("name", *name, "Endpoint name")->required();
  add_client_flags(rm_cmd, *client);

  CLI::App* events_cmd = app.add_subcommand(
      "events", "Show an endpoint's events: changes, rollouts, replica starts and failures.");
  events_cmd->add_option("name", *name, "Endpoint name")->required();
  events_cmd->add_option("--limit", *limit, "Newest events to show")
      ->check(CLI::Range(1, 10'000))
      ->capture_default_str();
  add_client_flags(events_cmd, *client);

  CLI::App* tokens_cmd = app.add_subcommand("tokens", "Create, list and revoke API tokens.");
  tokens_cmd->require_subcommand(1);
  CLI::App* create_cmd = tokens_cmd->add_subcommand(
      "create", "Mint a token; it is printed once and stored only as a salted hash.");
  create_cmd->add_option("--id", token->id, "Public token id, e.g. ci or fraud-client")->required();
  create_cmd->add_option("--endpoint", token->endpoints,
                         "Endpoint the token may call (repeat; default: all)");
  create_cmd->add_flag("--admin", token->admin, "May also call the control plane API");
  create_cmd->add_option("--comment", token->comment, "Free text shown by tokens ls");
  add_client_flags(create_cmd, *client);
  CLI::App* tokens_ls_cmd = tokens_cmd->add_subcommand("ls", "List tokens (never their secrets).");
  add_client_flags(tokens_ls_cmd, *client);
  CLI::App* revoke_cmd = tokens_cmd->add_subcommand("revoke", "Revoke a token at once.");
  revoke_cmd->add_option("id", token->id, "Token id")->required();
  add_client_flags(revoke_cmd, *client);
  auto reset_dir = std::make_shared<std::string>();
  CLI::App* reset_cmd = tokens_cmd->add_subcommand(
      "reset-admin",
      "Lost admin.token: write a new admin token to DIR/admin.token (mode 0600) and replace the "
      "token 'admin' in DIR/state.db. Needs local access to the data directory and flotilla up "
      "stopped; prints the token.");
  reset_cmd->add_option("--data-dir", *reset_dir, "The data directory of flotilla up")->required();

  return [=]() -> int {
    auto connection = [&]() {
      return connect_flags(*client);
    };
    auto run = [&](const std::string& command, http::Method method, const std::string& target,
                   const std::string& body, const std::function<void(const json&)>& print) {
      auto conn = connection();
      if (!conn.is_ok()) {
        return fail(command, conn.status());
      }
      return print_or_fail(command, *client, call(*conn, method, target, body), print);
    };
    if (deploy_cmd->parsed()) {
      return run_deploy(*client, *deploy);
    }
    if (predict_cmd->parsed()) {
      return run_predict(*client, *predict);
    }
    if (ls_cmd->parsed()) {
      return run("ls", http::Method::kGet, "/api/2.0/serving-endpoints", "", [](const json& list) {
        std::vector<std::vector<std::string>> rows = {{"NAME", "STATE", "UPDATE", "VERSIONS"}};
        for (const json& view : list["endpoints"]) {
          rows.push_back({view["name"], view["state"]["ready"], view["state"]["config_update"],
                          versions_summary(view)});
        }
        print_table(rows);
      });
    }
    if (get_cmd->parsed()) {
      return run("get", http::Method::kGet, "/api/2.0/serving-endpoints/" + *name, "",
                 print_endpoint);
    }
    if (rm_cmd->parsed()) {
      return run("rm", http::Method::kDelete, "/api/2.0/serving-endpoints/" + *name, "",
                 [&](const json&) { std::cout << "endpoint " << *name << " deleted\n"; });
    }
    if (events_cmd->parsed()) {
      return run(
          "events", http::Method::kGet,
          "/api/2.0/serving-endpoints/" + *name + "/events?limit=" + std::to_string(*limit), "",
          [](const json& list) {
            std::vector<std::vector<std::string>> rows = {{"TIME", "KIND", "ACTOR", "MESSAGE"}};
            for (const json& event : list["events"]) {
              rows.push_back({format_time(event["timestamp"].get<int64_t>()), event["kind"],
                              event["actor"], event["message"]});
            }
            print_table(rows);
          });
    }
    if (create_cmd->parsed()) {
      json body = {{"id", token->id}, {"admin", token->admin}, {"comment", token->comment}};
      if (!token->endpoints.empty()) {
        body["endpoints"] = token->endpoints;
      }
      return run(
          "tokens create", http::Method::kPost, "/api/2.0/tokens", body.dump(),
          [](const json& created) { std::cout << created["token"].get<std::string>() << "\n"; });
    }
    if (tokens_ls_cmd->parsed()) {
      return run("tokens ls", http::Method::kGet, "/api/2.0/tokens", "", [](const json& list) {
        std::vector<std::vector<std::string>> rows = {
            {"ID", "ADMIN", "ENDPOINTS", "CREATED", "COMMENT"}};
        for (const json& row : list["tokens"]) {
          std::string endpoints;
          for (const json& endpoint : row["endpoints"]) {
            endpoints += (endpoints.empty() ? "" : ",") + endpoint.get<std::string>();
          }
          rows.push_back({row["id"], row["admin"].get<bool>() ? "yes" : "no",
                          endpoints.empty() ? "(all)" : endpoints,
                          format_time(row["creation_timestamp"].get<int64_t>()), row["comment"]});
        }
        print_table(rows);
      });
    }
    if (reset_cmd->parsed()) {
      Result<std::string> reset = control::reset_admin_token(*reset_dir);
      if (!reset.is_ok()) {
        return fail("tokens reset-admin", reset.status());
      }
      std::cout << *reset << "\n";
      std::cerr << "admin token reset; also in " << *reset_dir << "/admin.token\n";
      return 0;
    }
    if (revoke_cmd->parsed()) {
      return run("tokens revoke", http::Method::kDelete, "/api/2.0/tokens/" + token->id, "",
                 [&](const json&) { std::cout << "token " << token->id << " revoked\n"; });
    }
    return -1;
  };
}

}  // namespace flotilla::cli

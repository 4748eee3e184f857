#include "cli/api_client.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/commands.h"

namespace flotilla::cli {

using nlohmann::json;

namespace {

constexpr std::chrono::milliseconds kApiTimeout{30'000};

}  // namespace

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return "";
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string trim(std::string text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.pop_back();
  }
  size_t start = 0;
  while (start < text.size() && std::isspace(static_cast<unsigned char>(text[start]))) {
    ++start;
  }
  return text.substr(start);
}

Result<Connection> connect_flags(const ClientFlags& flags) {
  std::string api = flags.api;
  if (api.empty()) {
    const char* env = std::getenv("FLOTILLA_API");
    api = env != nullptr ? env : "http://127.0.0.1:8081";
  }
  if (api.starts_with("http://")) {
    api = api.substr(7);
  }
  while (!api.empty() && api.back() == '/') {
    api.pop_back();
  }
  FLOTILLA_ASSIGN_OR_RETURN(auto address, split_address(api));
  Connection connection{address.first, address.second, flags.token};
  if (connection.token.empty()) {
    const char* env = std::getenv("FLOTILLA_TOKEN");
    connection.token = env != nullptr ? env : trim(read_text_file(".flotilla/admin.token"));
  }
  return connection;
}

Result<json> call(const Connection& connection, http::Method method, const std::string& target,
                  std::string body, std::string content_type) {
  http::ClientRequest request;
  request.method = method;
  request.target = target;
  if (!connection.token.empty()) {
    request.headers.emplace_back("Authorization", "Bearer " + connection.token);
  }
  if (!body.empty()) {
    request.headers.emplace_back("Content-Type", content_type);
  }
  request.body = std::move(body);
  http::ClientResponse response =
      http::fetch(connection.host, connection.port, std::move(request), kApiTimeout);
  const std::string where = "http://" + connection.host + ":" + std::to_string(connection.port);
  if (response.failure != http::UpstreamFailure::kNone) {
    return unavailable("cannot reach the control plane at " + where + ": " + response.error +
                       " (is `flotilla up` running? --api or FLOTILLA_API say where)");
  }
  json parsed = json::parse(response.body, nullptr, false);
  if (response.status < 200 || response.status >= 300) {
    std::string message =
        parsed.is_object() && parsed.contains("message") && parsed["message"].is_string()
            ? parsed["message"].get<std::string>()
            : "HTTP " + std::to_string(response.status);
    const StatusCode code = response.status == 404   ? StatusCode::kNotFound
                            : response.status == 409 ? StatusCode::kFailedPrecondition
                            : response.status < 500  ? StatusCode::kInvalidArgument
                                                     : StatusCode::kInternal;
    return Status(code, message);
  }
  if (parsed.is_discarded()) {
    return internal_error("the control plane answered with a body that is not JSON");
  }
  return parsed;
}

int fail(const std::string& command, const Status& status) {
  std::cerr << "flotilla " << command << ": " << status.message() << "\n";
  return status.code() == StatusCode::kUnavailable ? kExitCannotListen : kExitBadInput;
}

void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) {
        line += std::string(widths[i] - row[i].size() + 2, ' ');
      }
    }
    std::cout << line << "\n";
  }
}

void add_client_flags(CLI::App* cmd, ClientFlags& flags) {
  cmd->add_option("--api", flags.api,
                  "Control plane URL (default: $FLOTILLA_API, else http://127.0.0.1:8081)");
  cmd->add_option("--token", flags.token,
                  "API token (default: $FLOTILLA_TOKEN, else ./.flotilla/admin.token)");
  cmd->add_option("-o,--output", flags.output, "table or json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
}

}  // namespace flotilla::cli

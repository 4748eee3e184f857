// What the control-plane client commands share: where the API is and the token, one API call,
// failing with one line, and tables.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/common.h"
#include "http/http.h"

namespace flotilla::cli {

struct ClientFlags {
  std::string api;
  std::string token;
  std::string output = "table";
};

// Where to find the API and the token: flags, else FLOTILLA_API / FLOTILLA_TOKEN, else the
// defaults of `flotilla up` and ./.flotilla/admin.token.
struct Connection {
  std::string host;
  uint16_t port = 0;
  std::string token;
};

// The whole of a small file, "" when it cannot be read.
std::string read_text_file(const std::string& path);
// `text` without leading and trailing white space.
std::string trim(std::string text);
Result<Connection> connect_flags(const ClientFlags& flags);
// One API call; a non-2xx answer becomes a Status carrying the API's message.
Result<nlohmann::json> call(const Connection& connection, http::Method method,
                            const std::string& target, std::string body = "",
                            std::string content_type = "application/json");
// Says "flotilla COMMAND: message" on stderr; the exit code for `status`.
int fail(const std::string& command, const Status& status);
// Prints rows as left-aligned columns.
void print_table(const std::vector<std::vector<std::string>>& rows);
// --api, --token and -o/--output.
void add_client_flags(CLI::App* cmd, ClientFlags& flags);

}  // namespace flotilla::cli

// The REST client: JSON over pooled keep-alive connections, watch streams read line by line.
#include <cctype>
#include <ctime>
#include <fstream>
#include <sstream>

#include "kube/kube.h"

namespace flotilla::kube {
namespace {

constexpr size_t kMaxBody = 256 * 1024 * 1024;  // a list of many objects; beyond: refused
constexpr size_t kMaxIdleConnections = 4;

std::string_view patch_content_type(PatchType type) {
  switch (type) {
    case PatchType::kJson:
      return "application/json-patch+json";
    case PatchType::kStrategicMerge:
      return "application/strategic-merge-patch+json";
    case PatchType::kMerge:
      break;
  }
  return "application/merge-patch+json";
}

}  // namespace

std::string collection_path(const Resource& resource, std::string_view namespace_name) {
  std::string path = resource.group.empty() ? "/api/" + resource.version
                                            : "/apis/" + resource.group + "/" + resource.version;
  if (resource.namespaced) {
    path += "/namespaces/";
    path += namespace_name;
  }
  path += "/" + resource.plural;
  return path;
}

std::string object_path(const Resource& resource, std::string_view namespace_name,
                        std::string_view name, std::string_view subresource) {
  std::string path = collection_path(resource, namespace_name);
  path += '/';
  path += name;
  if (!subresource.empty()) {
    path += '/';
    path += subresource;
  }
  return path;
}

std::string query_escape(std::string_view value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

const nlohmann::json& field(const nlohmann::json& object, std::string_view key) {
  static const nlohmann::json kNull;
  if (!object.is_object()) {
    return kNull;
  }
  const auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

std::string string_field(const nlohmann::json& object, std::string_view key) {
  const nlohmann::json& value = field(object, key);
  return value.is_string() ? value.get<std::string>() : "";
}

std::string label(const nlohmann::json& object, std::string_view key) {
  return string_field(field(field(object, "metadata"), "labels"), key);
}

const nlohmann::json& condition(const nlohmann::json& status, std::string_view type) {
  const nlohmann::json& conditions = field(status, "conditions");
  if (conditions.is_array()) {
    for (const nlohmann::json& entry : conditions) {
      if (string_field(entry, "type") == type) {
        return entry;
      }
    }
  }
  static const nlohmann::json kNone;
  return kNone;
}

int64_t integer_field(const nlohmann::json& object, std::string_view key, int64_t otherwise) {
  const nlohmann::json& value = field(object, key);
  return value.is_number_integer() ? value.get<int64_t>() : otherwise;
}

int64_t unix_ms_of(const std::string& text) {
  std::tm utc{};
  const char* rest = ::strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &utc);
  if (rest == nullptr) {
    return 0;
  }
  int64_t ms = static_cast<int64_t>(::timegm(&utc)) * 1000;
  if (*rest == '.') {
    int64_t scale = 100;
    for (++rest; std::isdigit(static_cast<unsigned char>(*rest)) != 0; ++rest) {
      ms += (*rest - '0') * scale;
      scale /= 10;
    }
  }
  return ms;
}

std::string Reply::reason() const {
  const nlohmann::json& reason = field(body, "reason");
  return field(body, "kind") == "Status" && reason.is_string() ? reason.get<std::string>() : "";
}

Status reply_status(const Reply& reply) {
  if (reply.ok()) {
    return Status::ok();
  }
  std::string message = "the API server answered " + std::to_string(reply.status);
  if (const std::string reason = reply.reason(); !reason.empty()) {
    message += " " + reason;
  }
  if (const nlohmann::json& text = field(reply.body, "message"); text.is_string()) {
    message += ": " + text.get<std::string>();
  }
  switch (reply.status) {
    case 404:
      return Status(StatusCode::kNotFound, message);
    case 400:
    case 422:
      return invalid_argument(message);
    case 429:
      return unavailable(message);
    default:
      return reply.status >= 500 ? unavailable(message)
                                 : Status(StatusCode::kFailedPrecondition, message);
  }
}

// Idle keep-alive connections, and the watches in progress (so cancel_watches() reaches them).
struct Client::Pool {
  Mutex mu;
  std::vector<std::unique_ptr<http::BlockingConnection>> idle FLOTILLA_GUARDED_BY(mu);
  std::vector<http::BlockingConnection*> watching FLOTILLA_GUARDED_BY(mu);
};

Client::Client(Config config, std::chrono::milliseconds io_timeout)
    : config_(std::move(config)), io_timeout_(io_timeout), pool_(std::make_unique<Pool>()) {}

Client::~Client() = default;

http::Headers Client::auth_headers() const {
  std::string token = config_.token;
  if (!config_.token_file.empty()) {
    // Read each time: a projected service-account token is rotated in place by the kubelet.
    std::ifstream in(config_.token_file);
    std::ostringstream text;
    text << in.rdbuf();
    token = text.str();
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) {
      token.pop_back();
    }
  }
  http::Headers headers = {{"Accept", "application/json"}};
  if (!token.empty()) {
    headers.emplace_back("Authorization", "Bearer " + token);
  }
  return headers;
}

Result<Reply> Client::call(http::Method method, const std::string& path, const std::string& query,
                           std::string body, std::string_view content_type) {
  std::unique_ptr<http::BlockingConnection> connection;
  {
    MutexLock lock(pool_->mu);
    if (!pool_->idle.empty()) {
      connection = std::move(pool_->idle.back());
      pool_->idle.pop_back();
    }
  }
  if (!connection) {
    connection = std::make_unique<http::BlockingConnection>(config_.server, io_timeout_);
  }
  http::ClientRequest request;
  request.method = method;
  request.target = config_.base_path + path + (query.empty() ? "" : "?" + query);
  request.headers = auth_headers();
  if (!content_type.empty()) {
    request.headers.emplace_back("Content-Type", std::string(content_type));
  }
  request.body = std::move(body);
  Reply reply;
  std::string text;
  const Status sent = connection->send(
      std::move(request),
      [&](const http::ResponseHead& head) {
        reply.status = head.status;
        return Status::ok();
      },
      [&](const char* data, size_t size) {
        if (text.size() + size > kMaxBody) {
          return invalid_argument("the API server's answer is over 256 MiB");
        }
        text.append(data, size);
        return Status::ok();
      });
  if (!sent.is_ok()) {
    return unavailable(sent.message());
  }
  {
    MutexLock lock(pool_->mu);
    if (pool_->idle.size() < kMaxIdleConnections) {
      pool_->idle.push_back(std::move(connection));
    }
  }
  reply.body = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (reply.body.is_discarded()) {
    if (reply.ok()) {
      return unavailable("the API server's answer to " + path + " is not JSON");
    }
    reply.body = nlohmann::json::object();  // an error from a proxy in front of it, say
  }
  return reply;
}

Result<Reply> Client::get(const std::string& path, const std::string& query) {
  return call(http::Method::kGet, path, query, "", "");
}

Result<Reply> Client::create(const std::string& path, const nlohmann::json& object) {
  return call(http::Method::kPost, path, "", object.dump(), "application/json");
}

Result<Reply> Client::replace(const std::string& path, const nlohmann::json& object) {
  return call(http::Method::kPut, path, "", object.dump(), "application/json");
}

Result<Reply> Client::patch(const std::string& path, const nlohmann::json& patch, PatchType type) {
  return call(http::Method::kPatch, path, "", patch.dump(), patch_content_type(type));
}

Result<Reply> Client::remove(const std::string& path) {
  return call(http::Method::kDelete, path, "", "", "");
}

Status Client::watch(const std::string& path, const std::string& query,
                     const std::function<bool(const WatchEvent&)>& on_event) {
  // A connection of its own for the whole stream, whose reads wait as long as a server may be
  // quiet between bookmarks (about a minute).
  http::BlockingConnection connection(config_.server,
                                      std::max(io_timeout_, std::chrono::milliseconds(120'000)));
  {
    MutexLock lock(pool_->mu);
    pool_->watching.push_back(&connection);
  }
  http::ClientRequest request;
  request.method = http::Method::kGet;
  request.target = config_.base_path + path + "?watch=1" + (query.empty() ? "" : "&" + query);
  request.headers = auth_headers();
  int status = 0;
  std::string line;
  std::string error_body;
  bool stopped = false;
  Status sent = connection.send(
      std::move(request),
      [&](const http::ResponseHead& head) {
        status = head.status;
        return Status::ok();
      },
      [&](const char* data, size_t size) {
        if (status < 200 || status >= 300) {
          error_body.append(
              data, std::min(size, size_t{65'536} - std::min(error_body.size(), size_t{65'536})));
          return Status::ok();
        }
        for (size_t i = 0; i < size; ++i) {
          if (data[i] != '\n') {
            line += data[i];
            continue;
          }
          const nlohmann::json event = nlohmann::json::parse(line, nullptr, false);
          line.clear();
          const nlohmann::json& type = field(event, "type");
          if (!type.is_string()) {
            return unavailable("a watch event of " + path + " is not an event");
          }
          if (!on_event({type.get<std::string>(), field(event, "object")})) {
            stopped = true;
            return Status(StatusCode::kFailedPrecondition, "stopped");  // ends the stream
          }
        }
        return Status::ok();
      });
  {
    MutexLock lock(pool_->mu);
    std::erase(pool_->watching, &connection);
  }
  if (stopped) {
    return Status::ok();
  }
  if (!sent.is_ok()) {
    return unavailable(sent.message());
  }
  if (status < 200 || status >= 300) {
    // The same as the ERROR event a server sends once the stream is open.
    nlohmann::json object = nlohmann::json::parse(error_body, nullptr, false);
    if (!object.is_object()) {
      object = {{"kind", "Status"},
                {"message", "the API server answered " + std::to_string(status)}};
    }
    object["code"] = status;
    on_event({"ERROR", std::move(object)});
  }
  return Status::ok();  // the server ended the stream (timeoutSeconds), or refused it
}

void Client::cancel_watches() {
  MutexLock lock(pool_->mu);
  for (http::BlockingConnection* connection : pool_->watching) {
    connection->cancel();
  }
}

}  // namespace flotilla::kube

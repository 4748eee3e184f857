// Where the API server is and how to authenticate: a kubeconfig file, or the service account of
// the pod the process runs in.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <openssl/evp.h>
#include <yaml-cpp/yaml.h>

#include "kube/kube.h"

namespace flotilla::kube {
namespace {

Result<std::string> read_text(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return invalid_argument(what + ": cannot read '" + path + "'");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string trim(std::string text) {
  const size_t end = text.find_last_not_of(" \t\r\n");
  text.erase(end == std::string::npos ? 0 : end + 1);
  const size_t begin = text.find_first_not_of(" \t\r\n");
  return begin == std::string::npos ? "" : text.substr(begin);
}

// "https://host[:port][/path]" into the origin and base path; the default port by scheme.
Status parse_server(const std::string& url, Config& config) {
  const std::string where = "server '" + url + "'";
  std::string rest;
  if (url.starts_with("https://")) {
    config.server.tls = true;
    rest = url.substr(8);
  } else if (url.starts_with("http://")) {
    config.server.tls = false;
    rest = url.substr(7);
  } else {
    return invalid_argument(where + ": must start with https:// or http://");
  }
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  config.base_path = slash == std::string::npos ? "" : rest.substr(slash);
  while (config.base_path.ends_with('/')) {
    config.base_path.pop_back();
  }
  std::string port;
  if (authority.starts_with('[')) {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == std::string::npos) {
      return invalid_argument(where + ": unclosed '['");
    }
    config.server.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') {
        return invalid_argument(where + ": bad address");
      }
      port = authority.substr(close + 2);
    }
  } else if (const size_t colon = authority.rfind(':'); colon != std::string::npos) {
    config.server.host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  } else {
    config.server.host = authority;
  }
  if (config.server.host.empty()) {
    return invalid_argument(where + ": no host");
  }
  if (port.empty()) {
    config.server.port = config.server.tls ? 443 : 80;
    return Status::ok();
  }
  int number = 0;
  for (char c : port) {
    if (c < '0' || c > '9' || number > 65535) {
      return invalid_argument(where + ": bad port '" + port + "'");
    }
    number = number * 10 + (c - '0');
  }
  if (number < 1 || number > 65535) {
    return invalid_argument(where + ": bad port '" + port + "'");
  }
  config.server.port = static_cast<uint16_t>(number);
  return Status::ok();
}

// The entry named `name` of a kubeconfig list (clusters, users, contexts): its `field` mapping.
Result<YAML::Node> named_entry(const YAML::Node& root, const std::string& list,
                               const std::string& field, const std::string& name) {
  const YAML::Node entries = root[list];
  if (entries && !entries.IsSequence()) {
    return invalid_argument(list + ": must be a list");
  }
  if (entries) {
    for (const YAML::Node& entry : entries) {
      if (entry.IsMap() && entry["name"] && entry["name"].as<std::string>() == name) {
        const YAML::Node value = entry[field];
        if (value && !value.IsMap()) {
          return invalid_argument(list + "['" + name + "']." + field + ": must be a mapping");
        }
        return value ? value : YAML::Node(YAML::NodeType::Map);
      }
    }
  }
  return invalid_argument(list + ": no entry named '" + name + "'");
}

std::string scalar(const YAML::Node& node, const char* key) {
  const YAML::Node value = node[key];
  return value && value.IsScalar() ? value.as<std::string>() : "";
}

// A PEM from `<key>-data` (base64) or the file `<key>` (relative to `dir`); "" when neither.
Result<std::string> pem(const YAML::Node& node, const std::string& key, const std::string& where,
                        const std::filesystem::path& dir) {
  if (const std::string data = scalar(node, (key + "-data").c_str()); !data.empty()) {
    return decode_base64(data, where + "." + key + "-data");
  }
  if (std::string file = scalar(node, key.c_str()); !file.empty()) {
    const std::filesystem::path path =
        std::filesystem::path(file).is_absolute() ? std::filesystem::path(file) : dir / file;
    return read_text(path.string(), where + "." + key);
  }
  return std::string();
}

Result<Config> read_kubeconfig(const YAML::Node& root, const std::string& context_name,
                               const std::filesystem::path& dir) {
  if (!root.IsMap()) {
    return invalid_argument("kubeconfig: must be a mapping");
  }
  const std::string name = context_name.empty() ? scalar(root, "current-context") : context_name;
  if (name.empty()) {
    return invalid_argument("kubeconfig: no current-context, and no context asked for");
  }
  FLOTILLA_ASSIGN_OR_RETURN(YAML::Node context, named_entry(root, "contexts", "context", name));
  Config config;
  FLOTILLA_ASSIGN_OR_RETURN(YAML::Node cluster,
                            named_entry(root, "clusters", "cluster", scalar(context, "cluster")));
  const std::string cluster_where = "clusters['" + scalar(context, "cluster") + "'].cluster";
  FLOTILLA_RETURN_IF_ERROR(parse_server(scalar(cluster, "server"), config));
  FLOTILLA_ASSIGN_OR_RETURN(config.server.tls_options.ca_pem,
                            pem(cluster, "certificate-authority", cluster_where, dir));
  if (const YAML::Node skip = cluster["insecure-skip-tls-verify"]; skip && skip.as<bool>()) {
    config.server.tls_options.verify = false;
  }

  if (const std::string user_name = scalar(context, "user"); !user_name.empty()) {
    FLOTILLA_ASSIGN_OR_RETURN(YAML::Node user, named_entry(root, "users", "user", user_name));
    const std::string where = "users['" + user_name + "'].user";
    for (const char* unsupported : {"exec", "auth-provider", "username", "password"}) {
      if (user[unsupported]) {
        return invalid_argument(where + "." + unsupported +
                                ": not supported (use a token or a client certificate)");
      }
    }
    config.token = scalar(user, "token");
    if (std::string file = scalar(user, "tokenFile"); !file.empty()) {
      config.token_file = std::filesystem::path(file).is_absolute() ? file : (dir / file).string();
    }
    FLOTILLA_ASSIGN_OR_RETURN(config.server.tls_options.cert_pem,
                              pem(user, "client-certificate", where, dir));
    FLOTILLA_ASSIGN_OR_RETURN(config.server.tls_options.key_pem,
                              pem(user, "client-key", where, dir));
    if (config.server.tls_options.cert_pem.empty() != config.server.tls_options.key_pem.empty()) {
      return invalid_argument(where +
                              ": a client certificate needs its key, and a key its "
                              "certificate");
    }
  }
  if (std::string ns = scalar(context, "namespace"); !ns.empty()) {
    config.namespace_name = std::move(ns);
  }
  return config;
}

bool in_a_pod() {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  return host != nullptr && *host != '\0';
}

}  // namespace

Result<std::string> decode_base64(std::string_view text, const std::string& what) {
  std::string compact;
  for (char c : text) {
    if (c != '\n' && c != '\r' && c != ' ') {
      compact += c;
    }
  }
  if (compact.size() % 4 != 0) {
    return invalid_argument(what + ": not base64");
  }
  std::string out(compact.size() / 4 * 3, '\0');
  const int length = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                     reinterpret_cast<const unsigned char*>(compact.data()),
                                     static_cast<int>(compact.size()));
  if (length < 0) {
    return invalid_argument(what + ": not base64");
  }
  // EVP_DecodeBlock counts the padding as zero bytes.
  size_t padding = 0;
  for (size_t i = compact.size(); i > 0 && compact[i - 1] == '='; --i) {
    ++padding;
  }
  out.resize(static_cast<size_t>(length) - padding);
  return out;
}

std::string encode_base64(std::string_view bytes) {
  std::string out((bytes.size() + 2) / 3 * 4 + 1, '\0');
  const int length = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                     reinterpret_cast<const unsigned char*>(bytes.data()),
                                     static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(length));
  return out;
}

Result<Config> in_cluster_config(const std::string& account_dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || *host == '\0' || port == nullptr || *port == '\0') {
    return Status(StatusCode::kFailedPrecondition,
                  "not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set "
                  "(give --kubeconfig)");
  }
  Config config;
  const std::string text_host = std::string(host).find(':') != std::string::npos
                                    ? "[" + std::string(host) + "]"  // IPv6
                                    : std::string(host);
  FLOTILLA_RETURN_IF_ERROR(parse_server("https://" + text_host + ":" + port, config));
  config.token_file = account_dir + "/token";
  FLOTILLA_ASSIGN_OR_RETURN(std::string token, read_text(config.token_file, "in-cluster token"));
  if (trim(token).empty()) {
    return invalid_argument("in-cluster token: '" + config.token_file + "' is empty");
  }
  FLOTILLA_ASSIGN_OR_RETURN(config.server.tls_options.ca_pem,
                            read_text(account_dir + "/ca.crt", "in-cluster CA"));
  FLOTILLA_ASSIGN_OR_RETURN(std::string ns,
                            read_text(account_dir + "/namespace", "in-cluster namespace"));
  if (!trim(ns).empty()) {
    config.namespace_name = trim(ns);
  }
  return config;
}

Result<Config> load_kubeconfig(const std::string& path, const std::string& context) {
  FLOTILLA_ASSIGN_OR_RETURN(std::string text, read_text(path, "kubeconfig"));
  try {
    return read_kubeconfig(YAML::Load(text), context,
                           std::filesystem::absolute(path).parent_path());
  } catch (const std::exception& e) {
    // yaml-cpp throws on syntax errors and on conversions of the wrong type.
    return invalid_argument("kubeconfig '" + path + "': " + e.what());
  }
}

Result<Config> resolve_config(const std::string& kubeconfig, const std::string& namespace_name) {
  Result<Config> config = Status(StatusCode::kInternal, "unset");
  if (!kubeconfig.empty()) {
    config = load_kubeconfig(kubeconfig);
  } else if (in_a_pod()) {
    config = in_cluster_config();
  } else if (const char* env = std::getenv("KUBECONFIG"); env != nullptr && *env != '\0') {
    // Several files joined by ':' are merged by kubectl; the first is what we read.
    const std::string first = std::string(env).substr(0, std::string(env).find(':'));
    config = load_kubeconfig(first);
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    config = load_kubeconfig(std::string(home) + "/.kube/config");
  } else {
    return invalid_argument("no kubeconfig: give --kubeconfig, or run in a pod");
  }
  if (config.is_ok() && !namespace_name.empty()) {
    config->namespace_name = namespace_name;
  }
  return config;
}

}  // namespace flotilla::kube

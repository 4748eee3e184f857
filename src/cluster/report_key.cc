// The key the gateways sign their load reports to the leading controller with.
#include <openssl/crypto.h>
#include <spdlog/spdlog.h>

#include "auth/auth.h"
#include "cluster/cluster.h"

namespace flotilla::cluster {
namespace {

using kube::field;
using nlohmann::json;

}  // namespace

Result<std::string> read_report_key(kube::Client& client, bool mint) {
  const std::string& ns = client.config().namespace_name;
  const std::string name(kReportKeySecret);
  const std::string path = kube::object_path(kube::kSecrets, ns, name);
  // Twice at most: missing, minted (or made by another controller at the same time), read.
  for (int attempt = 0;; ++attempt) {
    FLOTILLA_ASSIGN_OR_RETURN(kube::Reply reply, client.get(path));
    if (reply.ok()) {
      const json& key = field(field(reply.body, "data"), "key");
      if (!key.is_string()) {
        return invalid_argument("the Secret " + name + " has no data.key");
      }
      return kube::decode_base64(key.get<std::string>(), "the Secret " + name + ": data.key");
    }
    if (reply.status != 404 || !mint || attempt > 0) {
      return kube::reply_status(reply).with_context("reading the Secret " + name);
    }
    FLOTILLA_ASSIGN_OR_RETURN(auth::NewToken minted, auth::generate_token("gateway-reports", {}));
    const json secret = {{"apiVersion", "v1"},
                         {"kind", "Secret"},
                         {"metadata", {{"name", name}}},
                         {"type", "Opaque"},
                         {"data", {{"key", kube::encode_base64(minted.token)}}}};
    FLOTILLA_ASSIGN_OR_RETURN(reply,
                              client.create(kube::collection_path(kube::kSecrets, ns), secret));
    if (!reply.ok() && reply.reason() != "AlreadyExists") {
      return kube::reply_status(reply).with_context("minting the Secret " + name);
    }
    if (reply.ok()) {
      spdlog::info("minted the gateways' report key into the Secret {}", name);
    }
  }
}

ReportKeyCheck::ReportKeyCheck(kube::Client& client) : client_(client) {}

bool ReportKeyCheck::allows(std::string_view authorization) {
  // No key at all is a mismatch too: it may come from a gateway that found no Secret.
  constexpr std::string_view kBearer = "Bearer ";
  const std::string_view presented = authorization.substr(0, kBearer.size()) == kBearer
                                         ? authorization.substr(kBearer.size())
                                         : std::string_view();
  MutexLock lock(mu_);
  if (matches(presented)) {
    return true;
  }
  // A key the controller has not read yet (another controller minted it, or it was rotated by
  // deleting its Secret): read again, at most once a second whatever callers send.
  const auto now = std::chrono::steady_clock::now();
  if (read_once_ && now - last_read_ < std::chrono::seconds(1)) {
    return false;
  }
  read_once_ = true;
  last_read_ = now;
  Result<std::string> key = read_report_key(client_, /*mint=*/true);
  if (!key.is_ok()) {
    spdlog::warn("the gateways' report key: {}", key.status().message());
    return false;
  }
  key_ = std::move(key).value();
  return matches(presented);
}

bool ReportKeyCheck::matches(std::string_view presented) const {
  return !key_.empty() && presented.size() == key_.size() &&
         CRYPTO_memcmp(presented.data(), key_.data(), key_.size()) == 0;
}

}  // namespace flotilla::cluster

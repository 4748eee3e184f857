// Kubernetes API access for Kubernetes mode (issue #20, DESIGN.md §8): where the API server is
// and how to authenticate to it (a kubeconfig or the pod's service account), a small REST client
// on http::BlockingConnection (JSON objects, patches, subresources as plain paths, chunked watch
// streams), and a Reflector that keeps a list + watch mirror of one kind of object.
//
// Debian packages no Kubernetes client library for C++, so this is written here, kept to what
// the controller and the gateway use; it knows the API's conventions (paths, resourceVersion,
// watch events, Status objects) and nothing of Flotilla's resources beyond their names.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/common.h"
#include "http/http.h"

namespace flotilla::kube {

// ---- Connection settings ------------------------------------------------------------------------

// Where the API server is, how to authenticate, and the namespace to work in.
struct Config {
  http::Origin server;    // host, port, TLS (the cluster's CA, a client certificate)
  std::string base_path;  // the server URL's path ("" or "/prefix"), put before every API path
  std::string token;      // a bearer token; "" for none (client certificate, or anonymous)
  // Read again before a request when set (a service account's projected token rotates); it
  // then wins over `token`.
  std::string token_file;
  std::string namespace_name = "default";
};

// The service account's files inside a pod.
inline constexpr std::string_view kServiceAccountDir =
    "/var/run/secrets/kubernetes.io/serviceaccount";

// In-cluster settings: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT from the environment,
// and `account_dir`'s token, ca.crt and namespace files. kFailedPrecondition when the environment
// is not a pod's; kInvalidArgument naming the file that is missing or unreadable.
Result<Config> in_cluster_config(const std::string& account_dir = std::string(kServiceAccountDir));

// Reads a kubeconfig file (YAML): the cluster, user and namespace of `context` ("" for its
// current-context). Supports server (https or http), certificate-authority(-data),
// insecure-skip-tls-verify, token, tokenFile, client-certificate(-data), client-key(-data);
// relative file paths are relative to the kubeconfig's directory. Refuses what it cannot honour
// (exec and auth-provider plugins, username/password) with kInvalidArgument naming the field.
Result<Config> load_kubeconfig(const std::string& path, const std::string& context = "");

// The settings a command line asks for: `kubeconfig` when given, else in-cluster when the
// environment is a pod's, else $KUBECONFIG, else ~/.kube/config. A non-empty `namespace_name`
// overrides the one found.
Result<Config> resolve_config(const std::string& kubeconfig, const std::string& namespace_name);

// ---- Paths --------------------------------------------------------------------------------------

// One kind of object: its API group ("" for the core group), version and plural resource name.
struct Resource {
  std::string group;
  std::string version;
  std::string plural;
  bool namespaced = true;
};

inline const Resource kServingEndpoints{"flotilla.dev", "v1", "servingendpoints"};
inline const Resource kDeployments{"apps", "v1", "deployments"};
inline const Resource kServices{"", "v1", "services"};
inline const Resource kPods{"", "v1", "pods"};
inline const Resource kSecrets{"", "v1", "secrets"};
inline const Resource kConfigMaps{"", "v1", "configmaps"};
inline const Resource kEndpointSlices{"discovery.k8s.io", "v1", "endpointslices"};
inline const Resource kLeases{"coordination.k8s.io", "v1", "leases"};

// "/apis/{group}/{version}/namespaces/{ns}/{plural}" ("/api/v1/..." for the core group; no
// namespace part for a cluster-scoped resource).
std::string collection_path(const Resource& resource, std::string_view namespace_name);
// The collection path, then "/{name}" and "/{subresource}" when given ("scale", "status").
std::string object_path(const Resource& resource, std::string_view namespace_name,
                        std::string_view name, std::string_view subresource = "");
// `value` percent-encoded for a query string (label selectors hold '=', ',' and '!').
std::string query_escape(std::string_view value);

// Base64 (RFC 4648, padded; line breaks ignored), as kubeconfigs and Secrets' data carry bytes.
// kInvalidArgument naming `what` when `text` is not base64.
Result<std::string> decode_base64(std::string_view text, const std::string& what);
// `bytes` as padded base64 on one line, as a Secret's data takes them.
std::string encode_base64(std::string_view bytes);

// object[key] when `object` is an object holding `key`, else null: reads of fields that may be
// missing or of another type in what a server sent, without nlohmann's exceptions or its
// undefined behaviour on a const lookup of a missing key.
const nlohmann::json& field(const nlohmann::json& object, std::string_view key);
// field() as a string ("" when missing or not a string) and as an integer (`otherwise`).
std::string string_field(const nlohmann::json& object, std::string_view key);
int64_t integer_field(const nlohmann::json& object, std::string_view key, int64_t otherwise);
// The object's metadata.labels[key] ("" when it has none).
std::string label(const nlohmann::json& object, std::string_view key);
// The entry of `status`.conditions whose type is `type` (conditions are keyed by type), null
// when there is none.
const nlohmann::json& condition(const nlohmann::json& status, std::string_view type);
// RFC 3339 in UTC as the API server writes it ("2026-12-03T05:00:00Z", a fraction allowed) as
// unix ms; 0 when it is not that.
int64_t unix_ms_of(const std::string& text);

// ---- The client ---------------------------------------------------------------------------------

// One answer of the API server: a 2xx with the object or list, or an error with its Status
// object (kind Status: reason, message, code).
struct Reply {
  int status = 0;
  nlohmann::json body;
  bool ok() const { return status >= 200 && status < 300; }
  // The Status object's reason ("NotFound", "AlreadyExists", "Conflict", "Expired", ...), "".
  std::string reason() const;
};

// A reply as a Status: ok for a 2xx; otherwise the server's message, with 404 kNotFound, 409
// kFailedPrecondition (a conflict or an existing name), 400 and 422 kInvalidArgument, 429 and
// 5xx kUnavailable, anything else kFailedPrecondition.
Status reply_status(const Reply& reply);

enum class PatchType { kMerge, kJson, kStrategicMerge };

// One event of a watch stream: ADDED, MODIFIED, DELETED, BOOKMARK (object: only
// metadata.resourceVersion) or ERROR (object: a Status; code 410 when the resourceVersion is too
// old: list again).
struct WatchEvent {
  std::string type;
  nlohmann::json object;
};

// A REST client of one API server. Thread-safe: each call takes a keep-alive connection of its
// own from a small pool. Transport failures (connect, TLS, timeout, a malformed answer) are
// kUnavailable; every HTTP answer is a Reply.
class Client {
 public:
  explicit Client(Config config, std::chrono::milliseconds io_timeout = std::chrono::seconds(30));
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Config& config() const { return config_; }

  // `query` without the '?': "labelSelector=...&limit=500".
  Result<Reply> get(const std::string& path, const std::string& query = "");
  Result<Reply> create(const std::string& path, const nlohmann::json& object);
  // PUT: the object's metadata.resourceVersion, when set, must be the stored one (409 else).
  Result<Reply> replace(const std::string& path, const nlohmann::json& object);
  Result<Reply> patch(const std::string& path, const nlohmann::json& patch,
                      PatchType type = PatchType::kMerge);
  Result<Reply> remove(const std::string& path);

  // Watches `path` (a collection) with `query` (resourceVersion, allowWatchBookmarks,
  // timeoutSeconds, selectors; watch=1 is added), calling `on_event` for each event in order on
  // this thread until it returns false, the server ends the stream, or cancel_watches() is
  // called (then kUnavailable). A non-2xx answer to the watch request comes to `on_event` as
  // the ERROR event a server sends once a stream is open (its Status object, code set). Blocks.
  Status watch(const std::string& path, const std::string& query,
               const std::function<bool(const WatchEvent&)>& on_event);
  // Ends every watch in progress, from any thread; later watches still work.
  void cancel_watches();

 private:
  struct Pool;
  Result<Reply> call(http::Method method, const std::string& path, const std::string& query,
                     std::string body, std::string_view content_type);
  http::Headers auth_headers() const;

  const Config config_;
  const std::chrono::milliseconds io_timeout_;
  std::unique_ptr<Pool> pool_;
};

// ---- Reflector ----------------------------------------------------------------------------------

// A mirror of the objects of one resource in one namespace (optionally only those a label
// selector matches), kept by list + watch as client-go's reflector does: a list, then a watch from
// its resourceVersion with bookmarks; after a broken or ended watch, a new watch from the last
// resourceVersion seen, after a backoff with jitter when it failed; after 410 Gone, a new list.
// The mirror outlives every break, so its consumer keeps serving from the last state it saw.
class Reflector {
 public:
  struct Options {
    std::string label_selector;
    std::chrono::seconds watch_timeout{300};  // asked of the server (timeoutSeconds)
    std::chrono::milliseconds backoff_min{200};
    std::chrono::milliseconds backoff_max{30'000};
  };
  using Objects = std::map<std::string, nlohmann::json>;  // by metadata.name
  // Called on the reflector's thread with the whole mirror after each change: a list that
  // replaced it (the first call), or one watch event.
  using OnChange = std::function<void(const Objects& objects)>;

  Reflector(Client& client, Resource resource, std::string namespace_name, Options options,
            OnChange on_change, Random& random);

  // Lists and watches until stop(); blocks.
  void run();
  // From any thread: run() returns soon after, without waiting for the server.
  void stop();

  // Counters for tests and logs: lists made (the first and each relist after 410), and watches
  // started.
  int64_t lists() const { return lists_.load(); }
  int64_t watches() const { return watches_.load(); }

 private:
  Status list();
  Status watch_once();
  void wait(std::chrono::milliseconds delay);
  bool stopping();

  Client& client_;
  const Resource resource_;
  const std::string namespace_;
  const Options options_;
  const OnChange on_change_;
  Random& random_;
  Objects objects_;  // the reflector's thread only
  std::string resource_version_;
  std::atomic<int64_t> lists_{0};
  std::atomic<int64_t> watches_{0};
  Mutex mu_;
  CondVar wake_;
  bool stopping_ FLOTILLA_GUARDED_BY(mu_) = false;
};

// ---- Leader election ----------------------------------------------------------------------------

// Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does it: the
// leader renews the Lease every retry period; another candidate takes it over only when it has
// seen the Lease unchanged for a whole lease duration on its own clock (so clock skew between
// machines does not matter); the resourceVersion on every write makes two candidates that try
// at once end with one leader (the other gets 409). A leader that cannot renew for the renew
// deadline stops acting as leader before anyone may take over (renew_deadline < lease_duration).
class LeaderElector {
 public:
  struct Options {
    std::string lease_name;
    std::string identity;  // this candidate: its pod name, unique among candidates
    std::chrono::milliseconds lease_duration{15'000};
    std::chrono::milliseconds renew_deadline{10'000};
    std::chrono::milliseconds retry_period{2'000};
    // Written on the Lease with every acquire and renew, so that others can learn something of
    // the leader from it (the controller: where its samples API listens).
    std::map<std::string, std::string> annotations;
  };

  // `client` and `clock` must outlive it; the Lease lives in the client's namespace.
  LeaderElector(Client& client, Options options, const Clock& clock);

  // One attempt to take or keep the Lease; returns whether this candidate leads now. Called
  // every retry period by run(), or directly by tests.
  bool step();
  // Steps every retry period until stop(), calling `on_change(true)` when it starts leading and
  // `on_change(false)` when it stops; blocks. Releases the Lease when it stops (the next
  // candidate takes over at once).
  void run(const std::function<void(bool leading)>& on_change);
  void stop();  // from any thread
  // Gives the Lease up if this candidate holds it (holderIdentity emptied).
  void release();

  bool leading() const { return leading_.load(); }

 private:
  nlohmann::json lease_object(const nlohmann::json& previous, int64_t transitions) const;

  Client& client_;
  const Options options_;
  const Clock& clock_;
  const std::string path_;
  std::atomic<bool> leading_{false};
  // What this candidate last saw of the Lease and when (its own clock): the takeover rule.
  std::string observed_record_;
  Clock::TimePoint observed_at_{};
  Clock::TimePoint renewed_at_{};  // the last successful write while leading
  Mutex mu_;
  CondVar wake_;
  bool stopping_ FLOTILLA_GUARDED_BY(mu_) = false;
};

// The delay before attempt `failures` (1, 2, ...) of a failing watch or list: backoff_min
// doubled per failure up to backoff_max, then a uniform jitter of up to half of it taken off,
// so that many gateways that lost the server together do not come back together.
std::chrono::milliseconds backoff_delay(int failures, std::chrono::milliseconds min,
                                        std::chrono::milliseconds max, Random& random);

}  // namespace flotilla::kube

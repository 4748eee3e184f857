// List + watch of one resource, kept as a mirror that survives every broken watch.
#include <spdlog/spdlog.h>

#include "kube/kube.h"

namespace flotilla::kube {

std::chrono::milliseconds backoff_delay(int failures, std::chrono::milliseconds min,
                                        std::chrono::milliseconds max, Random& random) {
  int64_t delay = std::max<int64_t>(1, min.count());
  for (int i = 1; i < failures && delay < max.count(); ++i) {
    delay *= 2;
  }
  delay = std::min<int64_t>(delay, std::max<int64_t>(1, max.count()));
  const int64_t jitter = static_cast<int64_t>(random.uniform(static_cast<uint64_t>(delay / 2) + 1));
  return std::chrono::milliseconds(delay - jitter);
}

Reflector::Reflector(Client& client, Resource resource, std::string namespace_name, Options options,
                     OnChange on_change, Random& random)
    : client_(client),
      resource_(std::move(resource)),
      namespace_(std::move(namespace_name)),
      options_(std::move(options)),
      on_change_(std::move(on_change)),
      random_(random) {}

bool Reflector::stopping() {
  MutexLock lock(mu_);
  return stopping_;
}

void Reflector::stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  client_.cancel_watches();
}

void Reflector::wait(std::chrono::milliseconds delay) {
  const auto deadline = std::chrono::steady_clock::now() + delay;
  MutexLock lock(mu_);
  while (!stopping_ && wake_.wait_until(mu_, deadline)) {
  }
}

Status Reflector::list() {
  std::string query;
  if (!options_.label_selector.empty()) {
    query = "labelSelector=" + query_escape(options_.label_selector);
  }
  FLOTILLA_ASSIGN_OR_RETURN(Reply reply,
                            client_.get(collection_path(resource_, namespace_), query));
  FLOTILLA_RETURN_IF_ERROR(reply_status(reply));
  const nlohmann::json& items = field(reply.body, "items");
  const nlohmann::json& version = field(field(reply.body, "metadata"), "resourceVersion");
  if (!items.is_array() || !version.is_string()) {
    return unavailable("the list of " + resource_.plural + " has no items or resourceVersion");
  }
  Objects objects;
  for (const nlohmann::json& item : items) {
    if (const nlohmann::json& name = field(field(item, "metadata"), "name"); name.is_string()) {
      objects.emplace(name.get<std::string>(), item);
    }
  }
  objects_ = std::move(objects);
  resource_version_ = version.get<std::string>();
  lists_.fetch_add(1);
  on_change_(objects_);
  return Status::ok();
}

// One watch from resource_version_: ok when the stream ended (its timeout, or stop()),
// kFailedPrecondition "expired" when the server said 410 Gone, else why it broke.
Status Reflector::watch_once() {
  std::string query =
      "allowWatchBookmarks=true&resourceVersion=" + query_escape(resource_version_) +
      "&timeoutSeconds=" + std::to_string(options_.watch_timeout.count());
  if (!options_.label_selector.empty()) {
    query += "&labelSelector=" + query_escape(options_.label_selector);
  }
  watches_.fetch_add(1);
  bool expired = false;
  Status problem;
  const Status watched =
      client_.watch(collection_path(resource_, namespace_), query, [&](const WatchEvent& event) {
        if (stopping()) {
          return false;
        }
        if (event.type == "ERROR") {
          expired = field(event.object, "code") == 410;
          const nlohmann::json& message = field(event.object, "message");
          problem = unavailable("watch of " + resource_.plural + ": " +
                                (message.is_string() ? message.get<std::string>() : "an error"));
          return false;
        }
        const nlohmann::json& metadata = field(event.object, "metadata");
        const nlohmann::json& version = field(metadata, "resourceVersion");
        if (!version.is_string()) {
          problem = unavailable("watch of " + resource_.plural + ": an event without metadata");
          return false;
        }
        resource_version_ = version.get<std::string>();
        if (event.type == "BOOKMARK") {
          return true;
        }
        const nlohmann::json& name_field = field(metadata, "name");
        if (!name_field.is_string()) {
          return true;  // nothing to key it by
        }
        const std::string name = name_field.get<std::string>();
        if (event.type == "DELETED") {
          objects_.erase(name);
        } else if (event.type == "ADDED" || event.type == "MODIFIED") {
          objects_[name] = event.object;
        } else {
          return true;  // a type from a newer server: nothing to mirror
        }
        on_change_(objects_);
        return true;
      });
  if (expired) {
    return Status(StatusCode::kFailedPrecondition, "expired");
  }
  if (!problem.is_ok()) {
    return problem;
  }
  return watched;
}

void Reflector::run() {
  int failures = 0;
  bool listed = false;
  while (!stopping()) {
    Status status = listed ? watch_once() : list();
    if (stopping()) {
      return;
    }
    if (status.is_ok()) {
      failures = 0;
      listed = true;
      continue;
    }
    if (listed && status.code() == StatusCode::kFailedPrecondition &&
        status.message() == "expired") {
      spdlog::info("watch of {}: resourceVersion {} is too old; listing again", resource_.plural,
                   resource_version_);
      listed = false;
      continue;  // at once: the mirror stays as it is until the list replaces it
    }
    ++failures;
    const auto delay = backoff_delay(failures, options_.backoff_min, options_.backoff_max, random_);
    spdlog::warn("{} of {}: {}; again in {} ms", listed ? "watch" : "list", resource_.plural,
                 status.message(), delay.count());
    wait(delay);
  }
}

}  // namespace flotilla::kube

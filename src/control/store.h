// The control plane's state in one SQLite database (WAL) in the data directory: endpoints with
// the spec asked for and the spec serving traffic, the replicas running (for re-adoption after
// a restart), API tokens (hashed) and the event log. Private to the control module.
//
// Thread-safety: every method may be called from any thread; calls are serialized on one
// connection by an internal mutex. Each method is one transaction: a crash leaves the state
// before or after it, never between. Methods block on disk I/O (milliseconds).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "auth/auth.h"
#include "common/common.h"
#include "control/control_api.h"

struct sqlite3;

namespace flotilla::control {

struct EndpointRecord {
  std::string name;
  std::string spec_json;     // the spec the user asked for: the target of the reconciler
  std::string serving_json;  // the spec whose versions take traffic; "" before any is ready
  int64_t created_unix_ms = 0;
  int64_t updated_unix_ms = 0;
  bool operator==(const EndpointRecord&) const = default;
};

// A replica process, as the orchestrator reported it last; `json` is the orchestrator's whole
// description (opaque to the store).
struct ReplicaRecord {
  std::string id;
  std::string endpoint;
  std::string json;
  bool operator==(const ReplicaRecord&) const = default;
};

// One bucket of an endpoint's demand history: its start and its busiest second's offered
// concurrency (autoscaler::Forecaster).
struct DemandBucket {
  int64_t start_unix_ms = 0;
  double peak = 0;
  bool operator==(const DemandBucket&) const = default;
};

struct TokenRow {
  auth::TokenRecord record;  // id, salt, digest, endpoint scope
  bool admin = false;        // may call the control plane API
  std::string comment;
  int64_t created_unix_ms = 0;
  bool operator==(const TokenRow&) const = default;
};

class Store {
 public:
  // Opens (creating if needed) the database at `path`, sets WAL mode and a busy timeout, and
  // creates or checks the schema (PRAGMA user_version). Errors: kUnavailable naming the path
  // when it cannot be opened; kFailedPrecondition when its schema version is newer than ours.
  static Result<std::unique_ptr<Store>> open(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Inserts a new endpoint; kFailedPrecondition ("endpoint 'x' already exists") when it does.
  Status create_endpoint(const EndpointRecord& record);
  // Replaces an existing endpoint's record; kNotFound when there is none.
  Status update_endpoint(const EndpointRecord& record);
  // kNotFound when there is none.
  Status delete_endpoint(const std::string& name);
  Result<std::optional<EndpointRecord>> get_endpoint(const std::string& name);
  Result<std::vector<EndpointRecord>> list_endpoints();  // ordered by name

  Status put_replica(const ReplicaRecord& record);     // insert or replace by id
  Status delete_replica(const std::string& id);        // absent: ok
  Result<std::vector<ReplicaRecord>> list_replicas();  // ordered by id

  // What the autoscaler learned about an endpoint (JSON, opaque to the store); deleted with the
  // endpoint. kNotFound when the endpoint does not exist.
  Status put_autoscaler_state(const std::string& endpoint, const std::string& json);
  Result<std::map<std::string, std::string>> list_autoscaler_states();  // endpoint -> json

  // An endpoint's demand history (the autoscaler's forecast): inserts or replaces `buckets` and
  // deletes those that start before `keep_from_unix_ms`, in one transaction; deleted with the
  // endpoint. kNotFound when the endpoint does not exist.
  Status put_demand(const std::string& endpoint, const std::vector<DemandBucket>& buckets,
                    int64_t keep_from_unix_ms);
  Result<std::vector<DemandBucket>> list_demand(const std::string& endpoint);  // oldest first

  // kFailedPrecondition when the id exists.
  Status create_token(const TokenRow& token);
  // Inserts or replaces the token with this id (one statement: never a moment without it).
  Status put_token(const TokenRow& token);
  // kNotFound when the id does not exist.
  Status delete_token(const std::string& id);
  Result<std::vector<TokenRow>> list_tokens();  // ordered by id

  // Appends an event and returns its id. Keeps at most the newest 100,000 events.
  Result<int64_t> append_event(const EventRow& event);
  // The newest `limit` events of `endpoint` ("" = all endpoints), oldest first; with
  // `after_id` > 0 only events with a larger id.
  Result<std::vector<EventRow>> list_events(const std::string& endpoint, size_t limit,
                                            int64_t after_id = 0);

 private:
  explicit Store(sqlite3* db);
  Mutex mu_;
  sqlite3* db_ FLOTILLA_GUARDED_BY(mu_);  // owned; closed by the destructor
};

}  // namespace flotilla::control

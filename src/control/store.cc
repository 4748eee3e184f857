#include "control/store.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sqlite3.h>

namespace flotilla::control {
namespace {

constexpr int kSchemaVersion = 3;
constexpr int kBusyTimeoutMs = 5000;
constexpr int64_t kMaxEvents = 100000;

// Version 1. AUTOINCREMENT keeps event ids increasing even after pruning, so a client polling
// with after_id never sees an id twice.
constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE endpoints (
  name TEXT PRIMARY KEY NOT NULL,
  spec_json TEXT NOT NULL,
  serving_json TEXT NOT NULL,
  created_unix_ms INTEGER NOT NULL,
  updated_unix_ms INTEGER NOT NULL
);
CREATE TABLE replicas (
  id TEXT PRIMARY KEY NOT NULL,
  endpoint TEXT NOT NULL,
  json TEXT NOT NULL
);
CREATE TABLE tokens (
  id TEXT PRIMARY KEY NOT NULL,
  salt TEXT NOT NULL,
  sha256 TEXT NOT NULL,
  endpoints_json TEXT NOT NULL,
  admin INTEGER NOT NULL,
  comment TEXT NOT NULL,
  created_unix_ms INTEGER NOT NULL
);
CREATE TABLE events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  unix_ms INTEGER NOT NULL,
  endpoint TEXT NOT NULL,
  kind TEXT NOT NULL,
  actor TEXT NOT NULL,
  message TEXT NOT NULL
);
CREATE INDEX events_by_endpoint ON events (endpoint, id);
PRAGMA user_version = 1;
)sql";

// Version 2: what the autoscaler learned per endpoint, so a restart does not start over.
constexpr const char* kSchemaV2 = R"sql(
CREATE TABLE autoscaler_state (
  endpoint TEXT PRIMARY KEY NOT NULL,
  json TEXT NOT NULL
);
PRAGMA user_version = 2;
)sql";

// Version 3: each endpoint's demand per minute (its busiest second's offered concurrency), the
// history the autoscaler's seasonal forecast reads.
constexpr const char* kSchemaV3 = R"sql(
CREATE TABLE demand_history (
  endpoint TEXT NOT NULL,
  bucket_unix_ms INTEGER NOT NULL,
  peak REAL NOT NULL,
  PRIMARY KEY (endpoint, bucket_unix_ms)
) WITHOUT ROWID;
PRAGMA user_version = 3;
)sql";

struct DbDeleter {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using Db = std::unique_ptr<sqlite3, DbDeleter>;

struct StmtDeleter {
  void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
};
using Stmt = std::unique_ptr<sqlite3_stmt, StmtDeleter>;

// Disk, lock and open failures may pass (another process holding the lock, a full disk being
// cleaned); anything else is a bug or a corrupt file.
Status sqlite_error(sqlite3* db, int rc, const std::string& what) {
  const std::string message = "store: " + what + ": " + sqlite3_errmsg(db);
  switch (rc & 0xFF) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
      return unavailable(message);
    default:
      return internal_error(message);
  }
}

Result<Stmt> prepare(sqlite3* db, std::string_view sql, const std::string& what) {
  sqlite3_stmt* raw = nullptr;
  const int rc = sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &raw, nullptr);
  Stmt stmt(raw);
  if (rc != SQLITE_OK) {
    return sqlite_error(db, rc, what);
  }
  return stmt;
}

// Binders: the bound strings must outlive the statement's steps (SQLITE_STATIC), which holds
// because every statement lives only within the method that binds it.
int bind(sqlite3_stmt* stmt, int index, const std::string& value) {
  return sqlite3_bind_text64(stmt, index, value.data(), value.size(), SQLITE_STATIC, SQLITE_UTF8);
}

int bind(sqlite3_stmt* stmt, int index, int64_t value) {
  return sqlite3_bind_int64(stmt, index, value);
}

int bind(sqlite3_stmt* stmt, int index, double value) {
  return sqlite3_bind_double(stmt, index, value);
}
int bind(sqlite3_stmt* stmt, int index, bool value) {
  return sqlite3_bind_int(stmt, index, value ? 1 : 0);
}

template <typename... Args>
Status bind_all(sqlite3* db, sqlite3_stmt* stmt, const std::string& what, const Args&... args) {
  int index = 0;
  int rc = SQLITE_OK;
  ((rc = rc == SQLITE_OK ? bind(stmt, ++index, args) : rc), ...);
  if (rc != SQLITE_OK) {
    return sqlite_error(db, rc, what);
  }
  return Status::ok();
}

// Prepares `sql`, binds `args` and steps it to completion (a statement without result rows).
template <typename... Args>
Status exec(sqlite3* db, std::string_view sql, const std::string& what, const Args&... args) {
  FLOTILLA_ASSIGN_OR_RETURN(Stmt stmt, prepare(db, sql, what));
  FLOTILLA_RETURN_IF_ERROR(bind_all(db, stmt.get(), what, args...));
  int rc = SQLITE_ROW;
  while (rc == SQLITE_ROW) {
    rc = sqlite3_step(stmt.get());
  }
  if (rc != SQLITE_DONE) {
    return sqlite_error(db, rc, what);
  }
  return Status::ok();
}

// Runs a script of statements without parameters (schema, pragmas, BEGIN/COMMIT).
Status exec_script(sqlite3* db, const char* sql, const std::string& what) {
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) {
    return sqlite_error(db, rc, what);
  }
  return Status::ok();
}

std::string column_text(sqlite3_stmt* stmt, int column) {
  const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt, column));
  if (text == nullptr) {
    return "";
  }
  return std::string(text, static_cast<size_t>(sqlite3_column_bytes(stmt, column)));
}

// Steps `stmt` to the end, calling `read_row` on each row.
template <typename ReadRow>
Status for_each_row(sqlite3* db, sqlite3_stmt* stmt, const std::string& what, ReadRow read_row) {
  while (true) {
    const int rc = sqlite3_step(stmt);
    if (rc == SQLITE_DONE) {
      return Status::ok();
    }
    if (rc != SQLITE_ROW) {
      return sqlite_error(db, rc, what);
    }
    FLOTILLA_RETURN_IF_ERROR(read_row(stmt));
  }
}

Result<int64_t> read_user_version(sqlite3* db, const std::string& what) {
  FLOTILLA_ASSIGN_OR_RETURN(Stmt stmt, prepare(db, "PRAGMA user_version", what));
  int64_t version = 0;
  FLOTILLA_RETURN_IF_ERROR(for_each_row(db, stmt.get(), what, [&](sqlite3_stmt* row) {
    version = sqlite3_column_int64(row, 0);
    return Status::ok();
  }));
  return version;
}

Status refuse_newer(int64_t version, const std::string& path) {
  return Status(StatusCode::kFailedPrecondition,
                "store: database '" + path + "' has schema version " + std::to_string(version) +
                    ", newer than this flotilla's " + std::to_string(kSchemaVersion) +
                    "; upgrade flotilla");
}

// BEGIN IMMEDIATE takes the write lock up front, so a transaction never fails half way with
// SQLITE_BUSY on its first write; the busy timeout covers the wait for it. Rolls back unless
// commit() succeeded.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {}
  ~Transaction() {
    if (open_) {
      // Nothing to report to: the method already returns the error that brought us here.
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    }
  }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  Status begin(const std::string& what) {
    FLOTILLA_RETURN_IF_ERROR(exec_script(db_, "BEGIN IMMEDIATE", what));
    open_ = true;
    return Status::ok();
  }
  Status commit(const std::string& what) {
    FLOTILLA_RETURN_IF_ERROR(exec_script(db_, "COMMIT", what));
    open_ = false;
    return Status::ok();
  }

 private:
  sqlite3* db_;
  bool open_ = false;
};

Result<std::vector<std::string>> parse_endpoint_list(const std::string& text,
                                                     const std::string& what) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_array()) {
    return internal_error("store: " + what + ": endpoints column is not a JSON array");
  }
  std::vector<std::string> endpoints;
  for (const nlohmann::json& entry : json) {
    if (!entry.is_string()) {
      return internal_error("store: " + what + ": endpoints column holds a non-string");
    }
    endpoints.push_back(entry.get<std::string>());
  }
  return endpoints;
}

std::string endpoint_list_json(const std::vector<std::string>& endpoints) {
  // `replace` rather than throwing on invalid UTF-8: endpoint names are validated upstream,
  // and the store must not throw whatever it is given.
  return nlohmann::json(endpoints).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

namespace {

// Sets up a freshly opened database: busy timeout, WAL, and the schema (created or checked).
Status prepare_database(sqlite3* db, const std::string& path) {
  const std::string what = "opening '" + path + "'";
  sqlite3_busy_timeout(db, kBusyTimeoutMs);

  // Check the version before anything writes to the file: a newer flotilla's database is left
  // exactly as it was. Reading it is also the first access, which fails for a non-database.
  FLOTILLA_ASSIGN_OR_RETURN(int64_t version, read_user_version(db, what));
  if (version > kSchemaVersion) {
    return refuse_newer(version, path);
  }

  // journal_mode cannot change inside a transaction; it answers with the mode now in force.
  std::string mode;
  {
    FLOTILLA_ASSIGN_OR_RETURN(Stmt stmt, prepare(db, "PRAGMA journal_mode = WAL", what));
    FLOTILLA_RETURN_IF_ERROR(for_each_row(db, stmt.get(), what, [&](sqlite3_stmt* row) {
      mode = column_text(row, 0);
      return Status::ok();
    }));
  }
  if (mode != "wal") {
    spdlog::warn("store: database '{}' runs in journal mode '{}', not wal", path, mode);
  }

  Transaction transaction(db);
  FLOTILLA_RETURN_IF_ERROR(transaction.begin(what));
  // Read again under the write lock: another process may have created the schema meanwhile.
  FLOTILLA_ASSIGN_OR_RETURN(version, read_user_version(db, what));
  if (version > kSchemaVersion) {
    return refuse_newer(version, path);
  }
  if (version < 1) {
    FLOTILLA_RETURN_IF_ERROR(exec_script(db, kSchemaV1, what + ": creating the schema"));
  }
  if (version < 2) {
    FLOTILLA_RETURN_IF_ERROR(exec_script(db, kSchemaV2, what + ": upgrading the schema to 2"));
  }
  if (version < 3) {
    FLOTILLA_RETURN_IF_ERROR(exec_script(db, kSchemaV3, what + ": upgrading the schema to 3"));
  }
  return transaction.commit(what);
}

}  // namespace

Result<std::unique_ptr<Store>> Store::open(const std::string& path) {
  sqlite3* raw = nullptr;
  // NOMUTEX: the Store serializes every call with mu_.
  const int rc =
      sqlite3_open_v2(path.c_str(), &raw,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  Db db(raw);  // sqlite3_open_v2 hands back a handle to close even when it fails
  if (rc != SQLITE_OK) {
    return unavailable("store: cannot open database '" + path +
                       "': " + (raw != nullptr ? sqlite3_errmsg(raw) : sqlite3_errstr(rc)));
  }
  const Status prepared = prepare_database(db.get(), path);
  if (!prepared.is_ok()) {
    // The header promises two codes: a newer schema, or a database we cannot use (not a
    // database, locked past the timeout, read-only, ...).
    if (prepared.code() == StatusCode::kFailedPrecondition) {
      return prepared;
    }
    return Status(StatusCode::kUnavailable, prepared.message());
  }
  return std::unique_ptr<Store>(new Store(db.release()));
}

Store::Store(sqlite3* db) : db_(db) {}

Store::~Store() {
  sqlite3_close_v2(db_);
}

Status Store::create_endpoint(const EndpointRecord& record) {
  MutexLock lock(mu_);
  const std::string what = "creating endpoint '" + record.name + "'";
  // One statement, so one transaction; DO NOTHING turns a duplicate into zero changes.
  FLOTILLA_RETURN_IF_ERROR(exec(db_,
                                "INSERT INTO endpoints (name, spec_json, serving_json, "
                                "created_unix_ms, updated_unix_ms) VALUES (?, ?, ?, ?, ?) "
                                "ON CONFLICT (name) DO NOTHING",
                                what, record.name, record.spec_json, record.serving_json,
                                record.created_unix_ms, record.updated_unix_ms));
  if (sqlite3_changes(db_) == 0) {
    return Status(StatusCode::kFailedPrecondition, "endpoint '" + record.name + "' already exists");
  }
  return Status::ok();
}

Status Store::update_endpoint(const EndpointRecord& record) {
  MutexLock lock(mu_);
  const std::string what = "updating endpoint '" + record.name + "'";
  FLOTILLA_RETURN_IF_ERROR(exec(db_,
                                "UPDATE endpoints SET spec_json = ?, serving_json = ?, "
                                "created_unix_ms = ?, updated_unix_ms = ? WHERE name = ?",
                                what, record.spec_json, record.serving_json, record.created_unix_ms,
                                record.updated_unix_ms, record.name));
  if (sqlite3_changes(db_) == 0) {
    return not_found("endpoint '" + record.name + "' not found");
  }
  return Status::ok();
}

Status Store::delete_endpoint(const std::string& name) {
  MutexLock lock(mu_);
  const std::string what = "deleting endpoint '" + name + "'";
  Transaction transaction(db_);
  FLOTILLA_RETURN_IF_ERROR(transaction.begin(what));
  FLOTILLA_RETURN_IF_ERROR(exec(db_, "DELETE FROM endpoints WHERE name = ?", what, name));
  if (sqlite3_changes(db_) == 0) {
    return not_found("endpoint '" + name + "' not found");
  }
  FLOTILLA_RETURN_IF_ERROR(
      exec(db_, "DELETE FROM autoscaler_state WHERE endpoint = ?", what, name));
  FLOTILLA_RETURN_IF_ERROR(exec(db_, "DELETE FROM demand_history WHERE endpoint = ?", what, name));
  return transaction.commit(what);
}

Status Store::put_demand(const std::string& endpoint, const std::vector<DemandBucket>& buckets,
                         int64_t keep_from_unix_ms) {
  MutexLock lock(mu_);
  const std::string what = "saving the demand history of '" + endpoint + "'";
  Transaction transaction(db_);
  FLOTILLA_RETURN_IF_ERROR(transaction.begin(what));
  // Only for an endpoint that exists: a late write must not resurrect a deleted one's history.
  FLOTILLA_ASSIGN_OR_RETURN(Stmt insert,
                            prepare(db_,
                                    "INSERT OR REPLACE INTO demand_history "
                                    "(endpoint, bucket_unix_ms, peak) SELECT ?1, ?2, ?3 "
                                    "WHERE EXISTS (SELECT 1 FROM endpoints WHERE name = ?1)",
                                    what));
  for (const DemandBucket& bucket : buckets) {
    sqlite3_reset(insert.get());
    FLOTILLA_RETURN_IF_ERROR(
        bind_all(db_, insert.get(), what, endpoint, bucket.start_unix_ms, bucket.peak));
    if (const int rc = sqlite3_step(insert.get()); rc != SQLITE_DONE) {
      return sqlite_error(db_, rc, what);
    }
    if (sqlite3_changes(db_) == 0) {
      return not_found("endpoint '" + endpoint + "' not found");
    }
  }
  FLOTILLA_RETURN_IF_ERROR(
      exec(db_, "DELETE FROM demand_history WHERE endpoint = ? AND bucket_unix_ms < ?", what,
           endpoint, keep_from_unix_ms));
  return transaction.commit(what);
}

Result<std::vector<DemandBucket>> Store::list_demand(const std::string& endpoint) {
  MutexLock lock(mu_);
  const std::string what = "reading the demand history of '" + endpoint + "'";
  FLOTILLA_ASSIGN_OR_RETURN(Stmt stmt, prepare(db_,
                                               "SELECT bucket_unix_ms, peak FROM demand_history "
                                               "WHERE endpoint = ? ORDER BY bucket_unix_ms",
                                               what));
  FLOTILLA_RETURN_IF_ERROR(bind_all(db_, stmt.get(), what, endpoint));
  std::vector<DemandBucket> buckets;
  FLOTILLA_RETURN_IF_ERROR(for_each_row(db_, stmt.get(), what, [&](sqlite3_stmt* row) {
    buckets.push_back({sqlite3_column_int64(row, 0), sqlite3_column_double(row, 1)});
    return Status::ok();
  }));
  return buckets;
}

Status Store::put_autoscaler_state(const std::string& endpoint, const std::string& json) {
  MutexLock lock(mu_);
  const std::string what = "saving the autoscaler state of '" + endpoint + "'";
  // Only for an endpoint that exists: a late write must not resurrect a deleted one's state.
  FLOTILLA_RETURN_IF_ERROR(
      exec(db_,
           "INSERT OR REPLACE INTO autoscaler_state (endpoint, json) "
           "SELECT ?1, ?2 WHERE EXISTS (SELECT 1 FROM endpoints WHERE name = ?1)",
           what, endpoint, json));
  if (sqlite3_changes(db_) == 0) {
    return not_found("endpoint '" + endpoint + "' not found");
  }
  return Status::ok();
}

Result<std::map<std::string, std::string>> Store::list_autoscaler_states() {
  MutexLock lock(mu_);
  const std::string what = "listing autoscaler states";
  FLOTILLA_ASSIGN_OR_RETURN(Stmt stmt,
                            prepare(db_, "SELECT endpoint, json FROM autoscaler_state", what));
  std::map<std::string, std::string> states;
  FLOTILLA_RETURN_IF_ERROR(for_each_row(db_, stmt.get(), what, [&](sqlite3_stmt* row) {
    states.emplace(column_text(row, 0), column_text(row, 1));
    return Status::ok();
  }));
  return states;
}

namespace {

constexpr std::string_view kEndpointColumns =
    "SELECT name, spec_json, serving_json, created_unix_ms, updated_unix_ms FROM endpoints";

EndpointRecord read_endpoint(sqlite3_stmt* row) {
  EndpointRecord record;
  record.name = column_text(row, 0);
  record.spec_json = column_text(row, 1);
  record.serving_json = column_text(row, 2);
  record.created_unix_ms = sqlite3_column_int64(row, 3);
  record.updated_unix_ms = sqlite3_column_int64(row, 4);
  return record;
}

}  // namespace

Result<std::optional<EndpointRecord>> Store::get_endpoint(const std::string& name) {
  MutexLock lock(mu_);
  const std::string what = "reading endpoint '" + name + "'";
  const std::string sql = std::string(kEndpointColumns) + " WHERE name = ?";
  FLOTILLA_ASSIGN_OR_RETURN(Stmt stmt, prepare(db_, sql, what));
  FLOTILLA_RETURN_IF_ERROR(bind_all(db_, stmt.get(), what, name));
  std::optional<EndpointRecord> found;
  FLOTILLA_RETURN_IF_ERROR(for_each_row(db_, stmt.get(), what, [&](sqlite3_stmt* row) {
    found = read_endpoint(row);
    return Status::ok();
  }));
  return found;
}

Result<std::vector<EndpointRecord>> Store::list_endpoints() {
  MutexLock lock(mu_);
  const std::string what = "listing endpoints";
  const std::string sql = std::string(kEndpointColumns) + " ORDER BY name";
  FLOTILLA_ASSIGN_OR_RETURN(Stmt stmt, prepare(db_, sql, what));
  std::vector<EndpointRecord> records;
  FLOTILLA_RETURN_IF_ERROR(for_each_row(db_, stmt.get(), what, [&](sqlite3_stmt* row) {
    records.push_back(read_endpoint(row));
    return Status::ok();
  }));
  return records;
}

Status Store::put_replica(const ReplicaRecord& record) {
  MutexLock lock(mu_);
  return exec(db_, "INSERT OR REPLACE INTO replicas (id, endpoint, json) VALUES (?, ?, ?)",
              "storing replica '" + record.id + "'", record.id, record.endpoint, record.json);
}

Status Store::delete_replica(const std::string& id) {
  MutexLock lock(mu_);
  return exec(db_, "DELETE FROM replicas WHERE id = ?", "deleting replica '" + id + "'", id);
}

Result<std::vector<ReplicaRecord>> Store::list_replicas() {
  MutexLock lock(mu_);
  const std::string what = "listing replicas";
  FLOTILLA_ASSIGN_OR_RETURN(
      Stmt stmt, prepare(db_, "SELECT id, endpoint, json FROM replicas ORDER BY id", what));
  std::vector<ReplicaRecord> records;
  FLOTILLA_RETURN_IF_ERROR(for_each_row(db_, stmt.get(), what, [&](sqlite3_stmt* row) {
    records.push_back({column_text(row, 0), column_text(row, 1), column_text(row, 2)});
    return Status::ok();
  }));
  return records;
}

Status Store::create_token(const TokenRow& token) {
  MutexLock lock(mu_);
  const auth::TokenRecord& record = token.record;
  const std::string what = "creating token '" + record.id + "'";
  FLOTILLA_RETURN_IF_ERROR(exec(db_,
                                "INSERT INTO tokens (id, salt, sha256, endpoints_json, admin, "
                                "comment, created_unix_ms) VALUES (?, ?, ?, ?, ?, ?, ?) "
                                "ON CONFLICT (id) DO NOTHING",
                                what, record.id, record.salt, record.sha256,
                                endpoint_list_json(record.endpoints), token.admin, token.comment,
                                token.created_unix_ms));
  if (sqlite3_changes(db_) == 0) {
    return Status(StatusCode::kFailedPrecondition, "token '" + record.id + "' already exists");
  }
  return Status::ok();
}

Status Store::put_token(const TokenRow& token) {
  MutexLock lock(mu_);
  const auth::TokenRecord& record = token.record;
  return exec(db_,
              "INSERT OR REPLACE INTO tokens (id, salt, sha256, endpoints_json, admin, comment, "
              "created_unix_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
              "storing token '" + record.id + "'", record.id, record.salt, record.sha256,
              endpoint_list_json(record.endpoints), token.admin, token.comment,
              token.created_unix_ms);
}

Status Store::delete_token(const std::string& id) {
  MutexLock lock(mu_);
  FLOTILLA_RETURN_IF_ERROR(
      exec(db_, "DELETE FROM tokens WHERE id = ?", "deleting token '" + id + "'", id));
  if (sqlite3_changes(db_) == 0) {
    return not_found("token '" + id + "' not found");
  }
  return Status::ok();
}

Result<std::vector<TokenRow>> Store::list_tokens() {
  MutexLock lock(mu_);
  const std::string what = "listing tokens";
  FLOTILLA_ASSIGN_OR_RETURN(Stmt stmt,
                            prepare(db_,
                                    "SELECT id, salt, sha256, endpoints_json, admin, comment, "
                                    "created_unix_ms FROM tokens ORDER BY id",
                                    what));
  std::vector<TokenRow> tokens;
  FLOTILLA_RETURN_IF_ERROR(for_each_row(db_, stmt.get(), what, [&](sqlite3_stmt* row) -> Status {
    TokenRow token;
    token.record.id = column_text(row, 0);
    token.record.salt = column_text(row, 1);
    token.record.sha256 = column_text(row, 2);
    FLOTILLA_ASSIGN_OR_RETURN(
        token.record.endpoints,
        parse_endpoint_list(column_text(row, 3), "reading token '" + token.record.id + "'"));
    token.admin = sqlite3_column_int64(row, 4) != 0;
    token.comment = column_text(row, 5);
    token.created_unix_ms = sqlite3_column_int64(row, 6);
    tokens.push_back(std::move(token));
    return Status::ok();
  }));
  return tokens;
}

Result<int64_t> Store::append_event(const EventRow& event) {
  MutexLock lock(mu_);
  const std::string what = "appending event '" + event.kind + "'";
  Transaction transaction(db_);
  FLOTILLA_RETURN_IF_ERROR(transaction.begin(what));
  FLOTILLA_RETURN_IF_ERROR(exec(db_,
                                "INSERT INTO events (unix_ms, endpoint, kind, actor, message) "
                                "VALUES (?, ?, ?, ?, ?)",
                                what, event.unix_ms, event.endpoint, event.kind, event.actor,
                                event.message));
  const int64_t id = sqlite3_last_insert_rowid(db_);
  // Ids increase by one per event, so this range delete on the primary key keeps the newest
  // kMaxEvents at the cost of (usually) one deleted row per append.
  FLOTILLA_RETURN_IF_ERROR(
      exec(db_, "DELETE FROM events WHERE id <= ?", what + ": pruning", id - kMaxEvents));
  FLOTILLA_RETURN_IF_ERROR(transaction.commit(what));
  return id;
}

Result<std::vector<EventRow>> Store::list_events(const std::string& endpoint, size_t limit,
                                                 int64_t after_id) {
  MutexLock lock(mu_);
  const std::string what = "listing events";
  // Two texts rather than "(? = '' OR endpoint = ?)" so the filtered one uses the index. The
  // inner query takes the newest `limit`; the outer one puts them oldest first.
  constexpr std::string_view kAll =
      "SELECT id, unix_ms, endpoint, kind, actor, message FROM (SELECT * FROM events WHERE id > ? "
      "ORDER BY id DESC LIMIT ?) ORDER BY id";
  constexpr std::string_view kOneEndpoint =
      "SELECT id, unix_ms, endpoint, kind, actor, message FROM (SELECT * FROM events WHERE id > ? "
      "AND endpoint = ? ORDER BY id DESC LIMIT ?) ORDER BY id";
  const auto bounded_limit = static_cast<int64_t>(
      std::min<size_t>(limit, static_cast<size_t>(std::numeric_limits<int64_t>::max())));
  Stmt stmt;
  if (endpoint.empty()) {
    FLOTILLA_ASSIGN_OR_RETURN(stmt, prepare(db_, kAll, what));
    FLOTILLA_RETURN_IF_ERROR(bind_all(db_, stmt.get(), what, after_id, bounded_limit));
  } else {
    FLOTILLA_ASSIGN_OR_RETURN(stmt, prepare(db_, kOneEndpoint, what));
    FLOTILLA_RETURN_IF_ERROR(bind_all(db_, stmt.get(), what, after_id, endpoint, bounded_limit));
  }
  std::vector<EventRow> events;
  FLOTILLA_RETURN_IF_ERROR(for_each_row(db_, stmt.get(), what, [&](sqlite3_stmt* row) {
    EventRow event;
    event.id = sqlite3_column_int64(row, 0);
    event.unix_ms = sqlite3_column_int64(row, 1);
    event.endpoint = column_text(row, 2);
    event.kind = column_text(row, 3);
    event.actor = column_text(row, 4);
    event.message = column_text(row, 5);
    events.push_back(std::move(event));
    return Status::ok();
  }));
  return events;
}

}  // namespace flotilla::control

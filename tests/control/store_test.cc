#include "control/store.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>

namespace flotilla::control {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using namespace std::string_literals;

// Runs `sql` on the file with the plain SQLite API, beside the Store, and returns the first
// column of the last row as text ("" for none).
std::string raw_query(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::string last;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) ==
      SQLITE_OK) {
    sqlite3_exec(
        db, sql.c_str(),
        [](void* out, int columns, char** values, char**) {
          *static_cast<std::string*>(out) = columns > 0 && values[0] != nullptr ? values[0] : "";
          return 0;
        },
        &last, nullptr);
  }
  sqlite3_close(db);
  return last;
}

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/flotilla_store_test_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    path_ = (dir_ / "control.db").string();
    reopen();
  }
  void TearDown() override {
    store_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void reopen() {
    store_.reset();
    Result<std::unique_ptr<Store>> opened = Store::open(path_);
    ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
    store_ = std::move(opened).value();
  }

  static EndpointRecord endpoint(const std::string& name, int64_t unix_ms) {
    return {name, R"({"name":")" + name + R"("})", "", unix_ms, unix_ms};
  }

  static TokenRow token(const std::string& id, std::vector<std::string> endpoints, bool admin) {
    TokenRow row;
    row.record.id = id;
    row.record.salt = std::string(32, 'a');
    row.record.sha256 = std::string(64, 'b');
    row.record.endpoints = std::move(endpoints);
    row.admin = admin;
    row.comment = "made for " + id;
    row.created_unix_ms = 1700000000000;
    return row;
  }

  static EventRow event(const std::string& endpoint, const std::string& kind, int64_t unix_ms) {
    EventRow row;
    row.unix_ms = unix_ms;
    row.endpoint = endpoint;
    row.kind = kind;
    row.actor = "reconciler";
    row.message = kind + " " + endpoint;
    return row;
  }

  // The ids of list_events(endpoint, limit, after_id), asserting success.
  std::vector<int64_t> event_ids(const std::string& endpoint, size_t limit, int64_t after_id = 0) {
    Result<std::vector<EventRow>> events = store_->list_events(endpoint, limit, after_id);
    EXPECT_TRUE(events.is_ok()) << events.status().to_string();
    std::vector<int64_t> ids;
    if (events.is_ok()) {
      for (const EventRow& row : events.value()) {
        ids.push_back(row.id);
      }
    }
    return ids;
  }

  std::filesystem::path dir_;
  std::string path_;
  std::unique_ptr<Store> store_;
};

// ---- Opening ------------------------------------------------------------------------------------

TEST_F(StoreTest, CreatesSchemaVersionThreeInWalMode) {
  EXPECT_EQ(raw_query(path_, "PRAGMA user_version"), "3");
  EXPECT_EQ(raw_query(path_, "PRAGMA journal_mode"), "wal");
  EXPECT_EQ(raw_query(path_,
                      "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN "
                      "('endpoints', 'replicas', 'tokens', 'events', 'autoscaler_state', "
                      "'demand_history')"),
            "6");
}

TEST_F(StoreTest, UpgradesAVersionOneDatabaseKeepingItsData) {
  store_.reset();
  const std::string path = (dir_ / "v1.db").string();
  raw_query(path,
            "CREATE TABLE endpoints (name TEXT PRIMARY KEY NOT NULL, spec_json TEXT NOT NULL, "
            "serving_json TEXT NOT NULL, created_unix_ms INTEGER NOT NULL, updated_unix_ms "
            "INTEGER NOT NULL); CREATE TABLE replicas (id TEXT PRIMARY KEY NOT NULL, endpoint "
            "TEXT NOT NULL, json TEXT NOT NULL); CREATE TABLE tokens (id TEXT PRIMARY KEY NOT "
            "NULL, salt TEXT NOT NULL, sha256 TEXT NOT NULL, endpoints_json TEXT NOT NULL, admin "
            "INTEGER NOT NULL, comment TEXT NOT NULL, created_unix_ms INTEGER NOT NULL); CREATE "
            "TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, unix_ms INTEGER NOT NULL, "
            "endpoint TEXT NOT NULL, kind TEXT NOT NULL, actor TEXT NOT NULL, message TEXT NOT "
            "NULL); INSERT INTO endpoints VALUES ('fraud', '{}', '', 1, 2); "
            "PRAGMA user_version = 1;");
  Result<std::unique_ptr<Store>> opened = Store::open(path);
  ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
  EXPECT_EQ(raw_query(path, "PRAGMA user_version"), "3");
  Result<std::vector<EndpointRecord>> endpoints = opened.value()->list_endpoints();
  ASSERT_TRUE(endpoints.is_ok());
  ASSERT_EQ(endpoints->size(), 1u);
  EXPECT_EQ(endpoints->front().name, "fraud");
  EXPECT_TRUE(opened.value()->put_autoscaler_state("fraud", "{}").is_ok());
  EXPECT_TRUE(opened.value()->put_demand("fraud", {{60'000, 4}}, 0).is_ok());
}

TEST_F(StoreTest, DemandHistoryIsKeptPrunedAndGoesWithTheEndpoint) {
  EXPECT_EQ(store_->put_demand("fraud", {{0, 1}}, 0).code(), StatusCode::kNotFound);
  ASSERT_TRUE(store_->create_endpoint(endpoint("fraud", 10)).is_ok());
  ASSERT_TRUE(store_->create_endpoint(endpoint("churn", 10)).is_ok());
  ASSERT_TRUE(store_->put_demand("fraud", {{0, 1.5}, {60'000, 4}, {120'000, 2}}, 0).is_ok());
  ASSERT_TRUE(store_->put_demand("churn", {{60'000, 9}}, 0).is_ok());
  // A bucket written again is replaced; those before the retention go.
  ASSERT_TRUE(store_->put_demand("fraud", {{120'000, 3}, {180'000, 5}}, 60'000).is_ok());
  reopen();
  auto fraud = store_->list_demand("fraud");
  ASSERT_TRUE(fraud.is_ok());
  EXPECT_THAT(fraud.value(), ElementsAre(DemandBucket{60'000, 4}, DemandBucket{120'000, 3},
                                         DemandBucket{180'000, 5}));
  ASSERT_TRUE(store_->delete_endpoint("fraud").is_ok());
  fraud = store_->list_demand("fraud");
  ASSERT_TRUE(fraud.is_ok());
  EXPECT_TRUE(fraud->empty());
  auto churn = store_->list_demand("churn");
  ASSERT_TRUE(churn.is_ok());
  EXPECT_THAT(churn.value(), ElementsAre(DemandBucket{60'000, 9}));
}

TEST_F(StoreTest, AutoscalerStateBelongsToAnExistingEndpointAndGoesWithIt) {
  EXPECT_EQ(store_->put_autoscaler_state("fraud", R"({"target":4})").code(), StatusCode::kNotFound);
  ASSERT_TRUE(store_->create_endpoint(endpoint("fraud", 10)).is_ok());
  ASSERT_TRUE(store_->create_endpoint(endpoint("churn", 10)).is_ok());
  ASSERT_TRUE(store_->put_autoscaler_state("fraud", R"({"target":4})").is_ok());
  ASSERT_TRUE(store_->put_autoscaler_state("fraud", R"({"target":3})").is_ok());  // replaced
  ASSERT_TRUE(store_->put_autoscaler_state("churn", R"({"target":8})").is_ok());
  reopen();
  auto states = store_->list_autoscaler_states();
  ASSERT_TRUE(states.is_ok());
  EXPECT_EQ(states.value(), (std::map<std::string, std::string>{{"churn", R"({"target":8})"},
                                                                {"fraud", R"({"target":3})"}}));
  ASSERT_TRUE(store_->delete_endpoint("fraud").is_ok());
  states = store_->list_autoscaler_states();
  ASSERT_TRUE(states.is_ok());
  EXPECT_EQ(states.value(), (std::map<std::string, std::string>{{"churn", R"({"target":8})"}}));
  EXPECT_EQ(store_->delete_endpoint("fraud").code(), StatusCode::kNotFound);
}

TEST_F(StoreTest, OpeningInAMissingDirectoryFailsNamingThePath) {
  const std::string path = (dir_ / "no" / "such" / "dir" / "control.db").string();
  Result<std::unique_ptr<Store>> opened = Store::open(path);
  ASSERT_FALSE(opened.is_ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(opened.status().message(), HasSubstr("'" + path + "'"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "no"));
}

TEST_F(StoreTest, RefusesANewerSchemaVersionAndLeavesTheFileAlone) {
  store_.reset();
  const std::string path = (dir_ / "newer.db").string();
  raw_query(path, "CREATE TABLE future (x INTEGER); PRAGMA user_version = 99;");
  ASSERT_EQ(raw_query(path, "PRAGMA user_version"), "99");

  Result<std::unique_ptr<Store>> opened = Store::open(path);
  ASSERT_FALSE(opened.is_ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(opened.status().message(), HasSubstr("'" + path + "'"));
  EXPECT_THAT(opened.status().message(), HasSubstr("schema version 99"));
  EXPECT_EQ(raw_query(path, "PRAGMA user_version"), "99");
  EXPECT_EQ(raw_query(path, "SELECT count(*) FROM sqlite_master WHERE name = 'endpoints'"), "0");
  EXPECT_EQ(raw_query(path, "PRAGMA journal_mode"), "delete");
}

TEST_F(StoreTest, RefusesAFileThatIsNotADatabase) {
  const std::string path = (dir_ / "garbage.db").string();
  std::ofstream(path) << std::string(4096, 'x');
  Result<std::unique_ptr<Store>> opened = Store::open(path);
  ASSERT_FALSE(opened.is_ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(opened.status().message(), HasSubstr("'" + path + "'"));
}

TEST_F(StoreTest, ReopeningFindsTheSameData) {
  ASSERT_TRUE(store_->create_endpoint(endpoint("fraud", 10)).is_ok());
  ASSERT_TRUE(store_->put_replica({"r1", "fraud", R"({"pid":42})"}).is_ok());
  ASSERT_TRUE(store_->create_token(token("admin", {}, true)).is_ok());
  Result<int64_t> first = store_->append_event(event("fraud", "created", 10));
  ASSERT_TRUE(first.is_ok());

  reopen();
  EXPECT_EQ(raw_query(path_, "PRAGMA user_version"), "3");
  Result<std::vector<EndpointRecord>> endpoints = store_->list_endpoints();
  ASSERT_TRUE(endpoints.is_ok());
  EXPECT_THAT(endpoints.value(), ElementsAre(endpoint("fraud", 10)));
  Result<std::vector<ReplicaRecord>> replicas = store_->list_replicas();
  ASSERT_TRUE(replicas.is_ok());
  EXPECT_THAT(replicas.value(), ElementsAre(ReplicaRecord{"r1", "fraud", R"({"pid":42})"}));
  Result<std::vector<TokenRow>> tokens = store_->list_tokens();
  ASSERT_TRUE(tokens.is_ok());
  EXPECT_THAT(tokens.value(), ElementsAre(token("admin", {}, true)));
  Result<std::vector<EventRow>> events = store_->list_events("", 10);
  ASSERT_TRUE(events.is_ok());
  EventRow expected = event("fraud", "created", 10);
  expected.id = first.value();
  EXPECT_THAT(events.value(), ElementsAre(expected));

  // Ids keep increasing across a restart.
  Result<int64_t> second = store_->append_event(event("fraud", "updated", 11));
  ASSERT_TRUE(second.is_ok());
  EXPECT_GT(second.value(), first.value());
}

TEST_F(StoreTest, TwoStoresOnOneFileSeeEachOthersWrites) {
  Result<std::unique_ptr<Store>> other = Store::open(path_);
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  ASSERT_TRUE(store_->create_endpoint(endpoint("a", 1)).is_ok());
  Result<std::optional<EndpointRecord>> seen = other.value()->get_endpoint("a");
  ASSERT_TRUE(seen.is_ok());
  EXPECT_EQ(seen.value(), endpoint("a", 1));
  EXPECT_EQ(other.value()->create_endpoint(endpoint("a", 2)).code(),
            StatusCode::kFailedPrecondition);
}

// ---- Endpoints ----------------------------------------------------------------------------------

TEST_F(StoreTest, CreatesAndGetsAnEndpoint) {
  EndpointRecord record = endpoint("fraud", 1000);
  record.serving_json = R"({"name":"fraud","served_models":[]})";
  ASSERT_TRUE(store_->create_endpoint(record).is_ok());
  Result<std::optional<EndpointRecord>> got = store_->get_endpoint("fraud");
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got.value(), record);
}

TEST_F(StoreTest, GettingAMissingEndpointGivesNothing) {
  Result<std::optional<EndpointRecord>> got = store_->get_endpoint("missing");
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got.value(), std::nullopt);
}

TEST_F(StoreTest, CreatingAnExistingEndpointFailsAndKeepsTheFirst) {
  ASSERT_TRUE(store_->create_endpoint(endpoint("fraud", 1)).is_ok());
  const Status status = store_->create_endpoint(endpoint("fraud", 2));
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(), "endpoint 'fraud' already exists");
  Result<std::optional<EndpointRecord>> got = store_->get_endpoint("fraud");
  ASSERT_TRUE(got.is_ok());
  EXPECT_EQ(got.value(), endpoint("fraud", 1));
}

TEST_F(StoreTest, UpdatesAnEndpoint) {
  ASSERT_TRUE(store_->create_endpoint(endpoint("fraud", 1)).is_ok());
  EndpointRecord updated = endpoint("fraud", 1);
  updated.spec_json = R"({"name":"fraud","v":2})";
  updated.serving_json = R"({"name":"fraud","v":1})";
  updated.updated_unix_ms = 5;
  ASSERT_TRUE(store_->update_endpoint(updated).is_ok());
  Result<std::optional<EndpointRecord>> got = store_->get_endpoint("fraud");
  ASSERT_TRUE(got.is_ok());
  EXPECT_EQ(got.value(), updated);
}

TEST_F(StoreTest, UpdatingAMissingEndpointIsNotFound) {
  ASSERT_TRUE(store_->create_endpoint(endpoint("other", 1)).is_ok());
  const Status status = store_->update_endpoint(endpoint("fraud", 1));
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "endpoint 'fraud' not found");
  Result<std::optional<EndpointRecord>> got = store_->get_endpoint("fraud");
  ASSERT_TRUE(got.is_ok());
  EXPECT_EQ(got.value(), std::nullopt);
}

TEST_F(StoreTest, DeletesAnEndpoint) {
  ASSERT_TRUE(store_->create_endpoint(endpoint("fraud", 1)).is_ok());
  ASSERT_TRUE(store_->create_endpoint(endpoint("keep", 1)).is_ok());
  ASSERT_TRUE(store_->delete_endpoint("fraud").is_ok());
  Result<std::optional<EndpointRecord>> got = store_->get_endpoint("fraud");
  ASSERT_TRUE(got.is_ok());
  EXPECT_EQ(got.value(), std::nullopt);
  const Status again = store_->delete_endpoint("fraud");
  EXPECT_EQ(again.code(), StatusCode::kNotFound);
  EXPECT_EQ(again.message(), "endpoint 'fraud' not found");
  Result<std::vector<EndpointRecord>> left = store_->list_endpoints();
  ASSERT_TRUE(left.is_ok());
  EXPECT_THAT(left.value(), ElementsAre(endpoint("keep", 1)));
  // The name can be used again.
  EXPECT_TRUE(store_->create_endpoint(endpoint("fraud", 2)).is_ok());
}

TEST_F(StoreTest, ListsEndpointsByName) {
  Result<std::vector<EndpointRecord>> empty = store_->list_endpoints();
  ASSERT_TRUE(empty.is_ok());
  EXPECT_THAT(empty.value(), IsEmpty());
  for (const char* name : {"charlie", "alpha", "bravo"}) {
    ASSERT_TRUE(store_->create_endpoint(endpoint(name, 1)).is_ok());
  }
  Result<std::vector<EndpointRecord>> listed = store_->list_endpoints();
  ASSERT_TRUE(listed.is_ok());
  EXPECT_THAT(listed.value(),
              ElementsAre(endpoint("alpha", 1), endpoint("bravo", 1), endpoint("charlie", 1)));
}

TEST_F(StoreTest, StoresTextThatLooksLikeSqlAsData) {
  EndpointRecord record = endpoint("x'); DROP TABLE endpoints; --", 1);
  record.spec_json = "quote ' double \" nul \0 after é"s;
  ASSERT_TRUE(store_->create_endpoint(record).is_ok());
  Result<std::optional<EndpointRecord>> got = store_->get_endpoint(record.name);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(got.value(), record);
}

// ---- Replicas -----------------------------------------------------------------------------------

TEST_F(StoreTest, PutsListsAndDeletesReplicas) {
  ASSERT_TRUE(store_->put_replica({"r2", "fraud", R"({"pid":2})"}).is_ok());
  ASSERT_TRUE(store_->put_replica({"r1", "fraud", R"({"pid":1})"}).is_ok());
  ASSERT_TRUE(store_->put_replica({"r3", "other", R"({"pid":3})"}).is_ok());
  // Same id: replaced, not added.
  ASSERT_TRUE(store_->put_replica({"r2", "fraud", R"({"pid":2,"state":"ready"})"}).is_ok());

  Result<std::vector<ReplicaRecord>> listed = store_->list_replicas();
  ASSERT_TRUE(listed.is_ok());
  EXPECT_THAT(listed.value(),
              ElementsAre(ReplicaRecord{"r1", "fraud", R"({"pid":1})"},
                          ReplicaRecord{"r2", "fraud", R"({"pid":2,"state":"ready"})"},
                          ReplicaRecord{"r3", "other", R"({"pid":3})"}));

  ASSERT_TRUE(store_->delete_replica("r2").is_ok());
  EXPECT_TRUE(store_->delete_replica("r2").is_ok());  // absent: ok
  EXPECT_TRUE(store_->delete_replica("never").is_ok());
  listed = store_->list_replicas();
  ASSERT_TRUE(listed.is_ok());
  EXPECT_THAT(listed.value(), ElementsAre(ReplicaRecord{"r1", "fraud", R"({"pid":1})"},
                                          ReplicaRecord{"r3", "other", R"({"pid":3})"}));
}

// ---- Tokens -------------------------------------------------------------------------------------

TEST_F(StoreTest, CreatesListsAndDeletesTokens) {
  TokenRow scoped = token("ci", {"fraud", "churn"}, false);
  scoped.comment = "it's \"quoted\"; DROP TABLE tokens; --";
  const TokenRow admin = token("admin", {}, true);
  const TokenRow single = token("bot", {"fraud"}, false);
  ASSERT_TRUE(store_->create_token(scoped).is_ok());
  ASSERT_TRUE(store_->create_token(admin).is_ok());
  ASSERT_TRUE(store_->create_token(single).is_ok());

  Result<std::vector<TokenRow>> listed = store_->list_tokens();
  ASSERT_TRUE(listed.is_ok()) << listed.status().to_string();
  EXPECT_THAT(listed.value(), ElementsAre(admin, single, scoped));
  EXPECT_EQ(raw_query(path_, "SELECT endpoints_json FROM tokens WHERE id = 'ci'"),
            R"(["fraud","churn"])");

  ASSERT_TRUE(store_->delete_token("bot").is_ok());
  listed = store_->list_tokens();
  ASSERT_TRUE(listed.is_ok());
  EXPECT_THAT(listed.value(), ElementsAre(admin, scoped));
}

TEST_F(StoreTest, CreatingADuplicateTokenFails) {
  ASSERT_TRUE(store_->create_token(token("ci", {}, false)).is_ok());
  const Status status = store_->create_token(token("ci", {"fraud"}, true));
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(), "token 'ci' already exists");
  Result<std::vector<TokenRow>> listed = store_->list_tokens();
  ASSERT_TRUE(listed.is_ok());
  EXPECT_THAT(listed.value(), ElementsAre(token("ci", {}, false)));
}

TEST_F(StoreTest, DeletingAMissingTokenIsNotFound) {
  const Status status = store_->delete_token("ghost");
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "token 'ghost' not found");
}

TEST_F(StoreTest, ReportsACorruptTokenScope) {
  ASSERT_TRUE(store_->create_token(token("ci", {"a"}, false)).is_ok());
  raw_query(path_, "UPDATE tokens SET endpoints_json = 'not json' WHERE id = 'ci'");
  Result<std::vector<TokenRow>> listed = store_->list_tokens();
  ASSERT_FALSE(listed.is_ok());
  EXPECT_EQ(listed.status().code(), StatusCode::kInternal);
  EXPECT_THAT(listed.status().message(), HasSubstr("token 'ci'"));
}

// ---- Events -------------------------------------------------------------------------------------

TEST_F(StoreTest, AppendsEventsWithIncreasingIds) {
  int64_t last = 0;
  for (int i = 0; i < 5; ++i) {
    Result<int64_t> id = store_->append_event(event("fraud", "tick", i));
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    EXPECT_GT(id.value(), last);
    last = id.value();
  }
  Result<std::vector<EventRow>> events = store_->list_events("fraud", 1);
  ASSERT_TRUE(events.is_ok());
  ASSERT_EQ(events.value().size(), 1u);
  EventRow expected = event("fraud", "tick", 4);
  expected.id = last;
  EXPECT_EQ(events.value()[0], expected);
}

TEST_F(StoreTest, ListsTheNewestEventsOldestFirst) {
  // Ids 1..7 on a fresh database: a, b, a, "", a, b, a.
  const std::vector<std::string> endpoints = {"a", "b", "a", "", "a", "b", "a"};
  std::vector<int64_t> ids;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    Result<int64_t> id =
        store_->append_event(event(endpoints[i], "tick", 100 + static_cast<int64_t>(i)));
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    ids.push_back(id.value());
  }
  ASSERT_EQ(ids, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));

  EXPECT_EQ(event_ids("", 100), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(event_ids("", 3), (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(event_ids("", 0), (std::vector<int64_t>{}));
  EXPECT_EQ(event_ids("a", 100), (std::vector<int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(event_ids("a", 2), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(event_ids("b", 100), (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(event_ids("none", 100), (std::vector<int64_t>{}));
  // after_id: only larger ids, still the newest `limit` of them.
  EXPECT_EQ(event_ids("", 100, 4), (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(event_ids("", 2, 3), (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(event_ids("a", 100, 3), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(event_ids("a", 100, 7), (std::vector<int64_t>{}));
  EXPECT_EQ(event_ids("", SIZE_MAX, 0).size(), 7u);

  Result<std::vector<EventRow>> platform = store_->list_events("", 100, 3);
  ASSERT_TRUE(platform.is_ok());
  ASSERT_FALSE(platform.value().empty());
  EventRow expected = event("", "tick", 103);
  expected.id = 4;
  EXPECT_EQ(platform.value()[0], expected);
}

TEST_F(StoreTest, PrunesEventsOlderThanTheNewestHundredThousand) {
  // Rather than appending 100,000 events, plant two rows far apart: the append after them has
  // id 200,001 and must delete every id up to 100,001.
  ASSERT_TRUE(store_->append_event(event("a", "old", 1)).is_ok());  // id 1
  raw_query(path_,
            "INSERT INTO events (id, unix_ms, endpoint, kind, actor, message) VALUES "
            "(100001, 2, 'a', 'edge', 'x', 'm'), (100002, 3, 'a', 'kept', 'x', 'm'), "
            "(200000, 4, 'a', 'recent', 'x', 'm')");
  Result<int64_t> id = store_->append_event(event("a", "new", 5));
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  EXPECT_EQ(id.value(), 200001);
  EXPECT_EQ(event_ids("", 1000), (std::vector<int64_t>{100002, 200000, 200001}));
}

TEST_F(StoreTest, SerializesCallsFromSeveralThreads) {
  constexpr size_t kThreads = 4;
  constexpr int kPerThread = 25;
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  std::vector<std::vector<int64_t>> ids(kThreads);
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t, &ids] {
      for (int i = 0; i < kPerThread; ++i) {
        Result<int64_t> id = store_->append_event(event("e" + std::to_string(t), "tick", i));
        ids[t].push_back(id.is_ok() ? id.value() : -1);
        const Status put =
            store_->put_replica({"r" + std::to_string(t) + "-" + std::to_string(i), "e", "{}"});
        EXPECT_TRUE(put.is_ok()) << put.to_string();
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  std::vector<int64_t> all;
  for (const std::vector<int64_t>& mine : ids) {
    // Each thread sees its own ids increase.
    EXPECT_TRUE(std::is_sorted(mine.begin(), mine.end()));
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(kThreads * kPerThread);
  for (size_t i = 0; i < expected.size(); ++i) {
    expected[i] = static_cast<int64_t>(i) + 1;
  }
  EXPECT_EQ(all, expected);
  Result<std::vector<ReplicaRecord>> replicas = store_->list_replicas();
  ASSERT_TRUE(replicas.is_ok());
  EXPECT_EQ(replicas.value().size(), kThreads * kPerThread);
}

}  // namespace
}  // namespace flotilla::control

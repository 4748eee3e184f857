// The inference tables' writer and reader (inference_log.h): files per endpoint and period,
// closed files renamed and never written again, retention, the bounded buffer, and what a
// capture keeps of a call.
#include "gateway/inference_log.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <zlib.h>

#include "fakes/common/fake_clock.h"
#include "gateway/gateway.h"

namespace flotilla::gateway {
namespace {

namespace fs = std::filesystem;
using flotilla::testing::FakeClock;
using nlohmann::json;

class InferenceLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("flotilla-inference-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  InferenceRecord record(const std::string& endpoint, int status, std::string request = "{}",
                         std::string response = "{}") {
    InferenceRecord r;
    r.unix_ms = clock_.unix_ms();
    r.endpoint = endpoint;
    r.version = "v1";
    r.replica = "r1";
    r.request_id = "req-" + std::to_string(++requests_);
    r.method = "POST";
    r.path = "/serving-endpoints/" + endpoint + "/invocations";
    r.status = status;
    r.latency_ms = 1.5;
    r.retention_s = 86'400;
    r.capture = std::make_unique<InferenceCapture>(16);
    r.capture->protocol = "mlflow";
    r.capture->add_request(request);
    r.capture->add_response(response);
    return r;
  }

  std::vector<json> read_all(const std::string& endpoint) {
    std::vector<json> lines;
    for (const std::string& file : inference_table_files(dir_.string(), endpoint)) {
      Status read = read_inference_file(file, [&](std::string_view line) {
        lines.push_back(json::parse(line));
        return true;
      });
      EXPECT_TRUE(read.is_ok()) << read.message();
    }
    return lines;
  }

  std::vector<std::string> names(const std::string& endpoint) {
    std::vector<std::string> out;
    for (const std::string& file : inference_table_files(dir_.string(), endpoint)) {
      out.push_back(fs::path(file).filename().string());
    }
    return out;
  }

  FakeClock clock_;
  fs::path dir_;
  int requests_ = 0;
};

TEST_F(InferenceLogTest, WritesRecordsThatAReaderSeesWhileTheFileIsOpen) {
  InferenceLog log({dir_.string(), std::chrono::seconds(3'600), 1 << 20}, clock_);
  ASSERT_TRUE(log.offer(record("fraud", 200, R"({"instances": [[1, 2, 3, 4, 5, 6]]})")));
  ASSERT_TRUE(log.offer(record("fraud", 503)));
  ASSERT_TRUE(log.offer(record("other", 200)));
  log.flush();
  const std::string pid = std::to_string(::getpid());
  EXPECT_EQ(names("fraud"),
            std::vector<std::string>{"20260101T000000Z-" + pid + ".jsonl.gz.partial"});
  const std::vector<json> fraud = read_all("fraud");
  ASSERT_EQ(fraud.size(), 2u);
  EXPECT_EQ(fraud[0]["endpoint"], "fraud");
  EXPECT_EQ(fraud[0]["status"], 200);
  EXPECT_EQ(fraud[0]["protocol"], "mlflow");
  EXPECT_EQ(fraud[0]["request_id"], "req-1");
  EXPECT_EQ(fraud[0]["trace_id"], nullptr);
  EXPECT_EQ(fraud[0]["request"]["body"], R"({"instances": [[)");  // cut at 16 bytes
  EXPECT_EQ(fraud[0]["request"]["bytes"], 35);
  EXPECT_EQ(fraud[0]["request"]["truncated"], true);
  EXPECT_EQ(fraud[0]["response"]["body"], "{}");
  EXPECT_EQ(fraud[0]["response"]["truncated"], false);
  EXPECT_EQ(fraud[1]["status"], 503);
  EXPECT_EQ(read_all("other").size(), 1u);
}

TEST_F(InferenceLogTest, ClosesAFileWhenItsPeriodEndsAndNeverWritesItAgain) {
  const std::string pid = std::to_string(::getpid());
  {
    InferenceLog log({dir_.string(), std::chrono::seconds(60), 1 << 20}, clock_);
    ASSERT_TRUE(log.offer(record("fraud", 200)));
    log.flush();
    clock_.advance(std::chrono::seconds(61));
    ASSERT_TRUE(log.offer(record("fraud", 201)));
    log.flush();
    EXPECT_EQ(names("fraud"),
              (std::vector<std::string>{"20260101T000000Z-" + pid + ".jsonl.gz",
                                        "20260101T000100Z-" + pid + ".jsonl.gz.partial"}));
    const std::vector<json> both = read_all("fraud");
    ASSERT_EQ(both.size(), 2u);
    EXPECT_EQ(both[0]["status"], 200);
    EXPECT_EQ(both[1]["status"], 201);
  }
  // Stopping closes the open file too.
  EXPECT_EQ(names("fraud"), (std::vector<std::string>{"20260101T000000Z-" + pid + ".jsonl.gz",
                                                      "20260101T000100Z-" + pid + ".jsonl.gz"}));
  EXPECT_EQ(read_all("fraud").size(), 2u);
}

TEST_F(InferenceLogTest, DeletesClosedFilesPastTheRetentionOnly) {
  const fs::path endpoint_dir = dir_ / "fraud";
  fs::create_directories(endpoint_dir);
  const auto old_time = fs::file_time_type::clock::now() - std::chrono::hours(48);
  for (const char* name : {"20251201T000000Z-1.jsonl.gz", "20251201T000000Z-2.jsonl.gz.partial"}) {
    std::ofstream(endpoint_dir / name) << "x";
    fs::last_write_time(endpoint_dir / name, old_time);
  }
  std::ofstream(endpoint_dir / "20251202T000000Z-1.jsonl.gz") << "x";  // recent
  InferenceLog log({dir_.string(), std::chrono::seconds(3'600), 1 << 20}, clock_);
  ASSERT_TRUE(log.offer(record("fraud", 200)));  // retention 1 day
  clock_.advance(std::chrono::seconds(61));      // a prune is due
  log.flush();
  EXPECT_FALSE(fs::exists(endpoint_dir / "20251201T000000Z-1.jsonl.gz"));
  EXPECT_TRUE(fs::exists(endpoint_dir / "20251201T000000Z-2.jsonl.gz.partial"));
  EXPECT_TRUE(fs::exists(endpoint_dir / "20251202T000000Z-1.jsonl.gz"));
}

TEST_F(InferenceLogTest, AFullBufferDropsTheRecordInsteadOfWaiting) {
  InferenceLog log({dir_.string(), std::chrono::seconds(3'600), /*max_buffer_bytes=*/64}, clock_);
  EXPECT_FALSE(log.offer(record("fraud", 200)));  // bigger than the whole buffer
  log.flush();
  EXPECT_TRUE(read_all("fraud").empty());
}

TEST_F(InferenceLogTest, ReadingSkipsACutTailAndRefusesWhatIsNotGzip) {
  const fs::path endpoint_dir = dir_ / "fraud";
  fs::create_directories(endpoint_dir);
  const std::string path = (endpoint_dir / "20260101T000000Z-1.jsonl.gz.partial").string();
  gzFile gz = gzopen(path.c_str(), "wb1");
  ASSERT_NE(gz, nullptr);
  const std::string whole = "{\"status\": 200}\n{\"status\": 201}\n";
  gzwrite(gz, whole.data(), static_cast<unsigned>(whole.size()));
  gzflush(gz, Z_SYNC_FLUSH);
  gzwrite(gz, "{\"status\": 2", 12);  // a record still being written
  gzflush(gz, Z_SYNC_FLUSH);
  gzclose(gz);
  // Cut the trailer and the end of the last block, as a crash mid-write leaves it.
  fs::resize_file(path, fs::file_size(path) - 10);
  std::vector<std::string> lines;
  ASSERT_TRUE(read_inference_file(path, [&](std::string_view line) {
                lines.emplace_back(line);
                return true;
              }).is_ok());
  EXPECT_EQ(lines, (std::vector<std::string>{"{\"status\": 200}", "{\"status\": 201}"}));

  const std::string plain = (endpoint_dir / "20260101T010000Z-1.jsonl.gz").string();
  std::ofstream(plain) << "{\"status\": 200}\n";
  EXPECT_EQ(read_inference_file(plain, [](std::string_view) { return true; }).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(read_inference_file((endpoint_dir / "missing").string(),
                                [](std::string_view) { return true; })
                .code(),
            StatusCode::kNotFound);
  EXPECT_TRUE(inference_table_files(dir_.string(), "../etc").empty());
}

TEST(InferenceCaptureTest, AssemblesAStreamAndFindsItsUsage) {
  InferenceCapture capture(1 << 20);
  capture.stream = true;
  capture.add_response("data: {\"choices\": [{\"text\": \"a\"}]}\n\n");
  capture.add_response("data: {\"choices\": [{\"text\": \"b\"}]}\n\ndata: {\"cho");
  capture.add_response(
      "ices\": [], \"usage\": {\"prompt_tokens\": 5, \"completion_tokens\": 2, "
      "\"total_tokens\": 7}}\n\ndata: [DONE]\n\n");
  EXPECT_EQ(capture.stream_events, 3);
  EXPECT_EQ(capture.usage, R"({"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7})");
  InferenceRecord record;
  record.capture = std::make_unique<InferenceCapture>(std::move(capture));
  std::string text;
  append_inference_record_json(record, text);
  const json line = json::parse(text);
  EXPECT_EQ(line["tokens"], json({{"prompt", 5}, {"completion", 2}, {"total", 7}}));
  EXPECT_EQ(line["response"]["stream"], true);
  EXPECT_EQ(line["response"]["stream_events"], 3);
  EXPECT_NE(line["response"]["body"].get<std::string>().find("[DONE]"), std::string::npos);
}

TEST(InferenceCaptureTest, KeepsBodiesUpToTheCapAndTheirWholeSize) {
  InferenceCapture capture(4);
  capture.add_request("abcdefgh");
  capture.add_response("{\"usage\": null}");
  EXPECT_EQ(capture.request, "abcd");
  EXPECT_EQ(capture.request_bytes, 8u);
  EXPECT_EQ(capture.response, "{\"us");
  EXPECT_EQ(capture.response_bytes, 15u);
  EXPECT_TRUE(capture.usage.empty());  // null is no usage
  InferenceCapture none(0);
  none.add_request("abc");
  EXPECT_TRUE(none.request.empty());
  EXPECT_EQ(none.request_bytes, 3u);
}

}  // namespace
}  // namespace flotilla::gateway

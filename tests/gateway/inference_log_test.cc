// The inference tables' writer and reader (inference_log.h): files per endpoint and period,
// closed files renamed and never written again, retention, the bounded buffer, and what a
// capture keeps of a call.
#include "gateway/inference_log.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
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

  // A record's fields, kept here: an InferenceRecord only views them.
  struct Fields {
    int64_t unix_ms = 0;
    std::string endpoint;
    std::string request_id;
    std::string path;
    int status = 0;
    InferenceCapture capture{16};

    InferenceRecord view() const {
      InferenceRecord r;
      r.unix_ms = unix_ms;
      r.endpoint = endpoint;
      r.version = "v1";
      r.replica = "r1";
      r.request_id = request_id;
      r.method = "POST";
      r.path = path;
      r.status = status;
      r.latency_ms = 1.5;
      r.retention_s = 86'400;
      r.capture = &capture;
      return r;
    }
  };

  Fields record(const std::string& endpoint, int status, std::string request = "{}",
                std::string response = "{}") {
    Fields r;
    r.unix_ms = clock_.unix_ms();
    r.endpoint = endpoint;
    r.request_id = "req-" + std::to_string(++requests_);
    r.path = "/serving-endpoints/" + endpoint + "/invocations";
    r.status = status;
    r.capture.protocol = "mlflow";
    r.capture.add_request(request);
    r.capture.add_response(response);
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
  ASSERT_TRUE(log.offer(record("fraud", 200, R"({"instances": [[1, 2, 3, 4, 5, 6]]})").view()));
  ASSERT_TRUE(log.offer(record("fraud", 503).view()));
  ASSERT_TRUE(log.offer(record("other", 200).view()));
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
    ASSERT_TRUE(log.offer(record("fraud", 200).view()));
    log.flush();
    clock_.advance(std::chrono::seconds(61));
    ASSERT_TRUE(log.offer(record("fraud", 201).view()));
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
  ASSERT_TRUE(log.offer(record("fraud", 200).view()));  // retention 1 day
  clock_.advance(std::chrono::seconds(61));             // a prune is due
  log.flush();
  EXPECT_FALSE(fs::exists(endpoint_dir / "20251201T000000Z-1.jsonl.gz"));
  EXPECT_TRUE(fs::exists(endpoint_dir / "20251201T000000Z-2.jsonl.gz.partial"));
  EXPECT_TRUE(fs::exists(endpoint_dir / "20251202T000000Z-1.jsonl.gz"));
}

TEST_F(InferenceLogTest, AFullBufferDropsTheRecordInsteadOfWaiting) {
  {
    InferenceLog tiny({dir_.string(), std::chrono::seconds(3'600), /*max_buffer_bytes=*/64},
                      clock_);
    EXPECT_FALSE(tiny.offer(record("fraud", 200).view()));  // bigger than the whole buffer
    tiny.flush();
  }
  EXPECT_TRUE(read_all("fraud").empty());

  // Room for a few records: the writer drains every 100 ms, so offers in a row fill it; what
  // the writer takes is room again.
  InferenceLog log({dir_.string(), std::chrono::seconds(3'600), /*max_buffer_bytes=*/8 * 1024},
                   clock_);
  int offered = 0;
  while (log.offer(record("fraud", 200).view())) {
    ASSERT_LT(++offered, 1000) << "the buffer never filled";
  }
  EXPECT_GE(offered, 1);
  log.flush();
  EXPECT_TRUE(log.offer(record("fraud", 201).view()));
  log.flush();
  const std::vector<json> lines = read_all("fraud");
  ASSERT_EQ(lines.size(), static_cast<size_t>(offered) + 1);
  EXPECT_EQ(lines.back()["status"], 201);
}

TEST_F(InferenceLogTest, EachThreadsRecordsArriveWholeAndInOrder) {
  InferenceLog log({dir_.string(), std::chrono::seconds(3'600), 64 << 20}, clock_);
  constexpr int kThreads = 4;
  constexpr int kEach = 2'000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&log, t] {
      for (int i = 0; i < kEach; ++i) {
        InferenceCapture capture(1024);
        capture.add_request("{\"thread\": " + std::to_string(t) + "}");
        const std::string request_id = std::to_string(t) + "-" + std::to_string(i);
        InferenceRecord r;
        r.endpoint = t % 2 ? "odd" : "even";
        r.request_id = request_id;
        r.status = 200;
        r.capture = &capture;
        EXPECT_TRUE(log.offer(r));
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  log.flush();
  std::map<int, int> next;  // by thread: the index its next line must have
  for (const char* endpoint : {"even", "odd"}) {
    for (const json& line : read_all(endpoint)) {
      const std::string id = line["request_id"];
      const int thread = std::stoi(id.substr(0, id.find('-')));
      EXPECT_EQ(line["endpoint"], thread % 2 ? "odd" : "even");
      EXPECT_EQ(std::stoi(id.substr(id.find('-') + 1)), next[thread]++) << id;
    }
  }
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(next[t], kEach) << "thread " << t;
  }
}

TEST_F(InferenceLogTest, AClosedFileIsOneWholeGzipMember) {
  {
    InferenceLog log({dir_.string(), std::chrono::seconds(3'600), 1 << 20}, clock_);
    for (int i = 0; i < 100; ++i) {
      ASSERT_TRUE(log.offer(record("fraud", 200).view()));
      if (i % 10 == 0) {
        log.flush();  // a sync flush between batches, as every second
      }
    }
  }
  const std::vector<std::string> files = inference_table_files(dir_.string(), "fraud");
  ASSERT_EQ(files.size(), 1u);
  ASSERT_TRUE(files[0].ends_with(".jsonl.gz"));
  // zlib inflates it to its end, checking gzip's CRC and length trailer, with nothing after.
  std::ifstream in(files[0], std::ios::binary);
  std::string compressed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  z_stream stream{};
  ASSERT_EQ(inflateInit2(&stream, 16 + MAX_WBITS), Z_OK);
  std::string text(1 << 20, '\0');
  stream.next_in = reinterpret_cast<Bytef*>(compressed.data());
  stream.avail_in = static_cast<uInt>(compressed.size());
  stream.next_out = reinterpret_cast<Bytef*>(text.data());
  stream.avail_out = static_cast<uInt>(text.size());
  EXPECT_EQ(inflate(&stream, Z_FINISH), Z_STREAM_END);
  EXPECT_EQ(stream.avail_in, 0u);
  text.resize(stream.total_out);
  inflateEnd(&stream);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 100);
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
  record.capture = &capture;
  const json line = json::parse(inference_record_json(record));
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

  // A whole response is viewed, not copied, with the same cap, size and usage.
  InferenceCapture viewed(8);
  const std::string body = R"({"x": 1, "usage": {"prompt_tokens": 3}})";
  viewed.view_response(body);
  EXPECT_TRUE(viewed.response.empty());
  EXPECT_EQ(viewed.kept_response(), "{\"x\": 1,");
  EXPECT_EQ(viewed.kept_response().data(), body.data());
  EXPECT_EQ(viewed.response_bytes, body.size());
  InferenceRecord record;
  record.capture = &viewed;
  const json line = json::parse(inference_record_json(record));
  EXPECT_EQ(line["response"]["body"], "{\"x\": 1,");
  EXPECT_EQ(line["response"]["bytes"], body.size());
  EXPECT_EQ(line["response"]["truncated"], true);
  EXPECT_EQ(line["tokens"], json({{"prompt", 3}}));
}

}  // namespace
}  // namespace flotilla::gateway

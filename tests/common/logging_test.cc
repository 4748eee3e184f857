#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "common/common_logging.h"

namespace flotilla {
namespace {

// A logger writing JSON lines into a string, with the fields of `process`.
class JsonLines {
 public:
  explicit JsonLines(LogFields process)
      : logger_("test", std::make_shared<spdlog::sinks::ostream_sink_st>(out_)) {
    logger_.set_formatter(make_json_log_formatter(std::move(process)));
  }
  spdlog::logger& logger() { return logger_; }

  // Every line written so far, parsed; a line that is not one JSON object fails the test.
  std::vector<nlohmann::ordered_json> lines() {
    std::vector<nlohmann::ordered_json> parsed;
    std::istringstream in(out_.str());
    for (std::string line; std::getline(in, line);) {
      nlohmann::ordered_json object =
          nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
      EXPECT_TRUE(object.is_object()) << line;
      parsed.push_back(std::move(object));
    }
    return parsed;
  }

 private:
  std::ostringstream out_;
  spdlog::logger logger_;
};

TEST(LoggingTest, RejectsUnknownLevelOrFormat) {
  EXPECT_TRUE(init_logging("warn").is_ok());
  EXPECT_TRUE(init_logging("off", "json", {.component = "test"}).is_ok());
  EXPECT_FALSE(init_logging("loud").is_ok());
  Status format = init_logging("info", "xml");
  EXPECT_FALSE(format.is_ok());
  EXPECT_NE(format.message().find("use json or text"), std::string::npos) << format.message();
  EXPECT_TRUE(init_logging("warn", "text").is_ok());
}

TEST(LoggingTest, JsonLineCarriesTimeLevelProcessFieldsAndMessage) {
  JsonLines sink({.component = "replica", .endpoint = "fraud", .replica = "fraud-1-abc"});
  // Quotes, a newline and a backslash stay inside the one line's message.
  sink.logger().warn("model \"{}\" at {}\nsecond line \\", "m", 3);
  const std::vector<nlohmann::ordered_json> lines = sink.lines();
  ASSERT_EQ(lines.size(), 1u);
  const nlohmann::ordered_json& line = lines[0];
  std::vector<std::string> keys;
  for (const auto& [key, value] : line.items()) {
    keys.push_back(key);
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"time", "level", "component", "endpoint", "replica",
                                            "message"}));
  EXPECT_TRUE(std::regex_match(line["time"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")))
      << line["time"];
  EXPECT_EQ(line["level"], "warning");
  EXPECT_EQ(line["component"], "replica");
  EXPECT_EQ(line["endpoint"], "fraud");
  EXPECT_EQ(line["replica"], "fraud-1-abc");
  EXPECT_EQ(line["message"], "model \"m\" at 3\nsecond line \\");
}

TEST(LoggingTest, ScopesAddFieldsOnTheirThreadOnlyAndNest) {
  JsonLines sink({.component = "gateway"});
  sink.logger().info("before");
  {
    LogScope request({.endpoint = "llm", .request_id = "req-1"});
    sink.logger().info("in the request");
    {
      LogScope attempt({.replica = "llm-v1-x"});
      sink.logger().info("an attempt");
      std::thread([&] { sink.logger().info("another thread"); }).join();
    }
    sink.logger().info("after the attempt");
  }
  sink.logger().info("after");
  const std::vector<nlohmann::ordered_json> lines = sink.lines();
  ASSERT_EQ(lines.size(), 6u);
  auto field = [](const nlohmann::ordered_json& line, const char* key) {
    return line.contains(key) ? line[key].get<std::string>() : std::string("-");
  };
  auto fields = [&](const nlohmann::ordered_json& line) {
    return field(line, "component") + " " + field(line, "endpoint") + " " + field(line, "replica") +
           " " + field(line, "request_id") + " " + field(line, "message");
  };
  EXPECT_EQ(fields(lines[0]), "gateway - - - before");
  EXPECT_EQ(fields(lines[1]), "gateway llm - req-1 in the request");
  EXPECT_EQ(fields(lines[2]), "gateway llm llm-v1-x req-1 an attempt");
  EXPECT_EQ(fields(lines[3]), "gateway - - - another thread");
  EXPECT_EQ(fields(lines[4]), "gateway llm - req-1 after the attempt");
  EXPECT_EQ(fields(lines[5]), "gateway - - - after");
}

TEST(LoggingTest, InvalidUtf8InAMessageBecomesReplacementCharacters) {
  JsonLines sink({.component = "replica"});
  sink.logger().error("bad bytes: \xff\xfe end");
  const std::vector<nlohmann::ordered_json> lines = sink.lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["message"], "bad bytes: \xEF\xBF\xBD\xEF\xBF\xBD end");
}

}  // namespace
}  // namespace flotilla

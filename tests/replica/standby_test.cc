#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "replica/replica_standby.h"

namespace flotilla::replica {
namespace {

TEST(StandbyCommandTest, EncodesOneJsonLine) {
  EXPECT_EQ(encode_standby_command({"--model", "m.json", "--port", "0"}),
            "{\"args\":[\"--model\",\"m.json\",\"--port\",\"0\"]}\n");
  EXPECT_EQ(encode_standby_command({}), "{\"args\":[]}\n");
}

TEST(StandbyCommandTest, ParsesWhatItEncodes) {
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"--model", "models/fraud.json", "--name", "fraud"},
      {"--name", "quote\" back\\slash", "tab\tnew\nline", "ünï", ""},
  };
  for (const std::vector<std::string>& args : cases) {
    const std::string line = encode_standby_command(args);
    Result<std::vector<std::string>> parsed = parse_standby_command(line);
    ASSERT_TRUE(parsed.is_ok()) << line << ": " << parsed.status().message();
    EXPECT_EQ(*parsed, args);
    // std::getline strips the newline: the line parses without it too.
    Result<std::vector<std::string>> stripped =
        parse_standby_command(std::string_view(line).substr(0, line.size() - 1));
    ASSERT_TRUE(stripped.is_ok()) << stripped.status().message();
    EXPECT_EQ(*stripped, args);
  }
}

TEST(StandbyCommandTest, RefusesMalformedLines) {
  struct Case {
    std::string line;
    std::string error;  // a part of the message
  };
  const std::vector<Case> cases = {
      {"", "not JSON"},
      {"{\"args\": [\"--model\"", "not JSON"},
      {"--model m.json", "not JSON"},
      {"{\"args\": [\"a\"]} trailing", "not JSON"},
      {"[\"--model\", \"m.json\"]", "not a JSON object"},
      {"\"args\"", "not a JSON object"},
      {"{}", "no 'args'"},
      {"{\"argv\": [\"--model\"]}", "no 'args'"},
      {"{\"args\": \"--model m.json\"}", "not a list"},
      {"{\"args\": null}", "not a list"},
      {"{\"args\": [\"--port\", 0]}", "not of numbers"},
      {"{\"args\": [[\"--model\"]]}", "not of arrays"},
  };
  for (const Case& c : cases) {
    Result<std::vector<std::string>> parsed = parse_standby_command(c.line);
    ASSERT_FALSE(parsed.is_ok()) << c.line;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << c.line;
    EXPECT_NE(parsed.status().message().find(c.error), std::string::npos)
        << c.line << ": " << parsed.status().message();
  }
}

}  // namespace
}  // namespace flotilla::replica

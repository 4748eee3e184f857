#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "llm/llm.h"

namespace flotilla::llm {
namespace {

TEST(CheckContextTest, AcceptsWhatFits) {
  EXPECT_TRUE(check_context(1, 1, 2).is_ok());
  EXPECT_TRUE(check_context(100, 412, 512).is_ok());  // exactly the context
  EXPECT_TRUE(check_context(511, 1, 512).is_ok());    // one token of room, and it is asked for
}

TEST(CheckContextTest, RefusesAPromptThatLeavesNoRoom) {
  for (int64_t prompt : {512, 513, 4096}) {
    for (int64_t max_tokens : {1, 16, 100000}) {
      Status status = check_context(prompt, max_tokens, 512);
      EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << prompt << " " << max_tokens;
      EXPECT_EQ(status.message(),
                "the prompt has " + std::to_string(prompt) + " tokens; the model's context is 512");
    }
  }
}

TEST(CheckContextTest, RefusesMaxTokensPastTheContext) {
  Status status = check_context(300, 213, 512);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "the prompt (300 tokens) plus max_tokens (213) is longer than the model's context of "
            "512 tokens");
  // Sums that would overflow an int are still caught.
  EXPECT_FALSE(check_context(10, int64_t{1} << 40, 512).is_ok());
}

}  // namespace
}  // namespace flotilla::llm

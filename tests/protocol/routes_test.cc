// The route grammar (parse_path): each family's parts, the query split off, and the malformed
// shapes that no server serves.
#include <gtest/gtest.h>

#include "protocol/protocol.h"

namespace flotilla::protocol {
namespace {

TEST(ParsePath, OipModelWithAndWithoutVersion) {
  ParsedPath p = parse_path("/v2/models/fraud/infer");
  EXPECT_EQ(p.kind, PathKind::kOipModel);
  EXPECT_FALSE(p.malformed);
  EXPECT_EQ(p.name, "fraud");
  EXPECT_EQ(p.version, "");
  EXPECT_EQ(p.rest, "/infer");

  p = parse_path("/v2/models/fraud/versions/3/ready?x=1");
  EXPECT_EQ(p.kind, PathKind::kOipModel);
  EXPECT_FALSE(p.malformed);
  EXPECT_EQ(p.name, "fraud");
  EXPECT_EQ(p.version, "3");
  EXPECT_EQ(p.rest, "/ready");
  EXPECT_EQ(p.path, "/v2/models/fraud/versions/3/ready");
  EXPECT_EQ(p.query, "?x=1");

  p = parse_path("/v2/models/fraud");
  EXPECT_EQ(p.name, "fraud");
  EXPECT_EQ(p.rest, "");
  p = parse_path("/v2/models/fraud/versions/7");
  EXPECT_EQ(p.version, "7");
  EXPECT_EQ(p.rest, "");
  // "versions" without a version after it is an ordinary tail, not a version.
  p = parse_path("/v2/models/fraud/versions");
  EXPECT_FALSE(p.malformed);
  EXPECT_EQ(p.version, "");
  EXPECT_EQ(p.rest, "/versions");
}

TEST(ParsePath, ServingEndpoint) {
  const ParsedPath p = parse_path("/serving-endpoints/fraud/invocations?a=b");
  EXPECT_EQ(p.kind, PathKind::kServingEndpoint);
  EXPECT_FALSE(p.malformed);
  EXPECT_EQ(p.name, "fraud");
  EXPECT_EQ(p.rest, "/invocations");
  EXPECT_EQ(p.query, "?a=b");
  EXPECT_EQ(parse_path("/serving-endpoints/fraud").rest, "");
}

TEST(ParsePath, OpenAi) {
  ParsedPath p = parse_path("/v1/chat/completions");
  EXPECT_EQ(p.kind, PathKind::kOpenAi);
  EXPECT_EQ(p.rest, "/chat/completions");
  EXPECT_EQ(p.name, "");
  p = parse_path("/v1/models");
  EXPECT_EQ(p.rest, "/models");
  EXPECT_EQ(p.name, "");
  p = parse_path("/v1/models/org/model?x");
  EXPECT_EQ(p.kind, PathKind::kOpenAi);
  EXPECT_FALSE(p.malformed);
  EXPECT_EQ(p.name, "org/model");  // ids may hold slashes
  EXPECT_EQ(p.query, "?x");
  p = parse_path("/v1");
  EXPECT_EQ(p.kind, PathKind::kOpenAi);
  EXPECT_EQ(p.rest, "");
  EXPECT_EQ(parse_path("/v1?stream").kind, PathKind::kOpenAi);
}

TEST(ParsePath, MalformedShapesAreFlagged) {
  for (const char* target :
       {"/v2/models/", "/v2/models//infer", "/v2/models/m/versions/",
        "/v2/models/m/versions//infer", "/v2/models/?x=1", "/serving-endpoints/",
        "/serving-endpoints//invocations", "/v1/models/", "/v1/models/?q"}) {
    const ParsedPath p = parse_path(target);
    EXPECT_NE(p.kind, PathKind::kOther) << target;
    EXPECT_TRUE(p.malformed) << target;
  }
}

TEST(ParsePath, OtherPathsFitNoFamily) {
  for (const char* target :
       {"/", "", "?", "/v2", "/v2/", "/v2/health/live", "/v2/models", "/v1x", "/v1x/models/a",
        "/serving-endpoints", "/invocations", "/metrics", "v1/models/a", "/V1/models/a"}) {
    const ParsedPath p = parse_path(target);
    EXPECT_EQ(p.kind, PathKind::kOther) << target;
    EXPECT_FALSE(p.malformed) << target;
    EXPECT_EQ(p.name, "") << target;
  }
  const ParsedPath p = parse_path("/anything?q=/v1/models/x");
  EXPECT_EQ(p.kind, PathKind::kOther);
  EXPECT_EQ(p.path, "/anything");
  EXPECT_EQ(p.query, "?q=/v1/models/x");
}

TEST(ParsePath, QueryIsSplitBeforeTheGrammar) {
  // A '?' inside what looks like a name ends the path: the name stops there.
  const ParsedPath p = parse_path("/v2/models/a?b/infer");
  EXPECT_EQ(p.name, "a");
  EXPECT_EQ(p.rest, "");
  EXPECT_EQ(p.query, "?b/infer");
}

}  // namespace
}  // namespace flotilla::protocol

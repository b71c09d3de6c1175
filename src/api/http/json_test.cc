// ParseJsonBody's nesting bound and JsonSnippet's size bound (json.h). Found writing
// fuzz/v1_json.cc: a deeply nested value crashed the daemon when it was dump()ed or copied.
#include "api/http/json.h"

#include <gtest/gtest.h>

#include <string>

namespace sbx::http {
namespace {

std::string Nested(int levels, const std::string& open, const std::string& close) {
  std::string s;
  for (int i = 0; i < levels; ++i) s += open;
  for (int i = 0; i < levels; ++i) s += close;
  return s;
}

TEST(JsonTest, BodiesNestedPastTheBoundAreNotJson) {
  EXPECT_FALSE(ParseJsonBody(Nested(kMaxJsonDepth, "[", "]")).is_discarded());
  EXPECT_TRUE(ParseJsonBody(Nested(kMaxJsonDepth + 1, "[", "]")).is_discarded());
  EXPECT_FALSE(
      ParseJsonBody(Nested(kMaxJsonDepth, "{\"a\":", "}").replace(kMaxJsonDepth * 5, 0, "1"))
          .is_discarded());
  // 500,000 levels: refused without building them, and nothing recurses (this ran out of stack).
  nlohmann::json deep = ParseJsonBody(Nested(500000, "[", "]"));
  EXPECT_TRUE(deep.is_discarded());
  nlohmann::json copy = deep;
  EXPECT_TRUE(copy.is_discarded());
  // Ordinary bodies parse as before.
  nlohmann::json j = ParseJsonBody(R"({"argv":["sh","-c","x"],"limits":{"pids":5},"t":1.5})");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["limits"]["pids"], 5);
  EXPECT_TRUE(ParseJsonBody("{").is_discarded());
  EXPECT_TRUE(ParseJsonBody("").is_discarded());
}

TEST(JsonTest, SnippetsAreShortWhateverTheValue) {
  EXPECT_EQ(JsonSnippet(nlohmann::json(1.5)), "1.5");
  EXPECT_EQ(JsonSnippet(nlohmann::json("soon")), "\"soon\"");
  EXPECT_EQ(JsonSnippet(nlohmann::json::parse(R"({"a":[1,2]})")), R"({"a":[1,2]})");
  EXPECT_EQ(JsonSnippet(ParseJsonBody(Nested(10, "[", "]"))), "[[[[...]]]]");
  EXPECT_LT(JsonSnippet(nlohmann::json(std::string(100000, 'x'))).size(), 200u);
  nlohmann::json wide = nlohmann::json::array();
  for (int i = 0; i < 100000; ++i) wide.push_back(i);
  EXPECT_LT(JsonSnippet(wide).size(), 200u);
  // Not UTF-8 (a dump() would throw): replaced.
  EXPECT_EQ(JsonSnippet(nlohmann::json(std::string("a\xff"))), "\"a\xef\xbf\xbd\"");
}

}  // namespace
}  // namespace sbx::http

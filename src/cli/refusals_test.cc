#include "cli/refusals.h"

#include <gtest/gtest.h>

namespace sbx::cli {
namespace {

using nlohmann::json;

TEST(RefusalBlockTest, NamesThePolicyEveryRefusalAndTheHint) {
  json exit = json::parse(R"({"type":"exit","exit_code":1,
    "network_refused":[
      {"kind":"dns","target":"files.example","reason":"not in the allowlist","count":3},
      {"kind":"connect","target":"198.18.0.5:443","reason":"not in the allowlist","count":1}],
    "network_policy":"mode allowlist; allowed: pypi.test, *.pypi.test"})");
  auto refused = RefusalsOfExit(exit);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(RefusalBlock(*refused, "Change it with `sbx net ID`."),
            "sbx: this sandbox's network policy (mode allowlist; allowed: pypi.test, *.pypi.test) "
            "refused during this command: DNS lookup of files.example (not in the allowlist) "
            "\u00d73; connection to 198.18.0.5:443 (not in the allowlist). Change it with `sbx net "
            "ID`.\n");
}

TEST(RefusalBlockTest, MoreAndNothingAndHostileText) {
  EXPECT_FALSE(RefusalsOfExit(json{{"type", "exit"}, {"exit_code", 0}}).has_value());
  EXPECT_FALSE(RefusalsOfExit(json::parse(R"({"network_refused":"x"})")).has_value());
  auto more = RefusalsOfExit(json::parse(
      R"({"network_refused":[{"kind":"dns","target":"a.test\u001b[2J","reason":"r"}],
          "network_refused_more":4,"network_policy":"mode open"})"));
  ASSERT_TRUE(more.has_value());
  std::string block = RefusalBlock(*more, "");
  EXPECT_EQ(block,
            "sbx: this sandbox's network policy (mode open) refused during this command: DNS "
            "lookup of a.test?[2J (r); and 4 more refusals.\n");
}

}  // namespace
}  // namespace sbx::cli

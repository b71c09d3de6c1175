#include "cli/units.h"

#include <gtest/gtest.h>

namespace sbx::cli {
namespace {

TEST(Units, Sizes) {
  EXPECT_EQ(*ParseSize("64M"), 64 << 20);
  EXPECT_EQ(*ParseSize("64MiB"), 64 << 20);
  EXPECT_EQ(*ParseSize("1.5G"), 3LL << 29);
  EXPECT_EQ(*ParseSize("512k"), 512 << 10);
  EXPECT_EQ(*ParseSize("4096"), 4096);
  EXPECT_FALSE(ParseSize("").ok());
  EXPECT_FALSE(ParseSize("M").ok());
  EXPECT_FALSE(ParseSize("-1M").ok());
  EXPECT_FALSE(ParseSize("12X").ok());
  EXPECT_FALSE(ParseSize("99999999T").ok());
}

TEST(Units, Durations) {
  EXPECT_EQ(*ParseDuration("90"), 90'000);
  EXPECT_EQ(*ParseDuration("90s"), 90'000);
  EXPECT_EQ(*ParseDuration("250ms"), 250);
  EXPECT_EQ(*ParseDuration("1.5m"), 90'000);
  EXPECT_EQ(*ParseDuration("2h"), 7'200'000);
  EXPECT_EQ(*ParseDuration("30d"), int64_t{30} * 86'400'000);
  EXPECT_FALSE(ParseDuration("soon").ok());
  EXPECT_FALSE(ParseDuration("5w").ok());
}

}  // namespace
}  // namespace sbx::cli

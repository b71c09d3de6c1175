#include <gtest/gtest.h>

#include "cli/serve.h"

namespace sbx::cli {
namespace {

TEST(ServeDefaults, OneIoThreadPerFourCpusFromOneToEight) {
  EXPECT_EQ(IoThreadsFor(1), 1);
  EXPECT_EQ(IoThreadsFor(2), 1);
  EXPECT_EQ(IoThreadsFor(7), 1);
  EXPECT_EQ(IoThreadsFor(8), 2);
  EXPECT_EQ(IoThreadsFor(16), 4);
  EXPECT_EQ(IoThreadsFor(64), 8);
  EXPECT_EQ(IoThreadsFor(0), 1);
  EXPECT_GE(UsableCpus(), 1);
}

}  // namespace
}  // namespace sbx::cli

#include "agent/paths.h"

#include <gtest/gtest.h>

#include "agent/spawn.h"

namespace sbx::agent {
namespace {

std::string Clean(std::string_view in) {
  std::string out;
  EXPECT_TRUE(CleanPath(in, &out)) << in;
  return out;
}

TEST(Paths, CleansLexically) {
  EXPECT_EQ(Clean("/"), "/");
  EXPECT_EQ(Clean("a/b"), "/a/b");
  EXPECT_EQ(Clean("//a//b/./c/"), "/a/b/c");
  EXPECT_EQ(Clean("/a/../b"), "/a/../b");  // ".." is left to the kernel
  EXPECT_EQ(Clean("."), "/");
  std::string out;
  EXPECT_FALSE(CleanPath("", &out));
  EXPECT_FALSE(CleanPath(std::string_view("/a\0b", 4), &out));
}

TEST(Paths, SplitsAndJoins) {
  EXPECT_EQ(DirName("/a/b"), "/a");
  EXPECT_EQ(DirName("/a"), "/");
  EXPECT_EQ(DirName("/"), "/");
  EXPECT_EQ(BaseName("/a/b"), "b");
  EXPECT_EQ(BaseName("/"), "/");
  EXPECT_EQ(JoinPath("/", "x"), "/x");
  EXPECT_EQ(JoinPath("/a", "x"), "/a/x");
}

TEST(Paths, ExecCandidatesFollowPath) {
  EXPECT_EQ(ExecCandidates("./run", "/bin"), (std::vector<std::string>{"./run"}));
  EXPECT_EQ(ExecCandidates("ls", "/usr/bin::/bin"),
            (std::vector<std::string>{"/usr/bin/ls", "./ls", "/bin/ls"}));
  EXPECT_EQ(ExecCandidates("ls", "").size(), 6u);  // the default PATH
}

}  // namespace
}  // namespace sbx::agent

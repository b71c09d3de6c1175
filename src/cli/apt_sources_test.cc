#include "cli/apt_sources.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "common/fd.h"
#include "common/fs.h"

namespace sbx::cli {
namespace {

TEST(AptSources, OneLineFormat) {
  auto s = ParseSourcesList(
      "# a comment\n"
      "deb-src http://deb.debian.org/debian bookworm main\n"
      "deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://mirror.example/debian/ "
      "bookworm main contrib # trailing\r\n"
      "deb http://security.debian.org/debian-security bookworm-security main\n"
      "deb [broken http://x/ y\n"
      "deb too-short\n");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].uri, "http://mirror.example/debian/");
  EXPECT_EQ(s[0].suites, std::vector<std::string>{"bookworm"});
  EXPECT_EQ(s[0].components, (std::vector<std::string>{"main", "contrib"}));
  EXPECT_EQ(s[1].suites, std::vector<std::string>{"bookworm-security"});
}

TEST(AptSources, Deb822) {
  auto s = ParseDeb822Sources(
      "Types: deb deb-src\n"
      "# http://snapshot.debian.org/archive/debian/20250520T000000Z\n"
      "URIs: http://deb.debian.org/debian\n"
      "Suites: bookworm bookworm-updates\n"
      "Components: main\n"
      "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
      "\n"
      "Types: deb-src\n"
      "URIs: http://src.example/debian\n"
      "Suites: bookworm\n"
      "\n"
      "Types: deb\n"
      "URIs: http://off.example/debian\n"
      "Suites: bookworm\n"
      "Enabled: no\n"
      "\n"
      "types: deb\n"
      "uris: http://a.example/debian\n"
      "  http://b.example/debian\n"
      "suites: trixie\n");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].uri, "http://deb.debian.org/debian");
  EXPECT_EQ(s[0].suites, (std::vector<std::string>{"bookworm", "bookworm-updates"}));
  EXPECT_EQ(s[0].components, std::vector<std::string>{"main"});
  EXPECT_EQ(s[1].uri, "http://a.example/debian");
  EXPECT_EQ(s[2].uri, "http://b.example/debian");
  EXPECT_EQ(s[2].suites, std::vector<std::string>{"trixie"});
}

TEST(AptSources, PicksTheMirrorOfTheSuiteElseOfARelease) {
  std::vector<AptSource> s = {
      {"cdrom:[Debian]/", {"bookworm"}, {"main"}},
      {"https://deb.nodesource.com/node_20.x", {"nodistro"}, {"main"}},
      {"http://security.debian.org/debian-security", {"bookworm-security"}, {"main"}},
      {"http://deb.debian.org/debian/", {"bookworm", "bookworm-updates"}, {"main"}},
      {"http://other.example/debian", {"trixie"}, {"main"}},
  };
  EXPECT_EQ(PickDebianMirror(s, "bookworm"), "http://deb.debian.org/debian");
  EXPECT_EQ(PickDebianMirror(s, "trixie"), "http://other.example/debian");
  // Not listed anywhere: the first mirror of a whole release serves it too.
  EXPECT_EQ(PickDebianMirror(s, "sid"), "http://deb.debian.org/debian");
  EXPECT_EQ(PickDebianMirror({s[1], s[2]}, "bookworm"), std::nullopt);
}

TEST(AptSources, ReadsTheListAndTheDirectoryInNameOrder) {
  char tmpl[] = "/tmp/sbx-apt-sources-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  ASSERT_TRUE(MakeDirs(dir + "/sources.list.d").ok());
  ASSERT_TRUE(WriteFile(dir + "/sources.list", "deb http://one.example/debian sid main\n").ok());
  ASSERT_TRUE(WriteFile(dir + "/sources.list.d/b.sources",
                        "Types: deb\nURIs: http://three.example/debian\nSuites: trixie\n")
                  .ok());
  ASSERT_TRUE(
      WriteFile(dir + "/sources.list.d/a.list", "deb http://two.example/debian bookworm main\n")
          .ok());
  ASSERT_TRUE(WriteFile(dir + "/sources.list.d/c.sources.disabled-by-farm",
                        "Types: deb\nURIs: http://no.example/debian\nSuites: forky\n")
                  .ok());
  auto s = ReadAptSources(dir);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].uri, "http://one.example/debian");
  EXPECT_EQ(s[1].uri, "http://two.example/debian");
  EXPECT_EQ(s[2].uri, "http://three.example/debian");
  EXPECT_TRUE(ReadAptSources(dir + "/none").empty());
  (void)RemoveTree(dir);  // the test's scratch directory: a leftover in /tmp harms no result
}

}  // namespace
}  // namespace sbx::cli

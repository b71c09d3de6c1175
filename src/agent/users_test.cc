#include "agent/users.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace sbx::agent {
namespace {

TEST(Users, ParsesPasswdAndSkipsMalformedLines) {
  auto users = ParsePasswd(
      "root:x:0:0:root:/root:/bin/bash\n"
      "# comment\n"
      "\n"
      "broken:x:12\n"
      "bad:x:abc:1:gecos:/home/bad:/bin/sh\n"
      "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\r\n"
      "user:x:1000:1000::/home/user:/bin/sh");
  ASSERT_EQ(users.size(), 3u);
  EXPECT_EQ(users[0].name, "root");
  EXPECT_EQ(users[0].home, "/root");
  EXPECT_EQ(users[1].uid, 65534u);
  EXPECT_EQ(users[1].shell, "/usr/sbin/nologin");
  EXPECT_EQ(users[2].name, "user");
  EXPECT_EQ(users[2].gid, 1000u);
}

TEST(Users, ParsesGroupMembers) {
  auto groups = ParseGroup(
      "root:x:0:\n"
      "wheel:x:10:alice,bob\n"
      "bad:x:notanumber:alice\n"
      "users:x:100:bob\n");
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_TRUE(groups[0].members.empty());
  ASSERT_EQ(groups[1].members.size(), 2u);
  EXPECT_EQ(groups[1].members[1], "bob");
}

TEST(Users, ResolvesNamesAndSupplementaryGroups) {
  UserDb db;
  db.Set(ParsePasswd("alice:x:1001:1001::/home/alice:/bin/sh\n"),
         ParseGroup("alice:x:1001:\nwheel:x:10:alice,bob\nusers:x:100:bob\ndup:x:1001:alice\n"));
  EXPECT_EQ(db.UserName(1001), "alice");
  EXPECT_EQ(db.UserName(4242), "4242");
  EXPECT_EQ(db.GroupName(10), "wheel");
  EXPECT_EQ(db.GroupName(7), "7");
  ASSERT_NE(db.FindUser("alice"), nullptr);
  EXPECT_EQ(db.FindUser("bob"), nullptr);
  auto groups = db.GroupsOf("alice", 1001);
  EXPECT_EQ(groups, (std::vector<gid_t>{1001, 10}));
}

TEST(Users, ReloadsFromFilesWhenTheyChange) {
  std::string dir = ::testing::TempDir();
  std::string pw = dir + "/passwd_test", gr = dir + "/group_test";
  std::ofstream(pw) << "a:x:1:1::/:/bin/sh\n";
  std::ofstream(gr) << "g:x:5:a\n";
  UserDb db(pw, gr);
  db.Reload();
  EXPECT_EQ(db.UserName(1), "a");
  EXPECT_EQ(db.GroupName(5), "g");
  std::ofstream(pw) << "a:x:1:1::/:/bin/sh\nbb:x:2:2::/:/bin/sh\n";
  db.Reload();
  EXPECT_EQ(db.UserName(2), "bb");
  std::remove(pw.c_str());
  std::remove(gr.c_str());
}

TEST(Users, ParseIdRejectsNonNumbers) {
  EXPECT_EQ(ParseId("0"), 0ul);
  EXPECT_EQ(ParseId("65534"), 65534ul);
  EXPECT_FALSE(ParseId(""));
  EXPECT_FALSE(ParseId("-1"));
  EXPECT_FALSE(ParseId("12a"));
  EXPECT_FALSE(ParseId("99999999999"));
}

}  // namespace
}  // namespace sbx::agent

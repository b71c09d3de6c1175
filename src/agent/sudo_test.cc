// sudo's request format (sudo.h). The end-to-end behaviour (a real box, `sudo id -u` as user,
// no_new_privs kept) is tested in tests/integration/sudo_test.cc.
#include "agent/sudo.h"

#include <gtest/gtest.h>

namespace sbx::agent {
namespace {

TEST(SudoRequestTest, RoundTrips) {
  SudoRequest r;
  r.target = "#1000";
  r.preserve_env = true;
  r.login = true;
  r.cwd = "/home/user";
  r.argv = {"id", "-u", ""};
  r.env = {"A=1", "B=x=y"};
  auto back = ParseSudoRequest(EncodeSudoRequest(r));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->target, "#1000");
  EXPECT_TRUE(back->preserve_env);
  EXPECT_TRUE(back->login);
  EXPECT_FALSE(back->shell);
  EXPECT_EQ(back->cwd, "/home/user");
  EXPECT_EQ(back->argv, r.argv);
  EXPECT_EQ(back->env, r.env);
}

TEST(SudoRequestTest, RefusesMalformed) {
  SudoRequest ok;
  ok.argv = {"true"};
  std::string good = EncodeSudoRequest(ok);
  EXPECT_TRUE(ParseSudoRequest(good).ok());
  EXPECT_FALSE(ParseSudoRequest(good.substr(0, good.size() - 1)).ok());  // unterminated
  EXPECT_FALSE(ParseSudoRequest(std::string("sbx-sudo/2\0", 11) + good.substr(11)).ok());
  SudoRequest none;  // no command and no shell
  EXPECT_FALSE(ParseSudoRequest(EncodeSudoRequest(none)).ok());
  SudoRequest shell;
  shell.shell = true;  // a shell alone is fine
  EXPECT_TRUE(ParseSudoRequest(EncodeSudoRequest(shell)).ok());
  SudoRequest bad_env;
  bad_env.argv = {"true"};
  bad_env.env = {"NOEQUALS"};
  EXPECT_FALSE(ParseSudoRequest(EncodeSudoRequest(bad_env)).ok());
  std::string wrong_count = EncodeSudoRequest(ok);
  wrong_count.replace(wrong_count.find(std::string("\0"
                                                   "1\0",
                                                   3)),
                      3,
                      std::string("\0"
                                  "9\0",
                                  3));
  EXPECT_FALSE(ParseSudoRequest(wrong_count).ok());
  EXPECT_FALSE(ParseSudoRequest("").ok());
}

}  // namespace
}  // namespace sbx::agent

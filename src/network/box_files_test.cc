#include "network/box_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fd.h"
#include "common/fs.h"

namespace sbx::network {
namespace {

class BoxFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-box-files-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)RemoveTree(dir_); }
  std::string dir_;
};

TEST_F(BoxFilesTest, ABoxWithNetworkingGetsSbxsResolverAndItsHostname) {
  auto files = WriteBoxNetFiles(dir_ + "/box", boost::asio::ip::make_address("10.213.0.13"),
                                boost::asio::ip::make_address("10.213.0.14"), "sbx");
  ASSERT_TRUE(files.ok()) << files.status().message();
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0],
            std::make_pair(dir_ + "/box/resolv.conf", std::string("/etc/resolv.conf")));
  EXPECT_EQ((*files)[1], std::make_pair(dir_ + "/box/hosts", std::string("/etc/hosts")));
  auto resolv = ReadFile(dir_ + "/box/resolv.conf");
  ASSERT_TRUE(resolv.ok());
  EXPECT_NE(resolv->find("\nnameserver 10.213.0.13\n"), std::string::npos) << *resolv;
  EXPECT_NE(resolv->find("options ndots:0 edns0"), std::string::npos);
  EXPECT_NE(resolv->find("# sbx answers"), std::string::npos);
  EXPECT_NE(resolv->find("policy allows"), std::string::npos);
  auto hosts = ReadFile(dir_ + "/box/hosts");
  ASSERT_TRUE(hosts.ok());
  EXPECT_EQ(*hosts, "127.0.0.1\tlocalhost\n10.213.0.14\tsbx\n");
  struct stat st {};
  ASSERT_EQ(::stat((dir_ + "/box/hosts").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  ASSERT_EQ(::stat((dir_ + "/box/resolv.conf").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
}

TEST_F(BoxFilesTest, ABoxWithoutNetworkingIsToldWhyAndHow) {
  // Below a directory nothing made yet (<data>/network of a daemon without networking).
  auto files = WriteNoNetworkFiles(dir_ + "/network/none");
  ASSERT_TRUE(files.ok()) << files.status().message();
  ASSERT_EQ(files->size(), 1u);
  EXPECT_EQ((*files)[0].second, "/etc/resolv.conf");
  auto resolv = ReadFile((*files)[0].first);
  ASSERT_TRUE(resolv.ok());
  EXPECT_EQ(resolv->find("nameserver"), std::string::npos);
  EXPECT_NE(resolv->find("# sbx: this sandbox has no network (network mode none); create it with a "
                         "policy, e.g. sbx create --net allow=pypi.org"),
            std::string::npos)
      << *resolv;
}

TEST_F(BoxFilesTest, RewritingReplacesAtomicallyAndLeavesNoTemporaryFile) {
  auto a = boost::asio::ip::make_address("10.213.0.1");
  auto b = boost::asio::ip::make_address("10.213.0.2");
  ASSERT_TRUE(WriteBoxNetFiles(dir_ + "/box", a, b, "one").ok());
  ASSERT_TRUE(WriteBoxNetFiles(dir_ + "/box", a, b, "two").ok());
  EXPECT_EQ(*ReadFile(dir_ + "/box/hosts"), "127.0.0.1\tlocalhost\n10.213.0.2\ttwo\n");
  int n = 0;
  DIR* d = ::opendir((dir_ + "/box").c_str());
  ASSERT_NE(d, nullptr);
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  EXPECT_EQ(n, 2);
}

TEST_F(BoxFilesTest, SymlinksAreNeverFollowed) {
  // A symlink as a file: the rename replaces the link itself; its target is untouched.
  ASSERT_EQ(::mkdir((dir_ + "/box").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(dir_ + "/victim", "keep\n").ok());
  ASSERT_EQ(::symlink((dir_ + "/victim").c_str(), (dir_ + "/box/hosts").c_str()), 0);
  ASSERT_TRUE(WriteBoxNetFiles(dir_ + "/box", boost::asio::ip::make_address("10.213.0.1"),
                               boost::asio::ip::make_address("10.213.0.2"), "sbx")
                  .ok());
  EXPECT_EQ(*ReadFile(dir_ + "/victim"), "keep\n");
  struct stat st {};
  ASSERT_EQ(::lstat((dir_ + "/box/hosts").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  // A symlink as the directory: refused.
  ASSERT_EQ(::mkdir((dir_ + "/elsewhere").c_str(), 0755), 0);
  ASSERT_EQ(::symlink((dir_ + "/elsewhere").c_str(), (dir_ + "/linked").c_str()), 0);
  auto r = WriteNoNetworkFiles(dir_ + "/linked");
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.status().err() == ENOTDIR || r.status().err() == ELOOP) << r.status().message();
  EXPECT_NE(::access((dir_ + "/elsewhere/resolv.conf").c_str(), F_OK), 0);
}

TEST_F(BoxFilesTest, AHostnameThatWouldAddLinesIsRefused) {
  auto r = WriteBoxNetFiles(dir_ + "/box", boost::asio::ip::make_address("10.213.0.1"),
                            boost::asio::ip::make_address("10.213.0.2"), "x\n1.2.3.4 evil");
  EXPECT_EQ(r.status().err(), EINVAL);
}

}  // namespace
}  // namespace sbx::network

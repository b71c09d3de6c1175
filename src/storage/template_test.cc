#include "storage/template.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fd.h"
#include "common/fs.h"

namespace sbx::storage {
namespace {

class TemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-template-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    store_.dir = dir_ + "/templates";
    store_.id_base = 1000000;
  }
  void TearDown() override { RemoveTree(dir_); }

  // Writes a tarball with the given (name, content, uid) entries; content "<dir>" makes a dir.
  std::string Tar(const std::string& name,
                  const std::vector<std::tuple<std::string, std::string, int>>& entries) {
    std::string path = dir_ + "/" + name;
    archive* a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    archive_write_add_filter_gzip(a);
    archive_write_open_filename(a, path.c_str());
    for (const auto& [n, content, uid] : entries) {
      archive_entry* e = archive_entry_new();
      archive_entry_set_pathname(e, n.c_str());
      archive_entry_set_uid(e, uid);
      archive_entry_set_gid(e, uid);
      if (content.rfind("<link:", 0) == 0) {
        archive_entry_set_filetype(e, AE_IFLNK);
        archive_entry_set_perm(e, 0777);
        archive_entry_set_symlink(e, content.substr(6, content.size() - 7).c_str());
        archive_write_header(a, e);
      } else if (content == "<dir>") {
        archive_entry_set_filetype(e, AE_IFDIR);
        archive_entry_set_perm(e, 0755);
        archive_write_header(a, e);
      } else {
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_perm(e, 0644);
        archive_entry_set_size(e, static_cast<la_int64_t>(content.size()));
        archive_write_header(a, e);
        archive_write_data(a, content.data(), content.size());
      }
      archive_entry_free(e);
    }
    archive_write_close(a);
    archive_write_free(a);
    return path;
  }

  std::string dir_;
  TemplateStore store_;
};

TEST_F(TemplateTest, HostTemplateHasGeneratedEtcAndNoHostSecrets) {
  auto t = ResolveTemplate(store_, "host");
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_EQ(t->layers.size(), 1u);
  const std::string root = t->layers[0];
  auto passwd = ReadFile(root + "/etc/passwd");
  ASSERT_TRUE(passwd.ok());
  EXPECT_NE(passwd->find("root:x:0:0:"), std::string::npos);
  EXPECT_NE(passwd->find("user:x:1000:1000:"), std::string::npos);
  struct stat st;
  ASSERT_EQ(::stat((root + "/etc/passwd").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, store_.id_base);  // root inside owns it
  ASSERT_EQ(::stat((root + "/home/user").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, store_.id_base + 1000);
  ASSERT_EQ(::stat((root + "/tmp").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 01777u);
  EXPECT_EQ(::stat((root + "/etc/ssl/certs/ca-certificates.crt").c_str(), &st), 0);
  for (const char* secret :
       {"/etc/shadow", "/etc/gshadow", "/etc/ssh", "/etc/npmrc", "/etc/pip.conf"})
    EXPECT_NE(::lstat((root + secret).c_str(), &st), 0) << secret;
  bool has_usr = false;
  for (const auto& b : t->binds) has_usr |= b.source == "/usr" && b.target == "/usr" && b.read_only;
  EXPECT_TRUE(has_usr);

  // Cached: resolving again reuses the same layer.
  auto again = ResolveTemplate(store_, "host");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->layers, t->layers);
}

TEST_F(TemplateTest, TarballIsUnpackedWithIdsShiftedIntoTheBoxRange) {
  std::string tar = Tar("ok.tar.gz", {{"etc/", "<dir>", 0},
                                      {"etc/hello", "hi\n", 0},
                                      {"home/", "<dir>", 0},
                                      {"home/u.txt", "u\n", 1000}});
  auto t = ResolveTemplate(store_, tar);
  ASSERT_TRUE(t.ok()) << t.status().message();
  const std::string root = t->layers[0];
  EXPECT_EQ(*ReadFile(root + "/etc/hello"), "hi\n");
  struct stat st;
  ASSERT_EQ(::stat((root + "/etc/hello").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, store_.id_base);
  ASSERT_EQ(::stat((root + "/home/u.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, store_.id_base + 1000);
}

TEST_F(TemplateTest, TarballWithEscapingNamesIsRejectedAndLeavesNothing) {
  for (const char* bad : {"../escape", "a/../../escape", "/etc/abs"}) {
    std::string tar = Tar("bad.tar.gz", {{"ok", "x", 0}, {bad, "pwned", 0}});
    auto t = ResolveTemplate(store_, tar);
    EXPECT_FALSE(t.ok()) << bad;
    struct stat st;
    EXPECT_NE(::stat((dir_ + "/escape").c_str(), &st), 0);
    // No cached layer and no temporary directory left behind.
    EXPECT_EQ(::system(("test -z \"$(ls -A " + store_.dir + ")\"").c_str()), 0) << bad;
    ::unlink(tar.c_str());
  }
}

TEST_F(TemplateTest, TarballSymlinkThenFileCannotWriteOutside) {
  std::string outside = dir_ + "/outside";
  ASSERT_EQ(::mkdir(outside.c_str(), 0755), 0);
  std::string tar = Tar("link.tar.gz", {{"a", "<link:" + outside + ">", 0}, {"a/pwned", "x", 0}});
  auto t = ResolveTemplate(store_, tar);
  EXPECT_FALSE(t.ok());
  struct stat st;
  EXPECT_NE(::stat((outside + "/pwned").c_str(), &st), 0);
}

TEST_F(TemplateTest, UnknownTemplateIsAClearError) {
  auto t = ResolveTemplate(store_, "ubuntu");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("unknown template 'ubuntu'"), std::string::npos);
  auto missing = ResolveTemplate(store_, "/nonexistent/rootfs");
  EXPECT_FALSE(missing.ok());
}

}  // namespace
}  // namespace sbx::storage

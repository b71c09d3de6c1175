#include "storage/template.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <functional>

#include "common/fd.h"
#include "common/fs.h"
#include "storage/cache.h"

namespace sbx::storage {
namespace {

struct Entry {
  std::string name;
  std::string content;  // "<dir>", "<link:TARGET>", or file content
  int uid = 0;
  int mode = 0644;
};

class TemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-template-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ts_.dir = dir_ + "/templates";
    auto st = store::Store::Open(dir_ + "/sbx.db");
    ASSERT_TRUE(st.ok()) << st.status().message();
    st_ = std::move(*st);
  }
  void TearDown() override { (void)RemoveTree(dir_); }  // scratch: a leftover harms no result

  // Writes a gzip tarball of `entries` (or another archive, through `format`).
  std::string Tar(const std::string& name, const std::vector<Entry>& entries,
                  const std::function<void(archive*)>& format = {}) {
    std::string path = dir_ + "/" + name;
    archive* a = archive_write_new();
    if (format) {
      format(a);
    } else {
      archive_write_set_format_pax_restricted(a);
      archive_write_add_filter_gzip(a);
    }
    archive_write_open_filename(a, path.c_str());
    for (const auto& en : entries) {
      archive_entry* e = archive_entry_new();
      archive_entry_set_pathname(e, en.name.c_str());
      archive_entry_set_uid(e, en.uid);
      archive_entry_set_gid(e, en.uid);
      if (en.content.rfind("<link:", 0) == 0) {
        archive_entry_set_filetype(e, AE_IFLNK);
        archive_entry_set_perm(e, 0777);
        archive_entry_set_symlink(e, en.content.substr(6, en.content.size() - 7).c_str());
        archive_write_header(a, e);
      } else if (en.content == "<dir>") {
        archive_entry_set_filetype(e, AE_IFDIR);
        archive_entry_set_perm(e, 0755);
        archive_write_header(a, e);
      } else {
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_perm(e, en.mode);
        archive_entry_set_size(e, static_cast<la_int64_t>(en.content.size()));
        archive_write_header(a, e);
        archive_write_data(a, en.content.data(), en.content.size());
      }
      archive_entry_free(e);
    }
    archive_write_close(a);
    archive_write_free(a);
    return path;
  }

  std::vector<std::string> Ls(const std::string& d) {
    std::vector<std::string> out;
    if (DIR* dd = ::opendir(d.c_str())) {
      while (dirent* e = ::readdir(dd)) {
        std::string n = e->d_name;
        if (n != "." && n != "..") out.push_back(n);
      }
      ::closedir(dd);
    }
    return out;
  }

  struct stat Stat(const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st;
  }

  // Nothing is in the cache: no layer directory, no layer record.
  void ExpectCacheEmpty(const std::string& why) {
    EXPECT_TRUE(Ls(ts_.dir + "/layers").empty()) << why;
    EXPECT_EQ(*st_->LayerBytes(), 0) << why;
  }

  std::string dir_;
  TemplateStore ts_;
  std::unique_ptr<store::Store> st_;
};

TEST_F(TemplateTest, NamesAreNamesNeverPaths) {
  for (const char* ok :
       {"host", "base", "ubuntu-22.04", "py:3.12", "a", "code-interpreter-v1", "x_y", "0abc"})
    EXPECT_TRUE(IsValidTemplateName(ok)) << ok;
  for (const char* bad : {"", "/etc", "../x", "./x", ".hidden", "a/b", "Ubuntu", "a:", ":t",
                          "a:b:c", "-x", "a b", "tpl.tar.gz/", "x\n"})
    EXPECT_FALSE(IsValidTemplateName(bad)) << bad;
  EXPECT_FALSE(IsValidTemplateName(std::string(65, 'a')));
  EXPECT_TRUE(IsValidTemplateName(std::string(64, 'a')));
}

TEST_F(TemplateTest, HostTemplateHasGeneratedEtcWithRealOwnershipAndNoHostSecrets) {
  // The binary the host template's sudo is a copy of (the agent's, in the daemon).
  ts_.sudo_binary = ts_.dir + "-fake-agent";
  ASSERT_TRUE(WriteFile(ts_.sudo_binary, "#!/bin/sh\n", 0700).ok());
  auto t = ResolveTemplate(ts_, *st_, "host", "sb1");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->name, "host");
  ASSERT_EQ(t->layers.size(), 1u);
  const std::string root = t->layers[0];
  EXPECT_EQ(root.rfind(ts_.dir + "/layers/host-", 0), 0u) << root;
  auto passwd = ReadFile(root + "/etc/passwd");
  ASSERT_TRUE(passwd.ok());
  EXPECT_NE(passwd->find("root:x:0:0:"), std::string::npos);
  EXPECT_NE(passwd->find("user:x:1000:1000:"), std::string::npos);
  // Real owners: root's files are uid 0, the user's home is uid 1000 (the runtime maps them).
  EXPECT_EQ(Stat(root + "/etc/passwd").st_uid, 0u);
  EXPECT_EQ(Stat(root + "/root").st_uid, 0u);
  EXPECT_EQ(Stat(root + "/root").st_mode & 07777, 0700u);
  EXPECT_EQ(Stat(root + "/home/user").st_uid, 1000u);
  EXPECT_EQ(Stat(root + "/home/user").st_gid, 1000u);
  EXPECT_EQ(Stat(root + "/tmp").st_mode & 07777, 01777u);
  EXPECT_EQ(::access((root + "/etc/ssl/certs/ca-certificates.crt").c_str(), F_OK), 0);
  for (const char* secret :
       {"/etc/shadow", "/etc/gshadow", "/etc/ssh", "/etc/npmrc", "/etc/pip.conf"}) {
    struct stat st {};
    EXPECT_NE(::lstat((root + secret).c_str(), &st), 0) << secret;
  }
  bool has_usr = false;
  for (const auto& b : t->binds)
    has_usr |= b.source == "/usr" && b.target == "/usr" && b.read_only &&
               b.overlaid == std::vector<std::string>{"local/bin"};
  EXPECT_TRUE(has_usr);
  // E2B's base has sudo and python: in the layer's usr/local/bin, laid over the host's.
  EXPECT_EQ(*ReadFile(root + "/usr/local/bin/sudo"), "#!/bin/sh\n");
  EXPECT_EQ(Stat(root + "/usr/local/bin/sudo").st_mode & 07777, 0755u);
  EXPECT_EQ(Stat(root + "/usr/local/bin/sudo").st_uid, 0u);
  struct stat py {};
  if (::stat("/usr/bin/python3", &py) == 0 && ::lstat("/usr/bin/python", &py) != 0) {
    char target[256] = {};
    ASSERT_GT(::readlink((root + "/usr/local/bin/python").c_str(), target, sizeof target - 1), 0);
    EXPECT_STREQ(target, "/usr/bin/python3");
  }
  // Root-only: no host user can pass the cache directory (threats.md row 46).
  EXPECT_EQ(Stat(ts_.dir).st_mode & 07777, 0700u);
  EXPECT_EQ(Stat(ts_.dir).st_uid, 0u);
  EXPECT_EQ(Stat(ts_.dir + "/layers").st_mode & 07777, 0700u);

  // Cached and recorded: resolving again (through an alias too) reuses the same layer.
  auto again = ResolveTemplate(ts_, *st_, "base", "sb2");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->name, "host");
  EXPECT_EQ(again->layers, t->layers);
  auto host = st_->GetTemplate("host");
  ASSERT_TRUE(host.ok() && host->has_value());
  ASSERT_EQ((*host)->layers.size(), 1u);
  EXPECT_EQ(LayerDir(ts_, (*host)->layers[0]), root);
  EXPECT_GT(*st_->LayerBytes(), 0);
}

TEST_F(TemplateTest, PathsAndUnknownNamesAreNotFoundAndTouchNothing) {
  std::string tar = Tar("root-only.tar.gz", {{"etc/", "<dir>"}, {"etc/secret", "s\n", 0, 0600}});
  ASSERT_EQ(::chmod(tar.c_str(), 0600), 0);
  for (const std::string& name :
       {std::string("/etc"), tar, dir_, dir_ + "/templates", std::string("../etc"),
        std::string("nope"), std::string("ubuntu:22.04"), std::string("Base")}) {
    auto t = ResolveTemplate(ts_, *st_, name, "sb1");
    ASSERT_FALSE(t.ok()) << name;
    EXPECT_EQ(t.status().err(), EINVAL) << name;
    EXPECT_EQ(t.status().what(), "template not found: " + name);
    EXPECT_TRUE(IsTemplateNotFound(t.status()));
    ExpectCacheEmpty(name);
  }
}

TEST_F(TemplateTest, AddedTarballKeepsRealOwnershipAndSetIdBitsBelowTheRootOnlyCache) {
  std::string tar = Tar("ok.tar.gz", {{"./", "<dir>"},
                                      {"etc/", "<dir>"},
                                      {"etc/hello", "hi\n"},
                                      {"home/", "<dir>"},
                                      {"home/u.txt", "u\n", 1000},
                                      {"bin/", "<dir>"},
                                      {"bin/suid", "#!/bin/sh\n", 0, 04755}});
  std::vector<int64_t> progress;
  auto rec = AddTemplate(ts_, *st_, "alpine:3", tar, [&](int64_t n) { progress.push_back(n); });
  ASSERT_TRUE(rec.ok()) << rec.status().message();
  EXPECT_EQ(rec->kind, store::kTemplateTar);
  EXPECT_EQ(rec->source, tar);
  EXPECT_GT(rec->size_bytes, 0);
  EXPECT_FALSE(progress.empty());
  auto t = ResolveTemplate(ts_, *st_, "alpine:3", "sb1");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->name, "alpine:3");
  ASSERT_EQ(t->layers.size(), 1u);
  const std::string root = t->layers[0];
  EXPECT_EQ(*ReadFile(root + "/etc/hello"), "hi\n");
  EXPECT_EQ(Stat(root + "/etc/hello").st_uid, 0u);
  EXPECT_EQ(Stat(root + "/home/u.txt").st_uid, 1000u);
  EXPECT_EQ(Stat(root + "/bin/suid").st_mode & 07777, 04755u);  // kept: reachable only in a box
  EXPECT_EQ(Stat(ts_.dir).st_mode & 07777, 0700u);
  EXPECT_EQ(Stat(ts_.dir + "/layers").st_mode & 07777, 0700u);

  // The same name again is refused; the same tarball under another name shares its layer.
  EXPECT_EQ(AddTemplate(ts_, *st_, "alpine:3", tar).status().err(), EEXIST);
  auto twin = AddTemplate(ts_, *st_, "alpine", tar);
  ASSERT_TRUE(twin.ok()) << twin.status().message();
  EXPECT_EQ(twin->layers, rec->layers);
  EXPECT_EQ(Ls(ts_.dir + "/layers").size(), 1u);
}

// What the host template's fingerprint sees of a directory of the host: a link replaced by
// another (update-alternatives), a file written in place, a new entry; and nothing else.
TEST_F(TemplateTest, PathFingerprintSeesReplacedLinksAndWrittenFiles) {
  std::string d = dir_ + "/alternatives";
  ASSERT_EQ(::mkdir(d.c_str(), 0755), 0);
  ASSERT_EQ(::symlink("/usr/bin/one", (d + "/editor").c_str()), 0);
  ASSERT_TRUE(WriteFile(d + "/conf", "a\n").ok());
  uint64_t before = internal::PathFingerprint(d);
  EXPECT_EQ(internal::PathFingerprint(d), before);
  // A new target, the way update-alternatives sets one: a new link renamed over the old.
  ASSERT_EQ(::symlink("/usr/bin/two", (d + "/editor.new").c_str()), 0);
  ASSERT_EQ(::rename((d + "/editor.new").c_str(), (d + "/editor").c_str()), 0);
  uint64_t relinked = internal::PathFingerprint(d);
  EXPECT_NE(relinked, before);
  EXPECT_EQ(internal::PathFingerprint(d), relinked);
  ASSERT_TRUE(WriteFile(d + "/conf", "a longer line\n").ok());
  uint64_t written = internal::PathFingerprint(d);
  EXPECT_NE(written, relinked);
  ASSERT_EQ(::symlink("/usr/bin/three", (d + "/pager").c_str()), 0);
  EXPECT_NE(internal::PathFingerprint(d), written);
}

TEST_F(TemplateTest, AddedDirectoryIsASnapshot) {
  std::string src = dir_ + "/rootfs";
  ASSERT_EQ(::system(("mkdir -p " + src + "/etc && echo one > " + src + "/etc/v && ln -s /etc " +
                      src + "/hostetc && chown -R 1000:1000 " + src + "/etc")
                         .c_str()),
            0);
  auto rec = AddTemplate(ts_, *st_, "mine", src);
  ASSERT_TRUE(rec.ok()) << rec.status().message();
  EXPECT_EQ(rec->kind, store::kTemplateDir);
  ASSERT_TRUE(WriteFile(src + "/etc/v", "two\n").ok());  // later host changes do not reach it
  auto t = ResolveTemplate(ts_, *st_, "mine", "sb1");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(*ReadFile(t->layers[0] + "/etc/v"), "one\n");
  EXPECT_EQ(Stat(t->layers[0] + "/etc/v").st_uid, 1000u);
  EXPECT_TRUE(S_ISLNK(Stat(t->layers[0] + "/hostetc").st_mode));  // copied, not followed
  EXPECT_NE(t->layers[0].find("/layers/dir-"), std::string::npos);
}

TEST_F(TemplateTest, AddRefusesBadNamesHostAndNonRootfsSources) {
  std::string tar = Tar("ok.tar.gz", {{"a", "x"}});
  EXPECT_EQ(AddTemplate(ts_, *st_, "/etc", tar).status().err(), EINVAL);
  EXPECT_EQ(AddTemplate(ts_, *st_, "Bad", tar).status().err(), EINVAL);
  EXPECT_EQ(AddTemplate(ts_, *st_, "host", tar).status().err(), EPERM);
  EXPECT_EQ(AddTemplate(ts_, *st_, "base", tar).status().err(), EEXIST);  // an alias
  ASSERT_TRUE(WriteFile(dir_ + "/notes.txt", "x").ok());
  EXPECT_EQ(AddTemplate(ts_, *st_, "notes", dir_ + "/notes.txt").status().err(), EINVAL);
  EXPECT_EQ(AddTemplate(ts_, *st_, "gone", dir_ + "/missing.tar").status().err(), ENOENT);
  EXPECT_EQ(RemoveTemplate(ts_, *st_, "host").err(), EPERM);
  EXPECT_EQ(RemoveTemplate(ts_, *st_, "nope").err(), ENOENT);
  ExpectCacheEmpty("refused adds");
}

TEST_F(TemplateTest, TarballWithEscapingNamesIsRejectedAndLeavesNothing) {
  for (const char* bad : {"../escape", "a/../../escape", "/etc/abs"}) {
    std::string tar = Tar("bad.tar.gz", {{"ok", "x"}, {bad, "pwned"}});
    auto t = AddTemplate(ts_, *st_, "bad", tar);
    EXPECT_EQ(t.status().err(), EINVAL) << bad;
    struct stat st {};
    EXPECT_NE(::stat((dir_ + "/escape").c_str(), &st), 0);
    ExpectCacheEmpty(bad);
    EXPECT_FALSE(st_->GetTemplate("bad")->has_value());
    ::unlink(tar.c_str());
  }
}

// A template's archive is a tarball, compressed or not: no other format's parser (zip, cpio,
// 7-Zip, RAR...) ever reads a file a user hands in.
TEST_F(TemplateTest, OnlyTarballsAreUnpacked) {
  auto as = [](int (*fmt)(archive*), int (*filter)(archive*)) {
    return [fmt, filter](archive* a) {
      fmt(a);
      if (filter) filter(a);
    };
  };
  for (const auto& [name, format] :
       std::vector<std::pair<std::string, std::function<void(archive*)>>>{
           {"root.tar", as(archive_write_set_format_pax_restricted, nullptr)},
           {"root.tar.zst", as(archive_write_set_format_gnutar, archive_write_add_filter_zstd)},
           {"root.tar.xz", as(archive_write_set_format_ustar, archive_write_add_filter_xz)},
           {"root.tar.bz2", as(archive_write_set_format_pax, archive_write_add_filter_bzip2)}}) {
    std::string tar = Tar(name, {{"etc/os-release", "ID=test\n"}}, format);
    auto t = AddTemplate(ts_, *st_, "ok", tar);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status().message();
    EXPECT_TRUE(RemoveTemplate(ts_, *st_, "ok").ok());
  }
  for (const auto& [name, format] :
       std::vector<std::pair<std::string, std::function<void(archive*)>>>{
           {"root.zip", as(archive_write_set_format_zip, nullptr)},
           {"root.cpio", as(archive_write_set_format_cpio_newc, nullptr)}}) {
    std::string file = Tar(name, {{"etc/os-release", "ID=test\n"}}, format);
    auto t = AddTemplate(ts_, *st_, "bad", file);
    EXPECT_EQ(t.status().err(), EINVAL) << name;
    EXPECT_FALSE(st_->GetTemplate("bad")->has_value()) << name;
  }
}

TEST_F(TemplateTest, TarballSymlinkThenFileCannotWriteOutside) {
  std::string outside = dir_ + "/outside";
  ASSERT_EQ(::mkdir(outside.c_str(), 0755), 0);
  std::string tar = Tar("link.tar.gz", {{"a", "<link:" + outside + ">"}, {"a/pwned", "x"}});
  EXPECT_FALSE(AddTemplate(ts_, *st_, "link", tar).ok());
  struct stat st {};
  EXPECT_NE(::stat((outside + "/pwned").c_str(), &st), 0);
  ExpectCacheEmpty("symlink");
}

// Found by fuzz/tar_unpack.cc: for this corrupt gzip stream libarchive fails to open with no
// error message, and appending its NULL to ours crashed `sbx template add` (strlen of NULL).
TEST_F(TemplateTest, ACorruptArchiveWithoutAMessageIsRefusedNotACrash) {
  static const char kCrash[] =
      "\x1f\x8b\x08\x00\x93\xb0\x0e\x6b\x02\xff\xed\xd6\x41\x0e\x82\x30"
      "\x10\x05\xd0\x59\x7b\x8a\x9e\x40\x5a\xe8\xb4\x89\x7b\x5d\x79\x09"
      "\x14\x12\x88\x06\x0c\xc5\xe8\xce\xab\xdb\xa0\xab\x06\xdd\xb5\x31"
      "\xf2\x5f\x93\x76\xf6\x3f\x33\xd3\x7a\x3c\x66\x14\x99\xf4\x2c\xf3"
      "\xf4\x7a\xe1\x3b\x53\x1b\x6d\x24\x09\xa6\x04\xae\x6e\x2c\x07\x21"
      "\x68\xa1\x6a\x9f\xff\xa5\x74\xee\x56\xc5\xcd\xdf\x68\xfd\x39\xff"
      "\xc2\x04\xf9\x5b\x2b\x0b\x12\x12\xf9\x47\x37\xf4\xfd\x01\x00\x00"
      "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xfe\xc3\x13\x29\x00\x00";
  std::string path = dir_ + "/corrupt.tar.gz";
  ASSERT_TRUE(WriteFile(path, std::string(kCrash, sizeof kCrash - 1)).ok());
  auto t = AddTemplate(ts_, *st_, "corrupt", path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().err(), EINVAL) << t.status().message();
  EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().message();
  ExpectCacheEmpty("corrupt");
  std::string dest = dir_ + "/dest";
  ASSERT_EQ(::mkdir(dest.c_str(), 0755), 0);
  EXPECT_FALSE(UnpackTarball(path, dest, 1 << 20).ok());
}

TEST_F(TemplateTest, DecompressionBombStopsAtTheCacheBound) {
  ts_.cache_bytes = 1 << 20;
  // 256 MiB of zeros: a few hundred KB compressed.
  std::string tar = Tar("bomb.tar.gz", {{"zeros", std::string(256 << 20, '\0')}});
  auto t = AddTemplate(ts_, *st_, "bomb", tar);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().err(), ENOSPC);
  EXPECT_NE(t.status().message().find("exceeds the template cache's free room"), std::string::npos)
      << t.status().message();
  ExpectCacheEmpty("bomb");  // and no temporary directory: unpacking stopped at 1 MiB
}

TEST_F(TemplateTest, UnusedLayersAreEvictedLeastRecentlyUsedFirstAndLiveOnesKept) {
  std::string a = Tar("a.tar.gz", {{"a", std::string(600 << 10, 'a')}});
  std::string b = Tar("b.tar.gz", {{"b", std::string(600 << 10, 'b')}});
  ts_.cache_bytes = 1 << 20;  // room for one of them
  ASSERT_TRUE(AddTemplate(ts_, *st_, "a", a).ok());
  auto ta = ResolveTemplate(ts_, *st_, "a", "sb1");
  ASSERT_TRUE(ta.ok());
  store::SandboxRecord sb;
  sb.id = "sb1";
  sb.state = store::kStateRunning;
  ASSERT_TRUE(st_->PutSandbox(sb).ok());

  // Removed while sb1 uses it: its layer stays, and counts, until sb1 has ended.
  ASSERT_TRUE(RemoveTemplate(ts_, *st_, "a").ok());
  EXPECT_FALSE(st_->GetTemplate("a")->has_value());
  EXPECT_EQ(::access(ta->layers[0].c_str(), F_OK), 0);
  auto refused = AddTemplate(ts_, *st_, "b", b);
  EXPECT_EQ(refused.status().err(), ENOSPC) << refused.status().message();
  EXPECT_EQ(::access(ta->layers[0].c_str(), F_OK), 0);

  sb.state = store::kStateKilled;
  ASSERT_TRUE(st_->PutSandbox(sb).ok());
  auto added = AddTemplate(ts_, *st_, "b", b);
  ASSERT_TRUE(added.ok()) << added.status().message();
  EXPECT_NE(::access(ta->layers[0].c_str(), F_OK), 0);  // evicted
  EXPECT_EQ(Ls(ts_.dir + "/layers"), std::vector<std::string>{added->layers[0]});
  EXPECT_LE(*st_->LayerBytes(), ts_.cache_bytes);
}

TEST_F(TemplateTest, RemovedTemplateWithoutSandboxesLeavesNothing) {
  ASSERT_TRUE(AddTemplate(ts_, *st_, "t", Tar("t.tar.gz", {{"f", "x"}})).ok());
  ASSERT_TRUE(RemoveTemplate(ts_, *st_, "t").ok());
  ExpectCacheEmpty("rm");
  EXPECT_EQ(ResolveTemplate(ts_, *st_, "t", "").status().what(), "template not found: t");
}

TEST_F(TemplateTest, LocalRunTakesAPathIntoAPrivateLayerItRemoves) {
  std::string tar = Tar("run.tar.gz", {{"etc/", "<dir>"}, {"etc/x", "y"}});
  std::function<void()> cleanup;
  auto t = ResolveLocalTemplate(ts_, *st_, tar, &cleanup);
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_TRUE(cleanup);
  EXPECT_EQ(*ReadFile(t->layers[0] + "/etc/x"), "y");
  ExpectCacheEmpty("a run's layer is not in the registry's cache");
  cleanup();
  EXPECT_NE(::access(t->layers[0].c_str(), F_OK), 0);
  std::function<void()> none;
  auto dir = ResolveLocalTemplate(ts_, *st_, dir_, &none);
  ASSERT_TRUE(dir.ok());
  EXPECT_EQ(dir->layers, std::vector<std::string>{dir_});
  auto name = ResolveLocalTemplate(ts_, *st_, "base", &none);
  ASSERT_TRUE(name.ok());
  EXPECT_EQ(name->name, "host");
  EXPECT_FALSE(ResolveLocalTemplate(ts_, *st_, "nope", &none).ok());
}

}  // namespace
}  // namespace sbx::storage

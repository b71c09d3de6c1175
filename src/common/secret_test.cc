#include "common/secret.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fd.h"
#include "common/fs.h"

namespace sbx {
namespace {

class SecretTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-secret-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/" + kSecretFileName;
  }
  void TearDown() override { (void)RemoveTree(dir_); }
  std::string dir_, path_;
};

TEST_F(SecretTest, MadeOnceWithMode0600AndKept) {
  auto a = InstallSecret::LoadOrCreate(dir_);
  ASSERT_TRUE(a.ok()) << a.status().message();
  struct stat st;
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_size, static_cast<off_t>(kSecretBytes));
  auto b = InstallSecret::LoadOrCreate(dir_);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(a->HmacHex("x"), b->HmacHex("x"));
  // Nothing but the secret is left in the directory (no temporary).
  auto listing = ::system(("test \"$(ls -A " + dir_ + ")\" = secret").c_str());
  EXPECT_EQ(listing, 0);
}

TEST_F(SecretTest, AnotherSecretGivesOtherTokens) {
  auto a = InstallSecret::LoadOrCreate(dir_);
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(::unlink(path_.c_str()), 0);
  auto b = InstallSecret::LoadOrCreate(dir_);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->HmacHex("token").size(), 64u);
  EXPECT_NE(a->HmacHex("token"), b->HmacHex("token"));
  EXPECT_NE(a->HmacHex("token"), a->HmacHex("token2"));
}

TEST_F(SecretTest, AWideModeAWrongSizeOrASymlinkIsRefused) {
  ASSERT_TRUE(InstallSecret::LoadOrCreate(dir_).ok());
  ASSERT_EQ(::chmod(path_.c_str(), 0644), 0);
  auto wide = InstallSecret::LoadOrCreate(dir_);
  ASSERT_FALSE(wide.ok());
  EXPECT_EQ(wide.status().err(), EPERM);
  EXPECT_NE(wide.status().message().find("0644"), std::string::npos) << wide.status().message();
  ASSERT_EQ(::chmod(path_.c_str(), 0400), 0);  // narrower is fine
  EXPECT_TRUE(InstallSecret::LoadOrCreate(dir_).ok());

  ASSERT_EQ(::unlink(path_.c_str()), 0);
  ASSERT_TRUE(WriteFile(path_, "short", 0600).ok());
  auto small = InstallSecret::LoadOrCreate(dir_);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().err(), EINVAL);
  EXPECT_EQ(*ReadFile(path_), "short");  // a refused file is never rewritten

  ASSERT_EQ(::unlink(path_.c_str()), 0);
  ASSERT_TRUE(WriteFile(dir_ + "/elsewhere", std::string(kSecretBytes, 'k'), 0600).ok());
  ASSERT_EQ(::symlink((dir_ + "/elsewhere").c_str(), path_.c_str()), 0);
  auto link = InstallSecret::LoadOrCreate(dir_);
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.status().err(), EPERM);
}

TEST(InstallSecret, HmacIsHmacSha256) {
  // Computed independently: printf hello | openssl dgst -sha256 -hmac <32 times k>.
  auto s = InstallSecret::FromBytes(std::string(32, 'k'));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->HmacHex("hello"),
            "b77dedb81d7deb352f617552af07a682c4267366ef53870025bc48b701c8a76d");
  EXPECT_FALSE(InstallSecret::FromBytes("short").ok());
}

TEST(ConstantTimeEquals, ComparesLengthThenBytes) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
}

TEST(Seal, RoundTripsWithAFreshNoncePerValue) {
  InstallSecret k = *InstallSecret::FromBytes(std::string(32, 'k'));
  auto a = k.Seal("secret", "sk-live-123", "owner\0name");
  auto b = k.Seal("secret", "sk-live-123", "owner\0name");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);  // random nonce: the same value never seals to the same bytes
  EXPECT_EQ(a->find("sk-live-123"), std::string::npos);
  auto opened = k.Unseal("secret", *a, "owner\0name");
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  EXPECT_EQ(*opened, "sk-live-123");
  auto empty = k.Seal("secret", "", "");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*k.Unseal("secret", *empty, ""), "");
}

TEST(Seal, DetectsEveryChangedByte) {
  InstallSecret k = *InstallSecret::FromBytes(std::string(32, 'k'));
  std::string sealed = *k.Seal("secret", "hunter2", "ctx");
  for (size_t i = 0; i < sealed.size(); ++i) {
    std::string t = sealed;
    t[i] ^= 1;
    auto r = k.Unseal("secret", t, "ctx");
    ASSERT_FALSE(r.ok()) << "byte " << i;
    EXPECT_EQ(r.status().err(), EBADMSG);
    EXPECT_EQ(r.status().message().find("hunter2"), std::string::npos);
  }
  EXPECT_FALSE(k.Unseal("secret", sealed.substr(0, sealed.size() - 1), "ctx").ok());
  EXPECT_FALSE(k.Unseal("secret", "", "ctx").ok());
}

TEST(Seal, WrongKeyPurposeOrContextDoNotOpen) {
  InstallSecret k = *InstallSecret::FromBytes(std::string(32, 'k'));
  InstallSecret other = *InstallSecret::FromBytes(std::string(32, 'o'));
  std::string sealed = *k.Seal("secret", "value", "ctx");
  EXPECT_EQ(other.Unseal("secret", sealed, "ctx").status().err(), EBADMSG);
  EXPECT_EQ(k.Unseal("token", sealed, "ctx").status().err(), EBADMSG);
  EXPECT_EQ(k.Unseal("secret", sealed, "ctx2").status().err(), EBADMSG);
}

}  // namespace
}  // namespace sbx

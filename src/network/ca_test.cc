// The per-install CA: made once with the file rules, leaves that verify against it with OpenSSL,
// a bounded cache.
#include "network/ca.h"

#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fd.h"
#include "common/fs.h"

namespace sbx::network {
namespace {

class CaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-ca-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)RemoveTree(dir_); }
  std::string dir_;
};

// X509_verify_cert of `leaf` against a store holding only `ca`, at the default purpose.
int Verify(X509* ca, X509* leaf) {
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, leaf, nullptr);
  X509_STORE_CTX_set_purpose(ctx, X509_PURPOSE_SSL_SERVER);
  int ok = X509_verify_cert(ctx);
  int err = X509_STORE_CTX_get_error(ctx);
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  return ok == 1 ? 0 : err == 0 ? -1 : err;
}

TEST_F(CaTest, MadeOnceAsAPrivateCaAndKept) {
  auto a = Ca::LoadOrCreate(dir_);
  ASSERT_TRUE(a.ok()) << a.status().message();
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/ca.pem").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(X509_check_ca((*a)->cert()), 1);
  auto* bc = static_cast<BASIC_CONSTRAINTS*>(
      X509_get_ext_d2i((*a)->cert(), NID_basic_constraints, nullptr, nullptr));
  ASSERT_NE(bc, nullptr);
  EXPECT_TRUE(bc->ca);
  ASSERT_NE(bc->pathlen, nullptr);
  EXPECT_EQ(ASN1_INTEGER_get(bc->pathlen), 0);
  BASIC_CONSTRAINTS_free(bc);
  auto crt = ReadFile(dir_ + "/ca.crt");
  ASSERT_TRUE(crt.ok());
  EXPECT_EQ(*crt, (*a)->cert_pem());
  EXPECT_EQ(crt->find("PRIVATE KEY"), std::string::npos);
  auto b = Ca::LoadOrCreate(dir_);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->cert_pem(), (*a)->cert_pem());
}

TEST_F(CaTest, RefusesAFileOthersCouldRead) {
  ASSERT_TRUE(Ca::LoadOrCreate(dir_).ok());
  ASSERT_EQ(::chmod((dir_ + "/ca.pem").c_str(), 0644), 0);
  auto r = Ca::LoadOrCreate(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().err(), EPERM);
  ASSERT_EQ(::chmod((dir_ + "/ca.pem").c_str(), 0600), 0);
  ASSERT_EQ(::chown((dir_ + "/ca.pem").c_str(), 12345, 12345), 0);
  EXPECT_EQ(Ca::LoadOrCreate(dir_).status().err(), EPERM);
  ASSERT_EQ(::unlink((dir_ + "/ca.pem").c_str()), 0);
  ASSERT_EQ(::symlink("/etc/passwd", (dir_ + "/ca.pem").c_str()), 0);
  EXPECT_EQ(Ca::LoadOrCreate(dir_).status().err(), EPERM);
  ASSERT_EQ(::unlink((dir_ + "/ca.pem").c_str()), 0);
  ASSERT_TRUE(WriteFile(dir_ + "/ca.pem", "garbage", 0600).ok());
  EXPECT_EQ(Ca::LoadOrCreate(dir_).status().err(), EINVAL);
}

TEST_F(CaTest, LeavesVerifyForTheirHostOnly) {
  auto ca = Ca::LoadOrCreate(dir_);
  ASSERT_TRUE(ca.ok());
  auto leaf = (*ca)->LeafFor("API.Example.com");
  ASSERT_TRUE(leaf.ok()) << leaf.status().message();
  EXPECT_EQ(Verify((*ca)->cert(), (*leaf)->cert), 0);
  EXPECT_EQ(X509_check_host((*leaf)->cert, "api.example.com", 0, 0, nullptr), 1);
  EXPECT_NE(X509_check_host((*leaf)->cert, "evil.test", 0, 0, nullptr), 1);
  EXPECT_EQ(X509_check_private_key((*leaf)->cert, (*leaf)->key), 1);
  EXPECT_EQ(X509_check_ca((*leaf)->cert), 0);
  auto ipleaf = (*ca)->LeafFor("198.18.0.7");
  ASSERT_TRUE(ipleaf.ok());
  EXPECT_EQ(Verify((*ca)->cert(), (*ipleaf)->cert), 0);
  EXPECT_EQ(X509_check_ip_asc((*ipleaf)->cert, "198.18.0.7", 0), 1);
  // Short validity.
  EXPECT_LE(ASN1_TIME_cmp_time_t(X509_get0_notAfter((*leaf)->cert),
                                 std::time(nullptr) + kLeafValiditySeconds),
            0);
  // Another CA's leaf does not verify against this one.
  char tmpl[] = "/tmp/sbx-ca-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  auto other = Ca::LoadOrCreate(tmpl);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(Verify((*ca)->cert(), (*(*other)->LeafFor("api.example.com"))->cert), 0);
  (void)RemoveTree(tmpl);
  for (const char* bad : {"", "a,b", "x y", "DNS:evil", "a..b", "*.example.com"})
    EXPECT_EQ((*ca)->LeafFor(bad).status().err(), EINVAL) << bad;
}

TEST_F(CaTest, CacheIsBoundedLeastRecentlyUsedFirst) {
  auto ca = Ca::LoadOrCreate(dir_, 4);
  ASSERT_TRUE(ca.ok());
  auto first = *(*ca)->LeafFor("h0.test");
  EXPECT_EQ(*(*ca)->LeafFor("h0.test"), first);  // cached
  for (int i = 1; i < 4; ++i) ASSERT_TRUE((*ca)->LeafFor("h" + std::to_string(i) + ".test").ok());
  EXPECT_EQ(*(*ca)->LeafFor("h0.test"), first);  // now the most recent
  ASSERT_TRUE((*ca)->LeafFor("h4.test").ok());   // evicts h1
  EXPECT_EQ((*ca)->cached(), 4u);
  EXPECT_EQ(*(*ca)->LeafFor("h0.test"), first);
  for (int i = 5; i < 20; ++i) ASSERT_TRUE((*ca)->LeafFor("h" + std::to_string(i) + ".test").ok());
  EXPECT_EQ((*ca)->cached(), 4u);
}

// A box churning through refused names (each one's 403 over TLS takes a leaf) fills only the
// refusals' small cache: the leaves of intercepted hosts stay, and neither cache grows past its
// bound.
TEST_F(CaTest, RefusalLeavesNeverEvictInterceptedOnes) {
  auto ca = Ca::LoadOrCreate(dir_, 4, 2);
  ASSERT_TRUE(ca.ok());
  auto api = *(*ca)->LeafFor("api.test");
  for (int i = 0; i < 100; ++i)
    ASSERT_TRUE((*ca)->LeafFor("x" + std::to_string(i) + ".evil.test", LeafUse::kRefusal).ok());
  EXPECT_EQ((*ca)->cached(LeafUse::kRefusal), 2u);
  EXPECT_EQ((*ca)->cached(), 1u);
  EXPECT_EQ(*(*ca)->LeafFor("api.test"), api);  // the same leaf: never evicted
  // A refusal's leaf is cached too (the same client retrying gets the same one).
  auto r = *(*ca)->LeafFor("x99.evil.test", LeafUse::kRefusal);
  EXPECT_EQ(*(*ca)->LeafFor("x99.evil.test", LeafUse::kRefusal), r);
  EXPECT_EQ(Verify((*ca)->cert(), r->cert), 0);
}

TEST_F(CaTest, BundleIsTheSystemBundleAndTheCa) {
  auto ca = Ca::LoadOrCreate(dir_);
  ASSERT_TRUE(ca.ok());
  ASSERT_TRUE(WriteFile(dir_ + "/system.crt", "SYSTEM CERTS", 0644).ok());
  auto path = (*ca)->WriteBundle(dir_ + "/system.crt");
  ASSERT_TRUE(path.ok()) << path.status().message();
  auto bundle = ReadFile(*path);
  ASSERT_TRUE(bundle.ok());
  EXPECT_EQ(*bundle, "SYSTEM CERTS\n" + (*ca)->cert_pem());
  EXPECT_TRUE((*ca)->WriteBundle(dir_ + "/missing.crt").ok());
}

}  // namespace
}  // namespace sbx::network

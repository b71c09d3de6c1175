// The tokens sbx hands out (envd access tokens, traffic tokens) and the URL signatures keyed by
// them: HMACs under the install secret, so that a copy of the database alone cannot make them
// (threats.md row 44).
#include <gtest/gtest.h>

#include <regex>

#include "api/e2b/internal.h"
#include "api/e2b/wire.h"
#include "common/secret.h"

namespace sbx::api::e2b {
namespace {

InstallSecret Secret(char fill) { return *InstallSecret::FromBytes(std::string(32, fill)); }

// What tokens were before the install secret: SHA-256 over values the database holds (the owner
// key's stored hash and the sandbox id). Anyone with a copy of sbx.db could compute these.
std::string OldEnvdToken(const sandbox::ApiKeyRecord& key, const std::string& id) {
  return sandbox::Sha256Hex("sbx-e2b-envd-token\n" + key.hash + "\n" + id);
}
std::string OldTrafficToken(const sandbox::ApiKeyRecord& key, const std::string& id) {
  return sandbox::Sha256Hex("sbx-e2b-traffic-token\n" + key.hash + "\n" + id);
}

TEST(Tokens, AreHmacsUnderTheInstallSecret) {
  InstallSecret a = Secret('a'), b = Secret('b');
  const std::string key = "key_abcdefghijkl", id = "sbx0123456789abcdefgh";
  std::string envd = EnvdToken(a, key, id), traffic = TrafficToken(a, key, id);
  EXPECT_TRUE(std::regex_match(envd, std::regex("[0-9a-f]{64}"))) << envd;
  EXPECT_TRUE(std::regex_match(traffic, std::regex("[0-9a-f]{64}"))) << traffic;
  // Stable for one install (they survive a restart), different per use, key and sandbox.
  EXPECT_EQ(envd, EnvdToken(Secret('a'), key, id));
  EXPECT_NE(envd, traffic);
  EXPECT_NE(envd, EnvdToken(a, "key_other", id));
  EXPECT_NE(envd, EnvdToken(a, key, "sbxother"));
  // Another install secret makes other tokens.
  EXPECT_NE(envd, EnvdToken(b, key, id));
  EXPECT_NE(traffic, TrafficToken(b, key, id));
}

TEST(Tokens, CannotBeDerivedFromTheDatabase) {
  // Everything a copy of sbx.db tells about a key and a sandbox.
  sandbox::ApiKeyRecord key;
  key.id = "key_abcdefghijkl";
  key.hash = sandbox::Sha256Hex("sbx_" + std::string(40, 'x'));
  const std::string id = "sbx0123456789abcdefgh";
  InstallSecret secret = Secret('s');
  std::string envd = EnvdToken(secret, key.id, id), traffic = TrafficToken(secret, key.id, id);
  EXPECT_NE(envd, OldEnvdToken(key, id));
  EXPECT_NE(traffic, OldTrafficToken(key, id));
  for (const std::string& guess :
       {sandbox::Sha256Hex(key.id + "\n" + id), sandbox::Sha256Hex(key.hash + "\n" + id),
        sandbox::Sha256Hex("sbx-envd-token\n" + key.id + "\n" + id),
        sandbox::Sha256Hex("sbx-traffic-token\n" + key.id + "\n" + id)}) {
    EXPECT_NE(envd, guess);
    EXPECT_NE(traffic, guess);
  }
}

TEST(Tokens, FileSignaturesStayE2bsAndAreKeyedByTheEnvdToken) {
  // The E2B SDK signs URLs itself (spec 2.6), so the format stays E2B's; what changes is that
  // the token it is keyed by is an HMAC under the install secret.
  const std::string key = "key_abcdefghijkl", id = "sbx0123456789abcdefgh";
  std::string with_a =
      FileSignature("/home/user/a.txt", "read", "", EnvdToken(Secret('a'), key, id), std::nullopt);
  std::string with_b =
      FileSignature("/home/user/a.txt", "read", "", EnvdToken(Secret('b'), key, id), std::nullopt);
  EXPECT_EQ(with_a.rfind("v1_", 0), 0u);
  EXPECT_NE(with_a, with_b);
  sandbox::ApiKeyRecord rec;
  rec.id = key;
  rec.hash = sandbox::Sha256Hex("sbx_" + std::string(40, 'x'));
  EXPECT_NE(with_a,
            FileSignature("/home/user/a.txt", "read", "", OldEnvdToken(rec, id), std::nullopt));
}

}  // namespace
}  // namespace sbx::api::e2b

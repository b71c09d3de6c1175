// The sandbox-facing half of ingress: the traffic token and port parsing. The relay itself is
// proved end to end against a real box (tests/integration/serve_test.cc, tests/e2e/ports).
#include "network/ingress.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <regex>

namespace sbx::network {
namespace {

InstallSecret Secret(char fill) { return *InstallSecret::FromBytes(std::string(32, fill)); }

TEST(Ingress, TrafficTokenIsAnHmacPerInstallKeyAndSandbox) {
  InstallSecret a = Secret('a');
  const std::string key = "key_abcdefghijkl", id = "sbx0123456789abcdefgh";
  std::string t = TrafficToken(a, key, id);
  EXPECT_TRUE(std::regex_match(t, std::regex("[0-9a-f]{64}"))) << t;
  // The value every released sbx computed: tokens handed out before stay valid.
  EXPECT_EQ(t, a.HmacHex("sbx-traffic-token\n" + key + "\n" + id));
  EXPECT_NE(t, TrafficToken(Secret('b'), key, id));
  EXPECT_NE(t, TrafficToken(a, "key_other", id));
  EXPECT_NE(t, TrafficToken(a, key, "sbxother"));
  EXPECT_TRUE(IsTrafficToken(a, key, id, t));
  EXPECT_FALSE(IsTrafficToken(a, key, id, ""));
  EXPECT_FALSE(IsTrafficToken(a, key, id, t.substr(1)));
  EXPECT_FALSE(IsTrafficToken(a, "key_other", id, t));
}

// The query of a signed URL: "sbx_expires=E&sbx_signature=S" -> {E, S}.
std::pair<std::string, std::string> Split(const std::string& q) {
  size_t amp = q.find('&');
  return {q.substr(q.find('=') + 1, amp - q.find('=') - 1), q.substr(q.rfind('=') + 1)};
}

TEST(Ingress, ASignedPortUrlIsBoundToKeySandboxPortAndExpiry) {
  InstallSecret a = Secret('a');
  const std::string key = "key_abcdefghijkl", id = "sbx0123456789abcdefgh";
  std::string q = SignPortUrl(a, key, id, 8080, 1000);
  EXPECT_TRUE(std::regex_match(q, std::regex("sbx_expires=1000&sbx_signature=[0-9a-f]{64}"))) << q;
  auto [exp, sig] = Split(q);
  EXPECT_EQ(VerifyPortUrl(a, key, id, 8080, exp, sig, 999), PortUrlCheck::kValid);
  EXPECT_EQ(VerifyPortUrl(a, key, id, 8080, exp, sig, 1000), PortUrlCheck::kExpired);
  EXPECT_EQ(VerifyPortUrl(a, key, id, 8081, exp, sig, 999), PortUrlCheck::kBadSignature);
  EXPECT_EQ(VerifyPortUrl(a, key, "sbxother", 8080, exp, sig, 999), PortUrlCheck::kBadSignature);
  EXPECT_EQ(VerifyPortUrl(a, "key_other", id, 8080, exp, sig, 999), PortUrlCheck::kBadSignature);
  EXPECT_EQ(VerifyPortUrl(Secret('b'), key, id, 8080, exp, sig, 999), PortUrlCheck::kBadSignature);
  // A later expiry with the old signature, another spelling of the same expiry, junk.
  EXPECT_EQ(VerifyPortUrl(a, key, id, 8080, "2000", sig, 999), PortUrlCheck::kBadSignature);
  EXPECT_EQ(VerifyPortUrl(a, key, id, 8080, "01000", sig, 999), PortUrlCheck::kBadSignature);
  EXPECT_EQ(VerifyPortUrl(a, key, id, 8080, "-1", sig, 999), PortUrlCheck::kBadSignature);
  EXPECT_EQ(VerifyPortUrl(a, key, id, 8080, "", sig, 999), PortUrlCheck::kBadSignature);
  EXPECT_EQ(VerifyPortUrl(a, key, id, 8080, exp, "", 999), PortUrlCheck::kBadSignature);
  EXPECT_EQ(VerifyPortUrl(a, key, id, 8080, exp, sig.substr(1), 999), PortUrlCheck::kBadSignature);
}

TEST(Ingress, PortsAreDecimal1To65535) {
  EXPECT_EQ(ParsePort("8000"), 8000);
  EXPECT_EQ(ParsePort("1"), 1);
  EXPECT_EQ(ParsePort("65535"), 65535);
  for (const char* bad : {"", "0", "65536", "99999", "-1", "+80", "80a", " 80", "0x50", "123456"})
    EXPECT_EQ(ParsePort(bad), 0) << bad;
  EXPECT_FALSE(ValidPort(0));
  EXPECT_FALSE(ValidPort(70000));
}

TEST(Ingress, APortIsOnTheBoxLoopback) {
  sockaddr_in a = BoxLoopback(8000);
  EXPECT_EQ(a.sin_family, AF_INET);
  EXPECT_EQ(ntohs(a.sin_port), 8000);
  EXPECT_EQ(ntohl(a.sin_addr.s_addr), INADDR_LOOPBACK);
}

}  // namespace
}  // namespace sbx::network

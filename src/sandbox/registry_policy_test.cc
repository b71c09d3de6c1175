// The registry policy of daemon builds (registry_policy.h): which references may be pulled, where
// they connect, and the check of every connection's addresses. No network: the connection check
// is called as the registry client calls it.
#include "sandbox/registry_policy.h"

#include <gtest/gtest.h>

namespace sbx::sandbox {
namespace {

storage::ImageRef Ref(const std::string& s) {
  auto r = storage::ParseImageRef(s, true);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : storage::ImageRef{};
}

TEST(RegistryPolicy, OnlyListedRegistriesAndMirrors) {
  RegistryPolicy p;
  p.allowed = {"127.0.0.1:5000", "registry.example.com"};
  p.mirrors = {{"docker.io", "127.0.0.1:6000"}};
  ASSERT_TRUE(ValidateRegistryPolicy(p).ok());
  EXPECT_TRUE(PullOptionsFor(p, Ref("127.0.0.1:5000/x:1")).ok());
  EXPECT_TRUE(PullOptionsFor(p, Ref("registry.example.com:8443/x")).ok());  // any port of it
  auto hub = PullOptionsFor(p, Ref("python:3.12"));
  ASSERT_TRUE(hub.ok());
  EXPECT_EQ(hub->endpoint, "127.0.0.1:6000");
  for (const char* refused : {"127.0.0.1:5001/x", "localhost:5000/x", "quay.io/x/y",
                              "169.254.169.254/latest:meta", "[::1]:5000/x"}) {
    auto o = PullOptionsFor(p, Ref(refused));
    ASSERT_FALSE(o.ok()) << refused;
    EXPECT_EQ(o.status().err(), EPERM);
    EXPECT_NE(o.status().message().find("sbx serve --registry"), std::string::npos);
  }
  // The default: nothing.
  EXPECT_EQ(PullOptionsFor(RegistryPolicy{}, Ref("python:3.12")).status().err(), EPERM);
  // `sbx build`: anything, no connection check.
  RegistryPolicy any;
  any.any_registry = true;
  auto o = PullOptionsFor(any, Ref("quay.io/x/y"));
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o->check_connect);
}

TEST(RegistryPolicy, ConnectionsGoToListedHostsOrPublicAddresses) {
  RegistryPolicy p;
  p.allowed = {"127.0.0.1:5000", "docker.io"};
  auto o = PullOptionsFor(p, Ref("127.0.0.1:5000/x"));
  ASSERT_TRUE(o.ok());
  ASSERT_TRUE(o->check_connect);
  auto& check = o->check_connect;
  EXPECT_TRUE(check("127.0.0.1", 5000, {"127.0.0.1"}).ok());           // listed: its own registry
  EXPECT_TRUE(check("storage.example", 443, {"93.184.216.34"}).ok());  // a public redirect
  for (const auto& [host, addr] : std::vector<std::pair<std::string, std::string>>{
           {"127.0.0.1", "127.0.0.1"},  // another port of a listed host
           {"localhost", "127.0.0.1"},
           {"localhost", "::1"},
           {"meta.example", "169.254.169.254"},
           {"mapped.example", "::ffff:127.0.0.1"},
           {"lan.example", "192.168.1.10"},
           {"ula.example", "fd00::1"},
           {"zero.example", "0.0.0.0"}}) {
    Status s = check(host, host == "127.0.0.1" ? 5001 : 80, {"93.184.216.34", addr});
    EXPECT_EQ(s.err(), EPERM) << host << " " << addr;
    EXPECT_NE(s.message().find("not a registry the operator named"), std::string::npos);
  }
}

TEST(RegistryPolicy, FlagsAreChecked) {
  RegistryPolicy p;
  p.allowed = {"http://x"};
  EXPECT_NE(ValidateRegistryPolicy(p).message().find("--registry"), std::string::npos);
  p.allowed.clear();
  p.mirrors = {{"docker.io", "not a host"}};
  EXPECT_NE(ValidateRegistryPolicy(p).message().find("--registry-mirror"), std::string::npos);
  p.mirrors.clear();
  p.insecure = {"a/b"};
  EXPECT_NE(ValidateRegistryPolicy(p).message().find("--insecure-registry"), std::string::npos);
}

}  // namespace
}  // namespace sbx::sandbox

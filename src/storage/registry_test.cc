// Unit tests of the registry client's parsers (registry.h): references, WWW-Authenticate
// challenges and docker config credentials. Pulls against real registries are in
// tests/integration/registry_test.cc.
#include "storage/registry.h"

#include <gtest/gtest.h>

#include "common/encoding.h"

namespace sbx::storage {
namespace {

TEST(ParseImageRef, TagDigestAndDefaults) {
  auto r = ParseImageRef("127.0.0.1:5000/python:3.12");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->registry, "127.0.0.1:5000");
  EXPECT_EQ(r->repository, "python");
  EXPECT_EQ(r->tag, "3.12");
  EXPECT_EQ(r->digest, "");
  EXPECT_EQ(r->String(), "127.0.0.1:5000/python:3.12");

  r = ParseImageRef("localhost/ns/sub/name");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->registry, "localhost");
  EXPECT_EQ(r->repository, "ns/sub/name");
  EXPECT_EQ(r->tag, "latest");

  std::string d = "sha256:" + std::string(64, 'a');
  r = ParseImageRef("reg.example.com/ns/name@" + d);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->repository, "ns/name");
  EXPECT_EQ(r->tag, "");
  EXPECT_EQ(r->digest, d);
  EXPECT_EQ(r->String(), "reg.example.com/ns/name@" + d);

  r = ParseImageRef("[::1]:5000/a__b.c-d--e:v1.0_x@" + d);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->registry, "[::1]:5000");
  EXPECT_EQ(r->repository, "a__b.c-d--e");
  EXPECT_EQ(r->tag, "v1.0_x");
  EXPECT_EQ(r->digest, d);
}

TEST(ParseImageRef, NoRegistryIsAnErrorThatSaysToNameOne) {
  for (const char* ref : {"python:3.12", "library/python", "python"}) {
    auto r = ParseImageRef(ref);
    ASSERT_FALSE(r.ok()) << ref;
    EXPECT_EQ(r.status().err(), EINVAL);
    EXPECT_NE(r.status().message().find("name the registry"), std::string::npos)
        << r.status().message();
  }
}

// Builds read references as Docker does: no registry host is Docker Hub, official images under
// library/.
TEST(ParseImageRef, DockerHubDefaultForBuilds) {
  auto r = ParseImageRef("python:3.12", true);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->String(), "docker.io/library/python:3.12");
  r = ParseImageRef("ns/app", true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->String(), "docker.io/ns/app:latest");
  r = ParseImageRef("docker.io/python", true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->String(), "docker.io/library/python:latest");
  r = ParseImageRef("127.0.0.1:5000/python:3.12", true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->String(), "127.0.0.1:5000/python:3.12");
  r = ParseImageRef("alpine@sha256:" + std::string(64, 'a'), true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->repository, "library/alpine");
  EXPECT_EQ(ParseImageRef("Python:3", true).status().err(), EINVAL);
}

TEST(ParseImageRef, RejectsMalformed) {
  for (const std::string& ref :
       {std::string(""), std::string("reg.io/"), std::string("reg.io/Upper"),
        std::string("reg.io/a..b"), std::string("reg.io/a/"), std::string("reg.io/-a"),
        std::string("reg.io/a:"), std::string("reg.io/a:.x"), std::string("reg.io/a:x y"),
        std::string("reg.io/a@sha512:") + std::string(128, 'a'),
        std::string("reg.io/a@sha256:") + std::string(63, 'a'),
        std::string("reg.io/a@sha256:") + std::string(64, 'A'), std::string("reg.io:0/a"),
        std::string("reg.io:99999/a"), std::string("re g.io/a"), std::string("reg.io/a/../b"),
        std::string("reg.io/a:") + std::string(129, 't'), std::string(600, 'a')}) {
    auto r = ParseImageRef(ref);
    ASSERT_FALSE(r.ok()) << ref;
    EXPECT_EQ(r.status().err(), EINVAL) << ref;
  }
}

TEST(ParseAuthChallenge, BearerAndBasic) {
  auto c = ParseAuthChallenge(
      R"(Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull,push")");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->scheme, "bearer");
  EXPECT_EQ(c->Param("realm"), "https://auth.example.com/token");
  EXPECT_EQ(c->Param("service"), "registry.example.com");
  EXPECT_EQ(c->Param("scope"), "repository:a/b:pull,push");
  EXPECT_EQ(c->Param("absent"), "");

  c = ParseAuthChallenge(R"(Basic realm="a \"quoted\" realm", charset=UTF-8)");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->scheme, "basic");
  EXPECT_EQ(c->Param("realm"), "a \"quoted\" realm");
  EXPECT_EQ(c->Param("charset"), "UTF-8");

  EXPECT_FALSE(ParseAuthChallenge("").ok());
  EXPECT_FALSE(ParseAuthChallenge(R"(Bearer realm="unterminated)").ok());
  EXPECT_FALSE(ParseAuthChallenge("Bearer realm").ok());
}

TEST(DockerConfigAuth, AuthAndUsernamePassword) {
  std::string cfg = R"({"auths":{
      "https://index.docker.io/v1/":{"auth":")" +
                    Base64Encode("u1:p1") + R"("},
      "127.0.0.1:5000":{"auth":")" +
                    Base64Encode("u2:pa:ss") + R"("},
      "reg.example.com":{"username":"u3","password":"p3"}}})";
  auto a = DockerConfigAuth(cfg, "127.0.0.1:5000");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->first, "u2");
  EXPECT_EQ(a->second, "pa:ss");
  a = DockerConfigAuth(cfg, "index.docker.io");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "u1");
  a = DockerConfigAuth(cfg, "reg.example.com");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->second, "p3");
  EXPECT_EQ(DockerConfigAuth(cfg, "other:1").status().err(), ENOENT);
  EXPECT_EQ(DockerConfigAuth("{}", "x").status().err(), ENOENT);
  EXPECT_EQ(DockerConfigAuth("[", "x").status().err(), EINVAL);
  EXPECT_EQ(DockerConfigAuth(R"({"auths":{"x":{"auth":"!!"}}})", "x").status().err(), EINVAL);
}

TEST(PullImage, RefusesAReferenceWithoutRegistryBeforeAnyIo) {
  auto r = PullImage(PullOptions{}, "python:3.12", "/nonexistent/never-made");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().err(), EINVAL);
}

}  // namespace
}  // namespace sbx::storage

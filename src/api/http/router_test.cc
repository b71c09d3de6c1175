#include "api/http/router.h"

#include <gtest/gtest.h>

#include "api/http/url.h"

namespace sbx::http {
namespace {

using Kind = Router::Match::Kind;

boost::asio::awaitable<void> Noop(Exchange&) { co_return; }

TEST(RouterTest, LiteralBeatsParamBeatsRest) {
  Router r;
  r.Get("/v1/sandboxes/{id}", Noop);
  r.Get("/v1/sandboxes/stats", Noop);
  r.Get("/v1/sandboxes/{id}/files/{path...}", Noop);
  r.Post("/v1/sandboxes", Noop);

  auto m = r.Find("GET", "/v1/sandboxes/abc");
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(m.params.Get("id"), "abc");

  m = r.Find("GET", "/v1/sandboxes/stats");
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_TRUE(m.params.items().empty());

  m = r.Find("GET", "/v1/sandboxes/a%20b/files/etc/my%2Fconf.d/x");
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(m.params.Get("id"), "a b");
  EXPECT_EQ(m.params.Get("path"), "etc/my/conf.d/x");

  m = r.Find("GET", "/v1/sandboxes/a/files");
  ASSERT_EQ(m.kind, Kind::kFound);
  EXPECT_EQ(m.params.Get("path"), "");
}

TEST(RouterTest, NotFoundAndMethodNotAllowed) {
  Router r;
  r.Get("/v1/sandboxes/{id}", Noop);
  r.Delete("/v1/sandboxes/{id}", Noop);
  EXPECT_EQ(r.Find("GET", "/v1/nope").kind, Kind::kNotFound);
  EXPECT_EQ(r.Find("GET", "/v1/sandboxes/").kind, Kind::kNotFound);  // empty {id}
  EXPECT_EQ(r.Find("GET", "/v1/sandboxes/a/b").kind, Kind::kNotFound);
  auto m = r.Find("POST", "/v1/sandboxes/x");
  EXPECT_EQ(m.kind, Kind::kMethodNotAllowed);
  EXPECT_EQ(m.allow, "DELETE, GET");
  EXPECT_EQ(r.Find("GET", "/v1/sandboxes/%zz").kind, Kind::kBadPath);
  EXPECT_EQ(r.Find("GET", "/v1/sandboxes/%00").kind, Kind::kBadPath);
}

TEST(RouterTest, BadPatternsThrow) {
  Router r;
  EXPECT_THROW(r.Get("nope", Noop), std::invalid_argument);
  EXPECT_THROW(r.Get("/a/{rest...}/b", Noop), std::invalid_argument);
  EXPECT_THROW(r.Get("/a/{}", Noop), std::invalid_argument);
  EXPECT_THROW(r.Get("/a/x{y}", Noop), std::invalid_argument);
}

TEST(UrlTest, QueryDecoding) {
  auto q = ParseQuery("a=1&b=x%20y+z&a=2&&flag&e=%E2%9C%93");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->GetAll("a"), (std::vector<std::string>{"1", "2"}));
  EXPECT_EQ(q->Get("b"), "x y z");
  EXPECT_EQ(q->Get("flag"), "");
  EXPECT_EQ(q->Get("e"), "\xE2\x9C\x93");
  EXPECT_FALSE(q->Has("zzz"));
  EXPECT_FALSE(ParseQuery("a=%4").ok());
  EXPECT_FALSE(ParseQuery("a=%G0").ok());
  EXPECT_EQ(PercentEncode("a b/c", true), "a%20b/c");
  EXPECT_EQ(PercentEncode("a b/c"), "a%20b%2Fc");
}

}  // namespace
}  // namespace sbx::http

// Secrets against a real SQLite store: ownership, sealing at rest, bindings.
#include "sandbox/secrets.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>

#include "common/fs.h"

namespace sbx::sandbox {
namespace {

constexpr char kValue[] = "sk-live-very-secret-0123456789";

class SecretsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-secrets-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto st = store::Store::Open(dir_ + "/sbx.db");
    ASSERT_TRUE(st.ok()) << st.status().message();
    store_ = std::move(*st);
    a_ = store_->CreateApiKey("a", 10, 10)->record;
    b_ = store_->CreateApiKey("b", 10, 10)->record;
  }
  void TearDown() override {
    store_.reset();
    (void)RemoveTree(dir_);
  }
  Secrets Make(const InstallSecret& s) {
    return Secrets(*store_, s,
                   [this](const std::string& type, const std::string&, nlohmann::json detail) {
                     audits_.push_back(type + " " + detail.dump());
                   });
  }
  SecretInput Input(const std::string& name) {
    SecretInput in;
    in.name = name;
    in.value = kValue;
    in.hosts = {"api.openai.com", "*.Example.com"};
    in.header = "Authorization";
    in.format = "Bearer {}";
    return in;
  }
  std::string dir_;
  std::unique_ptr<store::Store> store_;
  store::ApiKeyRecord a_, b_;
  InstallSecret secret_ = *InstallSecret::FromBytes(std::string(32, 's'));
  std::vector<std::string> audits_;
};

TEST_F(SecretsTest, AKeySeesOnlyItsOwnAndNoAnswerHoldsTheValue) {
  Secrets s = Make(secret_);
  auto added = s.Add(a_, Input("openai"));
  ASSERT_TRUE(added.ok()) << added.status().message();
  EXPECT_TRUE(added->sealed.empty());
  EXPECT_EQ(added->hosts, (std::vector<std::string>{"api.openai.com", "*.example.com"}));
  EXPECT_EQ(s.Add(a_, Input("openai")).status().err(), EEXIST);
  EXPECT_EQ(s.Get(b_, "openai").status().err(), ENOENT);
  EXPECT_EQ(s.Get(b_, added->id).status().err(), ENOENT);
  EXPECT_TRUE(s.List(b_)->empty());
  EXPECT_EQ(s.Delete(b_, "openai").err(), ENOENT);
  EXPECT_EQ(s.Bind(b_, {{"OPENAI_API_KEY", "openai"}}).status().err(), EINVAL);
  ASSERT_EQ(s.List(a_)->size(), 1u);
  EXPECT_TRUE(s.List(a_)->front().sealed.empty());
  EXPECT_TRUE(s.Get(a_, "openai")->sealed.empty());
  for (const std::string& e : audits_) EXPECT_EQ(e.find(kValue), std::string::npos) << e;
  // At rest: the database file never holds the value.
  store_.reset();
  std::ifstream f(dir_ + "/sbx.db", std::ios::binary);
  std::stringstream all;
  all << f.rdbuf();
  std::ifstream w(dir_ + "/sbx.db-wal", std::ios::binary);
  all << w.rdbuf();
  EXPECT_EQ(all.str().find(kValue), std::string::npos);
  EXPECT_NE(all.str().find("openai"), std::string::npos);
}

TEST_F(SecretsTest, BindOpensValuesWithFreshPlaceholders) {
  Secrets s = Make(secret_);
  ASSERT_TRUE(s.Add(a_, Input("openai")).ok());
  auto b1 = s.Bind(a_, {{"OPENAI_API_KEY", "openai"}, {"OTHER", "openai"}});
  ASSERT_TRUE(b1.ok()) << b1.status().message();
  ASSERT_EQ(b1->size(), 2u);
  EXPECT_EQ((*b1)[0].value, kValue);
  EXPECT_EQ((*b1)[0].header, "Authorization");
  EXPECT_EQ((*b1)[0].format, "Bearer {}");
  EXPECT_EQ((*b1)[0].placeholder.rfind(kPlaceholderPrefix, 0), 0u);
  EXPECT_EQ((*b1)[0].placeholder.size(), std::string(kPlaceholderPrefix).size() + 32);
  EXPECT_NE((*b1)[0].placeholder, (*b1)[1].placeholder);
  auto b2 = s.Bind(a_, {{"OPENAI_API_KEY", "openai"}});
  ASSERT_TRUE(b2.ok());
  EXPECT_NE((*b2)[0].placeholder, (*b1)[0].placeholder);  // random per box
  auto unknown = s.Bind(a_, {{"X", "nope"}, {"Y", "missing"}, {"Z", "openai"}});
  ASSERT_EQ(unknown.status().err(), EINVAL);
  EXPECT_NE(unknown.status().message().find("nope"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("missing"), std::string::npos);
  EXPECT_EQ(s.Bind(a_, {{"1BAD", "openai"}}).status().err(), EINVAL);
}

TEST_F(SecretsTest, AnotherInstallSecretCannotOpenThem) {
  ASSERT_TRUE(Make(secret_).Add(a_, Input("openai")).ok());
  InstallSecret other = *InstallSecret::FromBytes(std::string(32, 'x'));
  auto b = Make(other).Bind(a_, {{"K", "openai"}});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message().find(kValue), std::string::npos);
}

TEST_F(SecretsTest, BadInputIsRefusedNamingTheField) {
  Secrets s = Make(secret_);
  SecretInput in = Input("bad name");
  EXPECT_EQ(s.Add(a_, in).status().err(), EINVAL);
  in = Input("ok");
  in.value = "line\r\nX-Injected: 1";
  auto r = s.Add(a_, in);
  EXPECT_EQ(r.status().err(), EINVAL);
  EXPECT_EQ(r.status().message().find("Injected"), std::string::npos);
  in = Input("ok");
  in.hosts = {"bad host"};
  EXPECT_EQ(s.Add(a_, in).status().err(), EINVAL);
  in = Input("ok");
  in.format = "Bearer";
  EXPECT_EQ(s.Add(a_, in).status().err(), EINVAL);
  in = Input("ok");
  in.value.clear();
  EXPECT_EQ(s.Add(a_, in).status().err(), EINVAL);
  in = Input("ok");
  in.replace = true;
  ASSERT_TRUE(s.Add(a_, in).ok());
  auto again = s.Add(a_, in);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->version, 2);
  EXPECT_TRUE(s.Delete(a_, "ok").ok());
  EXPECT_EQ(s.Get(a_, "ok").status().err(), ENOENT);
}

// Version 12: what a sandbox record keeps of its bindings opens again with the same
// placeholders; a secret deleted since is left out and named.
TEST_F(SecretsTest, RecordedBindingsOpenAgainWithTheirPlaceholders) {
  Secrets s = Make(secret_);
  ASSERT_TRUE(s.Add(a_, Input("openai")).ok());
  ASSERT_TRUE(s.Add(a_, Input("gone")).ok());
  auto bound = s.Bind(a_, {{"OPENAI_API_KEY", "openai"}, {"GONE", "gone"}});
  ASSERT_TRUE(bound.ok());
  std::vector<store::SecretRef> refs = RefsOf(*bound);
  ASSERT_EQ(refs.size(), 2u);

  // Kept with the sandbox while it lives, through the store (no value in the row).
  store::SandboxRecord rec;
  rec.id = "sbx-secrets-row";
  rec.template_name = "host";
  rec.state = store::kStateRunning;
  rec.owner_key_id = a_.id;
  rec.secrets = refs;
  rec.limits.egress_mbps = 8.5;
  ASSERT_TRUE(store_->PutSandbox(rec).ok());
  auto read = store_->GetSandbox(rec.id);
  ASSERT_TRUE(read.ok() && *read);
  EXPECT_EQ((*read)->secrets, refs);
  EXPECT_EQ((*read)->limits.egress_mbps, 8.5);

  ASSERT_TRUE(s.Delete(a_, "gone").ok());
  std::vector<std::string> missing;
  auto again = s.Rebind(a_.id, (*read)->secrets, &missing);
  ASSERT_TRUE(again.ok()) << again.status().message();
  ASSERT_EQ(again->size(), 1u);
  EXPECT_EQ((*again)[0].env, "OPENAI_API_KEY");
  EXPECT_EQ((*again)[0].value, kValue);
  EXPECT_EQ((*again)[0].header, "Authorization");
  for (const auto& b : *bound)
    if (b.env == "OPENAI_API_KEY") {
      EXPECT_EQ((*again)[0].placeholder, b.placeholder);
    }
  EXPECT_EQ(missing, (std::vector<std::string>{"gone"}));
  // Another key's name is not found through a record either, and a forged placeholder that is
  // not one of ours is not bound.
  missing.clear();
  EXPECT_TRUE(s.Rebind(b_.id, refs, &missing)->empty());
  EXPECT_EQ(missing.size(), 2u);
  EXPECT_TRUE(s.Rebind(a_.id, {{"OPENAI_API_KEY", "openai", "Bearer"}}, nullptr)->empty());

  // An ended sandbox keeps no bindings.
  rec.state = store::kStateKilled;
  ASSERT_TRUE(store_->PutSandbox(rec).ok());
  EXPECT_TRUE((*store_->GetSandbox(rec.id))->secrets.empty());
}

// E2B's network.rules: each header with its ${e2b.secrets.NAME} replaced by the owner's value,
// for the rule's domain only; never another key's secret.
TEST_F(SecretsTest, RulesBecomeHeaderBindingsOfTheOwnersSecrets) {
  Secrets s = Make(secret_);
  ASSERT_TRUE(s.Add(a_, Input("openai")).ok());
  SecretInput other = Input("second");
  other.value = "v2";
  ASSERT_TRUE(s.Add(a_, other).ok());
  nlohmann::json rules = nlohmann::json::parse(R"({
    "API.Example.com": [{"transform": {"headers": {
      "Authorization": "Bearer ${e2b.secrets.openai}",
      "X-Both": "${e2b.secrets.openai}:${e2b.secrets.second}",
      "X-Plain": "literal ${HOME} {}"}}}]})");
  auto b = s.BindRules(a_.id, rules);
  ASSERT_TRUE(b.ok()) << b.status().message();
  ASSERT_EQ(b->size(), 3u);
  std::map<std::string, network::SecretBinding> by_header;
  for (const auto& x : *b) by_header[x.header] = x;
  EXPECT_EQ(by_header["Authorization"].value, std::string("Bearer ") + kValue);
  EXPECT_EQ(by_header["Authorization"].name, "openai");
  EXPECT_EQ(by_header["Authorization"].hosts, (std::vector<std::string>{"api.example.com"}));
  EXPECT_EQ(by_header["Authorization"].format, "{}");
  EXPECT_TRUE(by_header["Authorization"].env.empty());
  EXPECT_EQ(by_header["Authorization"].placeholder.rfind(kPlaceholderPrefix, 0), 0u);
  EXPECT_EQ(by_header["X-Both"].value, std::string(kValue) + ":v2");
  EXPECT_EQ(by_header["X-Both"].name, "openai,second");
  EXPECT_EQ(by_header["X-Plain"].value, "literal ${HOME} {}");
  EXPECT_EQ(by_header["X-Plain"].name, "");
  EXPECT_TRUE(RefsOf(*b).empty());  // nothing of a rule goes into the record's bindings
  EXPECT_EQ(*RuleSecretNames(rules), (std::vector<std::string>{"openai", "second"}));

  // B names A's secret: unknown, as if it did not exist.
  auto theirs = s.BindRules(b_.id, rules);
  ASSERT_EQ(theirs.status().err(), EINVAL);
  EXPECT_NE(theirs.status().message().find("no secret named openai"), std::string::npos);
  EXPECT_EQ(theirs.status().message().find(kValue), std::string::npos);
  // What sbx does not do is refused, not sent as it is.
  for (const char* v : {"${e2b.identity.tokens.github}", "${e2b.secrets.openai", "${e2b.x}",
                        "${e2b.secrets.bad name}"}) {
    nlohmann::json r = {{"api.example.com", {{{"transform", {{"headers", {{"X", v}}}}}}}}};
    EXPECT_EQ(s.BindRules(a_.id, r).status().err(), EINVAL) << v;
    EXPECT_EQ(RuleSecretNames(r).status().err(), EINVAL) << v;
  }
  EXPECT_TRUE(s.BindRules(a_.id, nlohmann::json::object())->empty());
}

}  // namespace
}  // namespace sbx::sandbox

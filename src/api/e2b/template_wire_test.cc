// Unit tests of E2B's template build bodies (template_wire.h), with the bodies the JS SDK
// (e2b 2.51) sends for Template().fromTemplate('base').copy().runCmd().setEnvs().setWorkdir().
#include "api/e2b/template_wire.h"

#include <gtest/gtest.h>

namespace sbx::api::e2b {
namespace {

using nlohmann::json;
using storage::BuildStep;

const std::string kHash(64, 'c');

TEST(E2bTemplateWire, TemplateRequestNamesAndTags) {
  auto r = ParseTemplateRequest(json{{"name", "my-app"}, {"cpuCount", 2}, {"memoryMB", 1024}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->base, "my-app");
  EXPECT_EQ(r->tags, std::vector<std::string>{"default"});  // as E2B's RegisterBuild
  EXPECT_EQ(r->target(), "my-app");
  EXPECT_TRUE(r->also().empty());
  auto tagged = ParseTemplateRequest(json{{"name", "my-app:v1"}, {"tags", {"v1"}}});
  ASSERT_TRUE(tagged.ok());
  EXPECT_EQ(tagged->target(), "my-app:v1");
  EXPECT_EQ(tagged->tags, std::vector<std::string>{"v1"});
  EXPECT_EQ(ParseTemplateRequest(json{{"alias", "old-style"}})->base, "old-style");
  EXPECT_EQ(ParseTemplateRequest(json::object()).status().err(), EINVAL);
  EXPECT_EQ(ParseTemplateRequest(json{{"name", "../etc"}}).status().err(), EINVAL);
  EXPECT_EQ(ParseTemplateRequest(json{{"name", "team/app"}}).status().err(), EINVAL);
  EXPECT_EQ(ParseTemplateRequest(json{{"name", "a"}, {"tags", {"Bad Tag"}}}).status().err(),
            EINVAL);
  EXPECT_EQ(ParseTemplateRequest(json{{"name", "a"}, {"cpuCount", "2"}}).status().err(), EINVAL);

  json answer = TemplateRequestJson(*tagged, "bld_x");
  EXPECT_EQ(answer, (json{{"templateID", "my-app"},
                          {"buildID", "bld_x"},
                          {"public", false},
                          {"names", {"my-app"}},
                          {"tags", {"v1"}},
                          {"aliases", {"my-app"}}}));
}

TEST(E2bTemplateWire, ABuildsTagsAreItsNameTagThenTheOthersAndDefaultIsTheBareName) {
  auto r = ParseTemplateRequest(
      json{{"name", "app:V1"}, {"tags", {" prod ", "v1", "default", "latest"}}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->tags, (std::vector<std::string>{"v1", "prod", "default", "latest"}));
  EXPECT_EQ(r->target(), "app:v1");
  EXPECT_EQ(r->also(), (std::vector<std::string>{"app:prod", "app", "app:latest"}));
  auto d = ParseTemplateRequest(json{{"name", "app:default"}});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->target(), "app");
  EXPECT_EQ(ParseTemplateRequest(json{{"name", "app:"}}).status().err(), EINVAL);
  EXPECT_EQ(ParseTemplateRequest(json{{"name", "app"}, {"tags", {"a:b"}}}).status().err(), EINVAL);
}

TEST(E2bTemplateWire, TagBodies) {
  auto t = ParseTags(json{{"target", "app:v1"}, {"tags", {"Production", "stable", "production"}}});
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(*t, (std::vector<std::string>{"production", "stable"}));
  // The SDK's own tests: a tag that starts with ':' and one that is "name:" are refused.
  EXPECT_EQ(ParseTags(json{{"tags", {":invalid-tag"}}}).status().err(), EINVAL);
  EXPECT_EQ(ParseTags(json{{"tags", {"e2b-tags-test:"}}}).status().err(), EINVAL);
  EXPECT_EQ(ParseTags(json{{"tags", json::array()}}).status().err(), EINVAL);
  EXPECT_EQ(ParseTags(json::object()).status().err(), EINVAL);
  EXPECT_EQ(ParseTags(json{{"tags", {1}}}).status().err(), EINVAL);
  json many = json::array();
  for (size_t i = 0; i <= kMaxTags; ++i) many.push_back("t" + std::to_string(i));
  EXPECT_EQ(ParseTags(json{{"tags", many}}).status().err(), EINVAL);
  EXPECT_EQ(ParseTemplateRequest(json{{"name", "a"}, {"tags", many}}).status().err(), EINVAL);

  std::vector<sandbox::TemplateBuilds::TagInfo> tags = {{"default", "bld_a", 1700000000000},
                                                        {"v1", "bld_b", 1700000001000}};
  EXPECT_EQ(TagsJson(tags), json::parse(R"([
    {"tag": "default", "buildID": "bld_a", "createdAt": "2023-11-14T22:13:20.000Z"},
    {"tag": "v1", "buildID": "bld_b", "createdAt": "2023-11-14T22:13:21.000Z"}])"));
}

TEST(E2bTemplateWire, BuildLogsPageByCursorDirectionLimitAndLevel) {
  sandbox::BuildStatus st;
  st.logs = {{1000, "info", "a"}, {2000, "error", "b"}, {3000, "info", "c"}, {4000, "debug", "d"}};
  auto messages = [](const json& j) {
    std::vector<std::string> out;
    for (const auto& e : j.at("logs")) out.push_back(e.at("message"));
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(messages(BuildLogsJson(st, std::nullopt, 100, false, "")), (V{"a", "b", "c", "d"}));
  EXPECT_EQ(messages(BuildLogsJson(st, 2000, 100, false, "")), (V{"b", "c", "d"}));
  EXPECT_EQ(messages(BuildLogsJson(st, 3000, 100, true, "")), (V{"c", "b", "a"}));
  EXPECT_EQ(messages(BuildLogsJson(st, std::nullopt, 2, true, "")), (V{"d", "c"}));
  EXPECT_EQ(messages(BuildLogsJson(st, std::nullopt, 1, false, "")), (V{"a"}));
  EXPECT_EQ(messages(BuildLogsJson(st, std::nullopt, 100, false, "info")), (V{"a", "b", "c"}));
  EXPECT_EQ(messages(BuildLogsJson(st, std::nullopt, 100, false, "error")), (V{"b"}));
  EXPECT_EQ(messages(BuildLogsJson(st, std::nullopt, 0, false, "")), V{});
  json first = BuildLogsJson(st, std::nullopt, 1, false, "")["logs"][0];
  EXPECT_EQ(first,
            (json{{"timestamp", "1970-01-01T00:00:01.000Z"}, {"level", "info"}, {"message", "a"}}));
}

TEST(E2bTemplateWire, TheSdksStepsBecomeBuildSteps) {
  // As TemplateBase.serialize() sends them (extra fields such as forceUpload are ignored).
  json body = json::parse(R"({
    "startCmd": "python -m http.server", "readyCmd": "sleep 1", "force": false,
    "fromTemplate": "base",
    "steps": [
      {"type": "COPY", "args": ["hello.txt", "/app/", "", "0644"], "force": false,
       "filesHash": ")" + kHash +
                          R"(", "resolveSymlinks": false, "gzip": true},
      {"type": "RUN", "args": ["echo built > /app/built"], "force": false},
      {"type": "RUN", "args": ["id -u > /tmp/uid", "nobody"], "force": false},
      {"type": "ENV", "args": ["GREETING", "hi", "EMPTY", ""], "force": false},
      {"type": "WORKDIR", "args": ["/app"], "force": false},
      {"type": "USER", "args": ["root"], "force": false}
    ]})");
  auto b = ParseBuildStart(body);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_TRUE(b->from_image.empty());
  EXPECT_EQ(b->spec.start_cmd, "python -m http.server");
  EXPECT_EQ(b->spec.ready_cmd, "sleep 1");
  EXPECT_FALSE(b->spec.no_cache);
  const auto& s = b->spec.steps;
  ASSERT_EQ(s.size(), 9u);
  EXPECT_EQ(s[0].kind, BuildStep::Kind::kFrom);
  EXPECT_EQ(s[0].args, std::vector<std::string>{"base"});
  EXPECT_EQ(s[1].kind, BuildStep::Kind::kCopy);
  EXPECT_EQ(s[1].args, (std::vector<std::string>{kHash + "/hello.txt", "/app/"}));
  EXPECT_EQ(s[1].chown, "");
  EXPECT_TRUE(s[1].copy_links);  // E2B copies links as links
  ASSERT_EQ(b->copies.size(), 1u);
  EXPECT_EQ(b->copies[0].files_hash, kHash);
  EXPECT_EQ(b->copies[0].mode, 0644);
  EXPECT_EQ(s[2].kind, BuildStep::Kind::kRun);
  EXPECT_EQ(s[2].args, std::vector<std::string>{"echo built > /app/built"});
  EXPECT_FALSE(s[2].exec_form);
  // RUN as a user: USER it, RUN, USER back to what it was.
  EXPECT_EQ(s[3].kind, BuildStep::Kind::kUser);
  EXPECT_EQ(s[3].args, std::vector<std::string>{"nobody"});
  EXPECT_EQ(s[4].kind, BuildStep::Kind::kRun);
  EXPECT_EQ(s[5].kind, BuildStep::Kind::kUser);
  EXPECT_EQ(s[5].args, std::vector<std::string>{"root"});
  EXPECT_EQ(s[6].kind, BuildStep::Kind::kEnv);
  EXPECT_EQ(s[6].args, (std::vector<std::string>{"GREETING", "hi", "EMPTY", ""}));
  EXPECT_EQ(s[7].kind, BuildStep::Kind::kWorkdir);
  EXPECT_EQ(s[8].kind, BuildStep::Kind::kUser);
  EXPECT_EQ(s[3].line, 3);  // the SDK's step index, 1-based after the base
}

TEST(E2bTemplateWire, BasesAndForce) {
  // The SDK's default image is E2B's base template's: sbx's base.
  auto def = ParseBuildStart(json{{"fromImage", "e2bdev/base"}, {"force", true}});
  ASSERT_TRUE(def.ok());
  EXPECT_TRUE(def->from_image.empty());
  EXPECT_EQ(def->spec.steps[0].args, std::vector<std::string>{"base"});
  EXPECT_TRUE(def->spec.no_cache);
  auto img = ParseBuildStart(json{{"fromImage", "python:3.12"}});
  ASSERT_TRUE(img.ok());
  EXPECT_EQ(img->from_image, "python:3.12");
  EXPECT_TRUE(img->spec.from_registry);  // pulled, never a local template of that name
  EXPECT_FALSE(def->spec.from_registry);
  // fromImageRegistry: the pull's credentials; cloud types are refused without an echo.
  auto creds = ParseBuildStart(
      json{{"fromImage", "r.example/x:1"},
           {"fromImageRegistry", {{"type", "registry"}, {"username", "u"}, {"password", "p4ss"}}}});
  ASSERT_TRUE(creds.ok()) << creds.status().message();
  EXPECT_EQ(creds->spec.registry_username, "u");
  EXPECT_EQ(creds->spec.registry_password, "p4ss");
  for (const char* type : {"aws", "gcp"}) {
    auto cloud = ParseBuildStart(
        json{{"fromImage", "x:1"},
             {"fromImageRegistry", {{"type", type}, {"awsSecretAccessKey", "SECRETVALUE"}}}});
    ASSERT_EQ(cloud.status().err(), EINVAL);
    EXPECT_NE(cloud.status().message().find(type), std::string::npos);
    EXPECT_EQ(cloud.status().message().find("SECRETVALUE"), std::string::npos);
  }
  EXPECT_EQ(ParseBuildStart(json{{"fromImage", "x:1"},
                                 {"fromImageRegistry", {{"type", "registry"}, {"username", "u"}}}})
                .status()
                .err(),
            EINVAL);
  EXPECT_EQ(
      ParseBuildStart(json{{"fromTemplate", "base"}, {"fromImageRegistry", {{"type", "registry"}}}})
          .status()
          .err(),
      EINVAL);
  auto step_force = ParseBuildStart(json{
      {"fromTemplate", "base"}, {"steps", {{{"type", "RUN"}, {"args", {"x"}}, {"force", true}}}}});
  ASSERT_TRUE(step_force.ok());
  EXPECT_TRUE(step_force->spec.no_cache);
  EXPECT_EQ(ParseBuildStart(json::object()).status().err(), EINVAL);
  EXPECT_EQ(ParseBuildStart(json{{"fromImage", "a"}, {"fromTemplate", "b"}}).status().err(),
            EINVAL);
}

TEST(E2bTemplateWire, BadStepsAreRefusedNamingTheField) {
  auto bad = [](json step) {
    auto r = ParseBuildStart(json{{"fromTemplate", "base"}, {"steps", {step}}});
    return r.ok() ? std::string("ok") : r.status().message();
  };
  EXPECT_NE(bad({{"type", "HEALTHCHECK"}, {"args", {"x"}}}).find("steps[0].type"),
            std::string::npos);
  EXPECT_NE(bad({{"type", "COPY"}, {"args", {"a", "/b"}}}).find("filesHash"), std::string::npos);
  EXPECT_NE(bad({{"type", "COPY"}, {"args", {"../a", "/b"}}, {"filesHash", kHash}}).find(".."),
            std::string::npos);
  EXPECT_NE(bad({{"type", "COPY"}, {"args", {"/etc/shadow", "/b"}}, {"filesHash", kHash}})
                .find("relative"),
            std::string::npos);
  EXPECT_NE(
      bad({{"type", "COPY"}, {"args", {"a", "/b", "", "999"}}, {"filesHash", kHash}}).find("octal"),
      std::string::npos);
  EXPECT_NE(bad({{"type", "ENV"}, {"args", {"ODD"}}}).find("pairs"), std::string::npos);
  EXPECT_NE(bad({{"type", "RUN"}, {"args", json::array()}}).find("steps[0].args"),
            std::string::npos);
  EXPECT_NE(bad({{"type", "RUN"}, {"args", {1}}}).find("strings"), std::string::npos);
  EXPECT_EQ(bad({{"type", "WORKDIR"}, {"args", {"/w"}}}), "ok");
}

TEST(E2bTemplateWire, BuildInfoAnswers) {
  sandbox::BuildStatus st;
  st.id = "bld_1";
  st.name = "app";
  st.state = sandbox::BuildState::kError;
  st.error = "RUN false: exit status 1";
  st.logs = {{1000, "info", "Step 1/2 : FROM base"}, {2000, "error", "exit status 1"}};
  json j = BuildInfoJson("app", st, 100, "");
  EXPECT_EQ(j["templateID"], "app");
  EXPECT_EQ(j["buildID"], "bld_1");
  EXPECT_EQ(j["status"], "error");
  EXPECT_EQ(j["logs"], (json{"Step 1/2 : FROM base", "exit status 1"}));
  ASSERT_EQ(j["logEntries"].size(), 2u);
  EXPECT_EQ(j["logEntries"][0], (json{{"timestamp", "1970-01-01T00:00:01.000Z"},
                                      {"level", "info"},
                                      {"message", "Step 1/2 : FROM base"}}));
  EXPECT_EQ(j["reason"]["message"], "RUN false: exit status 1");
  EXPECT_EQ(BuildInfoJson("app", st, 1, "")["logEntries"].size(), 1u);
  EXPECT_EQ(BuildInfoJson("app", st, 100, "error")["logEntries"].size(), 1u);
  st.state = sandbox::BuildState::kBuilding;
  EXPECT_FALSE(BuildInfoJson("app", st, 100, "").contains("reason"));
  EXPECT_EQ(BuildInfoJson("app", st, 100, "")["status"], "building");
}

TEST(E2bTemplateWire, TemplateAnswersHaveEveryRequiredField) {
  sandbox::TemplateInfo t;
  t.name = "app";
  t.owner = sandbox::TemplateOwner::kYou;
  t.build_id = "bld_1";
  t.created_at = 1000;
  t.updated_at = 2000;
  json j = TemplateJson(t);
  for (const char* f : {"templateID", "buildID", "cpuCount", "memoryMB", "diskSizeMB", "public",
                        "createdAt", "updatedAt", "createdBy", "lastSpawnedAt", "spawnCount",
                        "buildCount", "envdVersion", "aliases", "names", "buildStatus"})
    EXPECT_TRUE(j.contains(f)) << f;
  EXPECT_EQ(j["public"], false);
  EXPECT_EQ(j["buildStatus"], "ready");
  json w = TemplateWithBuildsJson(t);
  for (const char* f : {"templateID", "public", "aliases", "names", "createdAt", "updatedAt",
                        "lastSpawnedAt", "spawnCount", "builds"})
    EXPECT_TRUE(w.contains(f)) << f;
  ASSERT_EQ(w["builds"].size(), 1u);
  EXPECT_EQ(w["builds"][0]["buildID"], "bld_1");
}

}  // namespace
}  // namespace sbx::api::e2b

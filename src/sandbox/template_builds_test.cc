// Templates built through the API against a real SQLite store and real archives: who may build
// and delete which name, the builds' states, per-key uploads unpacked into a build's context.
// The Builder is a small recording peer here: the real one (sandbox/build.h) runs boxes, and
// what this file owns is what happens around it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "common/fs.h"
#include "sandbox/templates.h"

namespace sbx::sandbox {
namespace {

class RecordingBuilder : public Builder {
 public:
  Result<std::string> Start(BuildSpec spec) override {
    if (spec.steps.empty()) return Status::Error("no FROM", EINVAL);
    if (busy) return Status::Error("key runs 2 builds: at most 2 at once", EAGAIN);
    // What COPY would read, while the context exists.
    std::ifstream f(spec.context_dir + "/" + copied_path);
    std::stringstream ss;
    ss << f.rdbuf();
    copied = ss.str();
    struct stat st {};
    copied_mode = ::stat((spec.context_dir + "/" + copied_path).c_str(), &st) == 0
                      ? static_cast<int>(st.st_mode & 07777)
                      : -1;
    specs.push_back(std::move(spec));
    return std::string("fake-") + std::to_string(specs.size());
  }
  Result<BuildStatus> Get(const std::string& id, int64_t offset) override {
    BuildStatus st;
    st.id = id;
    st.state = state;
    st.error = state == BuildState::kError ? "RUN false: exit status 1" : "";
    std::vector<BuildLogLine> all = {{1, "info", "Step 1/2 : FROM base"},
                                     {2, "info", "Step 2/2 : RUN true"}};
    for (size_t i = static_cast<size_t>(offset); i < all.size(); ++i) st.logs.push_back(all[i]);
    return st;
  }
  Result<store::TemplateRecord> Run(BuildSpec,
                                    const std::function<void(const BuildLogLine&)>&) override {
    return Status::Error("not here", ENOSYS);
  }
  std::vector<BuildSpec> specs;
  bool busy = false;  // as the real one past a key's builds at once
  BuildState state = BuildState::kBuilding;
  std::string copied_path;
  std::string copied;
  int copied_mode = -1;
};

class TemplatesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-templates-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto st = store::Store::Open(dir_ + "/sbx.db");
    ASSERT_TRUE(st.ok()) << st.status().message();
    store_ = std::move(*st);
    a_ = store_->CreateApiKey("a", 10, 10)->record;
    b_ = store_->CreateApiKey("b", 10, 10)->record;
    op_ = store_->CreateApiKey("op", 10, 10, /*is_operator=*/true)->record;
    ts_.dir = dir_ + "/templates";
  }
  void TearDown() override {
    store_.reset();
    (void)RemoveTree(dir_);
  }
  TemplateBuilds Make(Builder* b) {
    return TemplateBuilds(
        *store_, ts_, dir_ + "/data", b,
        [this](const std::string& type, const std::string& key, nlohmann::json detail) {
          audits_.push_back(type + " " + key + " " + detail.dump());
        },
        clock_);
  }
  // A gzip tar of `files` (relative path -> content) made by tar(1), as the SDK's archive is.
  std::string Tar(const std::map<std::string, std::string>& files) {
    std::string src = dir_ + "/src-" + std::to_string(++tars_);
    EXPECT_TRUE(MakeDirs(src, 0755).ok());
    std::string names;
    for (const auto& [p, c] : files) {
      EXPECT_TRUE(
          MakeDirs(src + "/" + p.substr(0, p.rfind('/') == std::string::npos ? 0 : p.rfind('/')),
                   0755)
              .ok());
      std::ofstream(src + "/" + p) << c;
      names += " " + p;
    }
    std::string out = src + ".tar.gz";
    std::string cmd = "tar -czf " + out + " -C " + src + names;
    EXPECT_EQ(std::system(cmd.c_str()), 0);
    std::ifstream f(out, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  static std::function<Result<size_t>(char*, size_t)> Reader(const std::string& data) {
    auto pos = std::make_shared<size_t>(0);
    return [data, pos](char* buf, size_t n) -> Result<size_t> {
      size_t k = std::min(n, data.size() - *pos);
      std::memcpy(buf, data.data() + *pos, k);
      *pos += k;
      return k;
    };
  }
  static BuildSpec Spec() {
    BuildSpec s;
    s.steps.push_back({.kind = storage::BuildStep::Kind::kFrom, .args = {"base"}});
    return s;
  }

  std::string dir_;
  std::unique_ptr<store::Store> store_;
  store::ApiKeyRecord a_, b_, op_;
  storage::TemplateStore ts_;
  std::vector<std::string> audits_;
  int tars_ = 0;
  FakeClock clock_;
};

const std::string kHash(64, 'a');

TEST_F(TemplatesTest, ANameIsItsBuildersAndBuiltInsAreNobodys) {
  TemplateBuilds t = Make(nullptr);
  auto id = t.Reserve(a_, "app");
  ASSERT_TRUE(id.ok()) << id.status().message();
  EXPECT_TRUE(IsBuildId(*id)) << *id;
  EXPECT_EQ(t.Reserve(b_, "app").status().err(), EPERM);
  EXPECT_NE(t.Reserve(b_, "app").status().message().find("another key"), std::string::npos);
  EXPECT_EQ(t.Reserve(a_, "host").status().err(), EPERM);
  EXPECT_EQ(t.Reserve(op_, "base").status().err(), EPERM);  // not even an operator key
  EXPECT_EQ(t.Reserve(a_, "../etc").status().err(), EINVAL);
  EXPECT_EQ(t.Delete(a_, "host").err(), EPERM);
  EXPECT_EQ(t.Delete(op_, "base").err(), EPERM);
  EXPECT_EQ(t.Delete(a_, "nothing").err(), ENOENT);
  // For B, A's name does not exist (it holds A's files), but for an operator key; B may not
  // delete it or build it either.
  EXPECT_EQ(t.Info(b_, "app").status().err(), t.Info(b_, "nothing").status().err());
  EXPECT_TRUE(*t.Hidden(b_, "app"));
  EXPECT_FALSE(*t.Hidden(a_, "app"));
  EXPECT_EQ(t.Info(op_, "app")->owner, TemplateOwner::kOtherKey);
  EXPECT_EQ(t.Info(a_, "app")->owner, TemplateOwner::kYou);
  EXPECT_EQ(t.Info(a_, "host")->owner, TemplateOwner::kBuiltIn);
  EXPECT_EQ(t.Delete(b_, "app").err(), t.Delete(b_, "nothing").err());
  // A name of it that the operator made on the host (an alias) is as hidden.
  ASSERT_TRUE(store_->PutLayer({.id = "l0", .size_bytes = 1}).ok());
  ASSERT_TRUE(
      store_->PutTemplate({.name = "app", .kind = store::kTemplateBuild, .layers = {"l0"}}).ok());
  ASSERT_TRUE(
      store_->AddTemplate({.name = "app-alias", .kind = store::kTemplateAlias, .alias_of = "app"})
          .ok());
  EXPECT_TRUE(*t.Hidden(b_, "app-alias"));
  EXPECT_FALSE(*t.Hidden(a_, "app-alias"));
  ASSERT_TRUE(store_->DeleteTemplate("app-alias").ok());
  // A reserved build of a deleted name does not start.
  auto stale = t.Reserve(a_, "gone");
  ASSERT_TRUE(stale.ok());
  ASSERT_TRUE(t.Delete(a_, "gone").ok());
  EXPECT_EQ(t.Get(a_, *stale, 0)->state, BuildState::kError);
  // B's build ids of A's build do not exist.
  EXPECT_EQ(t.Get(b_, *id, 0).status().err(), ENOENT);
  ASSERT_TRUE(t.Delete(a_, "app").ok());
  EXPECT_TRUE(t.Reserve(b_, "app").ok());  // free again
  // B's is hidden from A's list.
  ASSERT_TRUE(t.Reserve(b_, "bs").ok());
  auto names = [&](const store::ApiKeyRecord& k) {
    std::set<std::string> out;
    for (const auto& i : *t.List(k)) out.insert(i.name);
    return out;
  };
  EXPECT_TRUE(names(b_).contains("bs"));
  EXPECT_FALSE(names(a_).contains("bs"));
  EXPECT_TRUE(names(op_).contains("bs"));
  // An operator key may delete or take over a tenant's: the operator's are every key's.
  EXPECT_TRUE(t.Reserve(op_, "app").ok());
  EXPECT_EQ(t.Info(b_, "app")->owner, TemplateOwner::kOtherKey);
  auto list = t.List(a_);
  ASSERT_TRUE(list.ok());
  bool saw_app = false, saw_host = false;
  for (const auto& i : *list) {
    saw_app |= i.name == "app";
    saw_host |= i.name == "host" && i.owner == TemplateOwner::kBuiltIn;
  }
  EXPECT_TRUE(saw_app && saw_host);
}

TEST_F(TemplatesTest, BuildsAreRefusedWithoutABuilderAndTrackedWithOne) {
  TemplateBuilds none = Make(nullptr);
  EXPECT_EQ(none.Start(a_, "",
                       [] {
                         BuildSpec s = Spec();
                         s.name = "x";
                         return s;
                       }())
                .status()
                .err(),
            ENOSYS);

  RecordingBuilder rb;
  TemplateBuilds t = Make(&rb);
  auto id = t.Reserve(a_, "app:v1");
  ASSERT_TRUE(id.ok());
  auto waiting = t.Get(a_, *id, 0);
  ASSERT_TRUE(waiting.ok());
  EXPECT_EQ(waiting->state, BuildState::kBuilding);
  EXPECT_EQ(waiting->name, "app:v1");
  BuildSpec spec = Spec();
  spec.name = "ignored: the reserved name wins";
  // Over the key's builds at once: 429, and the same build may be started again after.
  rb.busy = true;
  EXPECT_EQ(t.Start(a_, *id, spec).status().err(), EAGAIN);
  rb.busy = false;
  auto started = t.Start(a_, *id, spec);
  ASSERT_TRUE(started.ok()) << started.status().message();
  ASSERT_EQ(rb.specs.size(), 1u);
  EXPECT_EQ(rb.specs[0].name, "app:v1");
  EXPECT_EQ(rb.specs[0].owner_key_id, a_.id);
  EXPECT_EQ(rb.specs[0].timeout_ms, kBuildTimeoutMs);  // an API build's time limit
  EXPECT_EQ(t.Start(a_, *id, Spec()).status().err(), EBUSY);
  EXPECT_EQ(t.Start(b_, *id, Spec()).status().err(), ENOENT);
  auto st = t.Get(a_, *id, 1);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->id, *id);
  ASSERT_EQ(st->logs.size(), 1u);
  EXPECT_EQ(st->logs[0].text, "Step 2/2 : RUN true");
  rb.state = BuildState::kError;
  EXPECT_EQ(t.Get(a_, *id, 2)->state, BuildState::kError);
  EXPECT_EQ(t.Info(a_, "app:v1")->state, BuildState::kError);
  ASSERT_FALSE(audits_.empty());
  EXPECT_EQ(audits_.back().rfind("template.build " + a_.id, 0), 0u) << audits_.back();

  // A base the daemon cannot provide ends the reserved build in error, with the reason.
  auto id2 = t.Reserve(a_, "img");
  ASSERT_TRUE(id2.ok());
  ASSERT_TRUE(t.Fail(a_, *id2, "fromImage needs a registry").ok());
  auto failed = t.Get(a_, *id2, 0);
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(failed->state, BuildState::kError);
  EXPECT_EQ(failed->error, "fromImage needs a registry");
  ASSERT_EQ(failed->logs.size(), 1u);
  EXPECT_TRUE(t.Get(a_, *id2, 1)->logs.empty());
  EXPECT_EQ(t.Start(a_, *id2, Spec()).status().err(), EBUSY);

  // A bad spec: the builder's EINVAL, and the build says so.
  auto id3 = t.Reserve(a_, "bad");
  BuildSpec empty;
  EXPECT_EQ(t.Start(a_, *id3, empty).status().err(), EINVAL);
  EXPECT_EQ(t.Get(a_, *id3, 0)->state, BuildState::kError);
}

TEST_F(TemplatesTest, AnEarlierRunsBuildIsAnsweredFromTheStore) {
  std::string id;
  {
    TemplateBuilds t = Make(nullptr);
    id = *t.Reserve(a_, "app");
  }
  TemplateBuilds t = Make(nullptr);
  auto st = t.Get(a_, id, 0);
  ASSERT_TRUE(st.ok()) << st.status().message();
  EXPECT_EQ(st->state, BuildState::kError);
  EXPECT_NE(st->error.find("restarted"), std::string::npos);
  EXPECT_EQ(t.Get(b_, id, 0).status().err(), ENOENT);
}

TEST_F(TemplatesTest, UploadsArePerKeyAndUnpackedIntoTheBuildsContext) {
  RecordingBuilder rb;
  TemplateBuilds t = Make(&rb);
  std::string tar = Tar({{"dir/hello.txt", "hello from the context\n"}});
  EXPECT_EQ(t.HasUpload(a_, "../x").status().err(), EINVAL);
  EXPECT_EQ(t.HasUpload(a_, std::string(64, 'A')).status().err(), EINVAL);
  EXPECT_FALSE(*t.HasUpload(a_, kHash));
  ASSERT_TRUE(t.PutUpload(a_, kHash, Reader(tar)).ok());
  EXPECT_TRUE(*t.HasUpload(a_, kHash));
  EXPECT_FALSE(*t.HasUpload(b_, kHash));  // B's build cannot use A's archive as its own files
  // A read that fails leaves nothing.
  std::string other(64, 'b');
  EXPECT_FALSE(t.PutUpload(a_, other, [](char*, size_t) -> Result<size_t> {
                  return Status::Error("client went away", ECONNRESET);
                }).ok());
  EXPECT_FALSE(*t.HasUpload(a_, other));

  rb.copied_path = kHash + "/dir/hello.txt";
  auto id = t.Start(a_, "",
                    [] {
                      BuildSpec s = Spec();
                      s.name = "app";
                      return s;
                    }(),
                    {{kHash, 0640}});
  ASSERT_TRUE(id.ok()) << id.status().message();
  EXPECT_EQ(rb.copied, "hello from the context\n");
  EXPECT_EQ(rb.copied_mode, 0640);
  std::string ctx = rb.specs[0].context_dir;
  struct stat st {};
  ASSERT_EQ(::stat(ctx.c_str(), &st), 0);
  rb.state = BuildState::kReady;
  ASSERT_TRUE(t.Get(a_, *id, 0).ok());
  EXPECT_NE(::stat(ctx.c_str(), &st), 0);  // removed once the build ended

  // A build naming files B never uploaded fails and leaves no context.
  auto missing = t.Start(b_, "",
                         [] {
                           BuildSpec s = Spec();
                           s.name = "bapp";
                           return s;
                         }(),
                         {{kHash, -1}});
  EXPECT_EQ(missing.status().err(), ENOENT);
  EXPECT_EQ(missing.status().message().find(dir_), std::string::npos);
}

// The tenant rules around names and uploads that the daemon's battery (tests/security/
// tenant_test.cc, rows 13a-13f) drives over HTTP, here against the store directly.
TEST_F(TemplatesTest, TagsUploadsAndIdsFollowTheTenantRules) {
  TemplateBuilds t = Make(nullptr);
  ASSERT_TRUE(t.Reserve(a_, "app").ok());
  // A tag of A's name, the built-ins' or the operator's is nobody else's to publish.
  auto tag = t.Reserve(b_, "app:v2");
  EXPECT_EQ(tag.status().err(), EPERM);
  EXPECT_NE(tag.status().message().find("'app' was built by another key"), std::string::npos)
      << tag.status().message();
  EXPECT_EQ(t.Reserve(b_, "base:v2").status().err(), EPERM);
  EXPECT_TRUE(t.Reserve(a_, "app:v2").ok());  // A's own
  EXPECT_TRUE(t.MayBuild(a_, "app", "upload").ok());
  EXPECT_EQ(t.MayBuild(b_, "app", "upload").err(), EPERM);
  EXPECT_EQ(t.MayBuild(b_, "../app").err(), EINVAL);
  // Ids and names that are not ones are EINVAL before anything is looked up.
  EXPECT_EQ(t.Get(a_, "../../etc", 0).status().err(), EINVAL);
  EXPECT_EQ(t.Info(a_, "a/b").status().err(), EINVAL);
  EXPECT_EQ(t.Delete(a_, std::string(300, 'a')).err(), EINVAL);

  // An upload is kept as first stored: a second PUT of the hash does not replace it.
  ASSERT_TRUE(t.PutUpload(a_, kHash, Reader("first")).ok());
  ASSERT_TRUE(t.PutUpload(a_, kHash, Reader("second")).ok());
  std::ifstream f(dir_ + "/data/build-files/" + a_.id + "/" + kHash + ".tar");
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(), "first");
  // Past the size limit, declared: refused before a file is made.
  EXPECT_EQ(t.BeginUpload(a_, std::string(64, 'c'), kMaxUploadBytes + 1).status().err(), EFBIG);
  // Past the disk reserve: ENOSPC.
  t.SetDiskReserve(int64_t{1} << 62, 0);
  EXPECT_EQ(t.BeginUpload(a_, std::string(64, 'c'), 1).status().err(), ENOSPC);
  t.SetDiskReserve(0, 0);
  // An upload URL's key must still be there and active.
  EXPECT_TRUE(t.UploadKey(a_.id).ok());
  EXPECT_EQ(t.UploadKey("key_nosuchkey1").status().err(), EACCES);
  EXPECT_EQ(t.UploadKey("../" + a_.id).status().err(), EACCES);
  ASSERT_TRUE(store_->RevokeApiKey(a_.id).ok());
  EXPECT_EQ(t.UploadKey(a_.id).status().err(), EACCES);

  // Upload temp files: a dead writer's go, a live one's stays (unless every one is asked for).
  std::string dir = dir_ + "/data/build-files/" + b_.id;
  ASSERT_TRUE(MakeDirs(dir, 0700).ok());
  std::ofstream(dir + "/.tmp-1-1-dead") << "x";
  std::ofstream(dir + "/.tmp-" + storage::MakerPrefix() + "live") << "x";
  EXPECT_EQ(TemplateBuilds::SweepUploads(dir_ + "/data", false), 1);
  EXPECT_EQ(TemplateBuilds::SweepUploads(dir_ + "/data", true), 1);
}

// What the builder writes at the end of a build of `name` with id `build` (build.cc): a record
// of kind build whose source names the build.
void Built(store::Store& st, const std::string& name, const std::string& build,
           const std::string& layer) {
  ASSERT_TRUE(st.PutLayer({layer, 100, 0, 0}).ok());
  store::TemplateRecord r;
  r.name = name;
  r.kind = store::kTemplateBuild;
  r.source = "build " + build;
  r.layers = {layer};
  r.config = "{}";
  ASSERT_TRUE(st.PutTemplate(r).ok());
}

TEST_F(TemplatesTest, TagsPointAtOneBuildEachAndOnlyTheHolderChangesThem) {
  TemplateBuilds t = Make(nullptr);
  // A build of app:v1 tagged stable too: both names are claimed for A at once.
  auto v1 = t.Reserve(a_, "app:v1", {"app:stable"});
  ASSERT_TRUE(v1.ok()) << v1.status().message();
  EXPECT_EQ((*store_->GetTemplateOwner("app:stable"))->owner_key_id, a_.id);
  // B may not take a tag of A's name (MayUseFamily), and a build of A's whose other name is one
  // of B's claims nothing.
  EXPECT_EQ(t.Reserve(b_, "app:theirs").status().err(), EPERM);
  ASSERT_TRUE(t.Reserve(b_, "other").ok());
  EXPECT_EQ(t.Reserve(a_, "app:v9", {"other:x"}).status().err(), EPERM);
  EXPECT_FALSE(*store_->GetTemplateOwner("app:v9"));
  Built(*store_, "app:v1", *v1, "l1");
  Built(*store_, "app:stable", *v1, "l1");

  // A points default and prod at v1's build.
  auto tagged = t.Tag(a_, "app:v1", {"default", "prod"});
  ASSERT_TRUE(tagged.ok()) << tagged.status().message();
  EXPECT_EQ(*tagged, *v1);
  for (const char* n : {"app", "app:prod"}) {
    auto rec = store_->GetTemplate(n);
    ASSERT_TRUE(rec.ok() && *rec) << n;
    EXPECT_EQ(BuildIdOf(**rec), *v1) << n;
    EXPECT_EQ((*rec)->layers, std::vector<std::string>{"l1"});
    EXPECT_EQ((*store_->GetTemplateOwner(n))->owner_key_id, a_.id) << n;
  }
  EXPECT_NE(audits_.back().find("template.tag " + a_.id), std::string::npos) << audits_.back();

  // Refused, with nothing made: another key (for which it does not exist), a missing target, a
  // built-in, a bad tag.
  EXPECT_EQ(t.Tag(b_, "app:v1", {"mine"}).status().err(), ENOENT);
  EXPECT_EQ(t.Tag(a_, "app:nope", {"x"}).status().err(), ENOENT);
  EXPECT_EQ(t.Tag(a_, "host", {"x"}).status().err(), EPERM);
  EXPECT_EQ(t.Tag(op_, "base", {"x"}).status().err(), EPERM);
  EXPECT_EQ(t.Tag(a_, "app:v1", {"Bad Tag"}).status().err(), EINVAL);
  EXPECT_EQ(t.Tag(a_, "app:v1", {}).status().err(), EINVAL);
  EXPECT_FALSE(*store_->GetTemplate("app:mine"));
  EXPECT_FALSE(*store_->GetTemplate("host:x"));

  // A rebuild of v1 moves v1 only: prod, stable and default stay on the first build.
  auto v1b = t.Reserve(a_, "app:v1");
  ASSERT_TRUE(v1b.ok());
  Built(*store_, "app:v1", *v1b, "l2");
  EXPECT_EQ(t.Tags(b_, "app").status().err(), ENOENT);  // A's names are A's
  auto tags = t.Tags(a_, "app");
  ASSERT_TRUE(tags.ok()) << tags.status().message();
  std::map<std::string, std::string> by_tag;
  for (const auto& x : *tags) by_tag[x.tag] = x.build_id;
  EXPECT_EQ(by_tag, (std::map<std::string, std::string>{
                        {"default", *v1}, {"prod", *v1}, {"stable", *v1}, {"v1", *v1b}}));
  EXPECT_EQ(t.Tags(a_, "nothing").status().err(), ENOENT);

  // Untag: never default, never with a tagged name, never another's; missing tags are fine.
  EXPECT_EQ(t.Untag(a_, "app", {"default"}).err(), EINVAL);
  EXPECT_EQ(t.Untag(a_, "app:v1", {"prod"}).err(), EINVAL);
  EXPECT_EQ(t.Untag(a_, "app", {}).err(), EINVAL);
  EXPECT_EQ(t.Untag(b_, "app", {"prod"}).err(), ENOENT);
  EXPECT_EQ(t.Untag(a_, "nothing", {"x"}).err(), ENOENT);
  ASSERT_TRUE(t.Untag(a_, "app", {"prod", "never-was"}).ok());
  EXPECT_FALSE(*store_->GetTemplate("app:prod"));
  EXPECT_FALSE(*store_->GetTemplateOwner("app:prod"));

  // Deleting the template takes A's names; B's other template stays B's.
  EXPECT_EQ(t.DeleteWithTags(b_, "nothing").err(), ENOENT);
  ASSERT_TRUE(t.DeleteWithTags(a_, "app").ok());
  for (const char* n : {"app", "app:v1", "app:stable"}) {
    EXPECT_FALSE(*store_->GetTemplate(n)) << n;
    EXPECT_FALSE(*store_->GetTemplateOwner(n)) << n;
  }
  EXPECT_EQ((*store_->GetTemplateOwner("other"))->owner_key_id, b_.id);
  EXPECT_EQ(t.DeleteWithTags(a_, "app").err(), ENOENT);

  // The build id of a record built FROM a pulled image (its source names the image too).
  store::TemplateRecord pulled;
  pulled.kind = store::kTemplateBuild;
  pulled.source = "build bld_x from 127.0.0.1:5000/a:b (sha256:00)";
  EXPECT_EQ(BuildIdOf(pulled), "bld_x");
}

TEST_F(TemplatesTest, AnOperatorTagsAnOperatorsTemplateWhichStaysTheOperators) {
  TemplateBuilds t = Make(nullptr);
  ASSERT_TRUE(store_->PutLayer({"l1", 100, 0, 0}).ok());
  store::TemplateRecord r;
  r.name = "py";
  r.kind = store::kTemplateOci;
  r.source = "127.0.0.1:5000/python:3.12";
  r.layers = {"l1"};
  ASSERT_TRUE(store_->PutTemplate(r).ok());
  EXPECT_EQ(t.Tag(a_, "py", {"v3"}).status().err(), EPERM);
  auto b = t.Tag(op_, "py", {"v3"});
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(*b, "");  // not built through an API
  EXPECT_TRUE(*store_->GetTemplate("py:v3"));
  EXPECT_FALSE(*store_->GetTemplateOwner("py:v3"));  // the operator's, as its target
  EXPECT_EQ(t.Untag(a_, "py", {"v3"}).err(), EPERM);
  EXPECT_TRUE(t.Untag(op_, "py", {"v3"}).ok());
}

// A snapshot is its key's alone: other keys see neither it nor its names anywhere, a name moves
// only between the same key's snapshots, and deleting it takes its names.
TEST_F(TemplatesTest, SnapshotsArePrivateToTheirKeyWithTheirNames) {
  TemplateBuilds t = Make(nullptr);
  ASSERT_TRUE(store_->PutLayer({.id = "base-l", .size_bytes = 10}).ok());
  ASSERT_TRUE(store_->PutLayer({.id = "snap-aaaaaaaaaaaaaaaaaaaa", .size_bytes = 7}).ok());
  ASSERT_TRUE(store_->PutLayer({.id = "snap-bbbbbbbbbbbbbbbbbbbb", .size_bytes = 8}).ok());
  const std::string s1 = "snap-aaaaaaaaaaaaaaaaaaaa", s2 = "snap-bbbbbbbbbbbbbbbbbbbb";
  auto one = t.AddSnapshot(a_, s1, "sb1", {s1, "base-l"}, {}, "mine:v1");
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(one->names, std::vector<std::string>{"mine:v1"});
  EXPECT_EQ(one->size_bytes, 7);
  EXPECT_EQ(one->sandbox_id, "sb1");

  for (const std::string& n : {s1, std::string("mine:v1")}) {
    EXPECT_FALSE(*t.Hidden(a_, n)) << n;
    EXPECT_FALSE(*t.Hidden(op_, n)) << n;
    EXPECT_TRUE(*t.Hidden(b_, n)) << n;
    EXPECT_TRUE(storage::IsTemplateNotFound(t.Info(b_, n).status())) << n;
    EXPECT_EQ(t.Delete(b_, n).err(), ENOENT) << n;
    EXPECT_EQ(t.DeleteSnapshot(b_, n).err(), ENOENT) << n;
    EXPECT_EQ(t.Tag(b_, n, {"x"}).status().err(), ENOENT) << n;
    EXPECT_EQ(t.Tag(a_, n, {"x"}).status().err(), EINVAL) << n;
  }
  EXPECT_TRUE(t.Snapshots(b_, "", "")->empty());
  EXPECT_EQ(t.Snapshots(op_, "", "")->size(), 1u);
  for (const auto& info : *t.List(b_)) EXPECT_NE(info.name, s1);
  // Neither key may take a held name; another template's name is taken.
  EXPECT_EQ(t.AddSnapshot(b_, s2, "sb2", {s2}, {}, "mine:v1").status().err(), EPERM);
  EXPECT_EQ(t.AddSnapshot(a_, s2, "sb2", {s2}, {}, "base").status().err(), EEXIST);
  EXPECT_EQ(t.AddSnapshot(a_, s2, "sb2", {s2}, {}, "Bad Name").status().err(), EINVAL);
  EXPECT_FALSE(*store_->GetTemplate(s2)) << "nothing registered for a refused name";
  EXPECT_FALSE(*store_->GetTemplateOwner(s2));

  // The same key's name moves to its newer snapshot.
  auto two = t.AddSnapshot(a_, s2, "sb1", {s2, s1, "base-l"}, {}, "mine:v1");
  ASSERT_TRUE(two.ok()) << two.status().message();
  EXPECT_EQ((*store_->GetTemplate("mine:v1"))->alias_of, s2);
  EXPECT_TRUE(t.Snapshot(a_, s1)->names.empty());
  auto listed = t.Snapshots(a_, "sb1", "");
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ(t.Snapshots(a_, "", "mine:v1")->front().id, s2);

  // Deleted by name: the snapshot and its names go; the older one stays.
  ASSERT_TRUE(t.Delete(a_, "mine:v1").ok());
  EXPECT_FALSE(*store_->GetTemplate(s2));
  EXPECT_FALSE(*store_->GetTemplate("mine:v1"));
  EXPECT_FALSE(*store_->GetTemplateOwner("mine:v1"));
  EXPECT_TRUE(*store_->GetTemplate(s1));
  EXPECT_NE(audits_.back().find("snapshot.delete " + a_.id), std::string::npos) << audits_.back();
}

}  // namespace
}  // namespace sbx::sandbox

// Templates end to end with a real daemon (issue 9, tries 2-5): no API field is a host path, an
// unknown name is 400 "template not found: NAME" on the native and the E2B API alike and unpacks
// nothing; E2B's default names run on host; `sbx template add/ls/rm` works while the daemon
// runs; the cache bound evicts a layer nothing uses; no host user can reach the cache; `sbx build`
// makes a template both APIs run (issue 13).
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>

#include "api/http/client.h"
#include "common/fd.h"
#include "common/fs.h"
#include "daemon_process.h"
#include "sbx_process.h"
#include "store/store.h"

namespace sbx::test {
namespace {

using nlohmann::json;

class TemplatesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-templates-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    ASSERT_EQ(::chmod(tmpl, 0711), 0);
    dir_ = tmpl;
    data_ = dir_ + "/data";
    ASSERT_EQ(::mkdir(data_.c_str(), 0711), 0);
    ::setenv("SBX_CGROUP_PARENT", Parent().c_str(), 1);
    d_ = std::make_unique<DaemonProcess>(data_);
    d_->Start();
  }
  void TearDown() override {
    EXPECT_TRUE(d_->Alive()) << d_->log();
    if (d_->Alive()) {
      json list = Json("GET", "/v1/sandboxes?state=running&state=paused", "", 200);
      for (const auto& s : list["sandboxes"])
        Call("DELETE", "/v1/sandboxes/" + s["id"].get<std::string>());
    }
    d_.reset();
    EXPECT_EQ(::system(("test -z \"$(ls -A " + data_ + "/run 2>/dev/null)\"").c_str()), 0)
        << "box directories left";
    ExpectNoCgroupsAndRemoveParent(Parent());
    (void)RemoveTree(dir_);  // the test's scratch directory: a leftover in /tmp harms no result
  }
  static std::string Parent() { return "sbx-templates-test-" + std::to_string(::getpid()); }

  // `e2b`: the E2B control plane's key header instead of the native bearer token.
  http::Response Call(const std::string& method, const std::string& target,
                      const std::string& body = "", bool e2b = false) {
    http::ClientHeaders h = {{"Content-Type", "application/json"}};
    if (e2b) {
      h.push_back({"X-API-Key", d_->key()});
    } else {
      h.push_back({"Authorization", "Bearer " + d_->key()});
    }
    auto r = http::Request(http::Endpoint{"127.0.0.1", d_->port(), ""}, method, target, h, body,
                           std::chrono::seconds(60));
    EXPECT_TRUE(r.ok()) << method << " " << target << ": " << r.status().message();
    return r.ok() ? *r : http::Response{};
  }
  json Json(const std::string& method, const std::string& target, const std::string& body, int want,
            bool e2b = false) {
    auto r = Call(method, target, body, e2b);
    EXPECT_EQ(r.status, want) << method << " " << target << " " << body << ": " << r.body;
    return json::parse(r.body.empty() ? "null" : r.body, nullptr, false);
  }
  std::string Exec(const std::string& id, const std::string& sh) {
    auto r = Call("POST", "/v1/sandboxes/" + id + "/commands",
                  json{{"argv", {"/bin/sh", "-c", sh}}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    std::string out;
    std::istringstream lines(r.body);
    std::string line;
    while (std::getline(lines, line)) {
      json e = json::parse(line, nullptr, false);
      if (!e.is_discarded() && e.value("type", "") == "exit")
        out += "exit=" + std::to_string(e["exit_code"].get<int>());
    }
    return out;
  }
  ProcessResult Sbx(std::vector<std::string> args) {
    args.insert(args.begin(), {SBX_BIN, "--data-dir", data_});
    return RunProcess(args);
  }
  // What the template cache holds: every entry below it, with its size.
  std::string CacheListing() {
    auto r = RunProcess({"/bin/sh", "-c",
                         "cd " + data_ + " && find templates -mindepth 1 " +
                             "-not -name .lock -printf '%p %s\\n' 2>/dev/null | sort"});
    return r.out;
  }
  // A tarball with a busybox shell, an optional set-uid copy and a file of `pad` bytes.
  std::string BusyboxTar(const std::string& name, bool setuid, int pad = 0, int mode = 0644) {
    std::string root = dir_ + "/" + name + "-root";
    std::string tar = dir_ + "/" + name + ".tar.gz";
    std::string cmd = "mkdir -p " + root + "/bin " + root + "/tmp && cp /bin/busybox " + root +
                      "/bin/ && ln -s busybox " + root + "/bin/sh";
    if (setuid)
      cmd += " && cp /bin/busybox " + root + "/bin/su-me && chmod 4755 " + root + "/bin/su-me";
    if (pad > 0) cmd += " && head -c " + std::to_string(pad) + " /dev/zero > " + root + "/pad";
    cmd += " && tar -C " + root + " -czf " + tar + " . && rm -rf " + root;
    EXPECT_EQ(::system(cmd.c_str()), 0) << cmd;
    EXPECT_EQ(::chmod(tar.c_str(), mode), 0);
    return tar;
  }
  // A tarball with one file of `pad` zero bytes.
  std::string PadTar(const std::string& name, int pad) {
    std::string root = dir_ + "/" + name + "-root";
    std::string tar = dir_ + "/" + name + ".tar.gz";
    std::string cmd = "mkdir -p " + root + " && head -c " + std::to_string(pad) + " /dev/zero > " +
                      root + "/pad && tar -C " + root + " -czf " + tar + " . && rm -rf " + root;
    EXPECT_EQ(::system(cmd.c_str()), 0) << cmd;
    return tar;
  }
  // Whether the unprivileged host user `nobody` can stat `path`.
  static bool NobodyCanStat(const std::string& path) {
    pid_t pid = ::fork();
    if (pid == 0) {
      if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(2);
      struct stat st {};
      _exit(::stat(path.c_str(), &st) == 0 ? 0 : 1);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

  std::string dir_, data_;
  std::unique_ptr<DaemonProcess> d_;
};

TEST_F(TemplatesTest, HostPathsAndUnknownNamesAre400OnBothApisAndUnpackNothing) {
  // A tenant's own box, with a tarball holding a set-uid binary built inside it.
  json a = Json("POST", "/v1/sandboxes", "{}", 201);
  std::string a_id = a["id"];
  EXPECT_EQ(
      Exec(a_id, "cp /bin/sh /tmp/s && chmod 4755 /tmp/s && tar -C /tmp -czf /tmp/evil.tgz s"),
      "exit=0");
  std::string upper = data_ + "/run/" + a_id + "/fs/upper";
  ASSERT_EQ(::access((upper + "/tmp/evil.tgz").c_str(), F_OK), 0);
  std::string root_only = BusyboxTar("root-only", false, 0, 0600);
  std::string setuid = BusyboxTar("setuid", true);
  std::string before = CacheListing();
  ASSERT_FALSE(before.empty());  // the host layer of box a

  for (const std::string& name :
       {std::string("/etc"), upper, data_ + "/run", upper + "/tmp/evil.tgz", root_only, setuid,
        std::string("nope"), std::string("ubuntu:22.04"), std::string("../../etc")}) {
    json v1 = Json("POST", "/v1/sandboxes", json{{"template", name}}.dump(), 400);
    EXPECT_EQ(v1["error"]["message"], "template not found: " + name);
    json e2b = Json("POST", "/sandboxes", json{{"templateID", name}}.dump(), 400, true);
    EXPECT_EQ(e2b["code"], 400);
    EXPECT_EQ(e2b["message"], "template not found: " + name);
  }
  EXPECT_EQ(CacheListing(), before);  // nothing unpacked, nothing new in the cache
  EXPECT_EQ(Json("GET", "/v1/sandboxes", "", 200)["sandboxes"].size(), 1u);

  // E2B's default names are aliases of host.
  json base = Json("POST", "/v1/sandboxes", R"({"template":"base"})", 201);
  EXPECT_EQ(base["template"], "host");
  json e2b = Json("POST", "/sandboxes", R"({"templateID":"base"})", 201, true);
  EXPECT_EQ(e2b["templateID"], "host");
  json listed = Json("GET", "/v2/sandboxes?template=base", "", 200, true);
  EXPECT_EQ(listed.size(), 3u);
  EXPECT_EQ(Json("GET", "/v2/sandboxes?template=nope", "", 200, true).size(), 0u);
  EXPECT_EQ(Exec(e2b["sandboxID"], "test -x /usr/bin/env"), "exit=0");
}

TEST_F(TemplatesTest, AddLsRmWhileTheDaemonRunsAndTheCacheBoundEvictsUnusedLayers) {
  std::string tar = BusyboxTar("busy", true, 256 << 10);
  auto r = Sbx({"template", "add", "busy:1", tar});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("busy:1: unpacked"), std::string::npos) << r.err;
  r = Sbx({"template", "ls"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("busy:1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(tar), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("base,code-interpreter-stateful,code-interpreter-v1,desktop,mcp-gateway"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(Sbx({"template", "add", "busy:1", tar}).exit_code, 125);
  r = Sbx({"template", "rm", "host"});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find("host is built in"), std::string::npos) << r.err;

  // The added name works on both APIs.
  json s = Json("POST", "/v1/sandboxes", R"({"template":"busy:1"})", 201);
  EXPECT_EQ(s["template"], "busy:1");
  std::string id = s["id"];
  EXPECT_EQ(Exec(id, "test -f /pad && test -u /bin/su-me"), "exit=0");
  json e = Json("POST", "/sandboxes", R"({"templateID":"busy:1"})", 201, true);
  Call("DELETE", "/sandboxes/" + e["sandboxID"].get<std::string>(), "", true);

  // The layer on disk: real owners, set-id bit kept, nothing reachable by a host user.
  auto st = store::Store::Open(data_ + "/" + store::kDbFileName);
  ASSERT_TRUE(st.ok());
  auto busy = (*st)->GetTemplate("busy:1");
  ASSERT_TRUE(busy.ok() && busy->has_value());
  std::string layer = data_ + "/templates/layers/" + (*busy)->layers[0];
  struct stat sb {};
  ASSERT_EQ(::stat((layer + "/bin/su-me").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_uid, 0u);
  EXPECT_EQ(sb.st_mode & 07777, 04755u);
  ASSERT_EQ(::stat((data_ + "/templates").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 07777, 0700u);
  EXPECT_FALSE(NobodyCanStat(layer + "/bin/su-me"));
  // Inside, through the idmapped layer, the file is root's (not nobody's).
  EXPECT_EQ(Exec(id, "test \"$(stat -c %u:%g /bin/su-me)\" = 0:0"), "exit=0");

  // Removed while s uses it: gone from the registry, s keeps working on its layer.
  r = Sbx({"template", "rm", "busy:1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Sbx({"template", "ls"}).out.find("busy:1"), std::string::npos);
  json gone = Json("POST", "/v1/sandboxes", R"({"template":"busy:1"})", 400);
  EXPECT_EQ(gone["error"]["message"], "template not found: busy:1");
  EXPECT_EQ(Exec(id, "cat /pad | wc -c"), "exit=0");
  EXPECT_EQ(::access(layer.c_str(), F_OK), 0);

  // A bound with room for host, small and half of busy:1's layer: while s lives its layer
  // cannot go and an add is refused; once s has ended, the add evicts it.
  ASSERT_EQ(Sbx({"template", "add", "small", BusyboxTar("small", false)}).exit_code, 0);
  auto host = (*st)->GetTemplate("host");
  auto small = (*st)->GetTemplate("small");
  ASSERT_TRUE(host.ok() && host->has_value() && small.ok() && small->has_value());
  int64_t bound = (*host)->size_bytes + (*small)->size_bytes + (*busy)->size_bytes / 2;
  std::string bound_flag = "--template-cache-size=" + std::to_string(bound);
  std::string mid = PadTar("mid", static_cast<int>((*busy)->size_bytes / 4));
  r = Sbx({"template", "add", "mid", mid, bound_flag});
  EXPECT_EQ(r.exit_code, 125);
  EXPECT_NE(r.err.find("the template cache is full"), std::string::npos) << r.err;
  EXPECT_EQ(::access(layer.c_str(), F_OK), 0);
  r = Sbx({"template", "add", "huge", PadTar("huge", static_cast<int>((*busy)->size_bytes)),
           bound_flag});
  EXPECT_EQ(r.exit_code, 125);

  ASSERT_EQ(Call("DELETE", "/v1/sandboxes/" + id).status, 204);
  r = Sbx({"template", "add", "huge", PadTar("huge", static_cast<int>((*busy)->size_bytes)),
           bound_flag});
  EXPECT_EQ(r.exit_code, 125) << "larger than the room even with busy:1's layer evicted";
  EXPECT_NE(r.err.find("exceeds the template cache's free room"), std::string::npos) << r.err;
  EXPECT_EQ(::access(layer.c_str(), F_OK), 0) << "a refused add evicts nothing";
  r = Sbx({"template", "add", "mid", mid, bound_flag});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(::access(layer.c_str(), F_OK), 0) << "the unused layer of busy:1 was evicted";
  EXPECT_LE(*(*st)->LayerBytes(), bound);
  json ok = Json("POST", "/v1/sandboxes", R"({"template":"small"})", 201);
  EXPECT_EQ(Exec(ok["id"], "true"), "exit=0");
}

}  // namespace
// Issue 13's "done when": `sbx build` of a Dockerfile makes a template that the daemon's creates
// (native and E2B) run with its files, env, user and workdir; a second build of the same
// context reuses every step that makes a layer.
TEST_F(TemplatesTest, SbxBuildOfADockerfileMakesATemplateBothApisRun) {
  std::string ctx = dir_ + "/ctx";
  ASSERT_EQ(::mkdir(ctx.c_str(), 0755), 0);
  ASSERT_TRUE(WriteFile(ctx + "/hello.txt", "hello from the context\n").ok());
  ASSERT_TRUE(WriteFile(ctx + "/Dockerfile",
                        "FROM host\n"
                        "ENV GREETING=hi\n"
                        "WORKDIR /app\n"
                        "COPY hello.txt /app/hello.txt\n"
                        "RUN echo built > /app/built.txt && cat /app/hello.txt\n"
                        "USER nobody\n"
                        "CMD [\"cat\", \"/app/hello.txt\"]\n")
                  .ok());
  auto r = Sbx({"build", "-t", "demo", ctx});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::string log = r.out + r.err;
  EXPECT_NE(log.find("Step 5/7 : RUN echo built"), std::string::npos) << log;
  EXPECT_NE(log.find("hello from the context"), std::string::npos) << log;  // the RUN's output
  EXPECT_NE(log.find("Successfully built demo"), std::string::npos) << log;

  const std::string check =
      "test \"$(id -un)\" = nobody && test \"$(pwd)\" = /app && test \"$GREETING\" = hi && "
      "grep -qx built /app/built.txt && grep -qx 'hello from the context' /app/hello.txt";
  json s = Json("POST", "/v1/sandboxes", R"({"template":"demo"})", 201);
  EXPECT_EQ(Exec(s["id"], check), "exit=0");
  Call("DELETE", "/v1/sandboxes/" + s["id"].get<std::string>());
  json e = Json("POST", "/sandboxes", R"({"templateID":"demo"})", 201, true);
  Call("DELETE", "/sandboxes/" + e["sandboxID"].get<std::string>(), "", true);

  // Unchanged: the WORKDIR, COPY and RUN layers come from the cache, the RUN does not run again.
  r = Sbx({"build", "-t", "demo", ctx});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  log = r.out + r.err;
  size_t hits = 0;
  for (size_t at = log.find("Using cache"); at != std::string::npos;
       at = log.find("Using cache", at + 1))
    ++hits;
  EXPECT_EQ(hits, 3u) << log;
  EXPECT_EQ(log.find("Running in"), std::string::npos) << log;
  // An instruction outside the subset is refused with its line, and nothing is made.
  ASSERT_TRUE(WriteFile(ctx + "/Dockerfile", "FROM host\nHEALTHCHECK CMD true\n").ok());
  r = Sbx({"build", "-t", "other", ctx});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("line 2"), std::string::npos) << r.err;
  EXPECT_NE(Sbx({"template", "inspect", "other"}).exit_code, 0);
}

}  // namespace sbx::test

// `sbx template import` end to end (issue 13, items 1-2): a docker-archive made here (a busybox
// root, its config with Env, User and WorkingDir) and an OCI layout made from it by skopeo are
// imported while the daemon runs; a sandbox of the template runs every command with the image's
// env, user ("name:group", resolved in the box's /etc/passwd and /etc/group) and workdir; both
// templates share the one layer; `template gc` frees it once neither uses it.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>

#include "api/http/client.h"
#include "common/encoding.h"
#include "common/fd.h"
#include "common/fs.h"
#include "daemon_process.h"
#include "sbx_process.h"

namespace sbx::test {
namespace {

using nlohmann::json;

class ImageImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-image-import-test-XXXXXX";
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
    ExpectNoCgroupsAndRemoveParent(Parent());
    (void)RemoveTree(dir_);  // the test's scratch directory: a leftover in /tmp harms no result
  }
  static std::string Parent() { return "sbx-image-import-test-" + std::to_string(::getpid()); }

  http::Response Call(const std::string& method, const std::string& target,
                      const std::string& body = "") {
    http::ClientHeaders h = {{"Content-Type", "application/json"},
                             {"Authorization", "Bearer " + d_->key()}};
    auto r = http::Request(http::Endpoint{"127.0.0.1", d_->port(), ""}, method, target, h, body,
                           std::chrono::seconds(60));
    EXPECT_TRUE(r.ok()) << method << " " << target << ": " << r.status().message();
    return r.ok() ? *r : http::Response{};
  }
  json Json(const std::string& method, const std::string& target, const std::string& body,
            int want) {
    auto r = Call(method, target, body);
    EXPECT_EQ(r.status, want) << method << " " << target << " " << body << ": " << r.body;
    return json::parse(r.body.empty() ? "null" : r.body, nullptr, false);
  }
  // The command's stdout, with "exit=N" after it.
  std::string Exec(const std::string& id, const std::string& sh) {
    auto r = Call("POST", "/v1/sandboxes/" + id + "/commands",
                  json{{"argv", {"/bin/sh", "-c", sh}}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    std::string out;
    std::istringstream lines(r.body);
    std::string line;
    while (std::getline(lines, line)) {
      json e = json::parse(line, nullptr, false);
      if (e.is_discarded()) continue;
      if (e.value("type", "") == "stdout")
        if (auto d = Base64Decode(e["data"].get<std::string>()); d.ok()) out += *d;
      if (e.value("type", "") == "exit") out += "exit=" + std::to_string(e["exit_code"].get<int>());
    }
    return out;
  }
  ProcessResult Sbx(std::vector<std::string> args) {
    args.insert(args.begin(), {SBX_BIN, "--data-dir", data_});
    return RunProcess(args);
  }
  ProcessResult Sh(const std::string& cmd) { return RunProcess({"/bin/sh", "-c", cmd}); }

  // `docker save` of a one-layer busybox image: manifest.json, <config digest>.json, 0/layer.tar.
  // `lower` (a shell command, run in the root) adds to that layer; with `upper`, a second layer
  // (1/layer.tar) of what that shell command makes in the current directory.
  std::string DockerArchive(const std::string& lower = "", const std::string& upper = "") {
    std::string root = dir_ + "/root", out = dir_ + "/archive";
    std::string cmd =
        "set -e; mkdir -p " + root + "/bin " + root + "/etc " + root + "/work " + root + "/tmp " +
        out + "/0 && cp /bin/busybox " + root + "/bin/ && ln -s busybox " + root +
        "/bin/sh && printf 'root:x:0:0::/root:/bin/sh\\napp:x:1000:1000::/work:/bin/sh\\n' > " +
        root + "/etc/passwd && printf 'root:x:0:\\napp:x:1000:\\nstaff:x:50:app\\n' > " + root +
        "/etc/group && chown 1000:1000 " + root + "/work && chmod 1777 " + root + "/tmp && cd " +
        root + " && " + (lower.empty() ? "true" : lower) + " && tar -C " + root +
        " --numeric-owner -cf " + out + "/0/layer.tar .";
    EXPECT_EQ(Sh(cmd).exit_code, 0) << cmd;
    json diff_ids = json::array(), layers = json::array();
    auto add = [&](const std::string& tar) {
      auto diff = Sh("sha256sum " + out + "/" + tar + " | cut -d' ' -f1");
      diff_ids.push_back("sha256:" + diff.out.substr(0, 64));
      layers.push_back(tar);
    };
    add("0/layer.tar");
    if (!upper.empty()) {
      std::string u = dir_ + "/upper";
      std::string make = "set -e; mkdir -p " + u + " " + out + "/1 && cd " + u + " && " + upper +
                         " && tar -C " + u + " --numeric-owner -cf " + out + "/1/layer.tar .";
      EXPECT_EQ(Sh(make).exit_code, 0) << make;
      add("1/layer.tar");
    }
    json config = {{"architecture", "amd64"},
                   {"os", "linux"},
                   {"config",
                    {{"Env", {"PATH=/bin", "GREETING=hello from the image"}},
                     {"User", "app:staff"},
                     {"WorkingDir", "/work"},
                     {"Cmd", {"/bin/sh"}}}},
                   {"rootfs", {{"type", "layers"}, {"diff_ids", diff_ids}}}};
    EXPECT_TRUE(WriteFile(out + "/config.json", config.dump(), 0644).ok());
    auto cfg = Sh("sha256sum " + out + "/config.json | cut -d' ' -f1");
    std::string cfg_name = cfg.out.substr(0, 64) + ".json";
    EXPECT_EQ(::rename((out + "/config.json").c_str(), (out + "/" + cfg_name).c_str()), 0);
    json manifest =
        json::array({{{"Config", cfg_name}, {"RepoTags", {"busy/app:1"}}, {"Layers", layers}}});
    EXPECT_TRUE(WriteFile(out + "/manifest.json", manifest.dump(), 0644).ok());
    std::string tarball = dir_ + "/busy.tar";
    EXPECT_EQ(Sh("tar -C " + out + " -cf " + tarball + " .").exit_code, 0);
    return tarball;
  }

  std::string dir_, data_;
  std::unique_ptr<DaemonProcess> d_;
};

TEST_F(ImageImportTest, AnImportedImagesConfigIsEveryCommandsDefault) {
  std::string tarball = DockerArchive();
  auto r = Sbx({"template", "import", "busy:1", tarball});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "busy:1\n");
  EXPECT_NE(r.err.find("imported template busy:1 (1 layers, "), std::string::npos) << r.err;
  EXPECT_EQ(Sbx({"template", "import", "busy:1", tarball}).exit_code, 125);  // taken
  r = Sbx({"template", "ls"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("busy:1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" oci "), std::string::npos) << r.out;
  r = Sbx({"template", "inspect", "busy:1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json info = json::parse(r.out, nullptr, false);
  EXPECT_EQ(info["kind"], "oci");
  EXPECT_EQ(info["config"]["user"], "app:staff");
  EXPECT_EQ(info["config"]["workdir"], "/work");
  ASSERT_EQ(info["layers"].size(), 1u);
  std::string layer = info["layers"][0]["id"];
  EXPECT_EQ(layer.rfind("sha256-", 0), 0u) << layer;

  // Every command: the image's env (its PATH), user (app:staff: uid 1000, gid 50) and workdir;
  // a command's own user and cwd still win.
  json s = Json("POST", "/v1/sandboxes", R"({"template":"busy:1"})", 201);
  std::string id = s["id"];
  EXPECT_EQ(Exec(id, "echo \"$GREETING|$PATH|$(busybox id -u):$(busybox id -g)|$(pwd)\""),
            "hello from the image|/bin|1000:50|/work\nexit=0");
  auto root =
      Call("POST", "/v1/sandboxes/" + id + "/commands",
           json{{"argv", {"/bin/busybox", "id", "-u"}}, {"user", "root"}, {"cwd", "/"}}.dump());
  EXPECT_NE(root.body.find(Base64Encode("0\n")), std::string::npos) << root.body;
  // Files written by a command are the image user's.
  EXPECT_EQ(Exec(id, "touch mine && busybox stat -c %u:%g /work/mine"), "1000:50\nexit=0");

  // The same image as an OCI layout (made by skopeo from the archive): one layer shared.
  if (Sh("command -v skopeo").exit_code == 0) {
    std::string layout = dir_ + "/layout";
    auto copy = Sh("skopeo --insecure-policy copy -q docker-archive:" + tarball + " oci:" + layout +
                   ":busy 2>&1");
    ASSERT_EQ(copy.exit_code, 0) << copy.out;
    r = Sbx({"template", "import", "busy-oci", layout, "--ref", "busy"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json o = json::parse(Sbx({"template", "inspect", "busy-oci"}).out, nullptr, false);
    ASSERT_EQ(o["layers"].size(), 1u);
    EXPECT_EQ(o["layers"][0]["id"], layer);
    EXPECT_EQ(o["config"]["user"], "app:staff");
    ASSERT_EQ(Sbx({"template", "rm", "busy-oci"}).exit_code, 0);
  }

  // gc keeps the layer while the template and the sandbox use it, frees it after.
  r = Sbx({"template", "gc"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find(layer), std::string::npos) << r.out;
  // Removed while the sandbox lives: its layer stays (pinned) until gc after the sandbox ends.
  ASSERT_EQ(Sbx({"template", "rm", "busy:1"}).exit_code, 0);
  EXPECT_EQ(::access((data_ + "/templates/layers/" + layer).c_str(), F_OK), 0);
  ASSERT_EQ(Call("DELETE", "/v1/sandboxes/" + id).status, 204);
  r = Sbx({"template", "gc"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(layer), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("freed"), std::string::npos) << r.err;
  EXPECT_NE(::access((data_ + "/templates/layers/" + layer).c_str(), F_OK), 0);
}

// A later layer's whiteouts and opaque directories hide what the layers below hold, in a box of
// every runtime this host has, as `docker run` would show them; so does a directory a box
// replaced, in boxes of its snapshot. (Overlayfs reads its marks under trusted.* where the host
// mounts it, a vm guest's root, and under user.* where a user namespace does, every other box's.
// An image's ".wh..wh..opq" was marked under trusted.* alone, so the directory's old files showed
// through in native, runc and gVisor boxes; a box's own mark, user.*, was lost on a vm.)
TEST_F(ImageImportTest, AnImagesWhiteoutsAndOpaqueDirectoriesHideWhatIsBelow) {
  std::string tarball = DockerArchive(
      "mkdir -p opt/d opt/kept && touch opt/d/old opt/gone opt/kept/one",
      "mkdir -p opt/d opt/kept && touch opt/d/new opt/d/.wh..wh..opq opt/.wh.gone opt/kept/two");
  auto r = Sbx({"template", "import", "wh", tarball});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json src = Json("POST", "/v1/sandboxes", R"({"template":"wh"})", 201);
  auto replaced =
      Call("POST", "/v1/sandboxes/" + src["id"].get<std::string>() + "/commands",
           json{{"argv",
                 {"/bin/sh", "-c", "rm -rf /opt/kept && mkdir /opt/kept && touch /opt/kept/three"}},
                {"user", "root"}}
               .dump());
  ASSERT_NE(replaced.body.find(R"("exit_code":0)"), std::string::npos) << replaced.body;
  json snap =
      Json("POST", "/v1/sandboxes/" + src["id"].get<std::string>() + "/snapshots", "{}", 201);
  json rts = Json("GET", "/v1/runtimes", "", 200);
  int tried = 0;
  for (const auto& rt : rts["runtimes"]) {
    if (!rt.value("available", false)) continue;
    ++tried;
    for (const std::string& tmpl : {std::string("wh"), snap["id"].get<std::string>()}) {
      json s = Json("POST", "/v1/sandboxes",
                    json{{"template", tmpl}, {"runtime", rt["name"]}}.dump(), 201);
      std::string id = s["id"];
      EXPECT_EQ(Exec(id, "ls /opt/d; ls /opt/kept; test -e /opt/gone || echo no-gone"),
                tmpl == "wh" ? "new\none\ntwo\nno-gone\nexit=0" : "new\nthree\nno-gone\nexit=0")
          << rt["name"] << " " << tmpl;
      ASSERT_EQ(Call("DELETE", "/v1/sandboxes/" + id).status, 204);
    }
  }
  EXPECT_GE(tried, 1);
}

// The daemon started with a low inherited soft limit of open files (128, where a shell or unit
// may leave it) raises it to the hard limit and says so in its log; a create of a 500-layer
// image (overlayfs' most, a descriptor per layer while the box's root is assembled) then works,
// and every layer is visible in the box.
class ImageImportLowFdLimit : public ImageImportTest {
 protected:
  void SetUp() override {
    rlimit saved{};
    ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
    ASSERT_GT(saved.rlim_max, 1024u) << "the hard limit is too low to test the raise";
    rlimit low = saved;
    low.rlim_cur = 128;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
    ImageImportTest::SetUp();  // the daemon inherits the low soft limit
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
    hard_ = saved.rlim_max;
  }
  rlim_t hard_ = 0;
};

TEST_F(ImageImportLowFdLimit, TheDaemonRaisesItsSoftLimitAndA500LayerCreateWorks) {
  EXPECT_NE(d_->log().find("open files: soft limit " + std::to_string(hard_) +
                           " (inherited 128, hard " + std::to_string(hard_) + ")"),
            std::string::npos)
      << d_->log();
  constexpr int kLayers = 500;
  // A docker-archive of kLayers layers: busybox in the first, one file in each.
  std::string out = dir_ + "/many";
  std::string cmd = "set -e; mkdir -p " + out + "/r0/bin && cp /bin/busybox " + out +
                    "/r0/bin/ && ln -s busybox " + out + "/r0/bin/sh && cd " + out +
                    " && for i in $(seq 0 " + std::to_string(kLayers - 1) +
                    "); do mkdir -p r$i/stack $i && echo $i > r$i/stack/$i && "
                    "tar -C r$i --numeric-owner -cf $i/layer.tar . && rm -rf r$i; done";
  ASSERT_EQ(Sh(cmd).exit_code, 0) << cmd;
  json diff_ids = json::array(), layers = json::array();
  auto sums = Sh("cd " + out + " && for i in $(seq 0 " + std::to_string(kLayers - 1) +
                 "); do sha256sum $i/layer.tar; done");
  std::istringstream lines(sums.out);
  for (std::string line; std::getline(lines, line);) {
    ASSERT_GE(line.size(), 64u) << sums.out;
    diff_ids.push_back("sha256:" + line.substr(0, 64));
    layers.push_back(line.substr(66));  // "<hex>  N/layer.tar", in layer order
  }
  ASSERT_EQ(layers.size(), static_cast<size_t>(kLayers));
  json config = {{"architecture", "amd64"},
                 {"os", "linux"},
                 {"config", {{"Env", {"PATH=/bin"}}}},
                 {"rootfs", {{"type", "layers"}, {"diff_ids", diff_ids}}}};
  ASSERT_TRUE(WriteFile(out + "/config.json", config.dump(), 0644).ok());
  std::string cfg = Sh("sha256sum " + out + "/config.json").out.substr(0, 64) + ".json";
  ASSERT_EQ(::rename((out + "/config.json").c_str(), (out + "/" + cfg).c_str()), 0);
  json manifest =
      json::array({{{"Config", cfg}, {"RepoTags", {"many/layers:1"}}, {"Layers", layers}}});
  ASSERT_TRUE(WriteFile(out + "/manifest.json", manifest.dump(), 0644).ok());
  std::string tarball = dir_ + "/many.tar";
  ASSERT_EQ(Sh("tar -C " + out + " -cf " + tarball + " .").exit_code, 0);
  (void)RemoveTree(out);
  auto r = Sbx({"template", "import", "many", tarball});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json box = Json("POST", "/v1/sandboxes", json{{"template", "many"}}.dump(), 201);
  ASSERT_TRUE(box.is_object());
  std::string id = box.value("id", "");
  EXPECT_EQ(Exec(id, "ls /stack | wc -l; cat /stack/0 /stack/499"),
            std::to_string(kLayers) + "\n0\n499\nexit=0");
  Call("DELETE", "/v1/sandboxes/" + id);
}

}  // namespace
}  // namespace sbx::test

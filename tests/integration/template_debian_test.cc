// `sbx template debian` end to end without the network (issue 13, item 2): a local apt repository
// made here (a package holding the host's static busybox as /bin/sh and one holding a file to
// check, built with dpkg-deb; Packages by dpkg-scanpackages, Release by apt-ftparchive) is the
// file:// mirror of real mmdebstrap runs. The root becomes a one-layer template that `sbx run
// --template` runs a command in; a build mmdebstrap fails (a missing package) and one stopped by
// SIGINT while apt waits on a mirror that never answers both leave no template, no layer and no
// staging; bad flags fail before anything runs.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "common/fd.h"
#include "common/fs.h"
#include "sbx_process.h"

namespace sbx::test {
namespace {

std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class TemplateDebianTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access("/usr/bin/mmdebstrap", X_OK) != 0) GTEST_SKIP() << "mmdebstrap not installed";
    char tmpl[] = "/tmp/sbx-template-debian-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    ASSERT_EQ(::chmod(tmpl, 0711), 0);  // the boxes' root must be able to reach its layers
    dir_ = tmpl;
    data_ = dir_ + "/data";
    ASSERT_EQ(::mkdir(data_.c_str(), 0711), 0);
    cgroup_parent_ = "sbx-template-debian-test-" + std::to_string(::getpid());
    MakeRepository();
  }
  void TearDown() override {
    if (dir_.empty()) return;
    EXPECT_EQ(ReadText("/proc/self/mountinfo").find(dir_), std::string::npos) << "leaked mount";
    for (const auto& d : CgroupParentDirs(cgroup_parent_)) ::rmdir(d.c_str());
    (void)RemoveTree(dir_);  // the test's scratch directory: a leftover in /tmp harms no result
  }

  void Sh(const std::string& cmd) {
    auto r = RunProcess({"/bin/sh", "-ec", cmd});
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.out << r.err;
  }
  // A package `name` of the files below `root` (made by `fill`, a shell command run in it).
  void MakeDeb(const std::string& name, const std::string& arch, const std::string& depends,
               const std::string& fill) {
    std::string root = dir_ + "/pkg/" + name;
    Sh("mkdir -p " + root + "/DEBIAN && cd " + root + " && " + fill);
    std::string control = "Package: " + name + "\nVersion: 1.0\nArchitecture: " + arch +
                          "\nMaintainer: sbx test <root@localhost>\n" +
                          (depends.empty() ? "" : "Depends: " + depends + "\n") +
                          "Description: sbx template debian test package\n";
    ASSERT_TRUE(WriteFile(root + "/DEBIAN/control", control).ok());
    Sh("dpkg-deb --root-owner-group -b " + root + " " + repo_ + "/pool/" + name + ".deb");
  }
  void MakeRepository() {
    repo_ = dir_ + "/repo";
    Sh("mkdir -p " + repo_ + "/pool " + repo_ + "/dists/bookworm/main/binary-amd64");
    MakeDeb("sbx-test-shell", "amd64", "",
            "mkdir -p bin tmp && cp /bin/busybox bin/busybox && ln -s busybox bin/sh && "
            "ln -s busybox bin/cat");
    MakeDeb("sbx-test-greeting", "all", "sbx-test-shell",
            "mkdir -p usr/share/sbx-test && echo hello-from-a-deb > usr/share/sbx-test/greeting");
    Sh("cd " + repo_ + " && dpkg-scanpackages pool > dists/bookworm/main/binary-amd64/Packages " +
       "2>/dev/null && apt-ftparchive -o APT::FTPArchive::Release::Suite=bookworm " +
       "-o APT::FTPArchive::Release::Codename=bookworm " +
       "-o APT::FTPArchive::Release::Components=main " +
       "-o APT::FTPArchive::Release::Architectures=amd64 release dists/bookworm > Release.new && " +
       "mv Release.new dists/bookworm/Release");
  }

  std::vector<std::string> SbxArgs(std::vector<std::string> args) {
    args.insert(args.begin(), {SBX_BIN, "--data-dir", data_});
    return args;
  }
  ProcessResult Sbx(std::vector<std::string> args) {
    ProcessOptions o;
    o.env = {"SBX_CGROUP_PARENT=" + cgroup_parent_};
    return RunProcess(SbxArgs(std::move(args)), o);
  }
  // What the template cache's staging and layers hold (nothing after a failed build).
  std::string Entries(const std::string& sub) {
    return RunProcess({"/bin/sh", "-c", "ls -A " + data_ + "/templates/" + sub + " 2>/dev/null"})
        .out;
  }
  void ExpectNothingRegistered(const std::string& name) {
    EXPECT_NE(Sbx({"template", "inspect", name}).exit_code, 0);
    EXPECT_EQ(Entries("staging"), "");
    EXPECT_EQ(Entries("layers"), "");
    EXPECT_EQ(Entries("leases"), "");
  }

  std::string dir_, data_, repo_, cgroup_parent_;
};

TEST_F(TemplateDebianTest, ABuiltRootRunsAsATemplate) {
  auto r = Sbx({"template", "debian", "deb-mini", "--mirror", "file://" + repo_,
                "--insecure-mirror", "--variant", "extract", "--include", "sbx-test-greeting"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out, "deb-mini\n");
  // Its stages as it works, then the name, the layer's digest and the size.
  EXPECT_NE(r.err.find("downloading packages"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("debian template deb-mini (layer sha256-"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(data_), std::string::npos) << "a staging path in the output: " << r.err;
  EXPECT_EQ(Entries("staging"), "");

  // mmdebstrap resolved the dependency; the command sees both packages' files and the defaults.
  r = Sbx({"run", "--template", "deb-mini", "--", "/bin/sh", "-c",
           "cat /usr/share/sbx-test/greeting; pwd; echo $PATH"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "hello-from-a-deb\n/\n/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");

  auto inspect = Sbx({"template", "inspect", "deb-mini"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("\"kind\": \"oci\""), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("sha256-"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("/bin/sh"), std::string::npos) << inspect.out;  // no bash: Cmd sh

  // The name is taken until --replace; the same root again is the same layer.
  r = Sbx({"template", "debian", "deb-mini", "--mirror", "file://" + repo_, "--insecure-mirror",
           "--variant", "extract", "--include", "sbx-test-greeting"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("exists"), std::string::npos) << r.err;
  EXPECT_EQ(Entries("staging"), "");
}

TEST_F(TemplateDebianTest, AFailedBuildRegistersNothingAndLeavesNoStaging) {
  auto r =
      Sbx({"template", "debian", "deb-broken", "--mirror", "file://" + repo_, "--insecure-mirror",
           "--variant", "extract", "--include", "sbx-test-greeting,no-such-package"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("mmdebstrap failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no-such-package"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(data_), std::string::npos) << r.err;
  ExpectNothingRegistered("deb-broken");

  // An unsigned mirror without --insecure-mirror is refused by apt.
  r = Sbx({"template", "debian", "deb-unsigned", "--mirror", "file://" + repo_, "--variant",
           "extract", "--include", "sbx-test-greeting"});
  EXPECT_NE(r.exit_code, 0);
  ExpectNothingRegistered("deb-unsigned");
}

TEST_F(TemplateDebianTest, BadFlagsFailBeforeMmdebstrapRuns) {
  std::string mirror = "file://" + repo_;
  for (std::vector<std::string> args :
       {std::vector<std::string>{"Bad/Name", "--mirror", mirror},
        {"host", "--mirror", mirror},
        {"ok", "--mirror", mirror, "--suite", "../etc"},
        {"ok", "--mirror", mirror, "--include", "python3,/tmp/evil.deb"},
        {"ok", "--mirror", mirror, "--variant", "fat"},
        {"ok", "--mirror", "ftp://mirror.example/debian"},
        {"ok", "--mirror", "http://x/ bookworm main\ndeb http://y/"},
        {"ok", "--mirror", mirror, "--arch", "sparc64"}}) {
    args.insert(args.begin(), {"template", "debian"});
    auto r = Sbx(args);
    EXPECT_EQ(r.exit_code, 125) << args[2] << " " << args.back() << ": " << r.err;
    EXPECT_NE(r.err.find("sbx: "), std::string::npos) << r.err;
  }
  EXPECT_EQ(Entries("staging"), "");
  auto help = Sbx({"template", "debian", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--include"), std::string::npos) << help.out;
}

// Ctrl-C while apt waits on a mirror that accepts and never answers: mmdebstrap and all it
// started go (the connection closes), nothing is registered and the staging is gone.
TEST_F(TemplateDebianTest, SigintStopsTheBuildAndRemovesTheStaging) {
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(listener.valid());
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener.get(), 16), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::string mirror = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "/debian";

  std::string err_path = dir_ + "/sbx.err";
  auto argv = SbxArgs({"template", "debian", "deb-stopped", "--mirror", mirror, "--insecure-mirror",
                       "--variant", "extract", "--include", "x"});
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::dup2(fd, 1) < 0 || ::dup2(fd, 2) < 0) ::_exit(127);
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(s.data());
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    ::_exit(127);
  }
  // apt's http method connects: the build is under way.
  struct pollfd p = {listener.get(), POLLIN, 0};
  int ready = ::poll(&p, 1, 60000);
  UniqueFd conn(ready == 1 ? ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC) : -1);
  EXPECT_TRUE(conn.valid()) << "apt never connected: " << ReadText(err_path);
  ::kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  std::string err = ReadText(err_path);
  ASSERT_TRUE(WIFEXITED(status)) << err;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT) << err;
  EXPECT_NE(err.find("interrupted"), std::string::npos) << err;
  if (conn.valid()) {
    // Every process of the build has ended: the peer's end is closed (EOF, or a reset), after
    // whatever request it sent.
    bool closed = false;
    char b[4096];
    for (int i = 0; i < 1000 && !closed; ++i) {
      struct pollfd c = {conn.get(), POLLIN, 0};
      if (::poll(&c, 1, 60000) != 1) break;
      closed = ::read(conn.get(), b, sizeof b) <= 0;
    }
    EXPECT_TRUE(closed) << "a process of the build still holds the connection";
  }
  ExpectNothingRegistered("deb-stopped");
}

}  // namespace
}  // namespace sbx::test

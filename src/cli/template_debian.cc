// `sbx template debian NAME`: a Debian root made by mmdebstrap from the mirror the host's apt
// uses (apt_sources.h; --mirror overrides), registered as a one-layer template through the layer
// store's archive path (storage::AddLayerFromTarball: the same hardened unpacking as an image
// layer, content-addressed). mmdebstrap writes the tarball, and its own temporary root (TMPDIR),
// into a staging directory of the template cache that goes on every exit: an error, a signal
// (Ctrl-C stops mmdebstrap's whole process group first), or, should sbx be killed outright, the
// next cache sweep. Nothing is registered unless everything worked. docs/storage.md, "Debian
// roots".
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "cli/apt_sources.h"
#include "cli/template.h"
#include "cli/units.h"
#include "common/encoding.h"
#include "common/fd.h"
#include "common/fs.h"
#include "storage/image.h"
#include "store/store.h"

extern char** environ;

namespace sbx::cli {
namespace {

constexpr char kMmdebstrapPackage[] = "mmdebstrap";

struct DebianFlags {
  std::string name, suite = "bookworm", variant = "apt", mirror, arch = "amd64", cache_size;
  std::vector<std::string> include;
  bool insecure_mirror = false, replace = false;
};

// ---- signals ----

volatile sig_atomic_t g_signal = 0;   // the first signal that asked us to stop
volatile sig_atomic_t g_signals = 0;  // how many came
int g_wake_fd = -1;                   // the self-pipe's write end: wakes the poll loop

void OnSignal(int sig) {
  if (g_signal == 0) g_signal = sig;
  g_signals = g_signals + 1;
  int saved = errno;
  char c = 0;
  if (g_wake_fd >= 0) (void)!::write(g_wake_fd, &c, 1);
  errno = saved;
}

// While it lives, SIGINT, SIGTERM and SIGHUP do not end sbx: they are noted (interrupted()) and
// wake the loop that watches mmdebstrap, so that the build is stopped and its staging removed
// before sbx exits.
class InterruptGuard {
 public:
  InterruptGuard() {
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) return;
    read_.reset(p[0]);
    write_.reset(p[1]);
    g_signal = 0;
    g_signals = 0;
    g_wake_fd = p[1];
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~InterruptGuard() {
    if (!read_) return;
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
    g_wake_fd = -1;
  }
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

  bool ok() const { return read_.valid(); }
  int wake_fd() const { return read_.get(); }
  int interrupted() const { return g_signal; }
  bool insisted() const { return g_signals > 1; }

 private:
  static constexpr std::array<int, 3> kSignals = {SIGINT, SIGTERM, SIGHUP};
  UniqueFd read_, write_;
  std::array<struct sigaction, 3> old_{};
};

// ---- flags ----

bool ValidSuite(const std::string& s) {
  static const std::regex re("[a-z0-9][a-z0-9.-]{0,63}");
  return std::regex_match(s, re);
}

// A Debian package name (Debian Policy 5.6.7), optionally :ARCH; never a path of a .deb.
bool ValidPackage(const std::string& p) {
  static const std::regex re("[a-z0-9][a-z0-9+.-]{0,127}(:[a-z0-9-]{1,32})?");
  return std::regex_match(p, re);
}

// What mmdebstrap is given as the mirror: the URI goes into a one-line source, so nothing that
// could end it or add options.
bool ValidMirror(const std::string& m) {
  static const std::regex re("(https?|file|copy)://[A-Za-z0-9._~:/?#@!$&'()*+,;=%-]{1,1000}");
  return std::regex_match(m, re);
}

const std::set<std::string>& Variants() {
  static const std::set<std::string> v = {"extract", "custom", "essential", "apt",     "required",
                                          "minbase", "buildd", "important", "standard"};
  return v;
}

std::string HostArch() {
  struct utsname u {};
  if (::uname(&u) != 0) return "";
  std::string m = u.machine;
  if (m == "x86_64") return "amd64";
  if (m == "aarch64") return "arm64";
  if (m == "i686" || m == "i386") return "i386";
  if (m == "ppc64le") return "ppc64el";
  return m;  // riscv64, s390x
}

// Whether this host runs `arch`'s programs (which every variant but extract needs): its own,
// i386 on amd64, or one binfmt_misc hands to qemu-user.
bool HostRuns(const std::string& arch) {
  std::string host = HostArch();
  if (arch == host || (host == "amd64" && arch == "i386")) return true;
  static const std::map<std::string, std::string> qemu = {
      {"arm64", "aarch64"},   {"armhf", "arm"},   {"armel", "arm"},       {"i386", "i386"},
      {"ppc64el", "ppc64le"}, {"s390x", "s390x"}, {"riscv64", "riscv64"}, {"mips64el", "mips64el"}};
  auto q = qemu.find(arch);
  if (q == qemu.end()) return false;
  auto state = ReadFile("/proc/sys/fs/binfmt_misc/qemu-" + q->second, 4096);
  return state.ok() && state->rfind("enabled", 0) == 0;
}

std::string FindInPath(const std::string& prog) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr && *path != '\0' ? path : "/usr/sbin:/usr/bin:/sbin:/bin";
  size_t at = 0;
  while (at <= dirs.size()) {
    size_t colon = dirs.find(':', at);
    if (colon == std::string::npos) colon = dirs.size();
    std::string candidate = dirs.substr(at, colon - at) + "/" + prog;
    if (colon > at && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    at = colon + 1;
  }
  return "";
}

// ---- mmdebstrap ----

// mmdebstrap's stderr, line by line: "I: ..." lines are its stages (shown as progress); the last
// lines are kept for the error message.
class OutputLines {
 public:
  explicit OutputLines(std::function<void(const std::string&)> stage) : stage_(std::move(stage)) {}
  void Feed(const char* data, size_t n) {
    partial_.append(data, n);
    size_t nl;
    while ((nl = partial_.find('\n')) != std::string::npos) {
      Line(partial_.substr(0, nl));
      partial_.erase(0, nl + 1);
    }
    if (partial_.size() > 4096) {  // a line without end is cut, not kept whole
      Line(partial_);
      partial_.clear();
    }
  }
  void End() {
    if (!partial_.empty()) Line(partial_);
    partial_.clear();
  }
  // Its "E:" lines, else its last lines, joined by "; ".
  std::string Errors() const {
    std::string out;
    for (const auto& l : tail_)
      if (l.rfind("E: ", 0) == 0) out += (out.empty() ? "" : "; ") + l.substr(3);
    if (!out.empty()) return out;
    size_t from = tail_.size() > 5 ? tail_.size() - 5 : 0;
    for (size_t i = from; i < tail_.size(); ++i) out += (out.empty() ? "" : "; ") + tail_[i];
    return out;
  }

 private:
  void Line(const std::string& l) {
    if (l.empty()) return;
    tail_.push_back(l);
    if (tail_.size() > 40) tail_.pop_front();
    if (l.rfind("I: ", 0) == 0) stage_(l.substr(3));
  }
  std::function<void(const std::string&)> stage_;
  std::string partial_;
  std::deque<std::string> tail_;
};

// Runs `argv` (argv[0] the program's path) in its own process group with stdout and stderr into
// `lines` and TMPDIR=`tmpdir`, until it exits or `guard` sees a signal: then its group is asked to
// stop (SIGTERM), and after 10 s or a second signal killed. Returns its wait status.
Result<int> RunMmdebstrap(const std::vector<std::string>& argv, const std::string& tmpdir,
                          OutputLines& lines, const InterruptGuard& guard) {
  // Everything the child needs is made before fork: it only calls async-signal-safe functions.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "TMPDIR=", 7) != 0) env_strings.emplace_back(*e);
  env_strings.push_back("TMPDIR=" + tmpdir);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!null) return Status::Errno("mmdebstrap: open /dev/null");
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return Status::Errno("mmdebstrap: pipe");
  UniqueFd out_read(p[0]), out_write(p[1]);
  pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) return Status::Errno("mmdebstrap: fork");
  if (pid == 0) {
    ::setpgid(0, 0);
    // Should sbx be killed outright, mmdebstrap goes too rather than build for nobody.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (::dup2(null.get(), 0) < 0 || ::dup2(out_write.get(), 1) < 0 ||
        ::dup2(out_write.get(), 2) < 0)
      ::_exit(127);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: a signal may come before the child has run
  out_write.reset();

  using Clock = std::chrono::steady_clock;
  bool stopping = false, killed = false;
  Clock::time_point kill_at{};
  char buf[4096];
  for (;;) {
    if (guard.interrupted() != 0 && !stopping) {
      stopping = true;
      // To the whole group, as a terminal's Ctrl-C would be: mmdebstrap waits for its apt or
      // dpkg child before it cleans up, so that child must stop too.
      ::kill(-pid, SIGTERM);
      kill_at = Clock::now() + std::chrono::seconds(10);
    }
    if (stopping && !killed && (guard.insisted() || Clock::now() >= kill_at)) {
      ::kill(-pid, SIGKILL);
      killed = true;
    }
    int timeout = -1;
    if (stopping && !killed)
      timeout = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - Clock::now()).count() +
          1);
    struct pollfd fds[2] = {{out_read.get(), POLLIN, 0}, {guard.wake_fd(), POLLIN, 0}};
    int n = ::poll(fds, 2, timeout);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    if (fds[1].revents != 0) {
      while (::read(guard.wake_fd(), buf, sizeof buf) > 0) {
      }
    }
    if (fds[0].revents != 0) {
      ssize_t got = ::read(out_read.get(), buf, sizeof buf);
      if (got > 0) {
        lines.Feed(buf, static_cast<size_t>(got));
        continue;
      }
      if (got < 0 && errno == EINTR) continue;
      break;  // every writer is gone: mmdebstrap has ended (or closed its output)
    }
  }
  lines.End();
  if (stopping) ::kill(-pid, SIGKILL);  // stopped on request: none of it may run on
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Status::Errno("mmdebstrap: wait");
  }
  // Whatever of its group outlived it (ESRCH when nothing did, the usual case).
  ::kill(-pid, SIGKILL);
  return status;
}

// Removes the staging directory on every way out of the verb.
class StagingDir {
 public:
  explicit StagingDir(std::string path) : path_(std::move(path)) {}
  ~StagingDir() {
    // RemoveTree stays on the staging directory's filesystem, so even a mount mmdebstrap left
    // below it (none in unshare mode: its mounts live in its own mount namespace) is not emptied.
    if (!path_.empty()) (void)RemoveTree(path_);  // a leftover is the next cache sweep's
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = 0; !from.empty() && (at = s.find(from, at)) != std::string::npos;
       at += to.size())
    s.replace(at, from.size(), to);
  return s;
}

int Interrupted(const std::string& name, int sig) {
  std::fprintf(stderr, "\nsbx: template debian %s: interrupted (%s); nothing registered\n",
               name.c_str(), ::strsignal(sig));
  return 128 + sig;
}

int Build(const DebianFlags& f, const GlobalOptions& g) {
  const std::string what = "template debian " + f.name;
  int64_t bound = 0;
  if (!f.cache_size.empty()) {
    auto n = ParseSize(f.cache_size);
    if (!n.ok() || *n <= 0)
      return Fail(Status::Error("--template-cache-size: expected a size such as 20G, got '" +
                                f.cache_size + "'"));
    bound = *n;
  }
  if (!storage::IsValidTemplateName(f.name) || f.name == storage::kHostTemplate)
    return Fail(Status::Error("template name '" + f.name +
                              "': expected [a-z0-9][a-z0-9._-]* with an optional :TAG (not host)"));
  if (!ValidSuite(f.suite))
    return Fail(Status::Error("--suite '" + f.suite + "': expected a suite such as bookworm"));
  if (Variants().count(f.variant) == 0) {
    std::string all;
    for (const auto& v : Variants()) all += (all.empty() ? "" : ", ") + v;
    return Fail(Status::Error("--variant '" + f.variant + "': one of " + all));
  }
  std::vector<std::string> include;
  for (const auto& item : f.include) {
    if (item.empty()) continue;
    if (!ValidPackage(item))
      return Fail(Status::Error("--include '" + item + "': not a Debian package name"));
    include.push_back(item);
  }
  if (!std::regex_match(f.arch, std::regex("[a-z0-9]{1,16}")))
    return Fail(Status::Error("--arch '" + f.arch + "': expected a Debian architecture"));
  if (f.variant != "extract" && !HostRuns(f.arch))
    return Fail(Status::Error("--arch " + f.arch + ": this host (" + HostArch() +
                              ") cannot run its programs (no qemu-user binfmt handler for it)"));
  std::string mirror = f.mirror;
  if (mirror.empty()) {
    auto picked = PickDebianMirror(ReadAptSources(), f.suite);
    if (!picked)
      return Fail(
          Status::Error("no Debian mirror in the host's apt sources (/etc/apt/sources.list, "
                        "/etc/apt/sources.list.d/*.list, *.sources); name one with --mirror URL"));
    mirror = *picked;
  }
  if (!ValidMirror(mirror))
    return Fail(
        Status::Error("mirror '" + mirror + "': expected an http://, https:// or file:// URL"));
  // A file:// mirror is outside mmdebstrap's chroot, where apt would look for the .deb files;
  // copy:// is the same mirror, its files copied in (mmdebstrap's own advice).
  std::string apt_uri = mirror.rfind("file://", 0) == 0 ? "copy://" + mirror.substr(7) : mirror;
  std::string mmdebstrap = FindInPath("mmdebstrap");
  if (mmdebstrap.empty())
    return Fail(Status::Error(std::string("mmdebstrap is not installed (apt-get install ") +
                              kMmdebstrapPackage + ")"));

  if (::geteuid() != 0)
    return Fail(Status::Error(
        "sbx template manages the daemon's template cache and store directly and needs root"));
  auto st = store::Store::Open(g.data_dir + "/" + store::kDbFileName);
  if (!st.ok()) return Fail(st.status().Wrap("store"));
  if (!f.replace) {
    auto existing = (*st)->GetTemplate(f.name);
    if (!existing.ok()) return Fail(existing.status());
    if (*existing)
      return Fail(
          Status::Error(what + ": a template of that name exists (--replace replaces it)", EEXIST));
  }
  storage::TemplateStore ts = CliTemplateStore(g.data_dir, bound);

  InterruptGuard guard;
  if (!guard.ok()) return Fail(Status::Errno(what + ": signal pipe"));
  auto made = storage::MakeStagingDir(ts);
  if (!made.ok()) return Fail(made.status().Wrap(what));
  StagingDir staging(*made);
  std::string tmpdir = staging.path() + "/tmp", tar = staging.path() + "/root.tar";
  if (::mkdir(tmpdir.c_str(), 0700) != 0) return Fail(Status::Errno(what + ": staging"));

  // --mode=unshare: the root is built in mmdebstrap's own mount, pid, uts and ipc namespaces,
  // chrooted. As root mmdebstrap adds no user namespace to that (it only does for an unprivileged
  // user with /etc/subuid ranges), so maintainer scripts run as host root inside the chroot:
  // what they run comes only from the mirror, signed with the keys the host's apt trusts (unless
  // --insecure-mirror). The tarball's owners are the root's own (0 for root's files) either way.
  // --skip=output/dev: no device nodes in the tarball (the layer store refuses them; the box gets
  // its /dev from the runtime).
  std::string source = "deb " + std::string(f.insecure_mirror ? "[trusted=yes] " : "") + apt_uri +
                       " " + f.suite + " main";
  std::vector<std::string> argv = {mmdebstrap,
                                   "--mode=unshare",
                                   "--format=tar",
                                   "--variant=" + f.variant,
                                   "--architectures=" + f.arch,
                                   "--components=main",
                                   "--skip=output/dev"};
  if (!include.empty()) {
    std::string list;
    for (const auto& p : include) list += (list.empty() ? "" : ",") + p;
    argv.push_back("--include=" + list);
  }
  argv.insert(argv.end(), {f.suite, tar, source});

  bool tty = ::isatty(STDERR_FILENO) != 0;
  auto started = std::chrono::steady_clock::now();
  auto show = [&](const std::string& text) {
    if (tty)
      std::fprintf(stderr, "\r\033[Ksbx: %s: %s", what.c_str(), text.c_str());
    else
      std::fprintf(stderr, "sbx: %s: %s\n", what.c_str(), text.c_str());
    std::fflush(stderr);
  };
  show("mmdebstrap " + f.suite + " (" + f.variant + ", " + f.arch + ") from " + mirror);
  OutputLines lines([&](const std::string& stage) {
    // Its temporary directory and tarball are paths of ours, not news to the operator.
    if (stage.find(staging.path()) == std::string::npos) show(stage);
  });
  auto status = RunMmdebstrap(argv, tmpdir, lines, guard);
  if (tty) std::fprintf(stderr, "\n");
  if (!status.ok()) return Fail(status.status().Wrap(what));
  if (guard.interrupted() != 0) return Interrupted(f.name, guard.interrupted());
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    std::string how = WIFEXITED(*status) ? "exit status " + std::to_string(WEXITSTATUS(*status))
                                         : std::string("signal ") + ::strsignal(WTERMSIG(*status));
    std::string why = Replace(lines.Errors(), staging.path(), "<staging>");
    return Fail(Status::Error(what + ": mmdebstrap failed (" + how + ")" +
                              (why.empty() ? "" : ": " + why)));
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  char took[32];
  std::snprintf(took, sizeof took, "%.1f s", secs);
  struct stat sb {};
  if (::stat(tar.c_str(), &sb) != 0 || sb.st_size == 0)
    return Fail(Status::Error(what + ": mmdebstrap made no root", EIO));
  show(std::string("built the root in ") + took + " (" + FormatSize(sb.st_size) +
       " tarball); adding its layer");

  // The lease keeps the new layer from the cache sweep until the template lists it.
  auto lease = storage::PinLease::Take(ts, **st, "pull_debian_" + RandomId(12));
  if (!lease.ok()) return Fail(lease.status().Wrap(what));
  auto layer =
      storage::AddLayerFromTarball(ts, **st, tar, lease->id(), [&](const storage::Progress& p) {
        if (tty)
          std::fprintf(stderr, "\r\033[Ksbx: %s: unpack %s: %s / %s", what.c_str(), p.what.c_str(),
                       FormatSize(p.done).c_str(), FormatSize(p.total).c_str());
      });
  if (tty) std::fprintf(stderr, "\n");
  if (!layer.ok()) return Fail(layer.status().Wrap(what));
  if (guard.interrupted() != 0) return Interrupted(f.name, guard.interrupted());

  storage::ImageConfig cfg;
  cfg.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"};
  cfg.workdir = "/";
  // bash is Essential, so every variant but extract and custom has it; those get /bin/sh.
  std::string layer_dir = storage::LayerDir(ts, layer->id);
  struct stat bash {};
  bool has_bash = ::lstat((layer_dir + "/usr/bin/bash").c_str(), &bash) == 0 ||
                  ::lstat((layer_dir + "/bin/bash").c_str(), &bash) == 0;
  cfg.cmd = {has_bash ? "/bin/bash" : "/bin/sh"};
  cfg.labels = {{"org.opencontainers.image.title", "debian " + f.suite},
                {"sbx.debian.suite", f.suite},
                {"sbx.debian.variant", f.variant}};
  std::string src = "debian " + f.suite + " " + f.variant + " " + f.arch + " " + mirror;
  for (size_t i = 0; i < include.size() && src.size() < 400; ++i)
    src += (i == 0 ? " +" : ",") + include[i];
  auto t = storage::PutImageTemplate(ts, **st, f.name, store::kTemplateOci, src, {layer->id}, cfg,
                                     f.replace);
  if (!t.ok()) return Fail(t.status().Wrap(what));
  std::printf("%s\n", t->name.c_str());
  std::fprintf(stderr, "sbx: debian template %s (layer %s, %s)\n", t->name.c_str(),
               layer->id.c_str(), FormatSize(t->size_bytes).c_str());
  return 0;
}

}  // namespace

void RegisterTemplateDebianVerb(CLI::App* tmpl, const GlobalOptions& g, ClientVerbs& verbs) {
  auto f = std::make_shared<DebianFlags>();
  CLI::App* deb = tmpl->add_subcommand(
      "debian",
      "Build a Debian root with mmdebstrap from the host's Debian mirror and register it as a "
      "template");
  deb->footer(
      "The mirror is the host's own (the first source in /etc/apt/sources.list or "
      "sources.list.d/*.list, *.sources that serves the suite); components: main. Packages are "
      "checked with the keys the host's apt trusts. The root becomes one content-addressed layer; "
      "the template's defaults are PATH, WorkingDir / and Cmd /bin/bash (/bin/sh without bash). "
      "Needs root and the mmdebstrap package. Example: sbx template debian py --include "
      "python3,git");
  deb->add_option("name", f->name, "Template name: [a-z0-9][a-z0-9._-]* [:TAG]")->required();
  deb->add_option("--suite", f->suite, "Debian suite or codename")->capture_default_str();
  deb->add_option("--include", f->include, "Packages to add, comma-separated (repeatable)")
      ->delimiter(',');
  deb->add_option("--variant", f->variant,
                  "mmdebstrap variant: apt (Essential + apt), minbase, essential, required, "
                  "buildd, important, standard; custom or extract (only the --include packages)")
      ->capture_default_str();
  deb->add_option("--mirror", f->mirror,
                  "Debian mirror URL (http://, https://, file://) instead of the host's");
  deb->add_flag("--insecure-mirror", f->insecure_mirror,
                "Do not check the mirror's Release signature (an unsigned local mirror)");
  deb->add_option("--arch", f->arch, "Debian architecture (others than the host's need qemu-user)")
      ->capture_default_str();
  deb->add_flag("--replace,--force", f->replace, "Replace a template of that name");
  deb->add_option("--template-cache-size", f->cache_size,
                  "Bound of the template cache, e.g. 20G (default: what sbx serve uses)");
  verbs.Add(deb, [f, &g] { return Build(*f, g); });
}

}  // namespace sbx::cli

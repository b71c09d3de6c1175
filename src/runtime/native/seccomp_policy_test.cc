// Tests of the default seccomp policy: every denial in docs/isolation-seccomp.md returns its exact
// errno under the real kernel, normal workloads still run, and the argument rules hold for every
// value (checked by evaluating the BPF program directly). Filters are only ever installed in
// forked children, never in the test process.
#include "runtime/native/seccomp_policy.h"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

namespace sbx::runtime {
namespace {

constexpr int kSetupFailed = 250;

const sock_fprog& Program() {
  const Result<SeccompProgram>& p = DefaultSeccompProgram();
  EXPECT_TRUE(p.ok()) << p.status().message();
  static const sock_fprog prog = p->prog();
  return prog;
}

// Forks; the child (with `prog`: sets no_new_privs and installs it) _exits with body()'s result.
// Returns the child's wait status.
int RunInChild(const std::function<int()>& body, const sock_fprog* prog) {
  pid_t pid = fork();
  if (pid == 0) {
    if (prog != nullptr && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) _exit(kSetupFailed);
    if (prog != nullptr && ApplySeccompProgram(*prog) != 0) _exit(kSetupFailed);
    _exit(body());
  }
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return status;
}

// RunInChild under the default filter.
int RunFiltered(const std::function<int()>& body) { return RunInChild(body, &Program()); }

// The errno a system call fails with under the filter (0 if it succeeded).
int ErrnoUnderFilter(const std::function<long()>& call) {
  int status = RunFiltered([&] { return call() == -1 ? errno : 0; });
  EXPECT_TRUE(WIFEXITED(status)) << "wait status " << status;
  EXPECT_NE(WEXITSTATUS(status), kSetupFailed);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The exit code of body() run under the filter (killed -> -signal).
int ExitUnderFilter(const std::function<int()>& body) {
  int status = RunFiltered(body);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return WEXITSTATUS(status);
}

TEST(SeccompPolicyTest, BuildsOnceAndIsCached) {
  const Result<SeccompProgram>& a = DefaultSeccompProgram();
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_FALSE(a->filter.empty());
  EXPECT_LE(a->filter.size(), static_cast<size_t>(BPF_MAXINSNS));
  EXPECT_EQ(&a, &DefaultSeccompProgram());
  sock_fprog prog = a->prog();
  EXPECT_EQ(prog.len, a->filter.size());
  EXPECT_EQ(prog.filter, a->filter.data());
}

TEST(SeccompPolicyTest, EmbeddedProgramEqualsAFreshBuild) {
  const Result<SeccompProgram>& embedded = DefaultSeccompProgram();
  Result<SeccompProgram> fresh = BuildDefaultSeccompProgram();
  ASSERT_TRUE(embedded.ok());
  ASSERT_TRUE(fresh.ok()) << fresh.status().message();
  ASSERT_EQ(embedded->filter.size(), fresh->filter.size());
  for (size_t i = 0; i < fresh->filter.size(); ++i) {
    const sock_filter& a = embedded->filter[i];
    const sock_filter& b = fresh->filter[i];
    ASSERT_TRUE(a.code == b.code && a.jt == b.jt && a.jf == b.jf && a.k == b.k)
        << "instruction " << i;
  }
}

// Arguments chosen so that, were the filter missing, each call fails harmlessly or does nothing.
TEST(SeccompPolicyTest, MountsAreDenied) {
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_mount, "none", "/sbx-none", "tmpfs", 0, 0); }),
            EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_umount2, "/sbx-none", 0); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_fsopen, "tmpfs", 0); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_fsconfig, -1, 0, 0, 0, 0); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_fsmount, -1, 0, 0); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_fspick, -1, "", 0); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_open_tree, AT_FDCWD, "/", 0); }), EPERM);
  EXPECT_EQ(
      ErrnoUnderFilter([] { return syscall(467 /* open_tree_attr */, AT_FDCWD, "/", 0, 0, 0); }),
      EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_move_mount, -1, "", -1, "", 0); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_mount_setattr, -1, "", 0, nullptr, 0); }),
            EPERM);
}

TEST(SeccompPolicyTest, RootChangesAndFileHandlesAreDenied) {
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_pivot_root, "/sbx-none", "/sbx-none"); }),
            EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_chroot, "/"); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_open_by_handle_at, -1, nullptr, 0); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_name_to_handle_at, -1, "", 0, 0, 0); }),
            EPERM);
}

TEST(SeccompPolicyTest, KeyringsAreDenied) {
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_keyctl, 0 /* GET_KEYRING_ID */, -3, 0); }),
            EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_add_key, "sbx-none", "d", "", 0, -3); }),
            EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_request_key, "user", "sbx-none", 0, 0); }),
            EPERM);
}

TEST(SeccompPolicyTest, KernelAttackSurfaceIsDenied) {
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_bpf, -1, nullptr, 0); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_perf_event_open, nullptr, 0, -1, -1, 0); }),
            EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_userfaultfd, 0); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_io_uring_setup, 0, nullptr); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_io_uring_enter, -1, 0, 0, 0, nullptr, 0); }),
            EPERM);
}

TEST(SeccompPolicyTest, NamespacesAreDenied) {
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_unshare, CLONE_NEWUSER); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_unshare, CLONE_NEWNET); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_unshare, CLONE_NEWNS); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_unshare, CLONE_NEWTIME); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_setns, -1, 0); }), EPERM);
  // unshare without namespace flags is harmless and allowed.
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_unshare, CLONE_FILES); }), 0);
  // clone3 hides its flags behind a pointer: ENOSYS so libc falls back to clone().
  EXPECT_EQ(ErrnoUnderFilter([] {
              clone_args args = {};
              args.flags = CLONE_NEWUSER;
              args.exit_signal = SIGCHLD;
              long r = syscall(SYS_clone3, &args, sizeof(args));
              if (r == 0) _exit(0);  // Filter missing: the new child leaves at once.
              return r;
            }),
            ENOSYS);
  for (unsigned long flag : {CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWNS}) {
    EXPECT_EQ(ErrnoUnderFilter([flag] {
                long r = syscall(SYS_clone, flag | SIGCHLD, 0, 0, 0, 0);
                if (r == 0) _exit(0);
                return r;
              }),
              EPERM)
        << "flag " << std::hex << flag;
  }
}

TEST(SeccompPolicyTest, MachineControlIsDenied) {
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_init_module, nullptr, 0, ""); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_finit_module, -1, "", 0); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_delete_module, "sbx_none", 0); }), EPERM);
  // Invalid flags: were the filter missing, kexec_load would fail with EINVAL.
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_kexec_load, 0, 0, nullptr, 0xFFFF0000UL); }),
            EPERM);
  // Bad magic: reboot would fail with EINVAL.
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_reboot, 0, 0, 0, nullptr); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_swapon, "/sbx-none", 0); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_swapoff, "/sbx-none"); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_settimeofday, nullptr, nullptr); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_clock_settime, CLOCK_REALTIME, nullptr); }),
            EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_adjtimex, nullptr); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_syslog, 10 /* SIZE_BUFFER */, nullptr, 0); }),
            EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_acct, nullptr); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_iopl, 0); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_sethostname, "x", 1); }), EPERM);
}

TEST(SeccompPolicyTest, DeviceNodesAreDeniedButFifosWork) {
  char dir[] = "/tmp/sbx-seccomp-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string chr = std::string(dir) + "/null";
  const std::string blk = std::string(dir) + "/blk";
  const std::string fifo = std::string(dir) + "/fifo";
  const std::string file = std::string(dir) + "/file";
  EXPECT_EQ(ErrnoUnderFilter([&] { return mknod(chr.c_str(), S_IFCHR | 0600, makedev(1, 3)); }),
            EPERM);
  EXPECT_EQ(ErrnoUnderFilter(
                [&] { return mknodat(AT_FDCWD, blk.c_str(), S_IFBLK | 0600, makedev(7, 0)); }),
            EPERM);
  EXPECT_EQ(ErrnoUnderFilter([&] { return mknod(fifo.c_str(), S_IFIFO | 0600, 0); }), 0);
  EXPECT_EQ(ErrnoUnderFilter([&] { return mknodat(AT_FDCWD, file.c_str(), S_IFREG | 0600, 0); }),
            0);
  struct stat st;
  EXPECT_NE(lstat(chr.c_str(), &st), 0);
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  for (const std::string& p : {chr, blk, fifo, file}) unlink(p.c_str());
  rmdir(dir);
}

TEST(SeccompPolicyTest, SocketFamilies) {
  for (int family : {AF_ALG, AF_VSOCK, AF_PACKET, AF_KEY, AF_BLUETOOTH}) {
    EXPECT_EQ(ErrnoUnderFilter([family] { return socket(family, SOCK_RAW, 0); }), EAFNOSUPPORT)
        << "family " << family;
  }
  // The kernel reads the family as an int: high bits must not slip AF_VSOCK past the filter.
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_socket, 0x100000000UL | AF_VSOCK, 1, 0); }),
            EAFNOSUPPORT);
  EXPECT_EQ(ErrnoUnderFilter([] {
              int sv[2];
              return socketpair(AF_ALG, SOCK_SEQPACKET, 0, sv);
            }),
            EAFNOSUPPORT);
  EXPECT_EQ(ErrnoUnderFilter([] { return socket(AF_INET, SOCK_STREAM, 0) >= 0 ? 0 : -1; }), 0);
  EXPECT_EQ(ErrnoUnderFilter([] { return socket(AF_INET6, SOCK_DGRAM, 0) >= 0 ? 0 : -1; }), 0);
  EXPECT_EQ(ErrnoUnderFilter([] { return socket(AF_UNIX, SOCK_STREAM, 0) >= 0 ? 0 : -1; }), 0);
  EXPECT_EQ(ErrnoUnderFilter([] { return socket(AF_NETLINK, SOCK_RAW, 0) >= 0 ? 0 : -1; }), 0);
  EXPECT_EQ(ErrnoUnderFilter([] {
              int sv[2];
              return socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
            }),
            0);
}

TEST(SeccompPolicyTest, TerminalInjectionIsDenied) {
  int master = posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(grantpt(master), 0);
  ASSERT_EQ(unlockpt(master), 0);
  int pty = open(ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(pty, 0);
  char c = 'x';
  EXPECT_EQ(ErrnoUnderFilter([&] { return syscall(SYS_ioctl, pty, TIOCSTI, &c); }), EPERM);
  EXPECT_EQ(ErrnoUnderFilter([&] { return syscall(SYS_ioctl, pty, 0xFFFFFFFF00005412UL, &c); }),
            EPERM);
  EXPECT_EQ(ErrnoUnderFilter([&] { return syscall(SYS_ioctl, pty, TIOCLINUX, &c); }), EPERM);
  // Ordinary terminal ioctls still work.
  EXPECT_EQ(ErrnoUnderFilter([&] {
              winsize ws = {};
              return ioctl(pty, TIOCGWINSZ, &ws);
            }),
            0);
  EXPECT_EQ(ErrnoUnderFilter([&] {
              termios t;
              return tcgetattr(pty, &t);
            }),
            0);
  close(pty);
  close(master);
}

TEST(SeccompPolicyTest, PersonalityAllowsOnlyDockersValues) {
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_personality, 0xFFFFFFFFUL) == -1 ? -1 : 0; }),
            0);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_personality, 0x0008UL) == -1 ? -1 : 0; }), 0);
  EXPECT_EQ(ErrnoUnderFilter([] { return syscall(SYS_personality, 0x0040000UL /* no ASLR */); }),
            EPERM);
}

int I386Getpid() {
  long ret = 20;
  asm volatile("int $0x80" : "+a"(ret) : : "memory");
  return 0;
}

TEST(SeccompPolicyTest, OtherAbisAreKilled) {
  // An i386 getpid through int 0x80. A kernel without i386 emulation (ia32_emulation=0, or its
  // default off) raises SIGSEGV for it before any filter runs; one with it runs it unfiltered.
  const int status = RunInChild(I386Getpid, nullptr);
  const bool i386 = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!i386) {
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << status;
  }
  EXPECT_EQ(ExitUnderFilter(I386Getpid), i386 ? -SIGSYS : -SIGSEGV);
  // An x32 getpid (the kernel has no x32 ABI here, but the filter must not rely on that).
  EXPECT_EQ(ExitUnderFilter([] {
              syscall(0x40000000L | SYS_getpid);
              return 0;
            }),
            -SIGSYS);
}

void* ThreadBody(void* arg) {
  *static_cast<int*>(arg) = 42;
  return nullptr;
}

TEST(SeccompPolicyTest, NormalWorkloadsRun) {
  EXPECT_EQ(ExitUnderFilter([] { return getpid() > 0 ? 0 : 1; }), 0);
  EXPECT_EQ(ExitUnderFilter([] {
              pthread_t t;
              int value = 0;
              if (pthread_create(&t, nullptr, ThreadBody, &value) != 0) return 1;
              if (pthread_join(t, nullptr) != 0) return 2;
              return value == 42 ? 0 : 3;
            }),
            0);
  EXPECT_EQ(ExitUnderFilter([] {
              pid_t pid = fork();
              if (pid < 0) return 1;
              if (pid == 0) {
                execl("/bin/true", "true", static_cast<char*>(nullptr));
                _exit(127);
              }
              int status = 0;
              if (waitpid(pid, &status, 0) != pid) return 2;
              return WIFEXITED(status) ? WEXITSTATUS(status) : 3;
            }),
            0);
  EXPECT_EQ(ExitUnderFilter([] {
              char path[] = "/tmp/sbx-seccomp-file-XXXXXX";
              int fd = mkstemp(path);
              if (fd < 0) return 1;
              unlink(path);
              char buf[5] = {};
              if (write(fd, "hello", 5) != 5) return 2;
              if (pread(fd, buf, 5, 0) != 5) return 3;
              return std::string(buf, 5) == "hello" ? 0 : 4;
            }),
            0);
  EXPECT_EQ(ExitUnderFilter([] {
              if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) return 1;
              return getuid() == 65534 && getgid() == 65534 ? 0 : 2;
            }),
            0);
  // A workload may stack its own filter.
  EXPECT_EQ(ExitUnderFilter([] {
              sock_filter allow = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
              sock_fprog prog = {1, &allow};
              return ApplySeccompProgram(prog) == 0 ? 0 : 1;
            }),
            0);
}

// Runs `command` through /bin/sh under the filter; returns its exit status.
int ShellUnderFilter(const char* command) {
  return ExitUnderFilter([command] {
    pid_t pid = fork();
    if (pid == 0) {
      int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      execl("/bin/sh", "sh", "-c", command, static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  });
}

TEST(SeccompPolicyTest, RealToolsRun) {
  EXPECT_EQ(ShellUnderFilter("echo hi | cat | wc -c && ls / && sleep 0.01 & wait"), 0);
  EXPECT_EQ(ShellUnderFilter("d=$(mktemp -d) && cd $d && git init -q && git config user.email a@b"
                             " && git config user.name a && echo x > f && git add f &&"
                             " git commit -qm x && git log --oneline; r=$?; rm -rf $d; exit $r"),
            0);
  if (access("/usr/bin/python3", X_OK) == 0 || system("command -v python3 >/dev/null") == 0) {
    EXPECT_EQ(ShellUnderFilter("python3 -c 'import subprocess, threading, asyncio, socket, os;"
                               "t = threading.Thread(target=lambda: None); t.start(); t.join();"
                               "subprocess.run([\"true\"], check=True);"
                               "asyncio.run(asyncio.sleep(0)); os.pipe(); socket.socketpair()'"),
              0);
  }
  if (system("command -v node >/dev/null") == 0) {
    EXPECT_EQ(ShellUnderFilter("node -e 'require(\"child_process\").execSync(\"true\");"
                               "require(\"fs\").readFile(\"/etc/hostname\", (e) => {"
                               " if (e) process.exit(1); })'"),
              0);
  }
  if (system("command -v cc >/dev/null") == 0) {
    EXPECT_EQ(ShellUnderFilter("d=$(mktemp -d) && echo 'int main(void){return 0;}' > $d/m.c &&"
                               " cc -o $d/m $d/m.c && $d/m; r=$?; rm -rf $d; exit $r"),
              0);
  }
}

// A minimal classic-BPF interpreter, enough for libseccomp's output, so argument rules can be
// checked for values that would be unsafe or impossible to try for real.
uint32_t Evaluate(const SeccompProgram& p, const seccomp_data& d) {
  uint32_t a = 0, x = 0, mem[BPF_MEMWORDS] = {};
  const auto* bytes = reinterpret_cast<const unsigned char*>(&d);
  for (size_t pc = 0; pc < p.filter.size(); ++pc) {
    const sock_filter& f = p.filter[pc];
    switch (f.code) {
      case BPF_LD | BPF_W | BPF_ABS:
        std::memcpy(&a, bytes + f.k, 4);
        break;
      case BPF_LD | BPF_MEM:
        a = mem[f.k];
        break;
      case BPF_LDX | BPF_MEM:
        x = mem[f.k];
        break;
      case BPF_ST:
        mem[f.k] = a;
        break;
      case BPF_STX:
        mem[f.k] = x;
        break;
      case BPF_ALU | BPF_AND | BPF_K:
        a &= f.k;
        break;
      case BPF_ALU | BPF_OR | BPF_K:
        a |= f.k;
        break;
      case BPF_MISC | BPF_TAX:
        x = a;
        break;
      case BPF_MISC | BPF_TXA:
        a = x;
        break;
      case BPF_JMP | BPF_JA:
        pc += f.k;
        break;
      case BPF_JMP | BPF_JEQ | BPF_K:
        pc += a == f.k ? f.jt : f.jf;
        break;
      case BPF_JMP | BPF_JGT | BPF_K:
        pc += a > f.k ? f.jt : f.jf;
        break;
      case BPF_JMP | BPF_JGE | BPF_K:
        pc += a >= f.k ? f.jt : f.jf;
        break;
      case BPF_JMP | BPF_JSET | BPF_K:
        pc += (a & f.k) != 0 ? f.jt : f.jf;
        break;
      case BPF_RET | BPF_K:
        return f.k;
      default:
        ADD_FAILURE() << "unhandled BPF opcode " << f.code << " at " << pc;
        return 0;
    }
  }
  ADD_FAILURE() << "fell off the end of the program";
  return 0;
}

uint32_t Decide(int nr, std::initializer_list<uint64_t> args) {
  seccomp_data d = {};
  d.nr = nr;
  d.arch = AUDIT_ARCH_X86_64;
  int i = 0;
  for (uint64_t v : args) d.args[i++] = v;
  return Evaluate(*DefaultSeccompProgram(), d);
}

constexpr uint32_t kAllow = SECCOMP_RET_ALLOW;
constexpr uint32_t Errno(int e) { return SECCOMP_RET_ERRNO | static_cast<uint32_t>(e); }

TEST(SeccompPolicyBpfTest, IoctlDeniesOnlyTerminalInjectionWhateverTheHighBits) {
  for (uint64_t high : {0x0UL, 0x1UL, 0xFFFFFFFFUL, 0x80000000UL}) {
    for (uint32_t cmd = 0x5400; cmd < 0x5480; ++cmd) {
      const bool denied = cmd == TIOCSTI || cmd == TIOCLINUX;
      EXPECT_EQ(Decide(SYS_ioctl, {0, (high << 32) | cmd}), denied ? Errno(EPERM) : kAllow)
          << std::hex << high << ":" << cmd;
    }
    for (uint32_t cmd : {0u, 1u, 0x12u, 0x1Cu, 0x5012u, 0x1412u, 0xD412u, 0x80045412u, 0x00015412u,
                         0xFFFFFFFFu, 0xC0105412u}) {
      EXPECT_EQ(Decide(SYS_ioctl, {0, (high << 32) | cmd}), kAllow) << std::hex << cmd;
    }
  }
}

TEST(SeccompPolicyBpfTest, SocketAllowsOnlyListedFamilies) {
  for (uint64_t high : {0x0UL, 0x1UL, 0xFFFFFFFFUL}) {
    for (uint32_t family = 0; family < 64; ++family) {
      const bool ok =
          family == AF_UNIX || family == AF_INET || family == AF_INET6 || family == AF_NETLINK;
      for (int nr : {SYS_socket, SYS_socketpair}) {
        EXPECT_EQ(Decide(nr, {(high << 32) | family, 0, 0}), ok ? kAllow : Errno(EAFNOSUPPORT))
            << nr << " " << std::hex << high << ":" << family;
      }
    }
    EXPECT_EQ(Decide(SYS_socket, {(high << 32) | 0x80000002u}), Errno(EAFNOSUPPORT));
  }
}

TEST(SeccompPolicyBpfTest, MknodDecidesOnFileType) {
  for (uint32_t type = 0; type <= S_IFMT; type += 010000) {
    const bool ok = type == 0 || type == S_IFREG || type == S_IFIFO || type == S_IFSOCK;
    EXPECT_EQ(Decide(SYS_mknod, {0, type | 0644u, 0}), ok ? kAllow : Errno(EPERM)) << type;
    EXPECT_EQ(Decide(SYS_mknodat, {0, 0, type | 0777u | S_ISUID, 0}), ok ? kAllow : Errno(EPERM))
        << type;
  }
}

TEST(SeccompPolicyBpfTest, CloneAndUnshareDenyEveryNamespaceBit) {
  const uint64_t thread_flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD |
                                CLONE_SYSVSEM | CLONE_SETTLS | CLONE_PARENT_SETTID |
                                CLONE_CHILD_CLEARTID;
  EXPECT_EQ(Decide(SYS_clone, {thread_flags}), kAllow);
  EXPECT_EQ(Decide(SYS_clone, {SIGCHLD | CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID}), kAllow);
  EXPECT_EQ(Decide(SYS_unshare, {CLONE_FS | CLONE_FILES | CLONE_SYSVSEM}), kAllow);
  for (uint64_t ns : {CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER,
                      CLONE_NEWPID, CLONE_NEWNET}) {
    EXPECT_EQ(Decide(SYS_clone, {thread_flags | ns}), Errno(EPERM)) << std::hex << ns;
    EXPECT_EQ(Decide(SYS_clone, {(0xFFFFFFFFUL << 32) | ns | SIGCHLD}), Errno(EPERM));
    EXPECT_EQ(Decide(SYS_unshare, {ns}), Errno(EPERM)) << std::hex << ns;
  }
  EXPECT_EQ(Decide(SYS_unshare, {CLONE_NEWTIME}), Errno(EPERM));
  EXPECT_EQ(Decide(SYS_clone3, {0, 0}), Errno(ENOSYS));
}

TEST(SeccompPolicyBpfTest, UnknownSyscallsAndOtherArchitectures) {
  EXPECT_EQ(Decide(1000, {}), Errno(ENOSYS));
  EXPECT_EQ(Decide(457 /* listmount, unknown to libseccomp 2.5.4 */, {}), Errno(ENOSYS));
  EXPECT_EQ(Decide(0x40000000 | SYS_getpid, {}), SECCOMP_RET_KILL_PROCESS);
  seccomp_data d = {};
  d.nr = 20;
  d.arch = AUDIT_ARCH_I386;
  EXPECT_EQ(Evaluate(*DefaultSeccompProgram(), d), SECCOMP_RET_KILL_PROCESS);
  EXPECT_EQ(Decide(SYS_read, {}), kAllow);
  EXPECT_EQ(Decide(SYS_personality, {0x0040000}), Errno(EPERM));
  EXPECT_EQ(Decide(SYS_personality, {0xFFFFFFFF}), kAllow);
  EXPECT_EQ(Decide(SYS_personality, {0x20008}), kAllow);
}

}  // namespace
}  // namespace sbx::runtime

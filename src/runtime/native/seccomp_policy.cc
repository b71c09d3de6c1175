// Builds the default seccomp policy: an allow list modelled on Docker's default profile, explicit
// EPERM for what a box must never do, and ENOSYS for everything the list does not name. Why each
// rule exists is in docs/isolation-seccomp.md.
#include "runtime/native/seccomp_policy.h"

#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <set>
#include <span>
#include <string>

#include "common/fd.h"

namespace sbx::runtime {
namespace {

// Unknown system calls (including ones newer than this list and than libseccomp) fail as if the
// kernel lacked them, so libc falls back to older calls (clone3 -> clone, fchmodat2 -> fchmodat).
constexpr int kDefaultErrno = ENOSYS;

// System calls on x86_64 that libseccomp 2.5.4 cannot name; added by number.
constexpr int kNrOpenTreeAttr = 467;  // Linux 6.15, part of the new mount API.
constexpr int kNrMseal = 462;         // Linux 6.10, seals the caller's own mappings.

// Namespace flags shared by clone() and unshare(). CLONE_NEWTIME (0x80) is only meaningful to
// unshare(): in clone()'s first argument those bits are the exit signal.
constexpr uint32_t kCloneNamespaceFlags = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS |
                                          CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |
                                          CLONE_NEWNET;
constexpr uint32_t kUnshareNamespaceFlags = kCloneNamespaceFlags | CLONE_NEWTIME;

// Mask of the 32 low bits of a 64-bit argument: the kernel truncates int and unsigned int
// arguments, so a comparison must ignore what a caller puts in the high half.
constexpr uint64_t kLow32 = 0xFFFFFFFFu;

// Accumulates rules into a libseccomp context; the first failure is kept and reported by Build().
class PolicyBuilder {
 public:
  // With `record`, every rule added is also appended to it (DefaultSeccompRules).
  explicit PolicyBuilder(std::vector<SeccompRule>* record = nullptr)
      : ctx_(seccomp_init(SCMP_ACT_ERRNO(kDefaultErrno)), &seccomp_release), record_(record) {
    if (ctx_ == nullptr) {
      status_ = Status::Error("seccomp_init", ENOMEM);
      return;
    }
    // Only the native ABI is in the filter; an i386 (int 0x80) or x32 system call is not
    // something any workload of ours makes, and killing makes the attempt loud.
    Check(seccomp_attr_set(ctx_.get(), SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS),
          "seccomp_attr_set BADARCH");
    // A binary search over system call numbers instead of a linear chain of ~300 compares.
    Check(seccomp_attr_set(ctx_.get(), SCMP_FLTATR_CTL_OPTIMIZE, 2), "seccomp_attr_set OPTIMIZE");
  }

  PolicyBuilder& Allow(std::initializer_list<const char*> names) {
    for (const char* name : names) Add(SCMP_ACT_ALLOW, name);
    return *this;
  }
  PolicyBuilder& AllowNumber(int nr, const char* name) {
    Check(seccomp_rule_add(ctx_.get(), SCMP_ACT_ALLOW, nr, 0), std::string("allow ") + name);
    Record(SCMP_ACT_ALLOW, name, nullptr);
    return *this;
  }
  PolicyBuilder& Deny(int err, std::initializer_list<const char*> names) {
    for (const char* name : names) Add(SCMP_ACT_ERRNO(err), name);
    return *this;
  }
  PolicyBuilder& DenyNumber(int err, int nr, const char* name) {
    Check(seccomp_rule_add(ctx_.get(), SCMP_ACT_ERRNO(err), nr, 0), std::string("deny ") + name);
    Record(SCMP_ACT_ERRNO(err), name, nullptr);
    return *this;
  }

  // `name` is allowed unless argument `arg` has one of the bits of `flags`, then fails with EPERM.
  PolicyBuilder& DenyFlags(const char* name, unsigned arg, uint32_t flags) {
    int nr = Resolve(name);
    if (nr < 0) return *this;
    AddMasked(SCMP_ACT_ALLOW, nr, arg, flags, 0, name);
    for (uint32_t bit = 1; bit != 0; bit <<= 1) {
      if (flags & bit) AddMasked(SCMP_ACT_ERRNO(EPERM), nr, arg, bit, bit, name);
    }
    return *this;
  }

  // `name` takes `match` when the low 32 bits of argument `arg` equal one of `values`, and
  // `other` for every other value whatever the high 32 bits hold.
  //
  // libseccomp drops a conditional rule when the same system call also has an unconditional one,
  // and SCMP_CMP_NE compares all 64 bits (so 0xFFFFFFFF00005412 != TIOCSTI would pass while the
  // kernel sees TIOCSTI). So "everything else" is spelled out as disjoint masked compares: for
  // each prefix of the listed values, the sibling prefix that no listed value has.
  PolicyBuilder& Split(const char* name, unsigned arg, std::initializer_list<uint32_t> values,
                       uint32_t match, uint32_t other) {
    int nr = Resolve(name);
    if (nr < 0) return *this;
    for (int len = 1; len <= 32; ++len) {
      const uint32_t mask = len == 32 ? 0xFFFFFFFFu : ~(0xFFFFFFFFu >> len);
      std::set<uint32_t> prefixes, covered;
      for (uint32_t v : values) {
        prefixes.insert(v & mask);
        covered.insert(v & mask);
      }
      for (uint32_t p : prefixes) {
        const uint32_t sibling = (p ^ (1u << (32 - len))) & mask;
        if (!covered.contains(sibling)) {
          covered.insert(sibling);
          AddMasked(other, nr, arg, mask, sibling, name);
        }
      }
    }
    for (uint32_t v : std::set<uint32_t>(values)) AddMasked(match, nr, arg, 0xFFFFFFFFu, v, name);
    return *this;
  }

  // mknod/mknodat: regular files, FIFOs and sockets are fine; devices (and any other type) EPERM.
  PolicyBuilder& MknodRegularOnly(const char* name, unsigned mode_arg) {
    int nr = Resolve(name);
    if (nr < 0) return *this;
    constexpr uint32_t kTypeStep = 010000;  // lowest bit of S_IFMT
    for (uint32_t type = 0; type <= S_IFMT; type += kTypeStep) {
      const bool ok = type == 0 || type == S_IFREG || type == S_IFIFO || type == S_IFSOCK;
      AddMasked(ok ? SCMP_ACT_ALLOW : SCMP_ACT_ERRNO(EPERM), nr, mode_arg, S_IFMT, type, name);
    }
    return *this;
  }

  Result<SeccompProgram> Build() {
    if (!status_.ok()) return status_;
    UniqueFd fd(memfd_create("sbx-seccomp-bpf", MFD_CLOEXEC));
    if (!fd) return Status::Errno("memfd_create sbx-seccomp-bpf");
    if (int rc = seccomp_export_bpf(ctx_.get(), fd.get()); rc < 0) {
      return Status::Error("seccomp_export_bpf", -rc);
    }
    if (lseek(fd.get(), 0, SEEK_SET) < 0) return Status::Errno("lseek seccomp bpf memfd");
    Result<std::string> bytes = ReadAll(fd.get(), BPF_MAXINSNS * sizeof(sock_filter));
    if (!bytes.ok()) return bytes.status().Wrap("read seccomp bpf");
    if (bytes->empty() || bytes->size() % sizeof(sock_filter) != 0) {
      return Status::Error("seccomp_export_bpf: " + std::to_string(bytes->size()) +
                           " bytes is not a whole program");
    }
    SeccompProgram program;
    program.filter.resize(bytes->size() / sizeof(sock_filter));
    std::copy(bytes->begin(), bytes->end(), reinterpret_cast<char*>(program.filter.data()));
    return program;
  }

 private:
  void Check(int rc, const std::string& what) {
    if (rc < 0 && status_.ok()) status_ = Status::Error(what, -rc);
  }

  int Resolve(const char* name) {
    int nr = seccomp_syscall_resolve_name_arch(SCMP_ARCH_X86_64, name);
    if (nr < 0) {
      if (status_.ok()) status_ = Status::Error(std::string("unknown x86_64 syscall ") + name);
      return -1;
    }
    return nr;
  }

  void Add(uint32_t action, const char* name) {
    int nr = Resolve(name);
    if (nr >= 0) Check(seccomp_rule_add(ctx_.get(), action, nr, 0), std::string("rule ") + name);
    Record(action, name, nullptr);
  }

  void AddMasked(uint32_t action, int nr, unsigned arg, uint64_t mask, uint64_t value,
                 const char* name) {
    const scmp_arg_cmp cmp = {arg, SCMP_CMP_MASKED_EQ, mask & kLow32, value & kLow32};
    Check(seccomp_rule_add_array(ctx_.get(), action, nr, 1, &cmp),
          std::string("rule ") + name + " arg " + std::to_string(arg));
    Record(action, name, &cmp);
  }

  // Only ALLOW and ERRNO(e) actions are ever added.
  void Record(uint32_t action, const char* name, const scmp_arg_cmp* cmp) {
    if (record_ == nullptr) return;
    SeccompRule r;
    r.name = name;
    r.allow = action == SCMP_ACT_ALLOW;
    r.err = r.allow ? 0 : static_cast<int>(action & SECCOMP_RET_DATA);
    if (cmp != nullptr) {
      r.has_arg = true;
      r.arg = cmp->arg;
      r.mask = cmp->datum_a;
      r.value = cmp->datum_b;
    }
    record_->push_back(std::move(r));
  }

  std::unique_ptr<void, decltype(&seccomp_release)> ctx_;
  std::vector<SeccompRule>* record_;
  Status status_;
};

Result<SeccompProgram> BuildDefaultProgram(std::vector<SeccompRule>* record = nullptr) {
  PolicyBuilder b(record);
  // Docker's default allow list for x86_64 (moby profiles/seccomp/default.json), minus what the
  // Deny() lists below take out.
  b.Allow({"accept",
           "accept4",
           "access",
           "alarm",
           "arch_prctl",
           "bind",
           "brk",
           "cachestat",
           "capget",
           "capset",
           "chdir",
           "chmod",
           "chown",
           "clock_getres",
           "clock_gettime",
           "clock_nanosleep",
           "close",
           "close_range",
           "connect",
           "copy_file_range",
           "creat",
           "dup",
           "dup2",
           "dup3",
           "epoll_create",
           "epoll_create1",
           "epoll_ctl",
           "epoll_ctl_old",
           "epoll_pwait",
           "epoll_pwait2",
           "epoll_wait",
           "epoll_wait_old",
           "eventfd",
           "eventfd2",
           "execve",
           "execveat",
           "exit",
           "exit_group",
           "faccessat",
           "faccessat2",
           "fadvise64",
           "fallocate",
           "fanotify_mark",
           "fchdir",
           "fchmod",
           "fchmodat",
           "fchmodat2",
           "fchown",
           "fchownat",
           "fcntl",
           "fdatasync",
           "fgetxattr",
           "flistxattr",
           "flock",
           "fork",
           "fremovexattr",
           "fsetxattr",
           "fstat",
           "fstatfs",
           "fsync",
           "ftruncate",
           "futex",
           "futex_waitv",
           "futimesat",
           "getcpu",
           "getcwd",
           "getdents",
           "getdents64",
           "getegid",
           "geteuid",
           "getgid",
           "getgroups",
           "getitimer",
           "getpeername",
           "getpgid",
           "getpgrp",
           "getpid",
           "getppid",
           "getpriority",
           "getrandom",
           "getresgid",
           "getresuid",
           "getrlimit",
           "get_robust_list",
           "getrusage",
           "getsid",
           "getsockname",
           "getsockopt",
           "get_thread_area",
           "gettid",
           "gettimeofday",
           "getuid",
           "getxattr",
           "inotify_add_watch",
           "inotify_init",
           "inotify_init1",
           "inotify_rm_watch",
           "io_cancel",
           "io_destroy",
           "io_getevents",
           "io_pgetevents",
           "ioprio_get",
           "ioprio_set",
           "io_setup",
           "io_submit",
           "kill",
           "landlock_add_rule",
           "landlock_create_ruleset",
           "landlock_restrict_self",
           "lchown",
           "lgetxattr",
           "link",
           "linkat",
           "listen",
           "listxattr",
           "llistxattr",
           "lremovexattr",
           "lseek",
           "lsetxattr",
           "lstat",
           "madvise",
           "map_shadow_stack",
           "membarrier",
           "memfd_create",
           "memfd_secret",
           "mincore",
           "mkdir",
           "mkdirat",
           "mlock",
           "mlock2",
           "mlockall",
           "mmap",
           "modify_ldt",
           "mprotect",
           "mq_getsetattr",
           "mq_notify",
           "mq_open",
           "mq_timedreceive",
           "mq_timedsend",
           "mq_unlink",
           "mremap",
           "msgctl",
           "msgget",
           "msgrcv",
           "msgsnd",
           "msync",
           "munlock",
           "munlockall",
           "munmap",
           "nanosleep",
           "newfstatat",
           "open",
           "openat",
           "openat2",
           "pause",
           "pidfd_open",
           "pidfd_send_signal",
           "pipe",
           "pipe2",
           "pkey_alloc",
           "pkey_free",
           "pkey_mprotect",
           "poll",
           "ppoll",
           "prctl",
           "pread64",
           "preadv",
           "preadv2",
           "prlimit64",
           "process_mrelease",
           "pselect6",
           "pwrite64",
           "pwritev",
           "pwritev2",
           "read",
           "readahead",
           "readlink",
           "readlinkat",
           "readv",
           "recvfrom",
           "recvmmsg",
           "recvmsg",
           "remap_file_pages",
           "removexattr",
           "rename",
           "renameat",
           "renameat2",
           "restart_syscall",
           "rmdir",
           "rseq",
           "rt_sigaction",
           "rt_sigpending",
           "rt_sigprocmask",
           "rt_sigqueueinfo",
           "rt_sigreturn",
           "rt_sigsuspend",
           "rt_sigtimedwait",
           "rt_tgsigqueueinfo",
           "sched_getaffinity",
           "sched_getattr",
           "sched_getparam",
           "sched_get_priority_max",
           "sched_get_priority_min",
           "sched_getscheduler",
           "sched_rr_get_interval",
           "sched_setaffinity",
           "sched_setattr",
           "sched_setparam",
           "sched_setscheduler",
           "sched_yield",
           "seccomp",
           "select",
           "semctl",
           "semget",
           "semop",
           "semtimedop",
           "sendfile",
           "sendmmsg",
           "sendmsg",
           "sendto",
           "setfsgid",
           "setfsuid",
           "setgid",
           "setgroups",
           "setitimer",
           "setpgid",
           "setpriority",
           "setregid",
           "setresgid",
           "setresuid",
           "setreuid",
           "setrlimit",
           "set_robust_list",
           "setsid",
           "setsockopt",
           "set_thread_area",
           "set_tid_address",
           "setuid",
           "setxattr",
           "shmat",
           "shmctl",
           "shmdt",
           "shmget",
           "shutdown",
           "sigaltstack",
           "signalfd",
           "signalfd4",
           "splice",
           "stat",
           "statfs",
           "statx",
           "symlink",
           "symlinkat",
           "sync",
           "sync_file_range",
           "syncfs",
           "sysinfo",
           "tee",
           "tgkill",
           "time",
           "timer_create",
           "timer_delete",
           "timer_getoverrun",
           "timer_gettime",
           "timer_settime",
           "timerfd_create",
           "timerfd_gettime",
           "timerfd_settime",
           "times",
           "tkill",
           "truncate",
           "umask",
           "uname",
           "unlink",
           "unlinkat",
           "utime",
           "utimensat",
           "utimes",
           "vfork",
           "vmsplice",
           "wait4",
           "waitid",
           "write",
           "writev"});
  b.AllowNumber(kNrMseal, "mseal");
  // Debuggers work inside the box; the pid namespace hides every outside process and the kernel's
  // ptrace access checks (same uid or CAP_SYS_PTRACE, which is dropped) guard the rest.
  b.Allow({"ptrace", "process_vm_readv", "process_vm_writev"});

  // Mounts and root changes (threats 4, 5).
  b.Deny(EPERM, {"mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount",
                 "fspick", "open_tree", "move_mount", "mount_setattr"});
  b.DenyNumber(EPERM, kNrOpenTreeAttr, "open_tree_attr");
  // File handles reach inodes by number, past the mount namespace (threat 6, "shocker").
  b.Deny(EPERM, {"open_by_handle_at", "name_to_handle_at"});
  // Kernel keyrings are not namespaced (threat 9).
  b.Deny(EPERM, {"keyctl", "add_key", "request_key"});
  // Large kernel attack surface with a history of escapes (threat 10).
  b.Deny(EPERM, {"bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
                 "io_uring_register"});
  // The machine, its modules, swap and clock (threat 12).
  b.Deny(EPERM,
         {"init_module",     "finit_module",   "delete_module", "create_module", "kexec_load",
          "kexec_file_load", "reboot",         "swapon",        "swapoff",       "settimeofday",
          "clock_settime",   "clock_adjtime",  "adjtimex",      "acct",          "quotactl",
          "quotactl_fd",     "lookup_dcookie", "nfsservctl",    "vhangup",       "iopl",
          "ioperm",          "uselib",         "ustat",         "sysfs",         "_sysctl",
          "get_kernel_syms", "query_module",   "fanotify_init"});
  // The kernel log (threat 18).
  b.Deny(EPERM, {"syslog"});
  // Joining or creating namespaces to regain capabilities (threat 11); the box's hostname is set
  // before exec.
  b.Deny(EPERM, {"setns", "sethostname", "setdomainname"});
  // Cross-process inspection that Docker reserves for CAP_SYS_PTRACE.
  b.Deny(EPERM, {"kcmp", "pidfd_getfd", "process_madvise"});
  // NUMA placement; Docker reserves it for CAP_SYS_NICE.
  b.Deny(EPERM, {"get_mempolicy", "set_mempolicy", "mbind", "set_mempolicy_home_node",
                 "migrate_pages", "move_pages"});
  // clone3 passes its flags behind a pointer that seccomp cannot read, so it is left to the default
  // ENOSYS and libc falls back to clone(), whose flags are checked here.
  b.DenyFlags("clone", 0, kCloneNamespaceFlags);
  b.DenyFlags("unshare", 0, kUnshareNamespaceFlags);
  // Device nodes (threat 13).
  b.MknodRegularOnly("mknod", 1);
  b.MknodRegularOnly("mknodat", 2);
  // Faking terminal input and the Linux console ioctls (threat 15).
  b.Split("ioctl", 1, {TIOCSTI, TIOCLINUX}, SCMP_ACT_ERRNO(EPERM), SCMP_ACT_ALLOW);
  // Only the families a workload needs; everything else (AF_ALG, AF_VSOCK, AF_PACKET, and the
  // rarely used families behind most socket CVEs) is reported as unsupported (threat 14).
  for (const char* name : {"socket", "socketpair"}) {
    b.Split(name, 0, {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK}, SCMP_ACT_ALLOW,
            SCMP_ACT_ERRNO(EAFNOSUPPORT));
  }
  // Docker's personalities: PER_LINUX, PER_LINUX32, UNAME26 (alone and with PER_LINUX32), query.
  b.Split("personality", 0, {0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF}, SCMP_ACT_ALLOW,
          SCMP_ACT_ERRNO(EPERM));
  return b.Build();
}

}  // namespace

sock_fprog SeccompProgram::prog() const {
  return sock_fprog{static_cast<decltype(sock_fprog::len)>(filter.size()),
                    const_cast<sock_filter*>(filter.data())};
}

Result<SeccompProgram> BuildDefaultSeccompProgram() { return BuildDefaultProgram(); }

const Result<SeccompRules>& DefaultSeccompRules() {
  static const Result<SeccompRules> rules = []() -> Result<SeccompRules> {
    SeccompRules out;
    out.default_errno = kDefaultErrno;
    auto built = BuildDefaultProgram(&out.rules);
    if (!built.ok()) return built.status();
    return out;
  }();
  return rules;
}

int ApplySeccompProgram(const sock_fprog& prog) {
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) return -errno;
  return 0;
}

}  // namespace sbx::runtime

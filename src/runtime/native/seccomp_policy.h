// The seccomp filter every process in a native box runs under, and the one call that installs it.
//
// The filter is built with libseccomp at build time (sbx-seccomp-gen compiles the policy below
// into classic BPF, which is embedded in the binary), so no process pays libseccomp's ~7 ms per
// start and the child between clone() and exec only needs the raw program and one system call.
// A test checks that the embedded program equals a fresh build. The policy, rule by rule with the
// errno each denial returns, is written down in docs/isolation.md; keep the two in step.
#pragma once

#include <linux/filter.h>

#include <vector>

#include "common/status.h"

namespace sbx::runtime {

// A classic BPF seccomp program, ready for SECCOMP_SET_MODE_FILTER.
struct SeccompProgram {
  std::vector<sock_filter> filter;
  // A view of `filter`: valid while this object is alive and `filter` is not modified.
  sock_fprog prog() const;
};

// Builds the default policy (x86_64 only; i386 and x32 system calls kill the process) with
// libseccomp. Used by the generator and by tests; never in a child of a multi-threaded process.
Result<SeccompProgram> BuildDefaultSeccompProgram();

// The default policy as embedded at build time. The same object for the life of the process;
// thread-safe.
const Result<SeccompProgram>& DefaultSeccompProgram();

// Installs `prog` on the calling thread with one seccomp(2) call; async-signal-safe, so it may run
// between clone() and exec. Needs no_new_privs or CAP_SYS_ADMIN. Returns 0 or -errno.
int ApplySeccompProgram(const sock_fprog& prog);

}  // namespace sbx::runtime

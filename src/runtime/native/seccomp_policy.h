// The seccomp filter every process in a native box runs under, and the one call that installs it.
//
// The filter is built with libseccomp at build time (sbx-seccomp-gen compiles the policy below
// into classic BPF, which is embedded in the binary), so no process pays libseccomp's ~7 ms per
// start and the child between clone() and exec only needs the raw program and one system call.
// A test checks that the embedded program equals a fresh build. The policy, rule by rule with the
// errno each denial returns, is written down in docs/isolation.md; keep the two in step.
#pragma once

#include <linux/filter.h>

#include <cstdint>
#include <string>
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

// One rule of the default policy, as OCI's linux.seccomp states rules (runtime/oci/oci_spec.h
// writes them into a bundle): recorded by the same builder, in the same order, as it adds them
// to the native filter, so both are one policy.
struct SeccompRule {
  std::string name;  // x86_64 system call name (libseccomp's, or the kernel's for calls it lacks)
  bool allow = false;
  int err = 0;  // the errno returned when !allow
  // A condition on argument `arg`: its low 32 bits masked with `mask` equal `value`
  // (SCMP_CMP_MASKED_EQ). Without one the rule covers every call.
  bool has_arg = false;
  unsigned arg = 0;
  uint64_t mask = 0;
  uint64_t value = 0;
};

struct SeccompRules {
  int default_errno = 0;  // what every call no rule names returns
  std::vector<SeccompRule> rules;
};

// The default policy as rules. Built once (with libseccomp, as BuildDefaultSeccompProgram) and
// then the same object for the life of the process; thread-safe.
const Result<SeccompRules>& DefaultSeccompRules();

// Installs `prog` on the calling thread with one seccomp(2) call; async-signal-safe, so it may run
// between clone() and exec. Needs no_new_privs or CAP_SYS_ADMIN. Returns 0 or -errno.
int ApplySeccompProgram(const sock_fprog& prog);

}  // namespace sbx::runtime

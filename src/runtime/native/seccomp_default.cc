// The default seccomp program, compiled from seccomp_policy.cc by sbx-seccomp-gen at build time.
#include <linux/filter.h>

#include "runtime/native/seccomp_policy.h"

namespace sbx::runtime {
namespace {

constexpr sock_filter kDefaultFilter[] = {
#include "seccomp_default.inc"
};

}  // namespace

const Result<SeccompProgram>& DefaultSeccompProgram() {
  static const Result<SeccompProgram> program = SeccompProgram{
      std::vector<sock_filter>(std::begin(kDefaultFilter), std::end(kDefaultFilter))};
  return program;
}

}  // namespace sbx::runtime

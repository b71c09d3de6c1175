// Executes the capability drop planned in the parent; see capabilities.h.
#include "runtime/native/capabilities.h"

#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <string>

#include "common/fd.h"

namespace sbx::runtime {
namespace {

constexpr uint64_t Bit(int cap) { return uint64_t{1} << cap; }

Result<CapabilityPlan> ReadPlan() {
  constexpr const char* kPath = "/proc/sys/kernel/cap_last_cap";
  Result<std::string> text = ReadFile(kPath, 64);
  if (!text.ok()) return text.status();
  int last = -1;
  const std::string& t = *text;
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), last);
  if (ec != std::errc() || (end != t.data() + t.size() && *end != '\n')) {
    return Status::Error(std::string("parse ") + kPath + ": '" + t + "'");
  }
  // CAP_AUDIT_WRITE (29) and CAP_SETFCAP (31) are kept, and the mask has 64 bits.
  if (last < CAP_SETFCAP || last > 63) {
    return Status::Error(std::string(kPath) + " = " + std::to_string(last) + " is out of range");
  }
  return CapabilityPlan{last, KeptCapabilities()};
}

}  // namespace

uint64_t KeptCapabilities() {
  return Bit(CAP_CHOWN) | Bit(CAP_DAC_OVERRIDE) | Bit(CAP_FOWNER) | Bit(CAP_FSETID) |
         Bit(CAP_KILL) | Bit(CAP_SETGID) | Bit(CAP_SETUID) | Bit(CAP_SETPCAP) |
         Bit(CAP_NET_BIND_SERVICE) | Bit(CAP_AUDIT_WRITE) | Bit(CAP_SETFCAP);
}

const Result<CapabilityPlan>& DefaultCapabilityPlan() {
  static const Result<CapabilityPlan> plan = ReadPlan();
  return plan;
}

int DropCapabilities(const CapabilityPlan& plan) {
  // The bounding set first: dropping from it needs CAP_SETPCAP, which capset() below would keep
  // anyway, but this order does not depend on that.
  for (int cap = 0; cap <= plan.last_cap; ++cap) {
    if (plan.keep & Bit(cap)) continue;
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) return -errno;
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) return -errno;

  __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  for (int i = 0; i < _LINUX_CAPABILITY_U32S_3; ++i) {
    const auto word = static_cast<uint32_t>(plan.keep >> (32 * i));
    data[i].effective = word;
    data[i].permitted = word;
    data[i].inheritable = 0;
  }
  if (syscall(SYS_capset, &header, data) != 0) return -errno;
  return 0;
}

}  // namespace sbx::runtime

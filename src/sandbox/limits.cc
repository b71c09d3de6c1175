#include "sandbox/limits.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "common/encoding.h"
#include "common/fd.h"

namespace sbx::sandbox {
namespace {

using store::LimitRanges;

constexpr int64_t kMiB = int64_t{1} << 20;

// MemTotal of /proc/meminfo in bytes; 0 when unreadable.
int64_t HostMemoryBytes() {
  auto text = ReadFile("/proc/meminfo", 1 << 16);
  if (!text.ok()) return 0;
  size_t at = text->find("MemTotal:");
  if (at == std::string::npos) return 0;
  return std::strtoll(text->c_str() + at + 9, nullptr, 10) * 1024;  // the file says kB
}

enum class Unit { kBytes, kCpus, kPids, kMillis, kMbps };

// One limit: where its bounds are, how to say its values, and what its host maximum is.
template <typename T>
struct Spec {
  const char* field;  // as the APIs name it: "limits.memory_bytes"
  const char* flag;   // sbx serve's and sbx key create's: --min-<flag>, --max-<flag>
  Unit unit;
  const char* host_max;  // what the host's maximum is ("the host's memory"), or nullptr
  T LimitRanges::*min;
  T LimitRanges::*max;
};

constexpr Spec<int64_t> kMemory{"limits.memory_bytes",
                                "memory",
                                Unit::kBytes,
                                "the host's memory",
                                &LimitRanges::min_memory_bytes,
                                &LimitRanges::max_memory_bytes};
constexpr Spec<double> kCpus{
    "limits.cpus",         "cpus", Unit::kCpus, "the host's CPUs", &LimitRanges::min_cpus,
    &LimitRanges::max_cpus};
constexpr Spec<int64_t> kPids{
    "limits.pids", "pids", Unit::kPids, nullptr, &LimitRanges::min_pids, &LimitRanges::max_pids};
constexpr Spec<int64_t> kDisk{
    "limits.disk_bytes",         "disk", Unit::kBytes, nullptr, &LimitRanges::min_disk_bytes,
    &LimitRanges::max_disk_bytes};
constexpr Spec<double> kEgress{"limits.egress_mbps",
                               "egress-mbps",
                               Unit::kMbps,
                               nullptr,
                               &LimitRanges::min_egress_mbps,
                               &LimitRanges::max_egress_mbps};
constexpr Spec<int64_t> kTimeout{"timeout",
                                 "timeout",
                                 Unit::kMillis,
                                 nullptr,
                                 &LimitRanges::min_timeout_ms,
                                 &LimitRanges::max_timeout_ms};

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// A value in its unit; bytes as "1.5 GiB (1610612736 bytes)": people read the first part,
// scripts the second.
template <typename T>
std::string Show(T v, Unit u) {
  switch (u) {
    case Unit::kBytes:
      return FormatSize(static_cast<int64_t>(v)) + " (" + std::to_string(v) + " bytes)";
    case Unit::kCpus:
    case Unit::kMbps:
      return Number(static_cast<double>(v));
    case Unit::kPids:
      return std::to_string(v);
    case Unit::kMillis:
      return Number(static_cast<double>(v) / 1000);
  }
  return {};
}

// The raw value as the request had it (seconds for a timeout).
template <typename T>
std::string Got(T v, Unit u) {
  if (u == Unit::kCpus || u == Unit::kMbps) return Number(static_cast<double>(v));
  if (u == Unit::kMillis) return Number(static_cast<double>(v) / 1000);
  return std::to_string(v);
}

const char* UnitName(Unit u) {
  switch (u) {
    case Unit::kBytes:
      return "";
    case Unit::kCpus:
      return " CPUs";
    case Unit::kPids:
      return " processes";
    case Unit::kMillis:
      return " seconds";
    case Unit::kMbps:
      return " Mbit/s";
  }
  return "";
}

// `lower` narrowed by `upper`'s set bounds: a set bound replaces lower's when it is inside
// lower's range, and is moved to lower's nearest bound otherwise. The result is never wider than
// `lower` and its minimum is never above its maximum.
template <typename T>
void Narrow(const Spec<T>& s, const LimitRanges& lower, const LimitRanges& upper,
            LimitRanges* out) {
  T lo = lower.*s.min, hi = lower.*s.max;  // hi 0: no maximum
  T max = upper.*s.max == 0 ? hi : (hi == 0 ? upper.*s.max : std::min(upper.*s.max, hi));
  if (max != 0) max = std::max(max, lo);
  T min = upper.*s.min == 0 ? lo : std::max(upper.*s.min, lo);
  if (max != 0) min = std::min(min, max);
  out->*s.min = min;
  out->*s.max = max;
}

// "from 16 MiB (16777216 bytes) to 2 GiB (2147483648 bytes), the maximum of this key": the
// range and whose bounds narrowed it.
template <typename T>
std::string RangeText(const Spec<T>& s, const LimitRanges& r, const LimitRanges& key,
                      const LimitRanges& daemon, const LimitRanges& host) {
  T min = r.*s.min, max = r.*s.max;
  std::string text = (max == 0 ? "at least " : "from ") + Show(min, s.unit);
  if (max != 0) text += " to " + Show(max, s.unit);
  text += UnitName(s.unit);
  std::string why;
  auto add = [&](const std::string& w) { why += (why.empty() ? ", " : " and ") + w; };
  if (key.*s.min != 0 && min == key.*s.min && min != daemon.*s.min)
    add("the minimum of this key");
  else if (min == daemon.*s.min && min != host.*s.min)
    add(std::string("the minimum of sbx serve --min-") + s.flag);
  if (max != 0) {
    if (key.*s.max != 0 && max == key.*s.max && max != daemon.*s.max)
      add("the maximum of this key");
    else if (max == daemon.*s.max && max != host.*s.max)
      add(std::string("the maximum of sbx serve --max-") + s.flag);
    else if (s.host_max != nullptr && max == host.*s.max)
      add(s.host_max);
  }
  return text + why;
}

template <typename T>
bool InRange(T v, T min, T max) {
  return v >= min && (max == 0 || v <= max);  // false for NaN
}

}  // namespace

LimitRanges HostRanges() {
  LimitRanges h;
  h.min_memory_bytes = 16 * kMiB;
  h.max_memory_bytes = std::max(h.min_memory_bytes, HostMemoryBytes());
  h.min_cpus = 0.1;
  h.max_cpus = std::max(1.0, static_cast<double>(::sysconf(_SC_NPROCESSORS_ONLN)));
  h.min_pids = 16;
  h.max_pids = 32768;
  h.min_disk_bytes = 64 * kMiB;
  h.max_disk_bytes = 0;  // what fits in the data directory (the manager's check)
  h.min_timeout_ms = 1000;
  h.max_timeout_ms = int64_t{24} * 60 * 60 * 1000;
  // The proxy's token bucket: below 0.1 Mbit/s (12.5 kB/s) a TLS handshake takes seconds; above
  // 100 Gbit/s a limit means nothing.
  h.min_egress_mbps = 0.1;
  h.max_egress_mbps = 100000;
  return h;
}

Limits::Limits(const LimitRanges& configured, const LimitRanges& host) : host_(host) {
  Narrow(kMemory, host, configured, &daemon_);
  Narrow(kCpus, host, configured, &daemon_);
  Narrow(kPids, host, configured, &daemon_);
  Narrow(kDisk, host, configured, &daemon_);
  Narrow(kTimeout, host, configured, &daemon_);
  Narrow(kEgress, host, configured, &daemon_);
}

Status Limits::CheckConfigured(const LimitRanges& configured, const LimitRanges& host) {
  auto check = [&](const auto& s) -> Status {
    for (auto [bound, name] : {std::pair{s.min, "--min-"}, std::pair{s.max, "--max-"}}) {
      auto v = configured.*bound;
      if (v == 0 || InRange(v, host.*s.min, host.*s.max)) continue;
      return Status::Error(name + std::string(s.flag) + ": " +
                               RangeText(s, host, LimitRanges{}, host, host) + " (got " +
                               Got(v, s.unit) + ")",
                           EINVAL);
    }
    if (configured.*s.min != 0 && configured.*s.max != 0 && configured.*s.min > configured.*s.max)
      return Status::Error(std::string("--min-") + s.flag + " is above --max-" + s.flag, EINVAL);
    return {};
  };
  SBX_RETURN_IF_ERROR(check(kMemory));
  SBX_RETURN_IF_ERROR(check(kCpus));
  SBX_RETURN_IF_ERROR(check(kPids));
  SBX_RETURN_IF_ERROR(check(kDisk));
  SBX_RETURN_IF_ERROR(check(kEgress));
  return check(kTimeout);
}

LimitRanges Limits::ForKey(const LimitRanges& key) const {
  LimitRanges r;
  Narrow(kMemory, daemon_, key, &r);
  Narrow(kCpus, daemon_, key, &r);
  Narrow(kPids, daemon_, key, &r);
  Narrow(kDisk, daemon_, key, &r);
  Narrow(kTimeout, daemon_, key, &r);
  Narrow(kEgress, daemon_, key, &r);
  return r;
}

Status Limits::Apply(const LimitRanges& key, const store::SandboxLimits& defaults,
                     int64_t default_timeout_ms, store::SandboxLimits* limits,
                     int64_t* timeout_ms) const {
  LimitRanges r = ForKey(key);
  // Checks the asked value `*v` (0: the default), then fills in the default moved into range.
  auto apply = [&](const auto& s, auto* v, auto dflt, const char* zero) -> Status {
    using T = std::remove_pointer_t<decltype(v)>;
    T min = r.*s.min, max = r.*s.max;
    if (*v != 0 && !InRange(*v, min, max)) {
      std::string text = s.field + std::string(": ") + RangeText(s, r, key, daemon_, host_);
      if (zero != nullptr) text += std::string("; 0 for ") + (max == 0 ? "no limit" : zero);
      return Status::Error(text + " (got " + Got(*v, s.unit) + ")", EINVAL);
    }
    if (*v == 0) {
      T d = static_cast<T>(dflt);
      if (d == 0 && max == 0) return {};  // no limit, and none required
      if (d == 0 || (max != 0 && d > max)) d = max;
      *v = std::max(d, min);
    }
    return {};
  };
  SBX_RETURN_IF_ERROR(apply(kMemory, &limits->memory_bytes, defaults.memory_bytes, "the default"));
  SBX_RETURN_IF_ERROR(apply(kCpus, &limits->cpus, defaults.cpus, "the default"));
  SBX_RETURN_IF_ERROR(apply(kPids, &limits->pids, defaults.pids, "the default"));
  SBX_RETURN_IF_ERROR(apply(kDisk, &limits->disk_bytes, defaults.disk_bytes, "the default"));
  // The egress rate: unlimited unless asked for, sbx serve has a --default-egress-mbps, or an
  // operator set a maximum (which is then the default, as for disks; the host's is no limit).
  double& egress = limits->egress_mbps;
  if (egress != 0 && !InRange(egress, r.min_egress_mbps, r.max_egress_mbps))
    return Status::Error(
        std::string(kEgress.field) + ": " + RangeText(kEgress, r, key, daemon_, host_) +
            "; 0 for " + (r.max_egress_mbps == host_.max_egress_mbps ? "no limit" : "the default") +
            " (got " + Got(egress, kEgress.unit) + ")",
        EINVAL);
  if (egress == 0) egress = EgressWithin(key, defaults.egress_mbps);
  return apply(kTimeout, timeout_ms, default_timeout_ms, nullptr);
}

double Limits::EgressWithin(const LimitRanges& key, double mbps) const {
  LimitRanges r = ForKey(key);
  // None stays none unless an operator set a maximum.
  if (!(mbps > 0)) return r.max_egress_mbps == host_.max_egress_mbps ? 0 : r.max_egress_mbps;
  if (r.max_egress_mbps != 0) mbps = std::min(mbps, r.max_egress_mbps);
  return std::max(mbps, r.min_egress_mbps);
}

Status Limits::CheckTimeout(const LimitRanges& key, int64_t timeout_ms) const {
  LimitRanges r = ForKey(key);
  if (InRange(timeout_ms, r.min_timeout_ms, r.max_timeout_ms)) return {};
  return Status::Error("timeout: " + RangeText(kTimeout, r, key, daemon_, host_) + " (got " +
                           Got(timeout_ms, Unit::kMillis) + ")",
                       EINVAL);
}

}  // namespace sbx::sandbox

// The ranges of a create's limits: a key's bounds narrow the daemon's, which narrow the host's;
// values out of range are refused naming the field, the range and whose bound it is; defaults
// are moved into the range. A fixed host, so the messages are exact.
#include "sandbox/limits.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace sbx::sandbox {
namespace {

using store::LimitRanges;
using store::SandboxLimits;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

LimitRanges Host() {
  LimitRanges h;
  h.min_memory_bytes = 16 * kMiB;
  h.max_memory_bytes = 8 * kGiB;
  h.min_cpus = 0.1;
  h.max_cpus = 4;
  h.min_pids = 16;
  h.max_pids = 32768;
  h.min_disk_bytes = 64 * kMiB;
  h.max_disk_bytes = 0;
  h.min_timeout_ms = 1000;
  h.max_timeout_ms = 86400 * 1000;
  return h;
}

const SandboxLimits kDefaults{kGiB, 1.0, 0, 1024, 0};
constexpr int64_t kDefaultTimeoutMs = 300 * 1000;

// The message of applying `asked` for `key`, "" when accepted.
std::string Refusal(const Limits& l, const LimitRanges& key, SandboxLimits asked,
                    int64_t timeout_ms = 0) {
  Status s = l.Apply(key, kDefaults, kDefaultTimeoutMs, &asked, &timeout_ms);
  if (s.ok()) return "";
  EXPECT_EQ(s.err(), EINVAL) << s.message();
  return s.what();
}

TEST(LimitsTest, HostRangesAreSbxsOwnAndTheMachines) {
  LimitRanges h = HostRanges();
  EXPECT_EQ(h.min_memory_bytes, 16 * kMiB);
  EXPECT_GT(h.max_memory_bytes, h.min_memory_bytes);
  EXPECT_EQ(h.min_cpus, 0.1);
  EXPECT_GE(h.max_cpus, 1);
  EXPECT_EQ(h.min_pids, 16);
  EXPECT_EQ(h.max_pids, 32768);
  EXPECT_EQ(h.min_disk_bytes, 64 * kMiB);
  EXPECT_EQ(h.max_disk_bytes, 0);  // what fits: the manager's check
  EXPECT_EQ(h.min_timeout_ms, 1000);
  EXPECT_EQ(h.max_timeout_ms, 86400 * 1000);
}

TEST(LimitsTest, EachFieldOutOfRangeNamesTheFieldTheRangeAndTheValue) {
  Limits l({}, Host());
  EXPECT_EQ(Refusal(l, {}, {}), "");
  EXPECT_EQ(Refusal(l, {}, {1, 0, 0, 0, 0}),
            "limits.memory_bytes: from 16 MiB (16777216 bytes) to 8 GiB (8589934592 bytes), the "
            "host's memory; 0 for the default (got 1)");
  EXPECT_EQ(Refusal(l, {}, {-1, 0, 0, 0, 0}).substr(0, 31), "limits.memory_bytes: from 16 Mi");
  EXPECT_NE(Refusal(l, {}, {int64_t{1} << 50, 0, 0, 0, 0}).find("the host's memory"),
            std::string::npos);
  EXPECT_EQ(Refusal(l, {}, {0, 0.05, 0, 0, 0}),
            "limits.cpus: from 0.1 to 4 CPUs, the host's CPUs; 0 for the default (got 0.05)");
  EXPECT_NE(Refusal(l, {}, {0, 1e300, 0, 0, 0}), "");
  EXPECT_NE(Refusal(l, {}, {0, std::nan(""), 0, 0, 0}), "");
  EXPECT_NE(Refusal(l, {}, {0, std::numeric_limits<double>::infinity(), 0, 0, 0}), "");
  EXPECT_EQ(Refusal(l, {}, {0, 0, 0, 8, 0}),
            "limits.pids: from 16 to 32768 processes; 0 for the default (got 8)");
  EXPECT_EQ(Refusal(l, {}, {0, 0, 0, 40000, 0}),
            "limits.pids: from 16 to 32768 processes; 0 for the default (got 40000)");
  // No disk maximum but what fits (the manager's check): 0 is "no limit".
  EXPECT_EQ(Refusal(l, {}, {0, 0, 0, 0, kMiB}),
            "limits.disk_bytes: at least 64 MiB (67108864 bytes); 0 for no limit (got 1048576)");
  EXPECT_EQ(Refusal(l, {}, {0, 0, 0, 0, int64_t{1} << 50}), "");
  EXPECT_EQ(Refusal(l, {}, {}, 500), "timeout: from 1 to 86400 seconds (got 0.5)");
  EXPECT_EQ(Refusal(l, {}, {}, -1000), "timeout: from 1 to 86400 seconds (got -1)");
  EXPECT_EQ(Refusal(l, {}, {}, int64_t{86401} * 1000),
            "timeout: from 1 to 86400 seconds (got 86401)");
  // Extremes are compared, never computed with.
  EXPECT_NE(Refusal(l, {}, {std::numeric_limits<int64_t>::max(), 0, 0, 0, 0}), "");
  EXPECT_NE(Refusal(l, {}, {std::numeric_limits<int64_t>::min(), 0, 0, 0, 0}), "");
  EXPECT_NE(Refusal(l, {}, {}, std::numeric_limits<int64_t>::min()), "");
}

TEST(LimitsTest, AKeysBoundsNarrowTheDaemonsAndSaySo) {
  LimitRanges daemon;
  daemon.max_memory_bytes = 4 * kGiB;
  daemon.max_timeout_ms = 7200 * 1000;
  Limits l(daemon, Host());
  EXPECT_EQ(l.daemon().max_memory_bytes, 4 * kGiB);
  EXPECT_EQ(l.daemon().max_cpus, 4);  // not configured: the host's
  EXPECT_EQ(Refusal(l, {}, {5 * kGiB, 0, 0, 0, 0}),
            "limits.memory_bytes: from 16 MiB (16777216 bytes) to 4 GiB (4294967296 bytes), the "
            "maximum of sbx serve --max-memory; 0 for the default (got 5368709120)");

  LimitRanges key;
  key.max_memory_bytes = 2 * kGiB;
  key.min_memory_bytes = 256 * kMiB;
  key.max_cpus = 2;
  key.max_pids = 100;
  key.max_disk_bytes = 10 * kGiB;
  key.max_timeout_ms = 3600 * 1000;
  EXPECT_EQ(Refusal(l, key, {3 * kGiB, 0, 0, 0, 0}),
            "limits.memory_bytes: from 256 MiB (268435456 bytes) to 2 GiB (2147483648 bytes), the "
            "minimum of this key and the maximum of this key; 0 for the default (got 3221225472)");
  EXPECT_NE(Refusal(l, key, {128 * kMiB, 0, 0, 0, 0}), "");
  EXPECT_EQ(Refusal(l, key, {2 * kGiB, 2, 0, 100, 10 * kGiB}, 3600 * 1000), "");
  EXPECT_EQ(
      Refusal(l, key, {0, 2.5, 0, 0, 0}),
      "limits.cpus: from 0.1 to 2 CPUs, the maximum of this key; 0 for the default (got 2.5)");
  EXPECT_EQ(Refusal(l, key, {0, 0, 0, 0, 11 * kGiB}),
            "limits.disk_bytes: from 64 MiB (67108864 bytes) to 10 GiB (10737418240 bytes), the "
            "maximum of this key; 0 for the default (got 11811160064)");
  EXPECT_EQ(Refusal(l, key, {}, 7200 * 1000),
            "timeout: from 1 to 3600 seconds, the maximum of this key (got 7200)");
  EXPECT_TRUE(l.CheckTimeout(key, 3600 * 1000).ok());
  EXPECT_EQ(l.CheckTimeout(key, 3601 * 1000).what(),
            "timeout: from 1 to 3600 seconds, the maximum of this key (got 3601)");
  EXPECT_EQ(l.CheckTimeout(key, 0).err(), EINVAL);

  // A key's maximum above the daemon's (or the host's) never widens them.
  LimitRanges wide;
  wide.max_memory_bytes = 64 * kGiB;
  wide.max_cpus = 64;
  wide.max_timeout_ms = 100 * 86400 * 1000LL;
  wide.min_pids = 1;
  LimitRanges r = l.ForKey(wide);
  EXPECT_EQ(r.max_memory_bytes, 4 * kGiB);
  EXPECT_EQ(r.max_cpus, 4);
  EXPECT_EQ(r.max_timeout_ms, 7200 * 1000);
  EXPECT_EQ(r.min_pids, 16);
  EXPECT_NE(Refusal(l, wide, {5 * kGiB, 0, 0, 0, 0}), "");
  // A key's minimum above the daemon's maximum is that maximum: its range is never empty.
  LimitRanges crossed;
  crossed.min_memory_bytes = 6 * kGiB;
  r = l.ForKey(crossed);
  EXPECT_EQ(r.min_memory_bytes, 4 * kGiB);
  EXPECT_EQ(r.max_memory_bytes, 4 * kGiB);
}

TEST(LimitsTest, DefaultsAreMovedIntoTheKeysRange) {
  Limits l({}, Host());
  SandboxLimits got;
  int64_t timeout = 0;
  ASSERT_TRUE(l.Apply({}, kDefaults, kDefaultTimeoutMs, &got, &timeout).ok());
  EXPECT_EQ(got.memory_bytes, kGiB);
  EXPECT_EQ(got.cpus, 1.0);
  EXPECT_EQ(got.pids, 1024);
  EXPECT_EQ(got.disk_bytes, 0);  // no limit: none required
  EXPECT_EQ(got.cpu_weight, 0);
  EXPECT_EQ(timeout, kDefaultTimeoutMs);

  LimitRanges key;
  key.max_memory_bytes = 512 * kMiB;
  key.min_cpus = 2;
  key.max_pids = 64;
  key.max_disk_bytes = 2 * kGiB;
  key.max_timeout_ms = 60 * 1000;
  got = {};
  timeout = 0;
  ASSERT_TRUE(l.Apply(key, kDefaults, kDefaultTimeoutMs, &got, &timeout).ok());
  EXPECT_EQ(got.memory_bytes, 512 * kMiB);
  EXPECT_EQ(got.cpus, 2);
  EXPECT_EQ(got.pids, 64);
  EXPECT_EQ(got.disk_bytes, 2 * kGiB);  // "no limit" is the key's maximum
  EXPECT_EQ(timeout, 60 * 1000);
  // Asked values are kept as asked.
  got = {256 * kMiB, 3, 0, 32, kGiB};
  timeout = 30 * 1000;
  ASSERT_TRUE(l.Apply(key, kDefaults, kDefaultTimeoutMs, &got, &timeout).ok());
  EXPECT_EQ(got.memory_bytes, 256 * kMiB);
  EXPECT_EQ(got.cpus, 3);
  EXPECT_EQ(got.pids, 32);
  EXPECT_EQ(got.disk_bytes, kGiB);
  EXPECT_EQ(timeout, 30 * 1000);
}

TEST(LimitsTest, DaemonBoundsOutsideTheHostsAreRefusedNamingTheFlag) {
  LimitRanges c;
  EXPECT_TRUE(Limits::CheckConfigured(c, Host()).ok());
  c.max_memory_bytes = 16 * kGiB;
  Status s = Limits::CheckConfigured(c, Host());
  EXPECT_EQ(s.err(), EINVAL);
  EXPECT_EQ(s.what(),
            "--max-memory: from 16 MiB (16777216 bytes) to 8 GiB (8589934592 bytes), the host's "
            "memory (got 17179869184)");
  c = {};
  c.min_pids = 4;
  EXPECT_NE(Limits::CheckConfigured(c, Host()).what().find("--min-pids"), std::string::npos);
  c = {};
  c.min_cpus = 2;
  c.max_cpus = 1;
  EXPECT_EQ(Limits::CheckConfigured(c, Host()).what(), "--min-cpus is above --max-cpus");
  c = {};
  c.max_disk_bytes = int64_t{1} << 50;  // no host maximum: the manager checks what fits
  c.max_timeout_ms = 3600 * 1000;
  c.min_memory_bytes = 64 * kMiB;
  EXPECT_TRUE(Limits::CheckConfigured(c, Host()).ok());
  // Out of the host's range anyway (unchecked): moved into it.
  c.max_cpus = 100;
  Limits l(c, Host());
  EXPECT_EQ(l.daemon().max_cpus, 4);
  EXPECT_EQ(l.daemon().max_timeout_ms, 3600 * 1000);
  EXPECT_EQ(l.daemon().min_memory_bytes, 64 * kMiB);
}

// limits.egress_mbps: unlimited unless asked for; a value asked for lies in the host's range.
TEST(LimitsTest, AnEgressRateIsCheckedOnlyWhenAskedFor) {
  Limits l;
  SandboxLimits none;
  int64_t timeout = 0;
  ASSERT_TRUE(l.Apply({}, {}, 0, &none, &timeout).ok());
  EXPECT_EQ(none.egress_mbps, 0);
  SandboxLimits eight;
  eight.egress_mbps = 8;
  timeout = 0;
  ASSERT_TRUE(l.Apply({}, {}, 0, &eight, &timeout).ok());
  EXPECT_EQ(eight.egress_mbps, 8);
  for (double bad : {-1.0, 0.01, 1e6, std::nan("")}) {
    SandboxLimits asked;
    asked.egress_mbps = bad;
    timeout = 0;
    Status s = l.Apply({}, {}, 0, &asked, &timeout);
    EXPECT_EQ(s.err(), EINVAL) << bad;
    EXPECT_NE(s.message().find("limits.egress_mbps: from 0.1 to 100000 Mbit/s"), std::string::npos)
        << s.message();
  }
}

// sbx serve --max-egress-mbps and --default-egress-mbps: more than the maximum is refused naming
// the flag; a create that asks for nothing gets the default, or the maximum; a live policy change
// brings an older sandbox's rate into today's range.
TEST(LimitsTest, AnEgressMaximumRefusesMoreNamingTheFlagAndIsTheDefault) {
  LimitRanges configured;
  configured.max_egress_mbps = 50;
  Limits l(configured);
  SandboxLimits more;
  more.egress_mbps = 80;
  int64_t timeout = 0;
  Status s = l.Apply({}, {}, 0, &more, &timeout);
  EXPECT_EQ(s.err(), EINVAL);
  EXPECT_NE(s.message().find("limits.egress_mbps: from 0.1 to 50 Mbit/s, the maximum of sbx serve "
                             "--max-egress-mbps; 0 for the default (got 80)"),
            std::string::npos)
      << s.message();
  SandboxLimits none;
  timeout = 0;
  ASSERT_TRUE(l.Apply({}, {}, 0, &none, &timeout).ok());
  EXPECT_EQ(none.egress_mbps, 50);
  SandboxLimits dflt;
  SandboxLimits defaults;
  defaults.egress_mbps = 8;
  timeout = 0;
  ASSERT_TRUE(l.Apply({}, defaults, 0, &dflt, &timeout).ok());
  EXPECT_EQ(dflt.egress_mbps, 8);
  defaults.egress_mbps = 500;  // a default above the maximum is moved into the range
  SandboxLimits big;
  timeout = 0;
  ASSERT_TRUE(l.Apply({}, defaults, 0, &big, &timeout).ok());
  EXPECT_EQ(big.egress_mbps, 50);
  EXPECT_EQ(l.EgressWithin({}, 0), 50);
  EXPECT_EQ(l.EgressWithin({}, 200), 50);
  EXPECT_EQ(l.EgressWithin({}, 20), 20);
  // Without a maximum of the operator's, none stays none.
  EXPECT_EQ(Limits().EgressWithin({}, 0), 0);
  EXPECT_EQ(Limits().EgressWithin({}, 200), 200);
}

}  // namespace
}  // namespace sbx::sandbox

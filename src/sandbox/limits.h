// Limits: the allowed range of every number a create asks for (memory, cpus, pids, disk and the
// timeout), and the one check that holds a request to it. Three layers of bounds, each only
// narrowing the one below: the host's and sbx's own (HostRanges), the daemon's (sbx serve
// --min-memory/--max-memory ...), and a key's (sbx key create --max-memory ..., columns of
// api_keys, see docs/store.md). Whether a disk limit fits in the data directory's free space is
// the manager's check (it depends on creates in flight), not a range.
//
// Immutable after construction; safe to use from any thread.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "store/store.h"

namespace sbx::sandbox {

// What sbx allows whatever the flags say: memory from 16 MiB to the host's (MemTotal of
// /proc/meminfo), cpus from 0.1 to the online CPUs, pids from 16 to 32768, disk from 64 MiB with
// no fixed maximum (max_disk_bytes 0: what fits), timeouts from 1 s to 24 h, egress rates from
// 0.1 to 100000 Mbit/s (0, the default: unlimited). Below the minimums a box cannot start its
// agent and a shell.
store::LimitRanges HostRanges();

class Limits {
 public:
  // `configured`: the daemon's own bounds, 0 fields take the host's. A bound outside the host's
  // range is moved into it (sbx serve refuses one first, with CheckConfigured).
  explicit Limits(const store::LimitRanges& configured = {},
                  const store::LimitRanges& host = HostRanges());

  // EINVAL naming the flag (--max-memory ...) when a configured bound lies outside the host's
  // range or a minimum is above its maximum.
  static Status CheckConfigured(const store::LimitRanges& configured,
                                const store::LimitRanges& host = HostRanges());

  // The daemon-wide ranges, every bound filled in (max_disk_bytes 0: no maximum but what fits).
  const store::LimitRanges& daemon() const { return daemon_; }
  // The ranges of a key with bounds `key`: each set bound of the key narrows the daemon's, and a
  // key's bound outside the daemon's range counts as the daemon's nearest one. Never wider than
  // daemon().
  store::LimitRanges ForKey(const store::LimitRanges& key) const;

  // A create by a key with bounds `key`. Each nonzero field of *limits (memory, cpus, pids, disk;
  // cpu_weight is not a range here) and a nonzero *timeout_ms must lie in the key's range, or
  // EINVAL names the field, the range, whose bound it is and the value; only comparisons, so any
  // value is safe. Zero fields then take `defaults` / `default_timeout_ms`, moved into the range
  // (a key with --max-memory 512M gets 512M when it asks for nothing and the default is 1G; a
  // disk of 0, "no limit", gets the maximum when there is one).
  Status Apply(const store::LimitRanges& key, const store::SandboxLimits& defaults,
               int64_t default_timeout_ms, store::SandboxLimits* limits, int64_t* timeout_ms) const;
  // A new timeout for a sandbox of a key with bounds `key` (set-timeout, connect): EINVAL as in
  // Apply, and 0 is out of range too.
  Status CheckTimeout(const store::LimitRanges& key, int64_t timeout_ms) const;
  // The egress rate a running sandbox of a key with bounds `key` keeps at a live policy change:
  // `mbps` (0: none) moved into today's range (a daemon restarted with a lower --max-egress-mbps
  // brings it down; with a maximum, none becomes the maximum).
  double EgressWithin(const store::LimitRanges& key, double mbps) const;

 private:
  store::LimitRanges host_;
  store::LimitRanges daemon_;
};

}  // namespace sbx::sandbox

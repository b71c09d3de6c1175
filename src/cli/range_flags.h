// The --min-*/--max-* flags of memory, cpus, pids, disk and timeout, shared by sbx serve (the
// daemon's bounds) and sbx key create (a key's): registered and parsed in one place, so both
// take the same units (sizes as 2G, durations as 1h, see units.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "common/status.h"
#include "store/store.h"

namespace sbx::cli {

struct RangeFlags {
  std::string min_memory, max_memory;            // sizes
  std::string min_cpus, max_cpus;                // numbers of CPUs
  std::string min_pids, max_pids;                // whole numbers
  std::string min_disk, max_disk;                // sizes
  std::string min_timeout, max_timeout;          // durations
  std::string min_egress_mbps, max_egress_mbps;  // Mbit/s (sbx serve only: AddEgressRangeFlags)
};

// Adds the ten flags to `app`; `whose` ends each description ("for this key").
void AddRangeFlags(CLI::App* app, RangeFlags& flags, const std::string& whose);
// --min-egress-mbps and --max-egress-mbps (sbx serve's: a key has no bounds of its own for it).
void AddEgressRangeFlags(CLI::App* app, RangeFlags& flags, const std::string& whose);
// The bounds the flags set (0 where a flag is absent). EINVAL naming the flag for a value that
// does not parse or is not positive.
Result<store::LimitRanges> ParseRangeFlags(const RangeFlags& flags);

}  // namespace sbx::cli

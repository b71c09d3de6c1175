// The networks of `sbx run --net` boxes on one data directory and host (issue 12; docs/network.md,
// "sbx run --net"): the names a run's pieces have, its liveness lock, and the clean-up of runs
// that died. A run has no daemon, so it starts a network stack of its own beside any `sbx serve`
// and other runs, without touching theirs:
//   - its own nftables table, "sbxrun-<box id>", and host link "sbr<slot>" (sbx serve's are
//     "sbx" and "sbx<slot>"; no table guards another's links);
//   - its slot from the pool every process on the data directory shares (the store's
//     net_slots), held as "run:<box id>", a scope sbx serve's stack never frees;
//   - its box files, <data dir>/network/boxes/<box id>, and CA bundle,
//     <data dir>/network/ca-bundle-sbxrun-<box id>.crt;
//   - a lock file, <data dir>/network/runs/<box id>.lock, made (flock'd, then renamed into place)
//     before any of the above and removed after all of it: while its flock is held the run is
//     alive. The kernel drops the flock when the run dies, SIGKILL included.
// ReapKilledRunNetworks removes what dead runs left, at any instant they may have died; every
// `sbx run` calls it first, and `sbx serve` at its start (beside Manager::Reconcile), so a run
// killed on a host that never runs `sbx run` again is cleaned up too. A live run is never touched.
#pragma once

#include <string>

#include "common/fd.h"
#include "common/status.h"
#include "store/store.h"

namespace sbx::sandbox {

inline constexpr char kRunTablePrefix[] = "sbxrun-";
inline constexpr char kRunLinkPrefix[] = "sbr";
inline constexpr char kRunSlotScope[] = "run";  // the slot pool's scope (net_slot_pool.h)

// A run's box id, or a `sbx build --net` step's ("build-" + random): [a-z0-9-], 1 to 32
// characters, not starting with '-' (what the names above can hold).
bool ValidRunId(const std::string& id);
std::string RunNetworkDir(const std::string& data_dir);  // <data dir>/network
std::string RunTable(const std::string& id);             // "sbxrun-<id>"
std::string RunBundle(const std::string& data_dir, const std::string& id);
std::string RunLockPath(const std::string& data_dir, const std::string& id);

// The run's lock, flock'd before it has its final name, so that no reaper ever sees the file
// unlocked while its run lives (a reaper only looks at final names). Held for the run's life.
Result<UniqueFd> TakeRunLock(const std::string& data_dir, const std::string& id);

// Removes what runs that are gone left in this network namespace and on the data directory
// (their nftables tables, host links, box files, CA bundles, slots and lock files). Live runs
// (their lock held) are never touched. Returns how many dead runs it cleaned up. Safe to run from
// several processes at once (each dead run's lock is taken before its remains are touched).
Result<int> ReapKilledRunNetworks(const std::string& data_dir, store::Store& store);

}  // namespace sbx::sandbox

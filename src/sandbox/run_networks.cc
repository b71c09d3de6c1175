// What `sbx run --net` boxes leave, and its clean-up (run_networks.h).
#include "sandbox/run_networks.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <map>
#include <optional>
#include <set>
#include <vector>

#include "common/fs.h"
#include "network/firewall.h"
#include "network/netlink.h"
#include "network/network.h"
#include "sandbox/net_slot_pool.h"

namespace sbx::sandbox {
namespace {

constexpr char kLockSuffix[] = ".lock";

std::string RunsDir(const std::string& data_dir) { return RunNetworkDir(data_dir) + "/runs"; }

// A dead run's lock: held by the caller until the run's remains are gone. Nothing when the run
// lives (its flock is held) or its lock file is gone (it ended, or was reaped).
struct DeadLock {
  std::string path;
  UniqueFd fd;
};
std::optional<DeadLock> LockIfDead(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return std::nullopt;
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) return std::nullopt;
  return DeadLock{path, std::move(fd)};
}

}  // namespace

bool ValidRunId(const std::string& id) {
  return !id.empty() && id.size() <= 32 && id.front() != '-' &&
         id.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string::npos;
}
std::string RunNetworkDir(const std::string& data_dir) { return data_dir + "/network"; }
std::string RunTable(const std::string& id) { return kRunTablePrefix + id; }
// What Stack::Start names a stack's bundle for a table that is not sbx serve's (stack.cc).
std::string RunBundle(const std::string& data_dir, const std::string& id) {
  return RunNetworkDir(data_dir) + "/ca-bundle-" + RunTable(id) + ".crt";
}
std::string RunLockPath(const std::string& data_dir, const std::string& id) {
  return RunsDir(data_dir) + "/" + id + kLockSuffix;
}

Result<UniqueFd> TakeRunLock(const std::string& data_dir, const std::string& id) {
  SBX_RETURN_IF_ERROR(MakeDirs(RunsDir(data_dir), 0700));
  std::string tmp = RunsDir(data_dir) + "/." + id + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) return Status::Errno("create " + tmp);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    Status s = Status::Errno("flock " + tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), RunLockPath(data_dir, id).c_str()) != 0) {
    Status s = Status::Errno("rename " + tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  return fd;
}

Result<int> ReapKilledRunNetworks(const std::string& data_dir, store::Store& store) {
  const std::string runs = RunsDir(data_dir);
  std::map<std::string, DeadLock> dead;  // box id -> its lock, held until it is cleaned
  std::set<std::string> alive;
  // Whether the run of box `id` is gone; its lock is taken (and kept in `dead`) if so. A run that
  // holds anything has its lock file (made first, removed last), so no file means none.
  auto gone = [&](const std::string& id) {
    if (dead.count(id)) return true;
    if (alive.count(id)) return false;
    std::string path = RunLockPath(data_dir, id);
    if (::access(path.c_str(), F_OK) != 0) return true;
    auto lock = LockIfDead(path);
    if (!lock) {
      alive.insert(id);
      return false;
    }
    dead.emplace(id, std::move(*lock));
    return true;
  };
  std::vector<std::string> lock_ids, tmp_files;
  if (DIR* d = ::opendir(runs.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.size() > 5 && name.front() == '.' && name.ends_with(".tmp")) {
        tmp_files.push_back(name);
      } else if (name.size() > sizeof kLockSuffix - 1 && name.ends_with(kLockSuffix)) {
        std::string id = name.substr(0, name.size() - (sizeof kLockSuffix - 1));
        if (ValidRunId(id)) lock_ids.push_back(id);
      }
    }
    ::closedir(d);
  } else if (errno == ENOENT) {
    return 0;  // no run ever had a network on this data directory
  }
  Status first;
  auto keep = [&first](Status s) {
    if (!s.ok() && first.ok()) first = s;
  };
  for (const auto& id : lock_ids) (void)gone(id);
  // Tables first (they redirect to ports nobody serves any more), then the slots' links and box
  // files, then the slots.
  if (auto tables = network::ListTables(kRunTablePrefix); tables.ok()) {
    for (const auto& t : *tables) {
      std::string id = t.substr(sizeof kRunTablePrefix - 1);
      if (ValidRunId(id) && gone(id)) keep(network::DeleteTable(t));
    }
  } else {
    keep(tables.status());
  }
  // Holders do not depend on the subnet (the pool's size does, which reaping never asks for).
  if (auto cidr = network::ParseCidr(network::StackConfig{}.box_subnet); cidr.ok()) {
    auto pool = StoreNetSlotPool::Make(store, *cidr, kRunSlotScope);
    if (!pool.ok()) return pool.status();
    auto holders = (*pool)->Holders();
    if (!holders.ok()) return holders.status();
    for (const auto& [id, slot] : *holders) {
      if (!gone(id)) continue;
      std::string link = kRunLinkPrefix + std::to_string(slot);
      keep(network::DeleteLink(link));
      keep((*pool)->Release(id));
    }
  }
  int cleaned = 0;
  for (auto& [id, lock] : dead) {
    Status s = RemoveTree(RunNetworkDir(data_dir) + "/boxes/" + id);
    if (s.ok() && ::unlink(RunBundle(data_dir, id).c_str()) != 0 && errno != ENOENT)
      s = Status::Errno("unlink the CA bundle of run " + id);
    // Its lock file goes last, while still locked: a reaper that fails keeps it for the next.
    if (s.ok() && first.ok()) ::unlink(lock.path.c_str());
    keep(s);
    ++cleaned;
  }
  // A run killed between making its lock and naming it had made nothing else.
  for (const auto& name : tmp_files) {
    std::string path = runs + "/" + name;
    if (auto lock = LockIfDead(path)) ::unlink(path.c_str());
  }
  if (!first.ok()) return first.Wrap("reap killed runs");
  return cleaned;
}

}  // namespace sbx::sandbox

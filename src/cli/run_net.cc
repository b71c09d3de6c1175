#include "cli/run_net.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "cli/net.h"
#include "cli/serve.h"
#include "common/fs.h"
#include "network/firewall.h"
#include "network/netlink.h"
#include "sandbox/net_slot_pool.h"

namespace sbx::cli {
namespace {

constexpr char kScope[] = "run";  // the slot pool's scope of run boxes (net_slot_pool.h)
constexpr char kLockSuffix[] = ".lock";

std::string NetDir(const std::string& data_dir) { return data_dir + "/network"; }
std::string RunsDir(const std::string& data_dir) { return NetDir(data_dir) + "/runs"; }
std::string LockPath(const std::string& data_dir, const std::string& id) {
  return RunsDir(data_dir) + "/" + id + kLockSuffix;
}
std::string TableOf(const std::string& id) { return kRunTablePrefix + id; }
// What Stack::Start names a stack's bundle for a table that is not sbx serve's (stack.cc).
std::string BundleOf(const std::string& data_dir, const std::string& id) {
  return NetDir(data_dir) + "/ca-bundle-" + TableOf(id) + ".crt";
}

// A run's box id, or a `sbx build --net` step's ("build-" + random).
bool ValidId(const std::string& id) {
  return !id.empty() && id.size() <= 32 && id.front() != '-' &&
         id.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string::npos;
}

// The run's lock: flock'd before it has its final name, so that no reaper ever sees the file
// unlocked while its run lives (a reaper only looks at final names).
Result<UniqueFd> TakeLock(const std::string& data_dir, const std::string& id) {
  SBX_RETURN_IF_ERROR(MakeDirs(RunsDir(data_dir), 0700));
  std::string tmp = RunsDir(data_dir) + "/." + id + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) return Status::Errno("create " + tmp);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    Status s = Status::Errno("flock " + tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), LockPath(data_dir, id).c_str()) != 0) {
    Status s = Status::Errno("rename " + tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  return fd;
}

// The policy's network stack for one run: sbx serve's settings but for the names above.
Result<network::StackConfig> RunStackConfig(const std::string& data_dir, const std::string& id,
                                            const RunNetOptions& o) {
  ServeOptions so;  // one parser of the network flags for sbx serve and sbx run
  so.box_subnet = o.box_subnet;
  so.upstream_dns = o.upstream_dns;
  so.upstream_ca = o.upstream_ca;
  auto c = NetworkConfig(so);
  if (!c.ok()) return c.status();
  c->state_dir = NetDir(data_dir);
  c->table = TableOf(id);
  c->link_prefix = kRunLinkPrefix;
  c->owns_link_prefix = false;
  c->refusal_hint =
      o.refusal_hint.empty()
          ? "This box was made by `sbx run`: run the command again with another --net."
          : o.refusal_hint;
  return c;
}

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

void AddRunNetFlags(CLI::App* cmd, RunNetOptions& o, const std::string& what) {
  cmd->add_option("--net", o.net,
                  "Give " + what +
                      " a network: allow=NAME,... (an allowlist), open, deny=CIDR,... (with "
                      "open); as sbx create --net (repeatable)");
  cmd->add_option("--upstream-dns", o.upstream_dns,
                  "With --net: DNS servers names are resolved with, ADDR:PORT (repeatable; "
                  "default: the host's)");
  cmd->add_option("--upstream-ca", o.upstream_ca,
                  "With --net: the CA file upstream TLS is verified with (default: the host's)");
  cmd->add_option("--box-subnet", o.box_subnet,
                  "With --net: the pool box addresses come from (default 10.213.0.0/16)");
}

Result<network::Policy> RunPolicy(const RunNetOptions& o) {
  network::Policy p;
  if (!o.net.empty()) {
    auto j = ParseNetFlags(o.net);
    if (!j.ok()) return j.status();
    auto parsed = network::Policy::FromJson(j->dump());
    if (!parsed.ok()) return parsed.status().Wrap("--net");
    p = std::move(*parsed);
  }
  if (p.mode == network::Mode::kNone &&
      (!o.upstream_dns.empty() || !o.upstream_ca.empty() || !o.box_subnet.empty()))
    return Status::Error(
        "--upstream-dns, --upstream-ca and --box-subnet need --net (allow=NAME,... or open)",
        EINVAL);
  return p;
}

Result<std::unique_ptr<RunNetwork>> RunNetwork::Start(const std::string& data_dir,
                                                      store::Store& store,
                                                      const std::string& box_id,
                                                      const network::Policy& policy,
                                                      const RunNetOptions& o, bool verbose) {
  if (!ValidId(box_id)) return Status::Error("run network: bad box id '" + box_id + "'", EINVAL);
  auto config = RunStackConfig(data_dir, box_id, o);
  if (!config.ok()) return config.status();
  std::unique_ptr<RunNetwork> n(new RunNetwork(data_dir, box_id));
  auto lock = TakeLock(data_dir, box_id);
  if (!lock.ok()) return lock.status().Wrap("run network: lock");
  n->lock_ = std::move(*lock);
  // From here on the destructor removes whatever exists.
  auto cidr = network::ParseCidr(config->box_subnet);
  if (!cidr.ok()) return cidr.status().Wrap("--box-subnet");
  auto pool = sandbox::StoreNetSlotPool::Make(store, *cidr, kScope);
  if (!pool.ok()) return pool.status();
  n->slots_ = std::move(*pool);
  config->slots = n->slots_.get();
  if (verbose) {
    config->on_event = [](network::NetEvent e) {
      std::fprintf(stderr, "sbx: %s %s\n", e.type.c_str(), e.detail.dump().c_str());
    };
  }
  auto secret = InstallSecret::LoadOrCreate(data_dir);
  if (!secret.ok()) return secret.status();
  auto stack = network::Stack::Start(*config, *secret);
  if (!stack.ok()) return stack.status().Wrap("--net needs networking on this host");
  n->stack_ = std::move(*stack);
  network::BoxNetRequest req;
  req.policy = policy;
  n->prepared_ = true;  // Release is idempotent: a failed Prepare leaves nothing either way
  auto plan = n->stack_->Prepare(box_id, req);
  if (!plan.ok()) return plan.status();
  n->plan_ = std::move(*plan);
  return n;
}

Status RunNetwork::Close() {
  Status s;
  if (stack_ && prepared_) s = stack_->Release(box_id_);
  stack_.reset();  // its threads, resolver and proxy
  if (Status t = network::DeleteTable(TableOf(box_id_)); !t.ok() && s.ok()) s = t;
  if (::unlink(BundleOf(data_dir_, box_id_).c_str()) != 0 && errno != ENOENT && s.ok())
    s = Status::Errno("unlink the run's CA bundle");
  // Last: with the lock gone the run is no more; everything above is gone already (or for a
  // reaper to find: a failure here leaves the lock file unlinked only if all went well).
  if (s.ok() && lock_) ::unlink(LockPath(data_dir_, box_id_).c_str());
  lock_.reset();
  return s;
}

RunNetwork::~RunNetwork() {
  if (Status s = Close(); !s.ok())
    std::fprintf(stderr, "sbx: warning: the box's network: %s (the next sbx run removes it)\n",
                 s.message().c_str());
}

Result<int> ReapKilledRuns(const std::string& data_dir, store::Store& store) {
  const std::string runs = RunsDir(data_dir);
  std::map<std::string, DeadLock> dead;  // box id -> its lock, held until it is cleaned
  std::set<std::string> alive;
  // Whether the run of box `id` is gone; its lock is taken (and kept in `dead`) if so. A run that
  // holds anything has its lock file (made first, removed last), so no file means none.
  auto gone = [&](const std::string& id) {
    if (dead.count(id)) return true;
    if (alive.count(id)) return false;
    std::string path = LockPath(data_dir, id);
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
        if (ValidId(id)) lock_ids.push_back(id);
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
      if (ValidId(id) && gone(id)) keep(network::DeleteTable(t));
    }
  } else {
    keep(tables.status());
  }
  // Holders do not depend on the subnet (the pool's size does, which reaping never asks for).
  if (auto cidr = network::ParseCidr(network::StackConfig{}.box_subnet); cidr.ok()) {
    auto pool = sandbox::StoreNetSlotPool::Make(store, *cidr, kScope);
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
    Status s = RemoveTree(NetDir(data_dir) + "/boxes/" + id);
    if (s.ok() && ::unlink(BundleOf(data_dir, id).c_str()) != 0 && errno != ENOENT)
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

}  // namespace sbx::cli

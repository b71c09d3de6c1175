#include "runtime/native/box_owners.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "common/fs.h"

namespace sbx::runtime {
namespace {

constexpr char kCreationPrefix[] = ".creating.";

// Creates and locks <dir>/owner, which names the kind of owner. The lock lives as long as the
// returned descriptor (and dies with this process).
Result<UniqueFd> LockOwner(const std::string& dir, const std::string& owner) {
  std::string path = dir + "/owner";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd) return Status::Errno("create " + path);
  // Blocking: a reaper checking this box holds the lock only for a moment.
  if (::flock(fd.get(), LOCK_EX) != 0) return Status::Errno("lock " + path);
  SBX_RETURN_IF_ERROR(WriteAll(fd.get(), owner + "\n"));
  return fd;
}

}  // namespace

unsigned long long ProcessStartTime(pid_t pid) {
  auto stat = ReadFile("/proc/" + std::to_string(pid) + "/stat", 4096);
  if (!stat.ok()) return 0;
  // The command name (field 2) may hold spaces and parentheses: count fields after its last ')'.
  size_t pos = stat->rfind(')');
  if (pos == std::string::npos) return 0;
  for (int field = 2; field < 22; ++field) {
    pos = stat->find(' ', pos + 1);
    if (pos == std::string::npos) return 0;
  }
  return std::strtoull(stat->c_str() + pos + 1, nullptr, 10);
}

std::string CreationDirName(const std::string& id, pid_t pid, unsigned long long start_time) {
  return kCreationPrefix + std::to_string(pid) + "." + std::to_string(start_time) + "." + id;
}

bool IsAbandonedCreation(const std::string& name) {
  if (name.rfind(kCreationPrefix, 0) != 0) return false;
  const char* p = name.c_str() + sizeof kCreationPrefix - 1;
  char* end = nullptr;
  long pid = std::strtol(p, &end, 10);
  if (end == p || *end != '.' || pid <= 0) return false;
  p = end + 1;
  unsigned long long start = std::strtoull(p, &end, 10);
  if (end == p || *end != '.') return false;
  return ProcessStartTime(static_cast<pid_t>(pid)) != start;
}

Result<BoxDir> BoxDir::Make(const std::string& run_dir, const std::string& id,
                            const std::string& owner) {
  const std::string path = run_dir + "/" + id;
  const std::string tmp =
      run_dir + "/" + CreationDirName(id, ::getpid(), ProcessStartTime(::getpid()));
  if (::mkdir(tmp.c_str(), 0700) != 0) return Status::Errno("mkdir " + tmp);
  // From here until the rename, a failure removes the temporary directory (and a death leaves
  // it to IsAbandonedCreation).
  struct Tmp {
    const std::string& path;
    bool keep = false;
    ~Tmp() {
      // Best effort on a path only this creator knows; a leftover is reaped as abandoned.
      if (!keep) (void)RemoveTree(path);
    }
  } guard{tmp};
  auto lock = LockOwner(tmp, owner);
  if (!lock.ok()) return lock.status();
  // Never over an existing box's directory (rename(2) would replace an empty one).
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) != 0)
    return Status::Errno("create " + path);
  guard.keep = true;
  return BoxDir(path, id, std::move(lock).value());
}

BoxDir::BoxDir(BoxDir&& o) noexcept
    : path_(std::exchange(o.path_, {})),
      id_(std::move(o.id_)),
      lock_(std::move(o.lock_)),
      pool_(std::exchange(o.pool_, nullptr)),
      committed_(o.committed_) {}

Result<uint32_t> BoxDir::AcquireIdRange(IdPool* pool) {
  auto base = pool->Acquire(id_);
  if (!base.ok()) return base.status().Wrap("id range");
  pool_ = pool;
  return base;
}

UniqueFd BoxDir::Commit() {
  committed_ = true;
  return std::move(lock_);
}

BoxDir::~BoxDir() {
  if (committed_ || path_.empty()) return;
  // The range is free only once nothing the box wrote is left on the host; a directory that
  // cannot be removed keeps it (the reaper retries both).
  bool removed = RemoveTree(path_).ok();
  if (removed && pool_ != nullptr) {
    // A range whose release fails is released by ReapOrphans (its directory is gone).
    (void)pool_->Release(id_);
  }
}

void HostMount::Detach() {
  if (path_.empty()) return;
  // MNT_DETACH cannot fail on a mount point that exists; a missing one needs no detaching.
  (void)::umount2(path_.c_str(), MNT_DETACH);
  path_.clear();
}

void CgroupOwner::Undo() {
  if (committed_ || !cg_) return;
  // Nothing to report to on this path; what cannot be removed is a leftover ReapOrphans (which
  // runs Destroy on the box) removes.
  (void)cg_->Destroy();
  cg_.reset();
}

void ChildProcess::Undo() {
  if (committed_ || pid_ <= 0 || !pidfd_) return;
  ::syscall(SYS_pidfd_send_signal, pidfd_.get(), SIGKILL, nullptr, 0U);
  siginfo_t info{};
  while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd_.get()), &info,
                  WEXITED | __WALL) < 0 &&
         errno == EINTR) {
  }
  pidfd_.reset();
  pid_ = -1;
}

}  // namespace sbx::runtime

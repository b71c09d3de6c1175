// The one owner of each host resource a box creation makes, so that a failure anywhere in
// NativeRuntime::Create (an error returned, an exception thrown) undoes exactly what was made, in
// reverse, by destructors. Each owner undoes its resource unless it was committed (the box is
// live and Destroy owns it from then on). Declared in creation order, they are destroyed in the
// reverse one: the box's first process, then its cgroups, the disk mount, and last the directory
// (and only once it is gone, the id range).
//
// Resources with no owner here already have one: detached (idmapped) mounts are UniqueFds of
// open_tree (closing the last one unmounts the tree), and the disk's loop device has autoclear
// (it goes with the mount, see disk.h).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>

#include "common/fd.h"
#include "common/status.h"
#include "runtime/id_pool.h"
#include "runtime/native/cgroup.h"

namespace sbx::runtime {

// A box's directory <run_dir>/<id>, with its locked owner file, and the id range it holds.
//
// The directory is made under a temporary name (CreationDirName) holding the creator's pid and
// start time, the owner file is made and locked in it, and only then is it renamed into place:
// a box directory under its own name always has a locked owner file, and a temporary one left by
// a creator that died tells who made it, so the reaper removes it at once (IsAbandonedCreation).
class BoxDir {
 public:
  // `owner` names the kind of owner in the owner file ("run", "serve"). EEXIST when a box
  // directory of that id exists.
  static Result<BoxDir> Make(const std::string& run_dir, const std::string& id,
                             const std::string& owner);
  BoxDir(BoxDir&& o) noexcept;
  BoxDir& operator=(BoxDir&&) = delete;
  BoxDir(const BoxDir&) = delete;
  ~BoxDir();

  const std::string& path() const { return path_; }
  // Takes this box's id range from `pool` (held until the directory is gone; see id_pool.h).
  Result<uint32_t> AcquireIdRange(IdPool* pool);
  // The box is live: the directory and range stay; returns the owner lock for the runtime to
  // hold as long as it owns the box.
  UniqueFd Commit();

 private:
  BoxDir(std::string path, std::string id, UniqueFd lock)
      : path_(std::move(path)), id_(std::move(id)), lock_(std::move(lock)) {}
  std::string path_, id_;
  UniqueFd lock_;
  IdPool* pool_ = nullptr;  // set once a range is held
  bool committed_ = false;
};

// The temporary name in `run_dir`'s listing under which process `pid`, started at `start_time`
// (field 22 of /proc/<pid>/stat), makes box `id`'s directory. Starts with '.', which no box id
// does (ValidateBoxId).
std::string CreationDirName(const std::string& id, pid_t pid, unsigned long long start_time);
// Whether `name` in a run directory is a CreationDirName whose creator is no longer alive (no
// process with that pid, or one started at another time: a pid reused). Such a directory holds
// only its owner file: no range, cgroup, mount or process is taken before the rename. (Open's
// idmap probe uses such a name for its scratch directory too, for the same reason.)
bool IsAbandonedCreation(const std::string& name);
// Field 22 of /proc/<pid>/stat (clock ticks after boot); 0 when there is no such process.
unsigned long long ProcessStartTime(pid_t pid);

// A box's disk image mounted on the host, until the box's mount namespace holds its own
// reference: then (or on failure) Detach() takes it out of the host's mount table.
class HostMount {
 public:
  HostMount() = default;
  explicit HostMount(std::string path) : path_(std::move(path)) {}
  HostMount(HostMount&& o) noexcept : path_(std::exchange(o.path_, {})) {}
  HostMount& operator=(HostMount&& o) noexcept {
    if (this != &o) {
      Detach();
      path_ = std::exchange(o.path_, {});
    }
    return *this;
  }
  ~HostMount() { Detach(); }
  void Detach();

 private:
  std::string path_;
};

// A box's cgroups until the box is live: destroyed (its processes killed, its directories
// removed) unless committed. `Cgroup` itself is only a handle (Open makes one for every Freeze).
class CgroupOwner {
 public:
  CgroupOwner() = default;
  explicit CgroupOwner(std::unique_ptr<Cgroup> cg) : cg_(std::move(cg)) {}
  CgroupOwner(CgroupOwner&& o) noexcept
      : cg_(std::move(o.cg_)), committed_(std::exchange(o.committed_, false)) {}
  CgroupOwner& operator=(CgroupOwner&& o) noexcept {
    if (this != &o) {
      Undo();
      cg_ = std::move(o.cg_);
      committed_ = std::exchange(o.committed_, false);
    }
    return *this;
  }
  ~CgroupOwner() { Undo(); }
  Cgroup* operator->() const { return cg_.get(); }
  Cgroup* get() const { return cg_.get(); }
  void Commit() { committed_ = true; }

 private:
  void Undo();
  std::unique_ptr<Cgroup> cg_;
  bool committed_ = false;
};

// A box's first process from its clone on: its pid and the pidfd the clone returned. Killed with
// SIGKILL (through the pidfd, never a process that reused the pid) and reaped unless committed.
class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(pid_t pid, UniqueFd pidfd) : pid_(pid), pidfd_(std::move(pidfd)) {}
  ChildProcess(ChildProcess&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)),
        pidfd_(std::move(o.pidfd_)),
        committed_(std::exchange(o.committed_, false)) {}
  ChildProcess& operator=(ChildProcess&& o) noexcept {
    if (this != &o) {
      Undo();
      pid_ = std::exchange(o.pid_, -1);
      pidfd_ = std::move(o.pidfd_);
      committed_ = std::exchange(o.committed_, false);
    }
    return *this;
  }
  ~ChildProcess() { Undo(); }
  pid_t pid() const { return pid_; }
  void Commit() { committed_ = true; }

 private:
  void Undo();
  pid_t pid_ = -1;
  UniqueFd pidfd_;
  bool committed_ = false;
};

}  // namespace sbx::runtime

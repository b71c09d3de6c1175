// Directory watches (WATCH/UNWATCH, docs/agent-protocol.md "Files") over one inotify descriptor.
// A watch belongs to a connection and is named by the id of its WATCH request. Several watches
// may cover the same directory; inotify hands out one descriptor per inode, so each inotify
// descriptor keeps the list of (watch, directory path) pairs that use it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "agent/budget.h"
#include "common/fd.h"
#include "common/status.h"
#include "protocol/wire.h"

namespace sbx::agent {

// What a WATCH asked for besides its directory.
struct WatchOptions {
  bool recursive = false;
  bool with_entry = false;   // events carry the entry's fields (when it still exists)
  std::string xattr_prefix;  // for those fields
};

class Watcher {
 public:
  static constexpr size_t kMaxWatches = 64;
  // What one watched directory costs the budget besides its path: the map node and the Use.
  static constexpr size_t kDirOverhead = 128;

  // Every watched directory (a recursive watch has one per directory below it) is reserved from
  // `budget`'s ring pool, which must outlive the watcher; past it, Add answers ENOSPC and
  // directories appearing later under a recursive watch are not watched.
  explicit Watcher(MemoryBudget* budget) : budget_(budget) {}
  ~Watcher() { budget_->Release(MemoryBudget::kRings, reserved_); }
  Watcher(const Watcher&) = delete;
  Watcher& operator=(const Watcher&) = delete;

  // Called for each event: the owning connection and WATCH id with its options, the event, the
  // entry's absolute path and its path relative to the watched directory.
  using EventFn = std::function<void(uint64_t conn, uint32_t id, const WatchOptions& options,
                                     protocol::WatchEvent event, const std::string& path,
                                     const std::string& name)>;

  Status Init();
  int fd() const { return fd_.get(); }

  // ENOTDIR unless `path` is a directory, ENOSPC past kMaxWatches or the budget, EEXIST for a
  // reused id.
  Status Add(uint64_t conn, uint32_t id, const std::string& path, const WatchOptions& options);
  // False when there is no such watch.
  bool Remove(uint64_t conn, uint32_t id);
  // A paused watch's events are dropped (as for a connection whose queue is full).
  void SetPaused(uint64_t conn, uint32_t id, bool paused);
  void RemoveConnection(uint64_t conn);

  // Reads pending inotify events and reports them through `fn`.
  void OnReadable(const EventFn& fn);

 private:
  struct Watch {
    uint64_t conn;
    uint32_t id;
    std::string root;
    WatchOptions options;
    bool paused = false;
  };
  struct Use {
    uint64_t key;  // watches_ key
    std::string dir;
  };
  static uint64_t Key(uint64_t conn, uint32_t id) { return (conn << 32) | id; }
  // Adds inotify watches for every directory below `dir` (a recursive watch). With `report`,
  // existing entries found below are reported as created (they raced the new watch). False when
  // the budget stopped it before the whole tree was watched.
  bool AddTree(uint64_t key, const std::string& dir, int depth, const EventFn* report);
  // Watches one directory for watch `key`. False when inotify or the budget refuses it.
  bool AddOne(uint64_t key, const std::string& dir);
  static size_t Cost(const Use& u) { return u.dir.size() + kDirOverhead; }
  bool Reserve(size_t n);
  void Release(size_t n);
  // Forgets the uses of inotify descriptor `wd` (watch removed by the kernel or by us).
  void EraseUses(std::map<int, std::vector<Use>>::iterator it);
  void Drop(uint64_t key);

  UniqueFd fd_;
  std::map<uint64_t, Watch> watches_;
  std::map<int, std::vector<Use>> uses_;  // inotify wd -> who watches it
  MemoryBudget* budget_;
  size_t reserved_ = 0;  // what uses_ holds
  bool budget_logged_ = false;
};

}  // namespace sbx::agent

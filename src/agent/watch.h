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

  // Called for each event: the owning connection and WATCH id with its options, the event, the
  // entry's absolute path and its path relative to the watched directory.
  using EventFn = std::function<void(uint64_t conn, uint32_t id, const WatchOptions& options,
                                     protocol::WatchEvent event, const std::string& path,
                                     const std::string& name)>;

  Status Init();
  int fd() const { return fd_.get(); }

  // ENOTDIR unless `path` is a directory, ENOSPC past kMaxWatches, EEXIST for a reused id.
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
  // Adds inotify watches for `dir` (and, for a recursive watch, every directory below it). With
  // `report`, existing entries found below are reported as created (they raced the new watch).
  void AddTree(uint64_t key, const std::string& dir, int depth, const EventFn* report);
  bool AddOne(uint64_t key, const std::string& dir);
  void Drop(uint64_t key);

  UniqueFd fd_;
  std::map<uint64_t, Watch> watches_;
  std::map<int, std::vector<Use>> uses_;  // inotify wd -> who watches it
};

}  // namespace sbx::agent

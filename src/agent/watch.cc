#include "agent/watch.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "agent/log.h"
#include "agent/paths.h"

namespace sbx::agent {
namespace {

using protocol::WatchEvent;

constexpr uint32_t kMask = IN_CREATE | IN_CLOSE_WRITE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |
                           IN_ATTRIB | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK;
constexpr int kMaxTreeDepth = 64;

std::string Relative(const std::string& root, const std::string& path) {
  if (path.size() > root.size() && path.compare(0, root.size(), root) == 0) {
    size_t skip = root.size() + (root == "/" ? 0 : 1);
    return path.substr(skip);
  }
  return BaseName(path);
}

}  // namespace

Status Watcher::Init() {
  fd_.reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!fd_) return Status::Errno("inotify_init1");
  return {};
}

Status Watcher::Add(uint64_t conn, uint32_t id, const std::string& path,
                    const WatchOptions& options) {
  if (!fd_) return Status::Error("watch " + path + ": inotify unavailable", ENOSYS);
  uint64_t key = Key(conn, id);
  if (watches_.count(key)) return Status::Error("watch " + path + ": id in use", EEXIST);
  if (watches_.size() >= kMaxWatches) return Status::Error("watch " + path, ENOSPC);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Status::Errno("watch " + path);
  if (!S_ISDIR(st.st_mode)) return Status::Error("watch " + path, ENOTDIR);
  watches_[key] = Watch{conn, id, path, options};
  if (!AddOne(key, path)) {
    int e = errno;  // 0: the budget refused it
    watches_.erase(key);
    if (e == 0)
      return Status::Error("watch " + path + ": the agent's buffers are at the box's cap", ENOSPC);
    return Status::Error("watch " + path, e);
  }
  if (options.recursive && !AddTree(key, path, 0, nullptr)) {
    Drop(key);
    return Status::Error("watch " + path + ": the agent's buffers are at the box's cap", ENOSPC);
  }
  return {};
}

bool Watcher::Reserve(size_t n) {
  if (!budget_->TryReserve(MemoryBudget::kRings, n)) {
    if (!budget_logged_) Log("watch: the agent's buffers are at the box's cap; directory skipped");
    budget_logged_ = true;
    return false;
  }
  reserved_ += n;
  return true;
}

void Watcher::Release(size_t n) {
  n = n <= reserved_ ? n : reserved_;
  reserved_ -= n;
  budget_->Release(MemoryBudget::kRings, n);
  budget_logged_ = false;
}

bool Watcher::AddOne(uint64_t key, const std::string& dir) {
  // Reserved first: an inotify watch we could not keep a record of would never be removed.
  Use use{key, dir};
  if (!Reserve(Cost(use))) {
    errno = 0;
    return false;
  }
  int wd = ::inotify_add_watch(fd_.get(), dir.c_str(), kMask);
  if (wd < 0) {
    int e = errno;
    Release(Cost(use));
    errno = e;
    return false;
  }
  auto& v = uses_[wd];
  for (auto& u : v) {
    if (u.key == key) {
      Release(Cost(u));  // a directory moved inside the tree: same inode, new path
      u.dir = dir;
      return true;
    }
  }
  v.push_back(std::move(use));
  return true;
}

void Watcher::EraseUses(std::map<int, std::vector<Use>>::iterator it) {
  for (const Use& u : it->second) Release(Cost(u));
  uses_.erase(it);
}

bool Watcher::AddTree(uint64_t key, const std::string& dir, int depth, const EventFn* report) {
  if (depth > kMaxTreeDepth) return true;
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return true;
  DIR* d = ::fdopendir(fd);
  if (!d) {
    ::close(fd);
    return true;
  }
  std::vector<std::string> subdirs;
  while (struct dirent* de = ::readdir(d)) {
    std::string_view n = de->d_name;
    if (n == "." || n == "..") continue;
    std::string child = JoinPath(dir, n);
    bool is_dir = de->d_type == DT_DIR;
    if (de->d_type == DT_UNKNOWN) {
      struct stat st;
      is_dir =
          ::fstatat(::dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    if (report) {
      const Watch& w = watches_[key];
      if (!w.paused)
        (*report)(w.conn, w.id, w.options, WatchEvent::kCreate, child, Relative(w.root, child));
    }
    if (is_dir) subdirs.push_back(std::move(child));
  }
  ::closedir(d);
  for (const auto& s : subdirs) {
    if (AddOne(key, s)) {
      if (!AddTree(key, s, depth + 1, report)) return false;
    } else if (errno == 0) {
      return false;  // the budget, not a directory that went away
    }
  }
  return true;
}

void Watcher::Drop(uint64_t key) {
  watches_.erase(key);
  for (auto it = uses_.begin(); it != uses_.end();) {
    auto& v = it->second;
    std::erase_if(v, [this, key](const Use& u) {
      if (u.key != key) return false;
      Release(Cost(u));
      return true;
    });
    if (v.empty()) {
      ::inotify_rm_watch(fd_.get(), it->first);
      it = uses_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Watcher::Remove(uint64_t conn, uint32_t id) {
  uint64_t key = Key(conn, id);
  if (!watches_.count(key)) return false;
  Drop(key);
  return true;
}

void Watcher::SetPaused(uint64_t conn, uint32_t id, bool paused) {
  auto it = watches_.find(Key(conn, id));
  if (it != watches_.end()) it->second.paused = paused;
}

void Watcher::RemoveConnection(uint64_t conn) {
  std::vector<uint64_t> keys;
  for (const auto& [k, w] : watches_)
    if (w.conn == conn) keys.push_back(k);
  for (uint64_t k : keys) Drop(k);
}

void Watcher::OnReadable(const EventFn& fn) {
  alignas(struct inotify_event) char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd_.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    for (char* p = buf; p < buf + n;) {
      auto* ev = reinterpret_cast<struct inotify_event*>(p);
      p += sizeof(struct inotify_event) + ev->len;
      if (ev->mask & IN_Q_OVERFLOW) {
        Log("inotify queue overflow: watch events lost");
        continue;
      }
      auto it = uses_.find(ev->wd);
      if (it == uses_.end()) continue;
      if (ev->mask & IN_IGNORED) {
        EraseUses(it);
        continue;
      }
      std::string name = ev->len ? std::string(ev->name) : std::string();
      if (name.empty()) continue;
      WatchEvent kind;
      if (ev->mask & (IN_CREATE | IN_MOVED_TO))
        kind = WatchEvent::kCreate;
      else if (ev->mask & IN_CLOSE_WRITE)
        kind = WatchEvent::kWrite;
      else if (ev->mask & IN_DELETE)
        kind = WatchEvent::kRemove;
      else if (ev->mask & IN_MOVED_FROM)
        kind = WatchEvent::kRename;
      else if (ev->mask & IN_ATTRIB)
        kind = WatchEvent::kChmod;
      else
        continue;
      // Copy: reporting may not change uses_, but AddTree below does.
      std::vector<Use> uses = it->second;
      for (const Use& u : uses) {
        auto w = watches_.find(u.key);
        if (w == watches_.end()) continue;
        std::string path = JoinPath(u.dir, name);
        if (!w->second.paused)
          fn(w->second.conn, w->second.id, w->second.options, kind, path,
             Relative(w->second.root, path));
        if (kind == WatchEvent::kCreate && (ev->mask & IN_ISDIR) && w->second.options.recursive) {
          // Past the budget the new directory is not watched (logged once).
          if (AddOne(u.key, path)) AddTree(u.key, path, 0, &fn);
        }
      }
    }
  }
}

}  // namespace sbx::agent

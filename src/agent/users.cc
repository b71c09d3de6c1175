#include "agent/users.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

namespace sbx::agent {
namespace {

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t i = 0;
  for (;;) {
    size_t j = s.find(sep, i);
    if (j == std::string_view::npos) {
      out.push_back(s.substr(i));
      return out;
    }
    out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
}

template <typename F>
void ForEachLine(std::string_view text, F f) {
  for (std::string_view line : Split(text, '\n')) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    f(line);
  }
}

// Reads a small file; empty on any error (a missing /etc/group is not fatal).
std::string Slurp(const std::string& path, struct stat* st) {
  std::string out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  if (::fstat(fd, st) != 0 || st->st_size > (16 << 20)) {
    ::close(fd);
    return out;
  }
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (16u << 20)) break;
  }
  ::close(fd);
  return out;
}

}  // namespace

std::optional<unsigned long> ParseId(std::string_view s) {
  if (s.empty() || s.size() > 10) return std::nullopt;
  unsigned long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<unsigned long>(c - '0');
  }
  if (v > 0xfffffffeUL) return std::nullopt;
  return v;
}

std::vector<PasswdEntry> ParsePasswd(std::string_view text) {
  std::vector<PasswdEntry> out;
  ForEachLine(text, [&](std::string_view line) {
    auto f = Split(line, ':');
    if (f.size() != 7 || f[0].empty()) return;
    auto uid = ParseId(f[2]);
    auto gid = ParseId(f[3]);
    if (!uid || !gid) return;
    out.push_back({std::string(f[0]), static_cast<uid_t>(*uid), static_cast<gid_t>(*gid),
                   std::string(f[5]), std::string(f[6])});
  });
  return out;
}

std::vector<GroupEntry> ParseGroup(std::string_view text) {
  std::vector<GroupEntry> out;
  ForEachLine(text, [&](std::string_view line) {
    auto f = Split(line, ':');
    if (f.size() != 4 || f[0].empty()) return;
    auto gid = ParseId(f[2]);
    if (!gid) return;
    GroupEntry g{std::string(f[0]), static_cast<gid_t>(*gid), {}};
    if (!f[3].empty()) {
      for (std::string_view m : Split(f[3], ','))
        if (!m.empty()) g.members.emplace_back(m);
    }
    out.push_back(std::move(g));
  });
  return out;
}

void UserDb::Reload() {
  auto stale = [](const std::string& path, const FileStamp& stamp) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return stamp.size != -2;
    long long m = static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
    return m != stamp.mtime_ns || static_cast<long long>(st.st_size) != stamp.size;
  };
  auto load = [](const std::string& path, FileStamp* stamp) {
    struct stat st {};
    std::string text = Slurp(path, &st);
    if (st.st_ino == 0) {
      *stamp = {-1, -2};  // missing: remembered as missing
    } else {
      stamp->mtime_ns =
          static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
      stamp->size = static_cast<long long>(st.st_size);
    }
    return text;
  };
  if (stale(passwd_path_, passwd_stamp_)) users_ = ParsePasswd(load(passwd_path_, &passwd_stamp_));
  if (stale(group_path_, group_stamp_)) groups_ = ParseGroup(load(group_path_, &group_stamp_));
}

void UserDb::Set(std::vector<PasswdEntry> users, std::vector<GroupEntry> groups) {
  users_ = std::move(users);
  groups_ = std::move(groups);
}

const PasswdEntry* UserDb::FindUser(std::string_view name) const {
  for (const auto& u : users_)
    if (u.name == name) return &u;
  return nullptr;
}

const PasswdEntry* UserDb::FindUid(uid_t uid) const {
  for (const auto& u : users_)
    if (u.uid == uid) return &u;
  return nullptr;
}

const GroupEntry* UserDb::FindGid(gid_t gid) const {
  for (const auto& g : groups_)
    if (g.gid == gid) return &g;
  return nullptr;
}

const GroupEntry* UserDb::FindGroup(std::string_view name) const {
  for (const auto& g : groups_)
    if (g.name == name) return &g;
  return nullptr;
}

std::string UserDb::UserName(uid_t uid) const {
  const PasswdEntry* u = FindUid(uid);
  return u ? u->name : std::to_string(uid);
}

std::string UserDb::GroupName(gid_t gid) const {
  const GroupEntry* g = FindGid(gid);
  return g ? g->name : std::to_string(gid);
}

std::vector<gid_t> UserDb::GroupsOf(std::string_view user, gid_t gid) const {
  std::vector<gid_t> out{gid};
  for (const auto& g : groups_) {
    if (std::find(g.members.begin(), g.members.end(), user) == g.members.end()) continue;
    if (std::find(out.begin(), out.end(), g.gid) == out.end()) out.push_back(g.gid);
  }
  return out;
}

}  // namespace sbx::agent

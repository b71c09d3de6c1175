// The sandbox's own users and groups, parsed from its /etc/passwd and /etc/group. The agent is
// statically linked, where glibc's NSS (getpwnam and friends) does not work, and it must see the
// sandbox's files rather than any host database, so it reads them itself.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::agent {

struct PasswdEntry {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string home;
  std::string shell;
};

struct GroupEntry {
  std::string name;
  gid_t gid = 0;
  std::vector<std::string> members;
};

// Parses passwd(5) / group(5) text. Malformed lines (wrong field count, bad numbers) are skipped.
std::vector<PasswdEntry> ParsePasswd(std::string_view text);
std::vector<GroupEntry> ParseGroup(std::string_view text);

// A snapshot of both files. Reload() re-reads them only when their mtime or size changed, so it is
// cheap to call before every request that needs names.
class UserDb {
 public:
  explicit UserDb(std::string passwd_path = "/etc/passwd", std::string group_path = "/etc/group")
      : passwd_path_(std::move(passwd_path)), group_path_(std::move(group_path)) {}

  void Reload();
  // Replaces the contents (tests).
  void Set(std::vector<PasswdEntry> users, std::vector<GroupEntry> groups);

  const PasswdEntry* FindUser(std::string_view name) const;
  const PasswdEntry* FindUid(uid_t uid) const;
  const GroupEntry* FindGid(gid_t gid) const;
  const GroupEntry* FindGroup(std::string_view name) const;
  // The user's name, or the number when unknown.
  std::string UserName(uid_t uid) const;
  std::string GroupName(gid_t gid) const;
  // `gid` plus every group listing `user` as a member, without duplicates.
  std::vector<gid_t> GroupsOf(std::string_view user, gid_t gid) const;

 private:
  struct FileStamp {
    long long mtime_ns = -1;
    long long size = -1;
  };
  std::string passwd_path_, group_path_;
  FileStamp passwd_stamp_, group_stamp_;
  std::vector<PasswdEntry> users_;
  std::vector<GroupEntry> groups_;
};

// Parses a decimal id ("65534"); nullopt for anything else.
std::optional<unsigned long> ParseId(std::string_view s);

}  // namespace sbx::agent

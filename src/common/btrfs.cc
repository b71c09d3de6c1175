#include "common/btrfs.h"

#include <fcntl.h>
#include <linux/btrfs.h>
#include <linux/magic.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/fd.h"
#include "common/fs.h"

namespace sbx::btrfs {
namespace {

constexpr ino_t kSubvolumeRootInode = 256;  // BTRFS_FIRST_FREE_OBJECTID

UniqueFd OpenDir(const std::string& path) {
  return UniqueFd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
}

bool IsBtrfsMagic(const struct statfs& fs) {
  return static_cast<unsigned long>(fs.f_type) == static_cast<unsigned long>(BTRFS_SUPER_MAGIC);
}

// The parent directory of `path`, open, and its last component, as the subvolume ioctls take
// them.
struct Parent {
  UniqueFd dir;
  std::string name;
};
Result<Parent> OpenParent(const std::string& path, const std::string& what) {
  size_t slash = path.find_last_of('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  Parent p{UniqueFd(), slash == std::string::npos ? path : path.substr(slash + 1)};
  if (p.name.empty() || p.name == "." || p.name == ".." || p.name.size() >= BTRFS_PATH_NAME_MAX)
    return Status::Error(what + ": not a subvolume name", EINVAL);
  p.dir = OpenDir(dir);
  if (!p.dir) return Status::Errno(what + ": open " + dir);
  return p;
}

// An ioctl that takes a btrfs_ioctl_vol_args naming entry `name` of directory `dirfd`.
Status VolumeIoctl(int dirfd, unsigned long request, const std::string& name,
                   const std::string& what) {
  btrfs_ioctl_vol_args args{};
  if (name.empty() || name.size() >= sizeof args.name)
    return Status::Error(what + ": not a subvolume name", EINVAL);
  std::memcpy(args.name, name.c_str(), name.size());
  if (::ioctl(dirfd, request, &args) != 0) return Status::Errno(what);
  return {};
}

}  // namespace

bool IsBtrfs(const std::string& path) {
  struct statfs fs {};
  return ::statfs(path.c_str(), &fs) == 0 && IsBtrfsMagic(fs);
}

bool IsSubvolume(const std::string& path) {
  struct stat sb {};
  return ::lstat(path.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode) &&
         sb.st_ino == kSubvolumeRootInode && IsBtrfs(path);
}

bool IsSubvolume(const struct stat& st, int fd) {
  struct statfs fs {};
  return S_ISDIR(st.st_mode) && st.st_ino == kSubvolumeRootInode && ::fstatfs(fd, &fs) == 0 &&
         IsBtrfsMagic(fs);
}

bool SameFilesystem(const std::string& a, const std::string& b) {
  if (!IsBtrfs(a) || !IsBtrfs(b)) return false;
  btrfs_ioctl_fs_info_args ia{}, ib{};
  UniqueFd fa = OpenDir(a), fb = OpenDir(b);
  if (!fa || !fb || ::ioctl(fa.get(), BTRFS_IOC_FS_INFO, &ia) != 0 ||
      ::ioctl(fb.get(), BTRFS_IOC_FS_INFO, &ib) != 0)
    return true;
  return std::memcmp(ia.fsid, ib.fsid, sizeof ia.fsid) == 0;
}

Status CreateSubvolume(const std::string& path) {
  std::string what = "create subvolume " + path;
  auto at = OpenParent(path, what);
  if (!at.ok()) return at.status();
  return VolumeIoctl(at->dir.get(), BTRFS_IOC_SUBVOL_CREATE, at->name, what);
}

Status Snapshot(const std::string& source, const std::string& dest) {
  std::string what = "snapshot subvolume " + source + " to " + dest;
  auto at = OpenParent(dest, what);
  if (!at.ok()) return at.status();
  UniqueFd src = OpenDir(source);
  if (!src) return Status::Errno(what + ": open " + source);
  btrfs_ioctl_vol_args_v2 args{};
  args.fd = src.get();
  std::memcpy(args.name, at->name.c_str(), at->name.size());
  if (::ioctl(at->dir.get(), BTRFS_IOC_SNAP_CREATE_V2, &args) != 0) return Status::Errno(what);
  // A snapshot's qgroup starts without the source's limit: nothing to clear.
  return {};
}

Status DeleteSubvolume(const std::string& path) {
  std::string what = "delete subvolume " + path;
  auto at = OpenParent(path, what);
  if (!at.ok()) return at.status();
  return DeleteSubvolumeAt(at->dir.get(), at->name, what);
}

Status DeleteSubvolumeAt(int dirfd, const std::string& name, const std::string& what) {
  return VolumeIoctl(dirfd, BTRFS_IOC_SNAP_DESTROY, name, what);
}

Status EnableQuota(const std::string& path) {
  UniqueFd fd = OpenDir(path);
  if (!fd) return Status::Errno("enable btrfs quotas: open " + path);
  btrfs_ioctl_quota_ctl_args args{};
  args.cmd = BTRFS_QUOTA_CTL_ENABLE;
  if (::ioctl(fd.get(), BTRFS_IOC_QUOTA_CTL, &args) != 0)
    return Status::Errno("enable btrfs quotas on the filesystem of " + path);
  return {};
}

Status SetLimit(const std::string& path, int64_t bytes) {
  std::string what = "limit subvolume " + path + " to " + std::to_string(bytes) + " bytes";
  UniqueFd fd = OpenDir(path);
  if (!fd) return Status::Errno(what + ": open");
  btrfs_ioctl_qgroup_limit_args args{};
  args.qgroupid = 0;  // the subvolume's own level-0 qgroup
  args.lim.flags = BTRFS_QGROUP_LIMIT_MAX_RFER;
  // The kernel reads all ones as "clear the limit".
  args.lim.max_rfer = bytes > 0 ? static_cast<__u64>(bytes) : ~__u64{0};
  if (::ioctl(fd.get(), BTRFS_IOC_QGROUP_LIMIT, &args) != 0) return Status::Errno(what);
  return {};
}

Result<Usage> GetUsage(const std::string& path) {
  std::string what = "qgroup usage of " + path;
  UniqueFd fd = OpenDir(path);
  if (!fd) return Status::Errno(what + ": open");
  btrfs_ioctl_fs_info_args info{};
  if (::ioctl(fd.get(), BTRFS_IOC_FS_INFO, &info) != 0) return Status::Errno(what + ": fs info");
  btrfs_ioctl_ino_lookup_args lookup{};
  lookup.objectid = kSubvolumeRootInode;  // BTRFS_FIRST_FREE_OBJECTID: the subvolume's root
  if (::ioctl(fd.get(), BTRFS_IOC_INO_LOOKUP, &lookup) != 0)
    return Status::Errno(what + ": subvolume id");
  char uuid[37];
  const unsigned char* u = info.fsid;
  std::snprintf(uuid, sizeof uuid,
                "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
                u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
                u[15]);
  std::string dir =
      std::string("/sys/fs/btrfs/") + uuid + "/qgroups/0_" + std::to_string(lookup.treeid) + "/";
  auto referenced = ReadFile(dir + "referenced", 64);
  if (!referenced.ok()) return Status::Error(what + ": quotas are off", ENOENT);
  auto limit = ReadFile(dir + "max_referenced", 64);
  Usage out;
  out.referenced = std::strtoull(referenced->c_str(), nullptr, 10);
  if (limit.ok()) out.limit = std::strtoull(limit->c_str(), nullptr, 10);
  return out;
}

}  // namespace sbx::btrfs

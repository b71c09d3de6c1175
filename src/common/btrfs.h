// btrfs, for boxes whose data directory is on it (docs/storage.md, "Writable layer"): a box's
// writable layer is a subvolume, a snapshot of it is O(1) in its size, and a disk limit is the
// subvolume's qgroup limit instead of an ext4 image on a loop device. Thin wrappers over the
// kernel's ioctls (<linux/btrfs.h>): libbtrfsutil has no quota or qgroup calls, and these are a
// struct each.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>

#include "common/status.h"

namespace sbx::btrfs {

// Whether `path` is on a btrfs filesystem.
bool IsBtrfs(const std::string& path);
// Whether `path` is the root of a btrfs subvolume (inode 256 on btrfs).
bool IsSubvolume(const std::string& path);
// The same for a directory's stat and its open descriptor.
bool IsSubvolume(const struct stat& st, int fd);
// Whether directories `a` and `b` are on one btrfs filesystem (one fsid), whichever subvolumes
// hold them. Inode numbers are unique only within a subvolume, and overlayfs passes them through
// when every layer is on one filesystem: an overlay whose upper layer is a subvolume of its own
// and whose lower layers are elsewhere on that filesystem shows one inode number for different
// files (`find` sees loops, `tar` hard links). true also when both are btrfs and either cannot
// be asked.
bool SameFilesystem(const std::string& a, const std::string& b);

// Creates subvolume `path` (its parent must exist, on btrfs). EEXIST when something is there.
Status CreateSubvolume(const std::string& path);
// Makes `dest` (which must not exist) a writable snapshot of subvolume `source`, on the same
// filesystem. With quotas on, the snapshot's qgroup starts with the source's limit (btrfs copies
// it): SetLimit(dest, 0) removes it.
Status Snapshot(const std::string& source, const std::string& dest);
// Deletes subvolume `path` and everything in it, in O(1) for the caller (the kernel's cleaner
// frees the space later; on kernels from 6.x its qgroup goes once that is done). ENOENT when
// it is not there, EINVAL when it is not a subvolume, ENOTEMPTY when it holds one.
Status DeleteSubvolume(const std::string& path);
// The same for entry `name` of the directory open as `dirfd` (RemoveTree's walk).
Status DeleteSubvolumeAt(int dirfd, const std::string& name, const std::string& what);

// Turns quotas on for the filesystem of `path` (nothing when they are on).
Status EnableQuota(const std::string& path);
// Limits the bytes subvolume `path` may refer to (its level-0 qgroup's max_rfer); 0 removes the
// limit. Quotas must be on. Writes past it fail with EDQUOT.
Status SetLimit(const std::string& path, int64_t bytes);

struct Usage {
  uint64_t referenced = 0;  // bytes the subvolume refers to
  uint64_t limit = 0;       // its max_rfer; 0: none
};
// What subvolume `path` uses and may use, from its qgroup (sysfs). ENOENT when quotas are off.
Result<Usage> GetUsage(const std::string& path);

}  // namespace sbx::btrfs

// A box's size-limited writable layer: an ext4 image on a loop device. Used when a box has a disk
// limit; without one the writable layer is a plain directory on the data directory's filesystem.
#pragma once

#include <cstdint>
#include <string>

#include "common/fd.h"
#include "common/status.h"

namespace sbx::runtime {

// Creates `image` of `bytes`, allocated for real (fallocate: ENOSPC, with how much is free, when
// it does not fit; never sparse), formats it (ext4, no reserved blocks, root directory owned
// by `owner`), attaches it to a free loop device with autoclear and mounts it on `mountpoint`
// (nosuid, nodev). The loop device detaches itself once the last mount of it is gone, so callers
// only ever unmount. On failure nothing is left attached or mounted (the image file may remain).
Status MountDiskImage(const std::string& image, const std::string& mountpoint, int64_t bytes,
                      uint32_t owner);

// The loop device ("/dev/loopN") `image` is attached to: ENOENT when none is (its last mount is
// gone).
Result<std::string> LoopDeviceOf(const std::string& image);

// A mount of the filesystem on block device `dev` (ext4) that is attached nowhere: read-only,
// nosuid, nodev, noexec, and gone with the descriptor (a copy of a disk-limited box's writable
// layer reads it; one of a live box shares the box's superblock).
Result<UniqueFd> MountDetached(const std::string& dev);

// What a box's writable layer holds and may hold, for BoxStats.
struct LayerUsage {
  uint64_t used = 0;
  uint64_t total = 0;
};
// Of a disk image, read through `root_fd` (the box's root as its agent sees it, open O_PATH):
// the image's filesystem's used and total bytes (statfs of an overlay answers for its upper
// layer).
Result<LayerUsage> ImageUsage(int root_fd);
// Of a plain upper directory `upper` on the host: the blocks of everything below it (st_blocks,
// walked without following symlinks or crossing mounts, at most `max_entries` entries: a box
// with more is reported as the sum of those) and the size of its filesystem.
Result<LayerUsage> DirectoryUsage(const std::string& upper, size_t max_entries = 100000);

}  // namespace sbx::runtime

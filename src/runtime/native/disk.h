// A box's size-limited writable layer: an ext4 image on a loop device. Used when a box has a disk
// limit; without one the writable layer is a plain directory on the data directory's filesystem.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace sbx::runtime {

// Creates `image` of `bytes`, allocated for real (fallocate: ENOSPC, with how much is free, when
// it does not fit; never sparse), formats it (ext4, no reserved blocks, root directory owned
// by `owner`), attaches it to a free loop device with autoclear and mounts it on `mountpoint`
// (nosuid, nodev). The loop device detaches itself once the last mount of it is gone, so callers
// only ever unmount. On failure nothing is left attached or mounted (the image file may remain).
Status MountDiskImage(const std::string& image, const std::string& mountpoint, int64_t bytes,
                      uint32_t owner);

}  // namespace sbx::runtime

// Copies a box's writable layer (an overlay upper directory) exactly: what a snapshot takes while
// the box is frozen (Runtime::CopyWritableLayer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace sbx::runtime {

// Copies everything below the directory `src_dir` (an open fd, consumed only by reading) into
// the existing, empty directory `dest`, which gets `src_dir`'s own attributes at the end.
// Kept: file types (directories, regular files, symlinks, fifos, 0/0 character devices, which
// are overlayfs' whiteouts; other devices and sockets are skipped), owners, modes (set-id bits
// included), extended attributes (overlayfs' user.overlay.* and trusted.overlay.* marks,
// security.capability), timestamps and hard links within the tree. File data is cloned where the
// filesystem can (FICLONE: btrfs, XFS), else copied in the kernel (copy_file_range), else read
// and written. Every step is relative to a directory fd opened with O_NOFOLLOW, so nothing
// outside `src_dir` is read even if its content changes meanwhile (the caller freezes the box so
// that it does not). ENOSPC past `limit_bytes` (file sizes plus a small cost per entry), ELOOP
// past 512 levels of directories; what was copied is left in `dest` for the caller to remove.
// Returns the bytes counted.
Result<int64_t> CopyLayerTree(int src_dir, const std::string& dest, int64_t limit_bytes);
// CopyLayerTree of the directory at `src` (not followed if it is a symlink).
Result<int64_t> CopyLayerDir(const std::string& src, const std::string& dest, int64_t limit_bytes);

// Lays the layer `upper_dir` (an open directory in overlayfs' form: a layer, or a box's upper)
// over `dest`, a copy of the layers below it, so that `dest` shows what overlayfs showed of the
// two and can take their place. An entry of `upper_dir` replaces `dest`'s of its name: a whiteout
// stays one (it hides what lies further down too), an opaque directory comes whole. A directory
// that is not opaque merges into a directory of `dest` (the upper one's attributes and xattrs,
// the lower one's opacity); over anything else it is marked opaque, since overlayfs showed
// nothing below it. `dest`'s top takes `upper_dir`'s attributes. Copies as CopyLayerTree does
// (hard links within `upper_dir` kept, ENOSPC past `limit_bytes`, ELOOP past 512 levels).
// Returns the bytes counted of what was copied.
Result<int64_t> ApplyLayerTree(int upper_dir, const std::string& dest, int64_t limit_bytes);
// `layers` (directories, topmost first) made one in the empty directory `dest`: a copy of the
// bottom one, and each above it applied in turn (ApplyLayerTree). Stacked over the layers below
// them, `dest` shows what `layers` did.
Result<int64_t> MergeLayerDirs(const std::vector<std::string>& layers, const std::string& dest,
                               int64_t limit_bytes);

// On btrfs a box's writable layer is a subvolume holding overlayfs' upper/ and work/, its files
// stored under ids 0..65535 as a layer's are (it reaches the box through an idmapped mount), and
// a snapshot of it is O(1) in its size. These two turn such a snapshot into a layer's form and
// back, in O(entries at its top): nothing below is read or written.
//
// The snapshot `dir` of a writable layer becomes a layer: the entries of upper/ move up into
// `dir`, which takes upper/'s own owner, mode, xattrs and times; work/ is removed.
Status UpperToLayer(const std::string& dir);
// The snapshot `dir` of a layer becomes a writable layer: its entries move down into a new
// upper/, which takes `dir`'s attributes; an empty work/ is made beside it, and `dir` itself is
// left 0700, owned by 0:0.
Status LayerToUpper(const std::string& dir);

}  // namespace sbx::runtime

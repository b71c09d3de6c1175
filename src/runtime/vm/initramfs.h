// The guest's initramfs for vm boxes (docs/isolation.md, "The vm runtime"): a cpio archive (the
// kernel's "newc" format, written here) holding busybox, the kernel modules the guest needs (the
// virtio transports, 9p, overlay, ext4, with their dependencies, in load order), sbx-agent and
// /init, the shell script that assembles the box's root and execs the agent as PID 1.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace sbx::runtime {

// The modules /init loads: these and what modules.dep says they need, dependencies first.
// Modules the kernel has built in (modules.builtin) are skipped.
inline constexpr const char* kVmGuestModules[] = {
    "virtio_mmio", "virtio_console", "virtio_blk",     "9pnet_virtio",
    "9p",          "overlay",        "crc32c_generic", "ext4"};

// Paths (relative to <modules_dir>) of `wanted` and their dependencies, dependencies first, from
// <modules_dir>/modules.dep. ENOENT naming a module the kernel has neither as a file nor built in.
Result<std::vector<std::string>> ResolveModules(const std::string& modules_dir,
                                                const std::vector<std::string>& wanted);

struct InitramfsInput {
  std::string busybox;      // a static busybox
  std::string agent;        // a static sbx-agent
  std::string modules_dir;  // <kernel root>/lib/modules/<release>
};

// Writes the archive to `dest` (written beside it and renamed: a QEMU starting meanwhile reads the
// old or the new one, whole).
Status WriteInitramfs(const InitramfsInput& in, const std::string& dest);

// /init's text (exposed for the tests).
std::string GuestInit();

}  // namespace sbx::runtime

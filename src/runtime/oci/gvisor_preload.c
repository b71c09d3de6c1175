/* sbx-gvisor-preload.so: preloaded into every dynamically linked program of a gVisor box
 * (/etc/ld.so.preload, bound there by the oci runtime; docs/isolation.md, "The oci runtime").
 *
 * gVisor 20221219 (Debian 12's runsc) answers statx(2) with AT_NO_AUTOMOUNT in its flags with
 * EINVAL, and coreutils 9.1 always passes it: `ls PATH`, `ls -l` and `stat` failed on every path.
 * Automounts do not exist inside a box, so the flag means nothing there: this statx drops it.
 * glibc's other stat calls use newfstatat and are untouched. libc only, no state. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int statx(int dirfd, const char* path, int flags, unsigned int mask, struct statx* buf) {
  return (int)syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}

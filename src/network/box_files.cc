#include "network/box_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <random>

#include "common/fd.h"
#include "common/fs.h"

namespace sbx::network {
namespace {

// The directory, opened without following a symlink at its last component: every file below is
// then reached by openat/renameat relative to it, so a symlink planted in its place or inside it
// cannot redirect a write.
Result<UniqueFd> OpenDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    if (errno != ENOENT) return Status::Errno("make box network files directory " + dir);
    // Its parents too: without a network stack nothing made <data>/network (sbx serve
    // --network off, sbx build).
    SBX_RETURN_IF_ERROR(MakeDirs(dir, 0755).Wrap("make box network files directory " + dir));
  }
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return Status::Errno("open box network files directory " + dir);
  return fd;
}

Status WriteAt(int dirfd, const std::string& dir, const std::string& name,
               const std::string& text) {
  const std::string what = "write " + dir + "/" + name;
  std::string tmp = "." + name + ".tmp" + std::to_string(std::random_device{}());
  UniqueFd fd(
      ::openat(dirfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd) return Status::Errno(what);
  Status st = WriteAll(fd.get(), text);
  // The umask may have taken bits off: the box reads these as any user.
  if (st.ok() && ::fchmod(fd.get(), 0644) != 0) st = Status::Errno(what + ": chmod");
  if (st.ok() && ::fsync(fd.get()) != 0) st = Status::Errno(what + ": fsync");
  fd.reset();
  if (st.ok() && ::renameat(dirfd, tmp.c_str(), dirfd, name.c_str()) != 0)
    st = Status::Errno(what + ": rename");
  if (!st.ok()) (void)::unlinkat(dirfd, tmp.c_str(), 0);  // best effort: the failure is reported
  return st;
}

}  // namespace

std::string ResolvConf(const address& nameserver) {
  return "# sbx answers this sandbox's DNS queries itself: only names its network policy allows\n"
         "# resolve (every other name gets NXDOMAIN and is never asked upstream).\n"
         "nameserver " +
         nameserver.to_string() + "\noptions ndots:0 edns0\n";
}

std::string NoNetworkResolvConf() {
  return "# sbx: this sandbox has no network (network mode none); create it with a policy, e.g. "
         "sbx create --net allow=pypi.org\n";
}

std::string HostsFile(const std::string& hostname, const address& box_ip, bool ipv6) {
  std::string out = "127.0.0.1\tlocalhost\n";
  if (ipv6) out += "::1\tlocalhost ip6-localhost ip6-loopback\n";
  out += box_ip.to_string() + "\t" + hostname + "\n";
  return out;
}

Result<BoxFiles> WriteBoxNetFiles(const std::string& dir, const address& host_ip,
                                  const address& box_ip, const std::string& hostname, bool ipv6) {
  for (char c : hostname) {
    // A hostname with a newline or a tab would add lines of its own to /etc/hosts.
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '.';
    if (!ok || hostname.size() > 253)
      return Status::Error("box hostname '" + hostname + "': not a valid hostname", EINVAL);
  }
  if (hostname.empty()) return Status::Error("box hostname: empty", EINVAL);
  Result<UniqueFd> d = OpenDir(dir);
  if (!d.ok()) return d.status();
  SBX_RETURN_IF_ERROR(WriteAt(d->get(), dir, "resolv.conf", ResolvConf(host_ip)));
  SBX_RETURN_IF_ERROR(WriteAt(d->get(), dir, "hosts", HostsFile(hostname, box_ip, ipv6)));
  return BoxFiles{{dir + "/resolv.conf", "/etc/resolv.conf"}, {dir + "/hosts", "/etc/hosts"}};
}

Result<BoxFiles> WriteNoNetworkFiles(const std::string& dir) {
  Result<UniqueFd> d = OpenDir(dir);
  if (!d.ok()) return d.status();
  SBX_RETURN_IF_ERROR(WriteAt(d->get(), dir, "resolv.conf", NoNetworkResolvConf()));
  return BoxFiles{{dir + "/resolv.conf", "/etc/resolv.conf"}};
}

}  // namespace sbx::network

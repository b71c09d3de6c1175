#include "runtime/box_host.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>

#include "common/fs.h"
#include "runtime/native/native_runtime.h"

namespace sbx::runtime {

namespace {

// A unix stream socket (close-on-exec) connected to `path`, or bound there (0600) and listening.
Result<UniqueFd> UnixSocket(const std::string& path, bool listen) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path)
    return Status::Error("socket path too long: " + path, ENAMETOOLONG);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return Status::Errno("socket");
  auto* a = reinterpret_cast<sockaddr*>(&addr);
  if (!listen) {
    if (::connect(fd.get(), a, sizeof addr) != 0) return Status::Errno("connect " + path);
    return fd;
  }
  if (::bind(fd.get(), a, sizeof addr) != 0) return Status::Errno("bind " + path);
  if (::chmod(path.c_str(), 0600) != 0) return Status::Errno("chmod " + path);
  if (::listen(fd.get(), 128) != 0) return Status::Errno("listen " + path);
  return fd;
}

}  // namespace

Result<UniqueFd> ConnectUnix(const std::string& path) { return UnixSocket(path, false); }

Result<UniqueFd> ListenUnix(const std::string& path) { return UnixSocket(path, true); }

bool IsOrphan(const std::string& dir, const std::string& owner) {
  UniqueFd fd(::open((dir + "/owner").c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    struct stat st {};
    return errno == ENOENT && ::stat(dir.c_str(), &st) == 0 && st.st_mtime + 60 < ::time(nullptr);
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) return false;  // its owner is alive
  auto text = ReadAll(fd.get(), 256);
  return text.ok() && *text == owner + "\n";
}

Result<UniqueFd> SocketInNetworkOf(int pidfd, int domain, int type, const std::string& what) {
  int fd = -1, err = 0;
  std::thread t([&] {
    if (::setns(pidfd, CLONE_NEWNET) != 0) {
      err = errno;
      return;
    }
    fd = ::socket(domain, type | SOCK_CLOEXEC, 0);
    if (fd < 0) err = errno;
  });
  t.join();
  if (err != 0) return Status::Error(what, err);
  return UniqueFd(fd);
}

std::string FindBinary(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* env = std::getenv("PATH");
  std::string path = std::string(env ? env : "") + ":/usr/local/sbin:/usr/sbin:/sbin:/usr/bin";
  for (size_t b = 0; b <= path.size();) {
    size_t e = path.find(':', b);
    if (e == std::string::npos) e = path.size();
    std::string dir = path.substr(b, e - b);
    if (!dir.empty() && dir[0] == '/' && ::access((dir + "/" + name).c_str(), X_OK) == 0)
      return dir + "/" + name;
    b = e + 1;
  }
  return "";
}

namespace {

// Decodes the octal escapes (\040) of a mountinfo field.
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      out += static_cast<char>(std::strtol(s.substr(i + 1, 3).c_str(), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> MountsBelow(const std::string& dir) {
  std::vector<std::string> out;
  auto info = ReadFile("/proc/self/mountinfo", 16 << 20);
  if (!info.ok()) return out;
  size_t pos = 0;
  while (pos < info->size()) {
    size_t end = info->find('\n', pos);
    if (end == std::string::npos) end = info->size();
    std::string line = info->substr(pos, end - pos);
    pos = end + 1;
    // id parent major:minor root mount-point ...
    size_t f = 0;
    for (int field = 0; field < 4 && f != std::string::npos; ++field) f = line.find(' ', f + 1);
    if (f == std::string::npos) continue;
    size_t g = line.find(' ', f + 1);
    std::string mp = Unescape(line.substr(f + 1, g == std::string::npos ? g : g - f - 1));
    if (mp == dir || mp.rfind(dir + "/", 0) == 0) out.push_back(mp);
  }
  return out;
}

// Unmounts (detaching) everything mounted at or below `dir`, the latest mounts first. Mounts of
// mounts (a bind over a bind) take more than one pass.
Status UnmountBelow(const std::string& dir) {
  for (int pass = 0; pass < 8; ++pass) {
    auto mounts = MountsBelow(dir);
    if (mounts.empty()) return {};
    for (auto it = mounts.rbegin(); it != mounts.rend(); ++it)
      (void)::umount2(it->c_str(), MNT_DETACH);
  }
  auto left = MountsBelow(dir);
  if (left.empty()) return {};
  return Status::Error("unmount " + left.front(), EBUSY);
}

std::vector<std::string> DirNames(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
  }
  return out;
}

Result<std::vector<std::string>> ListBoxIds(const std::string& run_dir) {
  DIR* d = ::opendir(run_dir.c_str());
  if (d == nullptr) return Status::Errno("opendir " + run_dir);
  std::vector<std::string> ids;
  while (dirent* e = ::readdir(d)) {
    std::string id = e->d_name;
    if (ValidateBoxId(id).ok()) ids.push_back(id);
  }
  ::closedir(d);
  return ids;
}

Status InstallAgent(const std::string& src, const std::string& dest) {
  auto want = ReadFile(src, 256 << 20);
  if (!want.ok()) return want.status().Wrap("read sbx-agent");
  if (auto have = ReadFile(dest, 256 << 20); have.ok() && *have == *want) return {};
  std::string tmp = dest + ".new-" + std::to_string(::getpid());
  SBX_RETURN_IF_ERROR(WriteFile(tmp, *want, 0555));
  if (::chmod(tmp.c_str(), 0555) != 0 || ::rename(tmp.c_str(), dest.c_str()) != 0) {
    Status s = Status::Errno("install " + dest);
    ::unlink(tmp.c_str());
    return s;
  }
  return {};
}

size_t OverlayLayersThatFit(size_t fixed_bytes, const std::string& prefix) {
  size_t used = fixed_bytes;
  size_t n = 0;
  while (n < kMaxOverlayLayers) {
    used += prefix.size() + std::to_string(n).size() + (n ? 1 : 0);
    if (used >= kMaxOverlayOptions) break;
    ++n;
  }
  return n;
}

}  // namespace sbx::runtime

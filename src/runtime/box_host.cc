#include "runtime/box_host.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>

namespace sbx::runtime {

Result<UniqueFd> ListenUnix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path)
    return Status::Error("socket path too long: " + path, ENAMETOOLONG);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return Status::Errno("socket");
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return Status::Errno("bind " + path);
  if (::chmod(path.c_str(), 0600) != 0) return Status::Errno("chmod " + path);
  if (::listen(fd.get(), 128) != 0) return Status::Errno("listen " + path);
  return fd;
}

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

}  // namespace sbx::runtime

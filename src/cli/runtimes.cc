#include "cli/runtimes.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace sbx::cli {
namespace {

// Whether `name` is an executable in $PATH or the sbin directories root's PATH has.
bool OnPath(const std::string& name) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/local/sbin:/usr/sbin:/sbin";
  for (size_t b = 0, e; b <= path.size(); b = e + 1) {
    e = path.find(':', b);
    if (e == std::string::npos) e = path.size();
    std::string dir = path.substr(b, e - b);
    if (!dir.empty() && ::access((dir + "/" + name).c_str(), X_OK) == 0) return true;
  }
  return false;
}

}  // namespace

void AddHostRuntimes(runtime::Router& router, const GlobalOptions& global) {
  (void)global;
  struct Other {
    const char* name;
    const char* binary;
    const char* package;
  };
  for (const Other& o : {Other{"runc", "runc", "runc"}, Other{"gvisor", "runsc", "runsc"},
                         Other{"vm", "qemu-system-x86_64", "qemu-system-x86"}}) {
    if (!OnPath(o.binary)) {
      router.SetUnavailable(o.name, std::string(o.binary) +
                                        " is not installed (make deps installs " + o.package + ")");
    } else {
      router.SetUnavailable(o.name,
                            std::string("this sbx cannot run boxes under ") + o.binary + " yet");
    }
  }
}

}  // namespace sbx::cli

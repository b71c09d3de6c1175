#include "cli/runtimes.h"

#include <cstdlib>
#include <string>

#include "runtime/box_host.h"
#include "runtime/oci/oci_runtime.h"

namespace sbx::cli {

void AddHostRuntimes(runtime::Router& router, const GlobalOptions& global,
                     const std::string& agent_path, const std::string& only) {
  struct Other {
    const char* name;
    const char* binary;
    const char* package;
  };
  for (const Other& o : {Other{"runc", "runc", "runc"}, Other{"gvisor", "runsc", "runsc"},
                         Other{"vm", "qemu-system-x86_64", "qemu-system-x86"}}) {
    if (runtime::FindBinary(o.binary).empty()) {
      router.SetUnavailable(o.name, std::string(o.binary) +
                                        " is not installed (make deps installs " + o.package + ")");
    } else if (!only.empty() && only != o.name) {
      router.SetUnavailable(o.name, "not asked for");  // sbx run opens only the runtime it uses
    } else if (std::string(o.name) == "gvisor") {
      runtime::OciConfig c;
      c.name = o.name;
      c.binary = o.binary;
      if (const char* p = std::getenv("SBX_RUNSC_PLATFORM"); p != nullptr && *p != '\0')
        c.platform = p;
      if (const char* p = std::getenv("SBX_CGROUP_PARENT"); p != nullptr && *p != '\0')
        c.cgroup_parent = p;
      c.run_dir = global.data_dir + "/run-" + o.name;
      c.agent_path = agent_path;
      auto rt = runtime::OciRuntime::Open(c);
      if (rt.ok())
        router.Add(o.name, std::move(*rt));
      else
        router.SetUnavailable(o.name, rt.status().message());
    } else if (std::string(o.name) == "runc") {
      // runtime/oci drives runc, but its boxes would share one host id range until the oci
      // runtimes take per-box ranges from the daemon's pool: not offered until then.
      router.SetUnavailable(o.name, "runc boxes do not get a host id range of their own yet");
    } else {
      router.SetUnavailable(o.name,
                            std::string("this sbx cannot run boxes under ") + o.binary + " yet");
    }
  }
}

}  // namespace sbx::cli

#include "cli/runtimes.h"

#include <cstdlib>
#include <string>

#include "cli/template.h"
#include "runtime/box_host.h"
#include "runtime/oci/oci_runtime.h"
#include "runtime/vm/vm_runtime.h"

namespace sbx::cli {

namespace {

struct Other {
  const char* name;
  const char* binary;
  const char* package;
};
constexpr Other kOthers[] = {{"runc", "runc", "runc"},
                             {"gvisor", "runsc", "runsc"},
                             {"vm", "qemu-system-x86_64", "qemu-system-x86"}};

std::string RunDir(const GlobalOptions& global, const Other& o) {
  return global.data_dir + "/run-" + o.name;
}

}  // namespace

void AddHostRuntimes(runtime::Router& router, const GlobalOptions& global,
                     const std::string& agent_path, runtime::IdPool* pool,
                     const std::string& only) {
  for (const Other& o : kOthers) {
    const std::string name = o.name;
    if (runtime::FindBinary(o.binary).empty()) {
      router.SetUnavailable(
          name, std::string(o.binary) + " is not installed (make deps installs " + o.package + ")");
    } else if (!only.empty() && only != name) {
      router.SetUnavailable(name, "not asked for");  // sbx run opens only the runtime it uses
    } else if (name == "gvisor" || name == "runc") {
      runtime::OciConfig c;
      c.name = name;
      c.binary = o.binary;
      if (const char* p = std::getenv("SBX_RUNSC_PLATFORM"); p != nullptr && *p != '\0')
        c.platform = p;
      if (const char* p = std::getenv("SBX_CGROUP_PARENT"); p != nullptr && *p != '\0')
        c.cgroup_parent = p;
      c.run_dir = RunDir(global, o);
      c.agent_path = agent_path;
      // Beside sbx-agent, as the build and an install put it.
      c.preload_path = agent_path.substr(0, agent_path.rfind('/') + 1) + "sbx-gvisor-preload.so";
      c.id_pool = pool;
      auto rt = runtime::OciRuntime::Open(c);
      if (rt.ok())
        router.Add(name, std::move(*rt));
      else
        router.SetUnavailable(name, rt.status().message());
    } else if (name == "vm") {
      runtime::VmConfig c;
      c.qemu = o.binary;
      // Where `make deps` unpacks the guest kernel, unless the operator points elsewhere.
      if (const char* p = std::getenv("SBX_VM_KERNEL_DIR"); p != nullptr && *p != '\0')
        c.kernel_dir = p;
      if (const char* p = std::getenv("SBX_VM_ACCEL"); p != nullptr && *p != '\0') c.accel = p;
      if (const char* p = std::getenv("SBX_CGROUP_PARENT"); p != nullptr && *p != '\0')
        c.cgroup_parent = p;
      c.run_dir = RunDir(global, o);
      c.agent_path = agent_path;
      c.id_pool = pool;
      // The template store's layers never change once made: they reach the guest as an image.
      c.immutable_layers = storage::LayerDir(CliTemplateStore(global.data_dir, 0), "");
      auto rt = runtime::VmRuntime::Open(c);
      if (rt.ok())
        router.Add(name, std::move(*rt));
      else
        router.SetUnavailable(name, rt.status().message());
    } else {
      router.SetUnavailable(name,
                            std::string("this sbx cannot run boxes under ") + o.binary + " yet");
    }
  }
}

std::vector<std::string> HostRuntimeRunDirs(const GlobalOptions& global) {
  std::vector<std::string> out;
  for (const Other& o : kOthers) out.push_back(RunDir(global, o));
  return out;
}

}  // namespace sbx::cli

// Templates: what a box's root is made of. A template resolves to an ordered stack of read-only
// layers (topmost first) plus host bind mounts and defaults. Sources for now:
//   "host"            the host's /usr read-only under a generated /etc (the zero-setup default)
//   /path/to/rootfs   a directory used as the single layer, as is
//   /path/to/x.tar    a tarball (.tar, .tar.gz, .tgz, .tar.zst, .tar.xz), unpacked once into the
//                     template cache, keyed by the tarball's SHA-256
// The on-disk layout is described in docs/storage.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/runtime.h"

namespace sbx::storage {

struct Template {
  std::string name;
  std::vector<std::string> layers;
  std::vector<runtime::BindMount> binds;
  std::vector<std::string> env;  // defaults, "K=V"
  std::string user = "root";
  std::string workdir;  // empty: the user's home
};

struct TemplateStore {
  std::string dir = "/var/lib/sbx/templates";
  // Host uid/gid that root inside a box maps to: template files are given to it so that root
  // inside owns them (see runtime::NativeConfig::id_base).
  uint32_t id_base = 1000000;
};

// Resolves (and on first use builds) the template named `spec`. Safe to call concurrently from
// several processes: a template is built in a temporary directory and renamed into place.
Result<Template> ResolveTemplate(const TemplateStore& store, const std::string& spec);

// The generated /etc of the host template, as relative path -> content (exposed for tests).
struct GeneratedFile {
  std::string path;     // relative to the layer root, e.g. "etc/passwd"
  std::string content;  // file content, or the target when `symlink`
  bool symlink = false;
  int mode = 0644;
};
std::vector<GeneratedFile> HostEtcFiles();

}  // namespace sbx::storage

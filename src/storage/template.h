// Templates: what a box's root is made of. A template is a NAME in the one registry, the store's
// `templates` table; it resolves to an ordered stack of read-only layers (topmost first) plus host
// bind mounts and defaults. No API ever names a host path: registering a directory or tarball is
// an operator action on the host (`sbx template add`). Kinds:
//   host      built in: the host's /usr read-only under a generated /etc (the zero-setup default)
//   alias     another name of a template (the E2B SDKs' default names stand for `host`)
//   dir       a snapshot of a rootfs directory, copied into the template cache at add time
//   tar       a rootfs tarball (.tar, .tar.gz, .tgz, .tar.zst, .tar.xz, .tar.bz2), unpacked into
//             the template cache at add time
//   oci       an OCI image (`sbx template import`, `sbx template pull`): content-addressed layers
//             shared with every other image that has them, and the image's config (image.h)
//   build     the result of a build (a Dockerfile or E2B's template API), as oci
// Layers keep their real ownership (root's files are uid 0); the runtime maps them into each
// box's id range. The cache is bounded; unused layers are evicted least recently used first. The
// on-disk layout, the names and the bound are described in docs/storage.md.
//
// Every function may be called from several processes at once (the daemon and `sbx template` on
// the host): changes to the cache directory are serialized by a lock file inside it and recorded
// in the store in the same order.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/fd.h"
#include "common/status.h"
#include "runtime/runtime.h"
#include "store/store.h"

namespace sbx::storage {

inline constexpr char kHostTemplate[] = "host";
inline constexpr int64_t kDefaultTemplateCacheBytes = int64_t{20} << 30;

struct Template {
  std::string name;  // the registered template (an alias resolved), recorded with the sandbox
  std::vector<std::string> layers;
  std::vector<runtime::BindMount> binds;
  // What every command gets unless it says otherwise (sandbox::Manager records them as the
  // sandbox's store::TemplateDefaults). For an image (kinds oci, build) they are its config's
  // (image.h, ImageConfig): its Env over PATH and LANG below, its User ("name", "uid",
  // "uid:gid", "name:group"; empty in the image: root), its WorkingDir.
  std::vector<std::string> env;  // "K=V"; PATH and LANG unless the image sets them
  std::string user = "root";
  std::string workdir;  // empty: the user's home
  // The image's start command (Entrypoint then Cmd, as docker run without arguments); empty for
  // other kinds.
  std::vector<std::string> entrypoint;
  std::vector<std::string> cmd;
  // E2B's start and ready commands of a build (ImageConfig::start_cmd, ready_cmd); "" = none.
  std::string start_cmd;
  std::string ready_cmd;
  // The runtime its sandboxes run under (runtime::kRuntimeNames); "": the daemon's default.
  std::string runtime;
};

struct TemplateStore {
  std::string dir = "/var/lib/sbx/templates";  // made 0700: nothing below it is reachable by users
  int64_t cache_bytes = kDefaultTemplateCacheBytes;  // bound on the layers' unpacked size
  // The sbx-agent binary, copied into the host template's layer as /usr/local/bin/sudo: the
  // agent is a multi-call binary, and called as `sudo` it asks the box's agent to run a command
  // as root inside the box (docs/agent-protocol.md, "sudo"). Empty: the host template has none.
  std::string sudo_binary;
};

// [a-z0-9][a-z0-9._-]{0,63}, optionally followed by ":" and a tag [a-z0-9][a-z0-9._-]{0,63}.
// Never a path: no '/', no leading '.'.
bool IsValidTemplateName(std::string_view name);

// "<pid>-<start time>-" of this process: put before the names of what it is writing (staging
// directories, upload temp files) so that a sweep can tell the leftovers of a dead writer
// (MakerAlive false) from a live one's, even when the pid was reused.
std::string MakerPrefix();
bool MakerAlive(std::string_view name);
// The names in directory `dir` but "." and ".." (none when it cannot be read).
std::vector<std::string> DirEntries(const std::string& dir);

// A pull's hold on its directory <templates dir>/pulls/<name>: a lock file beside it
// (<name>.lock), taken before the pull fetches anything and kept until it has imported the image
// and removed the directory, so SweepAbandoned never takes a live pull's directory (between
// PullImage and ImportImage too). EBUSY while another process holds it.
class PullHold {
 public:
  static Result<PullHold> Take(const std::string& pull_dir);
  PullHold(PullHold&&) = default;
  ~PullHold();  // removes the lock file, then lets go of it

 private:
  PullHold(UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  UniqueFd fd_;
  std::string path_;
};

// What dead processes left in the template cache, removed under the cache lock: the sweep of
// every template action (layer directories the store does not know, staging directories of dead
// makers, pins of dead builds and pulls), and pull directories nothing holds (a `sbx template
// pull` killed mid-way: no PullHold and no PullImage lock on it). Run at daemon start and by
// `sbx template gc`; a live pull beside it keeps its directory. Returns the pull directories
// removed.
Result<int> SweepAbandoned(const TemplateStore& ts, store::Store& st);

// The error every facade turns into 400 with the message "template not found: NAME", exactly
// (its what(); errno EINVAL). IsTemplateNotFound tells it from other errors.
Status TemplateNotFound(const std::string& name);
bool IsTemplateNotFound(const Status& s);

// Resolves the registered template `name` (or an alias of it) for sandbox `pin_for`: its layers
// are pinned for that sandbox in the store (kept until it is no longer live) in the same
// transaction as the lookup. Builds the host layer on first use. Anything that is not a
// registered name, a path included, is TemplateNotFound and touches nothing on disk.
Result<Template> ResolveTemplate(const TemplateStore& ts, store::Store& st, const std::string& name,
                                 const std::string& pin_for);

// The read-only part of a box made again from the layers a sandbox recorded (topmost first; a
// sandbox paused without memory, resumed): their directories and, when the bottom one is the
// host layer, the host's binds. Nothing is pinned: the sandbox's own pins hold them. EIO for a
// layer missing from the cache.
Result<Template> TemplateOfLayers(const TemplateStore& ts, const std::vector<std::string>& layers);

// For `sbx run --template` (a local root action, not an API): a registered name as above
// (without a pin), or an absolute host path: a directory used as the single layer as it is, or a
// tarball unpacked into a private temporary layer that `cleanup` (set on success) removes.
Result<Template> ResolveLocalTemplate(const TemplateStore& ts, store::Store& st,
                                      const std::string& spec, std::function<void()>* cleanup);

// ---- operator actions (`sbx template`) ----

// Registers `path` (a rootfs directory, copied; or a tarball, unpacked) as template `name`.
// Refuses an invalid or taken name (EINVAL, EEXIST) and a source whose unpacked size does not fit
// in the cache bound after evicting every unused layer (ENOSPC, nothing left behind). Evicts
// unused layers as needed. `progress` (may be empty) is called now and then with bytes unpacked.
Result<store::TemplateRecord> AddTemplate(const TemplateStore& ts, store::Store& st,
                                          const std::string& name, const std::string& path,
                                          const std::function<void(int64_t)>& progress = {});

// Unregisters `name` (refuses `host`: EPERM) and removes its layers from disk unless a live
// sandbox still uses them (those go when it has ended and the cache next needs room, or at the
// next `sbx template` action).
Status RemoveTemplate(const TemplateStore& ts, store::Store& st, const std::string& name);

// Removes unused layers, least recently used first, until the cache holds at most `target_bytes`
// (0: every unused layer). Returns the bytes freed.
Result<int64_t> EvictUnusedLayers(const TemplateStore& ts, store::Store& st, int64_t target_bytes);

// Unpacks `tarball` below the existing directory `dest` with the rules of a tar template
// (names and hard links kept below `dest`, no writing through symlinks, ids in 0..65535, devices
// skipped), stopping with ENOSPC past `limit_bytes`. Returns the bytes written. What AddTemplate
// does with a tarball, exposed for tests and fuzz/tar_unpack.cc; `dest` is left as it is on error.
Result<int64_t> UnpackTarball(const std::string& tarball, const std::string& dest,
                              int64_t limit_bytes);

// The directory of layer `id` inside the cache.
std::string LayerDir(const TemplateStore& ts, const std::string& id);

// The generated /etc of the host template, as relative path -> content (exposed for tests).
struct GeneratedFile {
  std::string path;     // relative to the layer root, e.g. "etc/passwd"
  std::string content;  // file content, or the target when `symlink`
  bool symlink = false;
  int mode = 0644;
};
std::vector<GeneratedFile> HostEtcFiles();

}  // namespace sbx::storage

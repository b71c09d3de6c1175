// Template builds (issue 13, item 3 and 5): a base (a registered template, "scratch", or after a
// pull an image) plus steps. Each RUN runs in a box made of the layers so far, with the build's
// network policy, and its writable layer becomes the next layer (storage::AddLayerFromDir); ENV,
// WORKDIR, USER, CMD, ENTRYPOINT, LABEL and EXPOSE change the image config; COPY copies files of
// the build context into a new layer. Every step is cached by the hash of its parent layer, the
// instruction and the copied files' contents: an unchanged step reuses its layer. The result is
// a template (kind "build") any create can name.
//
// Builds run in the background: Start answers at once with a build id; Get reports the state
// and the log lines so far (E2B's logsOffset pagination maps onto `offset`).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "network/network.h"
#include "runtime/runtime.h"
#include "sandbox/registry_policy.h"
#include "storage/dockerfile.h"
#include "storage/image.h"
#include "storage/template.h"

namespace sbx::sandbox {

struct BuildSpec {
  std::string name;          // the template to make (replaced when it exists)
  std::string owner_key_id;  // who asked (audited; operator builds: "")
  // What its layers may bring that key's saved bytes to (store::ApiKeyRecord::max_saved_bytes;
  // 0: no bound): a build's layers are charged to the key that builds, as its snapshots are.
  int64_t max_saved_bytes = 0;
  // Its time limit, from its start (0: none, as `sbx build` on the host): a RUN step still
  // running then is stopped and the build fails (ETIMEDOUT).
  int64_t timeout_ms = 0;
  std::vector<storage::BuildStep> steps;  // the first is kFrom
  std::string context_dir;  // host directory COPY sources are read from (only below it)
  // The network policy of every RUN step's box (docs/build.md "Network"); mode none: loopback
  // only. Not part of a step's cache key (as Docker): --no-cache runs a step again.
  network::Policy network;
  int64_t memory_bytes = 0;  // per RUN step (0: the daemon's default)
  double cpus = 0;
  bool no_cache = false;
  // E2B startCmd / readyCmd, kept with the template (storage::ImageConfig); "" keeps the base's.
  std::string start_cmd;
  std::string ready_cmd;
  // The FROM step names an image to pull, never a local template (E2B's fromImage: an image
  // must not be shadowed by a template some key made under its name). Otherwise FROM X is the
  // template X when there is one, else pulled when X reads as an image reference (docs/build.md).
  bool from_registry = false;
  // Credentials of that pull (basic, or for a bearer token). Secret: never in a log line, an
  // error, the store or an answer; they live as long as the build.
  std::string registry_username;
  std::string registry_password;
  // More names the result is registered as, with the same layers and config (E2B's other tags
  // of the build: "n:t2", ...). Each is replaced when it exists.
  std::vector<std::string> also_names;
  // The build id the records name as their source ("build <id>", BuildIdOf); "" = the
  // builder's own id.
  std::string record_id;
};

// The build id a template record was made by ("" for one not built).
std::string BuildIdOf(const store::TemplateRecord& r);

enum class BuildState { kBuilding, kReady, kError };

struct BuildLogLine {
  int64_t at_ms = 0;
  std::string level;  // "info", "error"
  std::string text;   // one line: "Step 2/5 : RUN pip install x", a RUN's output line, ...
};

struct BuildStatus {
  std::string id;    // "bld_" + random
  std::string name;  // the template
  BuildState state = BuildState::kBuilding;
  std::string error;               // kError: what failed (no host path)
  std::vector<BuildLogLine> logs;  // from `offset` on
  int64_t size_bytes = 0;          // kReady: the template's layers
};

class Builder {
 public:
  virtual ~Builder() = default;
  // Starts a build; EINVAL for a bad spec (no FROM, an unknown base template, a COPY source
  // outside the context), EPERM for a FROM image of a registry BuilderConfig::registries does not
  // allow, nothing started then.
  virtual Result<std::string> Start(BuildSpec spec) = 0;
  // A build's state and its log lines from index `offset` on; ENOENT for an unknown id.
  virtual Result<BuildStatus> Get(const std::string& id, int64_t offset) = 0;
  // Runs a build to its end on the calling thread, `log` called with each line as it comes
  // (`sbx build`).
  virtual Result<store::TemplateRecord> Run(
      BuildSpec spec, const std::function<void(const BuildLogLine&)>& log) = 0;
};

// What a Builder works with. Nothing is owned: each must outlive the Builder.
struct BuilderConfig {
  runtime::Runtime* runtime = nullptr;  // makes the boxes of RUN steps (no disk limit)
  storage::TemplateStore templates;
  store::Store* store = nullptr;
  // RUN steps of a spec with a network policy get it through this stack (the daemon's, or
  // `sbx build --net`'s): Prepare before the step's box, Attach at its sync point, Release
  // after it. nullptr: a spec whose policy lets anything out is refused (EINVAL) and RUN steps
  // have loopback only.
  network::Stack* network = nullptr;
  // The last sentence of the 403 a RUN step's refused connection gets (BoxNetRequest::
  // refusal_hint); empty: the stack's. The daemon's says how a build's policy is changed, since
  // its stack's names `sbx net`, which does not apply to a build's box.
  std::string refusal_hint;
  // Host file -> path inside, bound into the boxes of RUN steps without a network (the
  // daemon's resolv.conf that says so; sandbox::ManagerConfig::no_network_files).
  std::vector<std::pair<std::string, std::string>> no_network_files;
  runtime::Limits default_limits;  // of a RUN step's box where the spec gives none
  // The owner kind of the RUN steps' boxes (runtime::BoxSpec::owner): each Run first removes
  // the boxes of that owner whose process died (a builder killed mid-step).
  std::string box_owner = "build";
  // Where FROM may pull images from (the daemon: what `sbx serve --registry` lists; `sbx build`:
  // anywhere). Checked by Start/Run before anything starts: EPERM for a registry not allowed.
  RegistryPolicy registries;
  size_t max_log_lines = 10000;  // per build kept for Get (the oldest go first)
  // Builds one key (BuildSpec::owner_key_id, not "") runs at once through Start; past it EAGAIN.
  size_t max_builds_per_key = 2;
  size_t max_finished = 64;  // finished builds kept for Get
};

std::unique_ptr<Builder> MakeBuilder(BuilderConfig config);

}  // namespace sbx::sandbox

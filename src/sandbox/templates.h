// Templates built through the API (issue 13, items 5 and 6): who may build, rebuild and delete
// which name, the builds in flight over the daemon's Builder (sandbox/build.h), and the file
// archives E2B's SDK uploads for COPY steps. The facades (native /v1/templates, E2B's template
// API) only translate onto this; the Manager owns one (Manager::templates()).
//
// Ownership (docs/api.md "Templates"). The registry is one namespace shared by every key
// (DESIGN.md "Tenants"): every key sees every name and may create sandboxes from any template.
//  - A name nobody holds may be built by any key, which then holds it (store `template_owners`),
//    also while its build runs and after it failed.
//  - Only the key that holds a name, or an operator key, may rebuild or delete it.
//  - Built-ins (`host` and its E2B aliases) are nobody's: never rebuilt or deleted through an API.
//  - Templates the operator registered on the host (`sbx template`) are the operator's: operator
//    keys only.
// Builds are first reserved (E2B's POST /v3/templates gives a build id before the steps are
// known), then started; Start alone does both. Their state lives in memory, as the Builder's
// does: after a restart a build id of the store is ready when its template exists, else error.
//
// Uploads are kept per key (<data>/build-files/<key id>/<sha256 hex>.tar): the E2B hash names the
// files' content as the client computed it, which the daemon cannot check against the archive,
// so one key's upload must never stand for another key's files. An upload, once stored, is never
// replaced (a second PUT of the hash keeps the first), so a leaked upload URL cannot swap the
// files of a build that already found them present. One being written is
// build-files/<key id>/.tmp-<pid>-<start time>-<random>: the start-up sweep (SweepUploads) tells
// a dead writer's from a live one.
//
// Every name, build id and hash a caller passes is checked before it reaches the store or a path:
// EINVAL (400) for anything else, naming the field.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "sandbox/build.h"
#include "storage/image.h"
#include "storage/template.h"
#include "store/store.h"

namespace sbx::sandbox {

enum class TemplateOwner { kYou, kOperator, kBuiltIn, kOtherKey };
const char* TemplateOwnerName(TemplateOwner o);  // "you", "operator", "built-in", "another key"

struct TemplateInfo {
  std::string name;
  store::TemplateRecord record;  // record.name empty: not built (yet)
  TemplateOwner owner = TemplateOwner::kOperator;
  std::string build_id;  // the latest build ("" for templates not built through an API)
  BuildState state = BuildState::kReady;  // of the latest build
  std::string error;                      // kError: why
  int64_t created_at = 0;
  int64_t updated_at = 0;
};

// A COPY step's files of an E2B build: the uploaded archive `files_hash` unpacked for the step.
struct UploadedCopy {
  std::string files_hash;  // [a-f0-9]{64}
  int mode = -1;           // chmod of every copied entry (E2B's `mode`); -1 keeps theirs
  bool at_root = false;    // unpacked at the context's root instead (a native build's context)
};

// A snapshot (issue 14): a sandbox's writable layer over the layers its box mounted, registered
// as a template of kind snapshot named by its id.
struct SnapshotInfo {
  std::string id;                  // "snap-" + 20 [a-z0-9]: the template a create names
  std::vector<std::string> names;  // its other names (aliases of it), by name
  std::string sandbox_id;          // the sandbox it was taken of
  int64_t size_bytes = 0;          // of its own layer
  int64_t created_at = 0;
};
inline constexpr char kSnapshotPrefix[] = "snap-";
// A snapshot template's id: kSnapshotPrefix + 20 [a-z0-9].
bool IsSnapshotId(const std::string& id);

inline constexpr int64_t kMaxUploadBytes = int64_t{1} << 30;         // one archive
inline constexpr int64_t kMaxUploadsBytesPerKey = int64_t{4} << 30;  // all of a key's kept
inline constexpr int64_t kBuildTimeoutMs = int64_t{60} * 60 * 1000;  // an API build's time limit
inline constexpr size_t kMaxBuildsKept = 1024;                       // in memory

class TemplateBuilds {
 public:
  using AuditFn = std::function<void(const std::string& type, const std::string& key_id,
                                     nlohmann::json detail)>;
  // `data_dir` holds build-files/ and build-contexts/ (empty: no uploads). `builder` may be null
  // (set it later with SetBuilder, before serving): builds are then refused with ENOSYS.
  TemplateBuilds(store::Store& store, storage::TemplateStore templates, std::string data_dir,
                 Builder* builder, AuditFn audit, Clock& clock);
  ~TemplateBuilds();

  void SetBuilder(Builder* b) { builder_.store(b); }
  bool enabled() const { return builder_.load() != nullptr; }

  // Claims `name` (and `also`, the build's other tags: BuildSpec::also_names) for a build by
  // `key` and returns the new build's id ("bld_" + 20 [a-z0-9]); the build is waiting until
  // Start. EINVAL for an invalid name, EPERM when `key` may not build one of them (see the top;
  // nothing is claimed then).
  Result<std::string> Reserve(const store::ApiKeyRecord& key, const std::string& name,
                              const std::vector<std::string>& also = {});
  // Whether `key` may build (rebuild) `name`, or upload files for it (`op` "upload"), without
  // claiming it: EINVAL for an invalid name, EPERM (audited as template.denied) as Reserve.
  Status MayBuild(const store::ApiKeyRecord& key, const std::string& name,
                  const std::string& op = "build");
  // Starts the build `build_id` (from Reserve; "" reserves spec.name now) of `key` with `spec`
  // (spec.name and spec.owner_key_id are set here). `copies` are the archives (UploadedCopy) the
  // COPY steps read: each is unpacked below spec.context_dir as <files_hash>/ (or at its root,
  // UploadedCopy::at_root), so an E2B COPY step's source is "<files_hash>/<path>". ENOSYS without a
  // builder, ENOENT for an unknown build id or a missing upload, EBUSY for a build already started,
  // EINVAL from the builder.
  Result<std::string> Start(const store::ApiKeyRecord& key, const std::string& build_id,
                            BuildSpec spec, const std::vector<UploadedCopy>& copies = {});
  // A native build of `name` (reserved now) from the context archive `context_hash` (an upload
  // of `key`, unpacked at the context's root and then forgotten) with the Dockerfile at path
  // `dockerfile` inside it (read without leaving the context), parsed with `build_args`; its RUN
  // steps get `network` (BuildSpec::network). EINVAL for a Dockerfile that is missing, too large
  // or outside the subset; as Start otherwise.
  Result<std::string> StartDockerfile(const store::ApiKeyRecord& key, const std::string& name,
                                      const std::string& context_hash,
                                      const std::string& dockerfile,
                                      const std::map<std::string, std::string>& build_args,
                                      bool no_cache, const network::Policy& network = {});
  // Ends a reserved build in error before it starts (a base the daemon cannot provide), with
  // `reason` as its error and log line.
  Status Fail(const store::ApiKeyRecord& key, const std::string& build_id,
              const std::string& reason);
  // The build's state and its log lines from `offset` on. ENOENT unless `key` (or an operator
  // key) started it.
  Result<BuildStatus> Get(const store::ApiKeyRecord& key, const std::string& build_id,
                          int64_t offset);
  // The template `name` was last built as (build_id, state), for a key that may see it.
  Result<TemplateInfo> Info(const store::ApiKeyRecord& key, const std::string& name);
  // Every registered template and every name held by a build, by name.
  Result<std::vector<TemplateInfo>> List(const store::ApiKeyRecord& key);
  // Deletes template `name` and its hold (see the top for who may). ENOENT when neither exists,
  // EPERM when `key` may not, EBUSY while a build of it runs.
  Status Delete(const store::ApiKeyRecord& key, const std::string& name);
  // Deletes `base` and every tag of it ("base:*") that `key` may delete (another key's stay);
  // EPERM when it may delete none of them, ENOENT when there are none, EBUSY (nothing deleted)
  // while one of them is being built.
  Status DeleteWithTags(const store::ApiKeyRecord& key, const std::string& base);

  // ---- tags (E2B's; docs/api.md "Templates") ----
  // Tag t of template n is the registered template "n:t", a record of its own (the same layers
  // and config as the build it points at, BuildIdOf), so a rebuild or removal of one tag never
  // moves another; n's `default` tag is "n" itself.
  struct TagInfo {
    std::string tag;       // "default" for the base name
    std::string build_id;  // "" for a template not built through an API
    int64_t created_at = 0;
  };
  // Points `tags` of `target`'s template (each "t" or "default") at the build `target` ("n" or
  // "n:t") runs now, and returns that build's id. `key` must hold `target` (or be an operator
  // key, for an operator's template) and be allowed to build each tag's name (the top's rules);
  // built-ins never. ENOENT for a missing target, EINVAL for a bad tag, EPERM, EBUSY while a
  // build of a tag's name runs. All or nothing for the permission checks.
  Result<std::string> Tag(const store::ApiKeyRecord& key, const std::string& target,
                          const std::vector<std::string>& tags);
  // Removes `tags` of template `base` (a name without a tag); tags it does not have are skipped.
  // EINVAL for `default` or a bad tag, ENOENT when `base` has neither a name nor a tag, EPERM
  // (nothing removed) when `key` may not delete one of them, EBUSY while one is being built.
  Status Untag(const store::ApiKeyRecord& key, const std::string& base,
               const std::vector<std::string>& tags);
  // The tags of `base` that are registered templates, by tag. ENOENT when there are none.
  Result<std::vector<TagInfo>> Tags(const store::ApiKeyRecord& key, const std::string& base);

  // A template a tenant built through an API (its COPY'd sources, what its RUN steps fetched)
  // and a snapshot (a sandbox's files) hold that tenant's files, so they are private: for any
  // key but the one that holds them and operator keys, they and their names (tags, aliases) do
  // not exist, whatever the call (create, info, list, delete, tag, FROM of a build), as E2B's
  // templates are their team's. The operator's templates (host imports, its keys' builds) and
  // the built-ins are every key's.
  // Whether `name` is, or is an alias of, such a template that `key` may not see.
  Result<bool> Hidden(const store::ApiKeyRecord& key, const std::string& name);

  // ---- snapshots (issue 14; docs/api.md "Snapshots") ----
  // A snapshot's names are aliases of it, held by the same key.
  // Registers snapshot `id` (IsSnapshotId) of sandbox `sandbox_id`, made of the recorded `layers`
  // (its own first) with `config`, held by `key`; with a `name` (a template name, ":default"
  // meaning the name itself), that name too: a name this key gave an earlier snapshot moves to
  // this one. EINVAL for a bad name, EEXIST for a name taken by any other template (EPERM when
  // another key holds it); nothing is registered then. Sandboxes made of it run under `runtime`,
  // the sandbox's ("": the daemon's default).
  Result<SnapshotInfo> AddSnapshot(const store::ApiKeyRecord& key, const std::string& id,
                                   const std::string& sandbox_id,
                                   const std::vector<std::string>& layers,
                                   const storage::ImageConfig& config, const std::string& name,
                                   const std::string& runtime = "");
  // The snapshots `key` may see (an operator key: every key's), newest first; only those of
  // sandbox `sandbox_id` and of name `name` when they are not empty.
  Result<std::vector<SnapshotInfo>> Snapshots(const store::ApiKeyRecord& key,
                                              const std::string& sandbox_id,
                                              const std::string& name);
  // The snapshot `id_or_name` names, for a key that may see it; ENOENT otherwise.
  Result<SnapshotInfo> Snapshot(const store::ApiKeyRecord& key, const std::string& id_or_name);
  // Deletes the snapshot `id_or_name` names and all its names. Its layer stays while sandboxes
  // made from it (or later snapshots stacked on it) use it. ENOENT when `key` sees no such
  // snapshot.
  Status DeleteSnapshot(const store::ApiKeyRecord& key, const std::string& id_or_name);

  // ---- E2B's uploads (per key, see the top) ----
  // The key an upload URL was signed for, as the store has it now: EACCES for an id that is not
  // a key's or a key that was revoked since the URL was made (its URL stores nothing).
  Result<store::ApiKeyRecord> UploadKey(const std::string& key_id);
  // Uploads leave at least this much of the data directory's filesystem free (the daemon's disk
  // reserve, ManagerConfig::disk_reserve_*): ENOSPC past it. Call before serving.
  void SetDiskReserve(int64_t bytes, double percent) {
    reserve_bytes_ = bytes;
    reserve_percent_ = percent;
  }
  // Removes upload temp files (.tmp-*) below <data_dir>/build-files whose writer is gone (every
  // one when `all`: at daemon start, when no upload can be running). Returns how many.
  static int SweepUploads(const std::string& data_dir, bool all);
  // Whether `key` has uploaded the archive `files_hash`. EINVAL unless [a-f0-9]{64}.
  Result<bool> HasUpload(const store::ApiKeyRecord& key, const std::string& files_hash);
  // An archive being stored: staged in the key's directory, renamed into place by Commit, so a
  // half upload leaves nothing (the destructor removes an uncommitted one).
  class Upload {
   public:
    ~Upload();
    // EFBIG past kMaxUploadBytes; ENOSPC when the filesystem would keep less than the reserve.
    Status Write(std::string_view data);
    // Makes it durable and visible, unless an upload of the same hash is stored already (which
    // stays; this one is dropped); then evicts the key's oldest uploads past
    // kMaxUploadsBytesPerKey (this one stays).
    Status Commit();

   private:
    friend class TemplateBuilds;
    Upload() = default;
    std::string dir_, tmp_, final_;
    int fd_ = -1;
    int64_t bytes_ = 0;
    int64_t reserve_bytes_ = 0;
    double reserve_percent_ = 0;
    int64_t checked_at_ = 0;  // bytes_ when free space was last looked at
  };
  // Starts storing the archive `files_hash` of `key`. `expected_bytes` (the request's
  // Content-Length; -1 unknown) is refused up front, before anything is written: EFBIG past
  // kMaxUploadBytes, ENOSPC past the free space above the reserve.
  Result<std::unique_ptr<Upload>> BeginUpload(const store::ApiKeyRecord& key,
                                              const std::string& files_hash,
                                              int64_t expected_bytes = -1);
  // BeginUpload, Write of everything `read` gives (a buffer's byte count, 0 at the end, or an
  // error), Commit.
  Status PutUpload(const store::ApiKeyRecord& key, const std::string& files_hash,
                   const std::function<Result<size_t>(char*, size_t)>& read);

 private:
  struct Entry {
    std::string name;
    std::vector<std::string> also_names;  // its other tags
    std::string key_id;
    std::string builder_id;   // "" until started
    std::string context_dir;  // made for it; removed when it ends
    bool failed = false;      // before it started
    std::string error;
    int64_t created_at = 0;
  };
  Status Refused(const store::ApiKeyRecord& key, const std::string& name, const std::string& op);
  Status MayUseFamily(const store::ApiKeyRecord& key, const std::string& name,
                      const std::string& op);
  // ENOENT / EPERM as Delete would answer, without deleting.
  Status MayDelete(const store::ApiKeyRecord& key, const std::string& name);
  // EBUSY while a build of `name` (or with `name` as a tag) runs.
  Status NotBeingBuilt(const std::string& name);
  // The snapshot record `name` names (itself, or the target of its alias); nullopt for others.
  // With `alias_of`, the target's name when `name` is an alias (else it is left as it is).
  Result<std::optional<store::TemplateRecord>> SnapshotOf(const std::string& name,
                                                          std::string* alias_of = nullptr);
  // Whether a tenant key other than `key` holds the name `name` (its template_owners row).
  Result<bool> HeldByAnotherTenant(const store::ApiKeyRecord& key, const std::string& name);
  // `names`: its aliases, when the caller has them (else they are looked up).
  Result<SnapshotInfo> InfoOf(const store::TemplateRecord& snap,
                              const std::vector<std::string>* names = nullptr);
  // `base` and its tags ("base:*") that are registered or held, by name.
  Result<std::vector<std::string>> NamesOf(const std::string& base);
  void Trim() REQUIRES(mu_);
  Result<std::string> PrepareContext(const store::ApiKeyRecord& key, const std::string& build_id,
                                     const std::vector<UploadedCopy>& copies);
  std::string UploadDir(const store::ApiKeyRecord& key) const;

  store::Store& store_;
  const storage::TemplateStore templates_;
  const std::string data_dir_;
  std::atomic<Builder*> builder_;
  AuditFn audit_;
  Clock& clock_;
  std::atomic<int64_t> reserve_bytes_{0};
  std::atomic<double> reserve_percent_{0};
  Mutex mu_;
  std::map<std::string, Entry> builds_ GUARDED_BY(mu_);  // by build id
};

// "bld_" + 20 [a-z0-9]; also what IsBuildId accepts.
bool IsBuildId(const std::string& id);
// [a-f0-9]{64}
bool IsFilesHash(const std::string& hash);

}  // namespace sbx::sandbox

// Images as templates (issue 13): the content-addressed layer store, OCI image import and the
// image config's defaults. This header is the contract between the layer store (image.cc), the
// registry client (registry.h: it fetches into an OCI image layout, then calls ImportImage) and
// builds (build.h: each RUN step's writable layer becomes a layer through AddLayerFromDir).
//
// A layer is a directory of the template cache, <templates dir>/layers/<id>, already in
// overlayfs' form (whiteouts are 0/0 character devices, opaque directories carry the
// trusted.overlay.opaque xattr), with its files' real ownership (root's files are uid 0: the
// runtime idmaps layers into each box's range). Layers made from an archive are named by the
// digest of their uncompressed content ("sha256-<64 hex>", the OCI diff_id), so an image's layer
// is unpacked once and shared by every template that uses it. Layers are reference-counted by
// the templates that list them and the pins of live sandboxes and running builds; unreferenced
// ones go by LRU eviction under the cache bound and `sbx template gc`. docs/storage.md has the
// layout.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "storage/template.h"
#include "store/store.h"

namespace sbx::storage {

// The defaults an image config gives (OCI image config `config`), kept with the template and
// applied to every command on every API (env merged under the command's, user, workdir) and to
// the start command (entrypoint + cmd).
struct ImageConfig {
  std::vector<std::string> env;  // "K=V"
  std::string user;              // "" = root; "name", "uid", "uid:gid" as in the image
  std::string workdir;           // "" = the user's home
  std::vector<std::string> entrypoint;
  std::vector<std::string> cmd;
  std::vector<std::string> exposed_ports;  // "8080/tcp"
  std::map<std::string, std::string> labels;
  // E2B's startCmd and readyCmd of a build (shell commands; "" = none): every create from the
  // template runs the start command in the background and answers once the ready one exits 0
  // (sandbox/start_ready.h). Not part of an OCI image's config.
  std::string start_cmd;
  std::string ready_cmd;
};

// The config as the `templates.config` column keeps it (a JSON object with the keys env, user,
// workdir, entrypoint, cmd, exposed_ports, labels, start_cmd, ready_cmd; absent keys are empty) and
// back. EINVAL for a value of the wrong shape.
std::string ImageConfigToJson(const ImageConfig& c);
Result<ImageConfig> ImageConfigFromJson(const std::string& json);
// Sets `t`'s defaults from `c`: its env over t's (a variable the image sets replaces t's, e.g.
// PATH), its user (empty: root), workdir, entrypoint, cmd, start and ready commands.
void ApplyImageConfig(const ImageConfig& c, Template* t);

// A build's or pull's hold on the pins of its id (store::IsLeasePinId: "bld_..." or "pull_...",
// then [A-Za-z0-9_-], at most 100 characters). Layers pinned for the id (AddLayerFromBlob,
// AddLayerFromDir, ResolveTemplate(..., id) of a FROM template) stay while the lease is held by a
// live process: it is a lock file, <templates dir>/leases/<id>, and the cache sweep (every
// template action, eviction, gc) drops the pins of an id whose lock nobody holds, so a maker
// killed mid-build leaves nothing pinned. Take it before the first pin. The destructor (or
// Release) unpins the id and removes the file; take care to register the template (which then
// references the layers) first.
class PinLease {
 public:
  static Result<PinLease> Take(const TemplateStore& ts, store::Store& st, const std::string& id);
  PinLease(PinLease&& o) noexcept;
  PinLease& operator=(PinLease&& o) noexcept;
  PinLease(const PinLease&) = delete;
  PinLease& operator=(const PinLease&) = delete;
  ~PinLease() { Release(); }
  const std::string& id() const { return id_; }
  void Release();

 private:
  PinLease() = default;
  store::Store* st_ = nullptr;
  std::string path_, id_;
  int fd_ = -1;
};

// Progress of a long operation, for the CLI's progress line and the API's build log.
struct Progress {
  std::string what;    // e.g. the layer's short digest, or "unpacking"
  int64_t done = 0;    // bytes so far
  int64_t total = -1;  // -1 unknown
};
using ProgressFn = std::function<void(const Progress&)>;

// "sha256-<hex>" for the diff_id "sha256:<hex>"; EINVAL for anything but sha256 and 64
// lowercase hex digits.
Result<std::string> LayerIdForDiffId(const std::string& diff_id);

// Unpacks the layer blob at `blob_path` (a tar, gzip or zstd compressed or not) into the cache as
// layer LayerIdForDiffId(diff_id), unless that layer is already there. While streaming it
// verifies the blob's sha256 against `blob_digest` ("sha256:<hex>"; empty: not checked) and the
// uncompressed stream's against `diff_id`; a mismatch is EBADMSG and leaves nothing. The
// archive is untrusted (threat row 25): no ".." or absolute names, no device nodes but
// whiteouts, no writes through symlinks, hard links only inside the layer, set-id bits kept
// (the layer is 0700 to host users) and OCI whiteouts (.wh.NAME, .wh..wh..opq) converted to
// overlayfs' form. ENOSPC past the cache bound after evicting unused layers. The layer is pinned
// for `pin_for` (a build or pull id) until UnpinLayers(pin_for) or until a template lists it.
Result<store::LayerRecord> AddLayerFromBlob(const TemplateStore& ts, store::Store& st,
                                            const std::string& blob_path,
                                            const std::string& blob_digest,
                                            const std::string& diff_id, const std::string& pin_for,
                                            const ProgressFn& progress = {});

// AddLayerFromBlob of an uncompressed tar made on this host (`sbx template debian`'s root): its
// diff_id is its own sha256, read from the file first. The archive is as untrusted as any other.
Result<store::LayerRecord> AddLayerFromTarball(const TemplateStore& ts, store::Store& st,
                                               const std::string& tar_path,
                                               const std::string& pin_for,
                                               const ProgressFn& progress = {});

// The key a new layer is charged to (store::LayerRecord::owner_key_id) and what that key's
// layers may take in all (0: no bound but the cache's).
struct LayerCharge {
  std::string key_id;
  int64_t max_bytes = 0;
  // Bytes of that key's layers in use that the new one replaces (merged into it): not counted
  // against the bound, as they go once it is recorded.
  int64_t credit_bytes = 0;
};

// Moves the directory `dir` (a build step's writable layer, already in overlayfs' form, on the
// cache's filesystem) into the cache as a new layer named `id` (a build's cache key,
// "build-<hex>"), shifting its files' owners down by `id_shift` (the box's host id base: a box
// writes as host ids id_base..id_base+65535; anything outside that range becomes 65534). Without
// `id_shift` the files are stored as a layer's already (runtime::Box::layer_ids) and are not
// walked but to count their size; `dir` may then be a btrfs subvolume, which stays one.
// Pinned for `pin_for` as above, and charged to `charge.key_id`: EDQUOT, before anything is
// evicted, where that key's layers would pass `charge.max_bytes` (counted under the cache's lock,
// so that layers added at once never do). `dir` is consumed on success and left on error.
Result<store::LayerRecord> AddLayerFromDir(const TemplateStore& ts, store::Store& st,
                                           const std::string& dir, const std::string& id,
                                           std::optional<uint32_t> id_shift,
                                           const std::string& pin_for,
                                           const LayerCharge& charge = {});

// A fresh empty directory (0700, root's) on the cache's filesystem for AddLayerFromDir's `dir`,
// <templates dir>/staging/<pid>-<start time>-<random>: the next cache sweep removes it once the
// process that made it has exited, so remove it yourself when done with it without
// AddLayerFromDir (a long-lived daemon's leftovers would wait for its exit).
Result<std::string> MakeStagingDir(const TemplateStore& ts);

// Registers (or with `replace`, replaces) template `name` of kind `kind` (store::kTemplateOci,
// kTemplateBuild, kTemplateSnapshot with the `sandbox_id` it was taken of) made of the recorded
// `layers` (topmost first) with `config`. EINVAL for an invalid name, EEXIST for a taken one
// without `replace`, ENOENT for an unrecorded layer.
Result<store::TemplateRecord> PutImageTemplate(
    const TemplateStore& ts, store::Store& st, const std::string& name, const std::string& kind,
    const std::string& source, const std::vector<std::string>& layers, const ImageConfig& config,
    bool replace, const std::string& sandbox_id = "", const std::string& runtime = "");

// The config recorded with template `name` (aliases resolved); empty for templates without one.
Result<ImageConfig> GetImageConfig(store::Store& st, const std::string& name);

// `sbx template gc`: removes every layer that no template lists and nothing pins (after a sweep
// of what dead processes left), returning what it removed.
Result<std::vector<store::LayerRecord>> GcLayers(const TemplateStore& ts, store::Store& st);

// An image's layers in the cache and its config, for a build's FROM (sandbox/build.h).
struct UnpackedImage {
  std::vector<std::string> layers;  // layer ids, topmost first, pinned for the caller's id
  ImageConfig config;
};

// What ImportImage does short of registering a template: the image at `path` (as ImportImage;
// `ref` picks the manifest) unpacked into the cache, its layers pinned for `pin_for` (a build's
// id, under its PinLease).
Result<UnpackedImage> UnpackImage(const TemplateStore& ts, store::Store& st,
                                  const std::string& path, const std::string& ref,
                                  const std::string& pin_for, const ProgressFn& progress = {});

// The image whose config (the image config blob's JSON) is `config_json`, from layers already in
// the cache: each diff_id's layer pinned for `pin_for`. ENOENT when one is not in the cache (those
// found stay pinned until the lease goes), EINVAL for a config that does not parse.
Result<UnpackedImage> CachedImage(const TemplateStore& ts, store::Store& st,
                                  const std::string& config_json, const std::string& pin_for);

// Imports an OCI image layout directory (index.json; `ref` picks the manifest whose
// org.opencontainers.image.ref.name annotation matches, empty: the only one) or a docker-archive
// tarball (`docker save`: manifest.json; `ref` picks the RepoTags entry) as template `name`.
// Image indexes resolve to linux/amd64. Every blob is digest-checked; the config's Env, User,
// WorkingDir, Entrypoint, Cmd, ExposedPorts and Labels become the template's ImageConfig.
Result<store::TemplateRecord> ImportImage(const TemplateStore& ts, store::Store& st,
                                          const std::string& name, const std::string& path,
                                          const std::string& ref, bool replace,
                                          const ProgressFn& progress = {});

}  // namespace sbx::storage

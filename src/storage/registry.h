// The OCI distribution registry client (issue 13, item 2): pulls one image from a registry into
// a local OCI image layout directory, which storage::ImportImage (image.h) then turns into a
// template. Speaks the distribution API's pull side (GET /v2/<name>/manifests/<ref> and
// /v2/<name>/blobs/<digest>) over HTTPS with the host's CAs (or a given bundle), plain HTTP only
// to registries the operator names insecure; bearer-token and basic auth; image indexes and
// Docker manifest lists resolved to one platform (linux/amd64). docs/storage.md, "Pulls".
//
// Everything a registry sends is untrusted: manifests are bounded (kMaxManifestBytes) and
// digest-checked, every blob is sha256-verified while it streams to disk and may not be longer
// than its descriptor says, the layers together may not exceed PullOptions.max_total_bytes, and
// redirects (registries send blob downloads to storage) are followed only to http(s), a bounded
// number of times, never downgrading to plain HTTP for a host not named insecure, and without the
// registry's credentials when they leave its host.
//
// A pull can be resumed: a blob being fetched is blobs/sha256/<hex>.partial in the layout and the
// next pull into the same directory continues it with a Range request (verifying the whole blob).
// Complete blobs are re-verified and kept. Two pulls into one directory at once: the second is
// EBUSY.
//
// Thread-safety: PullImage may be called from any thread, and from several at once for
// different directories. It runs its own I/O (blocking the caller); the progress callback is
// called from its worker threads, one call at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "storage/image.h"

namespace sbx::storage {

inline constexpr int64_t kMaxManifestBytes = int64_t{4} << 20;  // manifests, indexes, configs
inline constexpr int kMaxRedirects = 5;
inline constexpr char kRefNameAnnotation[] = "org.opencontainers.image.ref.name";

// A parsed image reference: REGISTRY/REPOSITORY[:TAG][@sha256:HEX]. `sbx template pull` has no
// default registry (the machine may have no internet and docker.io is not implied): the first
// component must be a registry host, that is contain a '.' or a ':' or be "localhost". Builds
// (FROM, E2B's fromImage) parse with `docker_hub` instead: a reference without a registry host is
// Docker Hub's, as Docker reads it ("python:3.12" is docker.io/library/python:3.12).
struct ImageRef {
  std::string registry;    // "127.0.0.1:5000", "registry.example.com", "[::1]:5000"
  std::string repository;  // "python", "ns/name"
  std::string tag;         // "latest" when neither tag nor digest was given; "" with a digest only
  std::string digest;      // "sha256:<64 hex>" or ""
  // "registry/repository:tag", "registry/repository@digest" or both: the canonical form.
  std::string String() const;
};

// EINVAL with a sentence saying what is wrong ("name the registry: ...") for anything that is not
// a reference as above: repository components [a-z0-9]+ separated by '.', '_', '__' or '-'s,
// tags [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}, digests sha256 only.
// With `docker_hub`, a first component that is no host is a repository on "docker.io", and a
// one-component repository there is "library/<name>".
Result<ImageRef> ParseImageRef(std::string_view ref, bool docker_hub = false);

struct PullOptions {
  // Registries reachable over plain HTTP, as "host" (any port) or "host:port"; every other host
  // (registries, token realms, redirect targets) needs HTTPS with a verified certificate.
  std::vector<std::string> insecure_registries;
  // A PEM bundle to verify registries with instead of the host's store.
  std::string ca_file;
  // Credentials for the registry (basic auth, or to get a bearer token). Secret: never logged,
  // never in an error. Empty username: from `docker_config` when it has the registry, else
  // anonymous.
  std::string username;
  std::string password;
  // A docker-style config.json whose "auths" map "host[:port]" (or "https://host/v1/") to
  // {"auth": base64("user:password")} or {"username","password"}. Empty, or missing: none.
  std::string docker_config;
  // Fetches at once (the config and the layers).
  int parallel = 3;
  // Tries per blob: a download that breaks after making progress is continued (Range) up to
  // this many times in all before the pull fails (and can be resumed by the next pull).
  int blob_attempts = 3;
  // Bound on each network step (connect, handshake, every read), not on the total.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  // Bound on the sum of the blobs' sizes; 0 = none. ENOSPC before anything is fetched.
  int64_t max_total_bytes = 0;
  std::string os = "linux";
  std::string architecture = "amd64";
  // Where to connect instead of the reference's registry, "host[:port]" (a mirror: the
  // repository path and the credentials are the reference's). Empty: the registry itself
  // (docker.io's API is registry-1.docker.io).
  std::string endpoint;
  // The SSRF guard of daemon pulls (sandbox/registry_policy.h): when set, called for every
  // connection the pull makes (the registry, its token realm, every redirect target) with the
  // host, the port and the addresses the host resolved to, before connecting to them; a non-ok
  // Status refuses the connection (and fails the pull with it). The addresses checked are the
  // ones connected to, so a name that resolves differently the second time cannot slip past.
  std::function<Status(const std::string& host, uint16_t port,
                       const std::vector<std::string>& addresses)>
      check_connect;
  // Called once the manifest and the image config are fetched and verified, before any layer,
  // with the config's JSON: true when the caller has every layer already (in the layer store, by
  // the config's diff_ids), and then no layer is fetched and no index.json written
  // (PulledImage::layers_fetched false). The manifest is always fetched with these options'
  // credentials, so a cached layer is never handed to someone the registry would refuse.
  std::function<bool(const std::string& config_json)> have_layers;
};

struct PulledImage {
  std::string ref;              // ImageRef::String() of what was asked for
  std::string ref_name;         // the index.json ref.name annotation: pass it to ImportImage
  std::string digest;           // the digest the reference resolved to (an index or a manifest)
  std::string manifest_digest;  // the platform's image manifest
  std::string config_digest;
  std::vector<std::string> layers;  // layer digests, bottom first, as in the manifest
  int64_t total_bytes = 0;          // the manifest's blobs (config and layers)
  int64_t fetched_bytes = 0;        // what this call downloaded (less when resumed or cached)
  std::string config_json;          // the image config blob
  bool layers_fetched = true;       // false when PullOptions::have_layers said they are there
};

// Pulls `ref` into the OCI image layout directory `layout_dir` (made if missing; an existing
// layout there is reused: its blobs are verified and kept, partial ones resumed), then writes its
// index.json naming the platform manifest with the ref.name annotation PulledImage::ref_name
// (= the canonical reference). `progress` (may be empty) hears of each blob: what = the first 12
// hex digits of its digest, done/total in bytes, called at its start, as it streams and at its
// end. Errors: EINVAL for a bad reference or a malformed manifest, ENOENT for an unknown image
// or a platform the index lacks, EACCES when the registry refuses the credentials (or wants
// some), EPERM for plain HTTP to a host not named insecure, EBADMSG for a digest mismatch (the
// partial blob is removed), EFBIG for a manifest or blob larger than allowed, ENOSPC past
// max_total_bytes, EBUSY for another pull into `layout_dir`, EPROTO for registry answers that
// make no sense, what PullOptions::check_connect answers, and network errors as their errno.
Result<PulledImage> PullImage(const PullOptions& options, const std::string& ref,
                              const std::string& layout_dir, const ProgressFn& progress = {});

// ---- parts, exposed for tests ----

// A WWW-Authenticate challenge: scheme ("bearer", "basic", lowercased) and its parameters
// (names lowercased, quoted values unquoted). EINVAL when it does not parse.
struct AuthChallenge {
  std::string scheme;
  std::vector<std::pair<std::string, std::string>> params;
  std::string Param(std::string_view name) const;  // "" when absent
};
Result<AuthChallenge> ParseAuthChallenge(std::string_view header);

// The user and password the docker config file `config_json` (its contents) has for `registry`;
// ENOENT when it has none, EINVAL when it is malformed.
Result<std::pair<std::string, std::string>> DockerConfigAuth(std::string_view config_json,
                                                             std::string_view registry);

}  // namespace sbx::storage

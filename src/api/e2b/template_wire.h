// E2B's template build API on the wire (spec section 6, "Template build"; the bodies are those of
// e2b-dev/infra spec/openapi.yml and the JS SDK's src/template/): the request bodies parsed into
// sandbox::BuildSpec and the answers made from sandbox::BuildStatus and TemplateInfo. Pure
// functions, so that every field an SDK sends is tested without a daemon (template_wire_test.cc).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "sandbox/build.h"
#include "sandbox/templates.h"

namespace sbx::api::e2b {

// The image E2B's SDK builds from when told nothing (`Template()` without a from*): the image of
// E2B's `base` template, which is sbx's base template too (the host's /usr, as for creates).
inline constexpr char kE2bDefaultImage[] = "e2bdev/base";

// Tags one request may name (each is a template record).
inline constexpr size_t kMaxTags = 64;

// POST /v3/templates {name: "n" | "n:tag", tags?, alias? (deprecated), cpuCount?, memoryMB?}.
// As E2B (infra id.ParseName): tags are trimmed and lowercased, "n:default" is "n", and a build
// without a tag gets the `default` one. Tag t of n is sbx's template "n:t"; `default` is "n".
struct TemplateRequest {
  std::string base;               // "n": the E2B templateID
  std::vector<std::string> tags;  // the name's tag first, then `tags`, deduplicated; never empty
  // The sbx template each tag names: "n" for default, else "n:<tag>".
  std::string NameOf(const std::string& tag) const {
    return tag == "default" ? base : base + ":" + tag;
  }
  // The build's own name (its first tag's) and its other tags' (BuildSpec::also_names).
  std::string target() const { return NameOf(tags.front()); }
  std::vector<std::string> also() const;
};
Result<TemplateRequest> ParseTemplateRequest(const nlohmann::json& body);

// POST /v2/templates/{templateID}/builds/{buildID} (TemplateBuildStartV2).
struct BuildStart {
  sandbox::BuildSpec spec;                    // steps from the base on; name not set
  std::vector<sandbox::UploadedCopy> copies;  // the archives the COPY steps read
  std::string from_image;  // set when the base is an image other than kE2bDefaultImage
};
// fromImage other than kE2bDefaultImage: spec.from_registry (the image is pulled, never a local
// template of that name) and fromImageRegistry {type: "registry", username, password} as the
// pull's credentials (spec.registry_username/password); types "aws" and "gcp" are EINVAL.
// Steps: COPY [src, dest, user?, mode?] with filesHash (its source becomes
// "<filesHash>/<src>"), RUN [command, user?] (a user runs it as USER user, RUN, USER back),
// ENV [k, v, ...], WORKDIR [path], USER [user]. force (top level or any step's) rebuilds without
// the cache. EINVAL naming the field for anything else.
Result<BuildStart> ParseBuildStart(const nlohmann::json& body);

// TemplateBuildInfo: {templateID, buildID, status, logs, logEntries, reason?}. `status` is
// building, ready or error; at most `limit` entries of those `st` holds (already from
// logsOffset on), only those at or above `level` ("" = all: debug, info, warn, error).
nlohmann::json BuildInfoJson(const std::string& template_id, const sandbox::BuildStatus& st,
                             size_t limit, const std::string& level);

// TemplateRequestResponseV3: {templateID, buildID, public, names, tags, aliases}.
nlohmann::json TemplateRequestJson(const TemplateRequest& r, const std::string& build_id);

// Template (list items of GET /templates and /v2/templates) and TemplateWithBuilds (GET
// /templates/{id}).
nlohmann::json TemplateJson(const sandbox::TemplateInfo& t);
nlohmann::json TemplateWithBuildsJson(const sandbox::TemplateInfo& t);

const char* BuildStatusName(sandbox::BuildState s);

// The tags of POST /templates/tags {target, tags} and DELETE /templates/tags {name, tags}: at
// least one, trimmed, lowercased, deduplicated (order kept). EINVAL naming the field.
Result<std::vector<std::string>> ParseTags(const nlohmann::json& body);

// GET /templates/{id}/builds/{buildID}/logs (TemplateBuildLogsResponse {logs: BuildLogEntry[]}):
// of `st`'s lines (all of them, from offset 0), those at or above `level` ("" = all), at or
// after `cursor_ms` oldest first (`backward`: at or before it, newest first; no cursor: from
// the first or the last line), at most `limit`.
nlohmann::json BuildLogsJson(const sandbox::BuildStatus& st, std::optional<int64_t> cursor_ms,
                             size_t limit, bool backward, const std::string& level);

// GET /templates/{id}/tags: TemplateTag[] {tag, buildID, createdAt}.
nlohmann::json TagsJson(const std::vector<sandbox::TemplateBuilds::TagInfo>& tags);

}  // namespace sbx::api::e2b

#include "api/e2b/template_wire.h"

#include <algorithm>
#include <cerrno>

#include "api/e2b/wire.h"
#include "storage/template.h"

namespace sbx::api::e2b {
namespace {

using nlohmann::json;
using storage::BuildStep;

Status Invalid(const std::string& what) { return Status::Error(what, EINVAL); }

Result<std::vector<std::string>> StringArray(const json& j, const std::string& field) {
  std::vector<std::string> out;
  if (!j.is_array()) return Invalid(field + ": must be an array of strings");
  for (const json& v : j) {
    if (!v.is_string()) return Invalid(field + ": must be an array of strings");
    out.push_back(v.get<std::string>());
  }
  return out;
}

Result<bool> OptionalBool(const json& j, const char* key, const std::string& field) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  if (!it->is_boolean()) return Invalid(field + ": must be true or false");
  return it->get<bool>();
}

Result<std::string> OptionalString(const json& j, const char* key, const std::string& field) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::string();
  if (!it->is_string()) return Invalid(field + ": must be a string");
  return it->get<std::string>();
}

// A COPY source as E2B's SDK sends it: relative to the build context, never leaving it.
Status CheckRelative(const std::string& src, const std::string& field) {
  if (src.empty() || src.front() == '/') return Invalid(field + ": a path relative to the context");
  size_t s = 0;
  while (s <= src.size()) {
    size_t e = src.find('/', s);
    if (e == std::string::npos) e = src.size();
    if (src.compare(s, e - s, "..") == 0) return Invalid(field + ": may not contain '..'");
    s = e + 1;
  }
  return {};
}

// E2B's COPY mode: octal digits ("0644", "755"); "" keeps the files' own.
Result<int> ParseMode(const std::string& m, const std::string& field) {
  if (m.empty()) return -1;
  if (m.size() > 5) return Invalid(field + ": an octal mode such as 0644");
  int v = 0;
  for (char c : m) {
    if (c < '0' || c > '7') return Invalid(field + ": an octal mode such as 0644");
    v = v * 8 + (c - '0');
  }
  if (v > 07777) return Invalid(field + ": an octal mode such as 0644");
  return v;
}

// As E2B's cleanAndValidate: surrounding spaces go, letters are lowercased.
std::string Clean(std::string t) {
  size_t b = t.find_first_not_of(" \t\r\n");
  size_t e = t.find_last_not_of(" \t\r\n");
  t = b == std::string::npos ? "" : t.substr(b, e - b + 1);
  for (char& c : t)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return t;
}

int LevelRank(const std::string& l) {
  if (l == "debug") return 0;
  if (l == "warn") return 2;
  if (l == "error") return 3;
  return 1;  // info, and anything else
}

// fromImageRegistry (the SDK's RegistryConfig): {type: "registry", username, password} as the
// pull's credentials; "aws" and "gcp" (ECR, Artifact Registry: credentials sbx would have to
// exchange with a cloud) are not supported. No message echoes a credential.
Status ParseImageRegistry(const json& j, sandbox::BuildSpec* spec) {
  if (!j.is_object()) return Invalid("fromImageRegistry: must be an object");
  auto type = OptionalString(j, "type", "fromImageRegistry.type");
  if (!type.ok()) return type.status();
  if (*type == "aws" || *type == "gcp")
    return Invalid("fromImageRegistry: type '" + *type +
                   "' is not supported by sbx (only 'registry', with a username and password)");
  if (*type != "registry") return Invalid("fromImageRegistry.type: 'registry', 'aws' or 'gcp'");
  auto user = OptionalString(j, "username", "fromImageRegistry.username");
  if (!user.ok()) return user.status();
  auto password = OptionalString(j, "password", "fromImageRegistry.password");
  if (!password.ok()) return password.status();
  if (user->empty() != password->empty())
    return Invalid("fromImageRegistry: username and password go together");
  if (user->size() > 1024 || password->size() > (64 << 10))
    return Invalid("fromImageRegistry: username or password too long");
  spec->registry_username = *user;
  spec->registry_password = *password;
  return {};
}

}  // namespace

std::vector<std::string> TemplateRequest::also() const {
  std::vector<std::string> out;
  for (size_t i = 1; i < tags.size(); ++i) out.push_back(NameOf(tags[i]));
  return out;
}

Result<std::vector<std::string>> ParseTags(const json& body) {
  auto it = body.find("tags");
  if (it == body.end() || it->is_null()) return Invalid("tags: at least one tag is required");
  auto tags = StringArray(*it, "tags");
  if (!tags.ok()) return tags.status();
  std::vector<std::string> out;
  for (auto t : *tags) {
    t = Clean(t);
    if (t.empty() || t.find(':') != std::string::npos ||
        (t != "default" && !storage::IsValidTemplateName("x:" + t)))
      return Invalid("tags: '" + t + "' is not a tag ([a-z0-9][a-z0-9._-]{0,63})");
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  }
  if (out.empty()) return Invalid("tags: at least one tag is required");
  if (out.size() > kMaxTags) return Invalid("tags: at most " + std::to_string(kMaxTags));
  return out;
}

json BuildLogsJson(const sandbox::BuildStatus& st, std::optional<int64_t> cursor_ms, size_t limit,
                   bool backward, const std::string& level) {
  json logs = json::array();
  int min_rank = level.empty() ? 0 : LevelRank(level);
  auto take = [&](const sandbox::BuildLogLine& l) {
    if (LevelRank(l.level) < min_rank) return;
    if (cursor_ms && (backward ? l.at_ms > *cursor_ms : l.at_ms < *cursor_ms)) return;
    logs.push_back({{"timestamp", Rfc3339(l.at_ms)},
                    {"level", l.level.empty() ? "info" : l.level},
                    {"message", l.text}});
  };
  if (backward) {
    for (auto it = st.logs.rbegin(); it != st.logs.rend() && logs.size() < limit; ++it) take(*it);
  } else {
    for (auto it = st.logs.begin(); it != st.logs.end() && logs.size() < limit; ++it) take(*it);
  }
  return {{"logs", logs}};
}

json TagsJson(const std::vector<sandbox::TemplateBuilds::TagInfo>& tags) {
  json out = json::array();
  for (const auto& t : tags)
    out.push_back({{"tag", t.tag}, {"buildID", t.build_id}, {"createdAt", Rfc3339(t.created_at)}});
  return out;
}

Result<TemplateRequest> ParseTemplateRequest(const json& body) {
  auto name = OptionalString(body, "name", "name");
  if (!name.ok()) return name.status();
  std::string n = *name;
  if (n.empty()) {
    auto alias = OptionalString(body, "alias", "alias");  // deprecated, as the SDK's old builds
    if (!alias.ok()) return alias.status();
    n = *alias;
  }
  if (n.empty()) return Invalid("name: required");
  if (n.size() > 128) return Invalid("name: at most 128 characters");
  TemplateRequest r;
  size_t colon = n.find(':');
  r.base = n.substr(0, colon);
  std::vector<std::string> all;
  if (colon != std::string::npos) all.push_back(n.substr(colon + 1));
  if (auto it = body.find("tags"); it != body.end() && !it->is_null()) {
    auto tags = StringArray(*it, "tags");
    if (!tags.ok()) return tags.status();
    all.insert(all.end(), tags->begin(), tags->end());
  }
  for (auto& t : all) {
    t = Clean(t);
    if (std::find(r.tags.begin(), r.tags.end(), t) == r.tags.end()) r.tags.push_back(t);
  }
  if (r.tags.empty()) r.tags.push_back("default");
  if (r.tags.size() > kMaxTags) return Invalid("tags: at most " + std::to_string(kMaxTags));
  if (!storage::IsValidTemplateName(r.base))
    return Invalid("name: '" + r.base +
                   "' is not a template name ([a-z0-9][a-z0-9._-]{0,63}, optionally :tag)");
  for (const auto& t : r.tags)
    if (t != "default" && !storage::IsValidTemplateName(r.base + ":" + t))
      return Invalid("tags: '" + t + "' is not a tag ([a-z0-9][a-z0-9._-]{0,63})");
  for (const char* f : {"cpuCount", "memoryMB"})
    if (auto it = body.find(f); it != body.end() && !it->is_null() && !it->is_number_integer())
      return Invalid(std::string(f) + ": must be an integer");
  return r;
}

Result<BuildStart> ParseBuildStart(const json& body) {
  BuildStart out;
  auto image = OptionalString(body, "fromImage", "fromImage");
  if (!image.ok()) return image.status();
  auto tmpl = OptionalString(body, "fromTemplate", "fromTemplate");
  if (!tmpl.ok()) return tmpl.status();
  if (!image->empty() && !tmpl->empty())
    return Invalid("fromImage and fromTemplate: give one, not both");
  std::string base = *tmpl;
  if (!image->empty()) {
    if (*image == kE2bDefaultImage)
      base = "base";
    else
      out.from_image = *image;
  }
  if (base.empty() && out.from_image.empty()) return Invalid("fromImage or fromTemplate: required");
  if (auto reg = body.find("fromImageRegistry"); reg != body.end() && !reg->is_null()) {
    if (out.from_image.empty())
      return Invalid("fromImageRegistry: only with a fromImage other than " +
                     std::string(kE2bDefaultImage));
    SBX_RETURN_IF_ERROR(ParseImageRegistry(*reg, &out.spec));
  }
  out.spec.from_registry = !out.from_image.empty();
  BuildStep from{.kind = BuildStep::Kind::kFrom,
                 .text = "FROM " + (base.empty() ? out.from_image : base),
                 .args = {base.empty() ? out.from_image : base}};
  out.spec.steps.push_back(from);
  auto force = OptionalBool(body, "force", "force");
  if (!force.ok()) return force.status();
  out.spec.no_cache = *force;
  auto start = OptionalString(body, "startCmd", "startCmd");
  if (!start.ok()) return start.status();
  auto ready = OptionalString(body, "readyCmd", "readyCmd");
  if (!ready.ok()) return ready.status();
  out.spec.start_cmd = *start;
  out.spec.ready_cmd = *ready;

  const json empty = json::array();
  auto it = body.find("steps");
  const json& steps = it == body.end() || it->is_null() ? empty : *it;
  if (!steps.is_array()) return Invalid("steps: must be an array");
  std::string user;  // the USER so far ("" = the base's, root for sbx's templates)
  for (size_t i = 0; i < steps.size(); ++i) {
    std::string f = "steps[" + std::to_string(i) + "]";
    const json& s = steps[i];
    if (!s.is_object()) return Invalid(f + ": must be an object");
    auto type = OptionalString(s, "type", f + ".type");
    if (!type.ok()) return type.status();
    std::vector<std::string> args;
    if (auto a = s.find("args"); a != s.end() && !a->is_null()) {
      auto v = StringArray(*a, f + ".args");
      if (!v.ok()) return v.status();
      args = std::move(*v);
    }
    auto step_force = OptionalBool(s, "force", f + ".force");
    if (!step_force.ok()) return step_force.status();
    if (*step_force) out.spec.no_cache = true;  // this step and those after: no cached layer
    int line = static_cast<int>(i) + 1;
    auto need = [&](size_t lo, size_t hi) -> Status {
      if (args.size() < lo || args.size() > hi)
        return Invalid(f + ".args: " + *type + " takes " + std::to_string(lo) +
                       (hi == lo ? "" : " to " + std::to_string(hi)) + " arguments");
      return {};
    };
    if (*type == "COPY") {
      SBX_RETURN_IF_ERROR(need(2, 4));
      auto hash = OptionalString(s, "filesHash", f + ".filesHash");
      if (!hash.ok()) return hash.status();
      if (!sandbox::IsFilesHash(*hash))
        return Invalid(f + ".filesHash: the sha256 (64 lowercase hex digits) of the files");
      SBX_RETURN_IF_ERROR(CheckRelative(args[0], f + ".args[0]"));
      if (args[1].empty()) return Invalid(f + ".args[1]: the destination is empty");
      auto mode = ParseMode(args.size() > 3 ? args[3] : "", f + ".args[3]");
      if (!mode.ok()) return mode.status();
      BuildStep c{.kind = BuildStep::Kind::kCopy,
                  .line = line,
                  .text = "COPY " + args[0] + " " + args[1],
                  .args = {*hash + "/" + args[0], args[1]}};
      if (args.size() > 2) c.chown = args[2];
      c.copy_links = true;  // E2B copies a link the SDK uploaded as the link
      out.spec.steps.push_back(std::move(c));
      out.copies.push_back({*hash, *mode});
    } else if (*type == "RUN") {
      SBX_RETURN_IF_ERROR(need(1, 2));
      std::string as = args.size() > 1 ? args[1] : "";
      auto set_user = [&](const std::string& u) {
        out.spec.steps.push_back(
            {.kind = BuildStep::Kind::kUser, .line = line, .text = "USER " + u, .args = {u}});
      };
      if (!as.empty() && as != user) set_user(as);
      out.spec.steps.push_back({.kind = BuildStep::Kind::kRun,
                                .line = line,
                                .text = "RUN " + args[0],
                                .args = {args[0]}});
      if (!as.empty() && as != user) set_user(user.empty() ? "root" : user);
    } else if (*type == "ENV") {
      if (args.empty() || args.size() % 2 != 0)
        return Invalid(f + ".args: ENV takes pairs of name and value");
      std::string text = "ENV";
      for (size_t k = 0; k < args.size(); k += 2) {
        if (args[k].empty()) return Invalid(f + ".args: an empty variable name");
        text += " " + args[k] + "=" + args[k + 1];
      }
      out.spec.steps.push_back(
          {.kind = BuildStep::Kind::kEnv, .line = line, .text = text, .args = args});
    } else if (*type == "WORKDIR") {
      SBX_RETURN_IF_ERROR(need(1, 1));
      out.spec.steps.push_back({.kind = BuildStep::Kind::kWorkdir,
                                .line = line,
                                .text = "WORKDIR " + args[0],
                                .args = args});
    } else if (*type == "USER") {
      SBX_RETURN_IF_ERROR(need(1, 1));
      user = args[0];
      out.spec.steps.push_back(
          {.kind = BuildStep::Kind::kUser, .line = line, .text = "USER " + args[0], .args = args});
    } else {
      return Invalid(f + ".type: '" + *type +
                     "' is not a step sbx builds (COPY, RUN, ENV, WORKDIR, USER)");
    }
  }
  return out;
}

const char* BuildStatusName(sandbox::BuildState s) {
  switch (s) {
    case sandbox::BuildState::kReady:
      return "ready";
    case sandbox::BuildState::kError:
      return "error";
    case sandbox::BuildState::kBuilding:
      return "building";
  }
  return "building";
}

json BuildInfoJson(const std::string& template_id, const sandbox::BuildStatus& st, size_t limit,
                   const std::string& level) {
  json logs = json::array();
  json entries = json::array();
  int min_rank = level.empty() ? 0 : LevelRank(level);
  for (const auto& l : st.logs) {
    if (entries.size() >= limit) break;
    if (LevelRank(l.level) < min_rank) continue;
    std::string lvl = l.level.empty() ? "info" : l.level;
    entries.push_back({{"timestamp", Rfc3339(l.at_ms)}, {"level", lvl}, {"message", l.text}});
    logs.push_back(l.text);
  }
  json out = {{"templateID", template_id},
              {"buildID", st.id},
              {"status", BuildStatusName(st.state)},
              {"logs", logs},
              {"logEntries", entries}};
  if (st.state == sandbox::BuildState::kError)
    out["reason"] = {{"message", st.error.empty() ? "the build failed" : st.error},
                     {"logEntries", json::array()}};
  return out;
}

json TemplateRequestJson(const TemplateRequest& r, const std::string& build_id) {
  // As E2B: names and aliases are the template's (untagged); its tags are listed apart.
  json names = json::array({r.base});
  json aliases = json::array({r.base});
  return {{"templateID", r.base}, {"buildID", build_id}, {"public", false},
          {"names", names},       {"tags", r.tags},      {"aliases", aliases}};
}

json TemplateJson(const sandbox::TemplateInfo& t) {
  const auto& rec = t.record;
  int64_t size_mb = rec.size_bytes >> 20;
  json last = rec.last_used_at ? json(Rfc3339(rec.last_used_at)) : json(nullptr);
  return {{"templateID", t.name},
          {"buildID", t.build_id.empty() ? t.name : t.build_id},
          {"cpuCount", 1},
          {"memoryMB", 1024},
          {"diskSizeMB", size_mb},
          {"public", t.owner != sandbox::TemplateOwner::kYou},
          {"aliases", json::array({t.name})},
          {"names", json::array({t.name})},
          {"createdAt", Rfc3339(t.created_at)},
          {"updatedAt", Rfc3339(t.updated_at)},
          {"createdBy", nullptr},
          {"lastSpawnedAt", last},
          {"spawnCount", 0},
          {"buildCount", t.build_id.empty() ? 0 : 1},
          {"envdVersion", kEnvdVersion},
          {"buildStatus", BuildStatusName(t.state)}};
}

json TemplateWithBuildsJson(const sandbox::TemplateInfo& t) {
  json base = TemplateJson(t);
  json builds = json::array();
  if (!t.build_id.empty())
    builds.push_back({{"buildID", t.build_id},
                      {"status", BuildStatusName(t.state)},
                      {"createdAt", base["updatedAt"]},
                      {"updatedAt", base["updatedAt"]},
                      {"cpuCount", 1},
                      {"memoryMB", 1024},
                      {"diskSizeMB", base["diskSizeMB"]},
                      {"envdVersion", kEnvdVersion}});
  return {{"templateID", base["templateID"]},
          {"public", base["public"]},
          {"aliases", base["aliases"]},
          {"names", base["names"]},
          {"createdAt", base["createdAt"]},
          {"updatedAt", base["updatedAt"]},
          {"lastSpawnedAt", base["lastSpawnedAt"]},
          {"spawnCount", 0},
          {"builds", builds}};
}

}  // namespace sbx::api::e2b

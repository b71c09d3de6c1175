#include "sandbox/templates.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include "common/encoding.h"
#include "common/fd.h"
#include "common/fs.h"
#include "storage/dockerfile.h"

namespace sbx::sandbox {
namespace {

constexpr char kBuildPrefix[] = "bld_";
constexpr size_t kBuildIdChars = 20;

Status NoBuild(const std::string& id) {
  return Status::Error("build '" + id + "' not found", ENOENT);
}

// The names, ids and hashes of requests are checked before any store lookup or path: the error
// echoes at most a bounded, printable prefix of what was sent.
std::string Echo(const std::string& v) {
  std::string out;
  for (char c : v.substr(0, 80)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return v.size() > 80 ? out + "..." : out;
}

Status BadName(const std::string& name) {
  return Status::Error("template name '" + Echo(name) +
                           "': [a-z0-9][a-z0-9._-]{0,63}, optionally with ':' and a tag",
                       EINVAL);
}

Status BadBuildId(const std::string& id) {
  return Status::Error("build id '" + Echo(id) + "': 'bld_' and 20 [a-z0-9]", EINVAL);
}

// ENOSPC when `need` more bytes would leave the filesystem `fs` less free space than the reserve
// (the larger of `reserve_bytes` and `reserve_percent` of it).
Status CheckRoom(const struct statvfs& fs, int64_t reserve_bytes, double reserve_percent,
                 int64_t need) {
  auto unit = static_cast<int64_t>(fs.f_frsize);
  int64_t total = static_cast<int64_t>(fs.f_blocks) * unit;
  int64_t reserve = std::max(
      reserve_bytes, static_cast<int64_t>(static_cast<double>(total) * reserve_percent / 100.0));
  if (static_cast<int64_t>(fs.f_bavail) * unit - need >= reserve) return {};
  return Status::Error(
      "upload: the daemon's disk is full (it keeps " + std::to_string(reserve >> 20) + " MiB free)",
      ENOSPC);
}

Status BadHash() { return Status::Error("files hash: 64 lowercase hex digits (sha256)", EINVAL); }

bool IsBuiltIn(const store::TemplateRecord& r) {
  return r.kind == store::kTemplateHost || r.kind == store::kTemplateAlias;
}

bool Terminal(BuildState s) { return s == BuildState::kReady || s == BuildState::kError; }

// chmod of every entry below a COPY step's unpacked archive (E2B's `mode`), never through a
// symlink. nftw has no context argument: the mode goes through a thread-local.
thread_local int chmod_mode = 0;
thread_local int chmod_err = 0;
int ChmodEntry(const char* path, const struct stat* st, int type, struct FTW* ftw) {
  if (ftw->level == 0 || type == FTW_SL || S_ISLNK(st->st_mode)) return 0;
  if (::chmod(path, static_cast<mode_t>(chmod_mode)) != 0) chmod_err = errno;
  return 0;
}

}  // namespace

const char* TemplateOwnerName(TemplateOwner o) {
  switch (o) {
    case TemplateOwner::kYou:
      return "you";
    case TemplateOwner::kOperator:
      return "operator";
    case TemplateOwner::kBuiltIn:
      return "built-in";
    case TemplateOwner::kOtherKey:
      return "another key";
  }
  return "operator";
}

bool IsBuildId(const std::string& id) {
  if (id.size() != sizeof kBuildPrefix - 1 + kBuildIdChars || !id.starts_with(kBuildPrefix))
    return false;
  return std::all_of(id.begin() + 4, id.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); });
}

bool IsFilesHash(const std::string& hash) {
  return hash.size() == 64 && std::all_of(hash.begin(), hash.end(), [](char c) {
           return (c >= 'a' && c <= 'f') || (c >= '0' && c <= '9');
         });
}

TemplateBuilds::TemplateBuilds(store::Store& store, storage::TemplateStore templates,
                               std::string data_dir, Builder* builder, AuditFn audit, Clock& clock)
    : store_(store),
      templates_(std::move(templates)),
      data_dir_(std::move(data_dir)),
      builder_(builder),
      audit_(std::move(audit)),
      clock_(clock) {
  // Contexts belong to builds, which do not outlive the daemon.
  if (!data_dir_.empty()) (void)RemoveTree(data_dir_ + "/build-contexts");
}

int TemplateBuilds::SweepUploads(const std::string& data_dir, bool all) {
  int removed = 0;
  std::string root = data_dir + "/build-files";
  for (const auto& key : storage::DirEntries(root)) {
    std::string dir = root + "/" + key;
    for (const auto& n : storage::DirEntries(dir)) {
      if (!n.starts_with(".tmp-")) continue;
      if (!all && storage::MakerAlive(n.substr(5))) continue;
      if (::unlink((dir + "/" + n).c_str()) == 0) ++removed;
    }
  }
  return removed;
}

Status TemplateBuilds::Refused(const store::ApiKeyRecord& key, const std::string& name,
                               const std::string& op) {
  auto rec = store_.GetTemplate(name);
  bool builtin = rec.ok() && *rec && IsBuiltIn(**rec);
  auto owner = store_.GetTemplateOwner(name);
  // A held name first: a snapshot's names are aliases too, but no built-in has an owner.
  std::string whose = owner.ok() && *owner ? "was built by another key"
                      : builtin            ? "is built in"
                                           : "is the operator's";
  audit_("template.denied", key.id, {{"template", name}, {"op", op}});
  return Status::Error("template '" + name + "' " + whose + ": this key may not " +
                           (op == "upload" ? "upload files for it" : "replace it"),
                       EPERM);
}

Status TemplateBuilds::MayBuild(const store::ApiKeyRecord& key, const std::string& name,
                                const std::string& op) {
  if (!storage::IsValidTemplateName(name)) return BadName(name);
  SBX_RETURN_IF_ERROR(MayUseFamily(key, name, op));
  auto owner = store_.GetTemplateOwner(name);
  if (!owner.ok()) return owner.status();
  if (*owner) {
    if ((*owner)->owner_key_id == key.id || key.is_operator) return {};
    return Refused(key, name, op);
  }
  auto rec = store_.GetTemplate(name);
  if (!rec.ok()) return rec.status();
  if (!*rec || (key.is_operator && !IsBuiltIn(**rec))) return {};
  return Refused(key, name, op);
}

// A tag goes with its name: "app:v2" is built only by a key that may build every other "app[:tag]"
// there is, so no key publishes a tag of another key's, the operator's or a built-in template
// (which users of that template would take for one of its versions).
Status TemplateBuilds::MayUseFamily(const store::ApiKeyRecord& key, const std::string& name,
                                    const std::string& op) {
  std::string base = name.substr(0, name.find(':'));
  auto same = [&](const std::string& other) {
    return other != name && other.substr(0, other.find(':')) == base;
  };
  auto refuse = [&](const std::string& other, const std::string& whose) {
    audit_("template.denied", key.id, {{"template", name}, {"op", op}});
    return Status::Error("template '" + name + "': '" + other + "' " + whose +
                             ": this key may not build another tag of it",
                         EPERM);
  };
  auto rows = store_.ListTemplateOwners("");
  if (!rows.ok()) return rows.status();
  for (const auto& r : *rows)
    if (same(r.name) && r.owner_key_id != key.id && !key.is_operator)
      return refuse(r.name, "was built by another key");
  auto recs = store_.ListTemplates();
  if (!recs.ok()) return recs.status();
  for (const auto& r : *recs) {
    if (!same(r.name)) continue;
    if (IsBuiltIn(r)) return refuse(r.name, "is built in");
    bool held = std::any_of(rows->begin(), rows->end(),
                            [&](const store::TemplateOwnerRecord& o) { return o.name == r.name; });
    if (!held && !key.is_operator) return refuse(r.name, "is the operator's");
  }
  return {};
}

Result<store::ApiKeyRecord> TemplateBuilds::UploadKey(const std::string& key_id) {
  auto gone = Status::Error("upload URL: the key it was made for no longer exists", EACCES);
  if (key_id.empty() || key_id.size() > 64 ||
      !std::all_of(key_id.begin(), key_id.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
      }))
    return gone;
  auto k = store_.GetApiKey(key_id);
  if (!k.ok()) return k.status();
  if (!*k || !(*k)->active()) return gone;
  return **k;
}

TemplateBuilds::~TemplateBuilds() {
  MutexLock lock(mu_);
  for (auto& [id, e] : builds_)
    if (!e.context_dir.empty()) (void)RemoveTree(e.context_dir);
}

Result<std::string> TemplateBuilds::Reserve(const store::ApiKeyRecord& key, const std::string& name,
                                            const std::vector<std::string>& also) {
  for (const std::string& n : also) SBX_RETURN_IF_ERROR(MayBuild(key, n, "build"));
  if (!storage::IsValidTemplateName(name)) return BadName(name);
  SBX_RETURN_IF_ERROR(MayUseFamily(key, name, "build"));
  std::string id = kBuildPrefix + RandomId(kBuildIdChars);
  auto claim = store_.ClaimTemplate(name, key.id, id, key.is_operator);
  if (!claim.ok()) {
    if (claim.status().err() != EPERM) return claim.status();
    return Refused(key, name, "build");
  }
  for (const std::string& n : also) {
    auto c = store_.ClaimTemplate(n, key.id, id, key.is_operator);
    if (!c.ok()) return c.status();  // lost a race with another key's claim since MayBuild
  }
  MutexLock lock(mu_);
  builds_[id] = Entry{name, also, key.id, "", "", false, "", clock_.NowMs()};
  Trim();
  return id;
}

Result<std::string> TemplateBuilds::Start(const store::ApiKeyRecord& key,
                                          const std::string& build_id, BuildSpec spec,
                                          const std::vector<UploadedCopy>& copies) {
  Builder* b = builder_.load();
  if (!b) return Status::Error("this sbx has no template builder", ENOSYS);
  std::string id = build_id;
  if (!id.empty() && !IsBuildId(id)) return BadBuildId(id);
  if (id.empty()) {
    auto r = Reserve(key, spec.name);
    if (!r.ok()) return r.status();
    id = *r;
  }
  {
    MutexLock lock(mu_);
    auto it = builds_.find(id);
    if (it == builds_.end() || (it->second.key_id != key.id && !key.is_operator))
      return NoBuild(id);
    if (!it->second.builder_id.empty() || it->second.failed)
      return Status::Error("build '" + id + "' was already started", EBUSY);
    it->second.builder_id = "starting";  // a second Start of the same id is EBUSY from now on
    spec.name = it->second.name;
    spec.also_names = it->second.also_names;
  }
  // FROM another key's snapshot: not found, as everywhere else.
  if (!spec.from_registry && !spec.steps.empty() && !spec.steps[0].args.empty() &&
      storage::IsValidTemplateName(spec.steps[0].args[0])) {
    auto hidden = Hidden(key, spec.steps[0].args[0]);
    if (!hidden.ok() || *hidden) {
      Status why =
          hidden.ok()
              ? Status::Error("FROM " + spec.steps[0].args[0] + ": template not found", EINVAL)
              : hidden.status();
      MutexLock lock(mu_);
      builds_[id].builder_id.clear();
      builds_[id].failed = true;
      builds_[id].error = why.message();
      return why;
    }
  }
  spec.record_id = id;
  spec.owner_key_id = key.id;
  spec.max_saved_bytes = key.max_saved_bytes;
  spec.timeout_ms = kBuildTimeoutMs;
  auto fail = [&](const Status& s) -> Status {
    MutexLock lock(mu_);
    auto it = builds_.find(id);
    if (it != builds_.end()) {
      it->second.builder_id.clear();
      // Over the key's builds at once (EAGAIN, 429): the same build may be started again.
      it->second.failed = s.err() != EAGAIN;
      it->second.error = s.err() != EAGAIN ? s.message() : "";
      if (!it->second.context_dir.empty()) (void)RemoveTree(it->second.context_dir);
      it->second.context_dir.clear();
    }
    return s;
  };
  if (!copies.empty()) {
    auto dir = PrepareContext(key, id, copies);
    if (!dir.ok()) return fail(dir.status());
    spec.context_dir = *dir;
    MutexLock lock(mu_);
    builds_[id].context_dir = *dir;
  }
  std::string name = spec.name;
  std::string net = spec.network.Describe();
  auto started = b->Start(std::move(spec));
  if (!started.ok()) return fail(started.status());
  {
    MutexLock lock(mu_);
    builds_[id].builder_id = *started;
  }
  audit_("template.build", key.id, {{"template", name}, {"build", id}, {"network", net}});
  return id;
}

Result<std::string> TemplateBuilds::StartDockerfile(
    const store::ApiKeyRecord& key, const std::string& name, const std::string& context_hash,
    const std::string& dockerfile, const std::map<std::string, std::string>& build_args,
    bool no_cache, const network::Policy& network) {
  // The context is used once, and never kept for a build that does not start.
  struct Forget {
    std::string path;
    ~Forget() { (void)::unlink(path.c_str()); }
  } forget{IsFilesHash(context_hash) ? UploadDir(key) + "/" + context_hash + ".tar" : ""};
  if (!enabled()) return Status::Error("this sbx has no template builder", ENOSYS);
  auto id = Reserve(key, name);
  if (!id.ok()) return id.status();
  auto dir = PrepareContext(key, *id, {{context_hash, -1, true}});
  auto fail = [&](const Status& s) -> Status {
    if (dir.ok()) (void)RemoveTree(*dir);
    MutexLock lock(mu_);
    auto it = builds_.find(*id);
    if (it != builds_.end()) {
      it->second.failed = true;
      it->second.error = s.message();
    }
    return s;
  };
  if (!dir.ok()) return fail(dir.status());
  // The context came from the client: its Dockerfile is read inside it, symlinks included.
  UniqueFd root(::open(dir->c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) return fail(Status::Errno("open build context"));
  struct open_how how {};
  how.flags = O_RDONLY | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  UniqueFd fd(
      static_cast<int>(::syscall(SYS_openat2, root.get(), dockerfile.c_str(), &how, sizeof how)));
  if (!fd)
    return fail(Status::Error("dockerfile '" + dockerfile + "': not in the context", EINVAL));
  std::string text;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(Status::Error("dockerfile '" + dockerfile + "': not a file", EINVAL));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > (size_t{1} << 20))
      return fail(Status::Error("dockerfile '" + dockerfile + "': larger than 1 MiB", EINVAL));
  }
  auto steps = storage::ParseDockerfile(text, build_args);
  if (!steps.ok()) return fail(steps.status());
  BuildSpec spec;
  spec.steps = std::move(*steps);
  spec.no_cache = no_cache;
  spec.network = network;
  spec.context_dir = *dir;
  {
    MutexLock lock(mu_);
    builds_[*id].context_dir = *dir;
  }
  return Start(key, *id, std::move(spec));
}

Status TemplateBuilds::Fail(const store::ApiKeyRecord& key, const std::string& build_id,
                            const std::string& reason) {
  if (!IsBuildId(build_id)) return BadBuildId(build_id);
  MutexLock lock(mu_);
  auto it = builds_.find(build_id);
  if (it == builds_.end() || (it->second.key_id != key.id && !key.is_operator))
    return NoBuild(build_id);
  if (!it->second.builder_id.empty())
    return Status::Error("build '" + build_id + "' was already started", EBUSY);
  it->second.failed = true;
  it->second.error = reason;
  return {};
}

Result<BuildStatus> TemplateBuilds::Get(const store::ApiKeyRecord& key, const std::string& build_id,
                                        int64_t offset) {
  if (!IsBuildId(build_id)) return BadBuildId(build_id);
  if (offset < 0) offset = 0;
  std::string builder_id, context_dir;
  BuildStatus out;
  out.id = build_id;
  {
    MutexLock lock(mu_);
    auto it = builds_.find(build_id);
    if (it != builds_.end()) {
      const Entry& e = it->second;
      if (e.key_id != key.id && !key.is_operator) return NoBuild(build_id);
      out.name = e.name;
      if (e.failed) {
        out.state = BuildState::kError;
        out.error = e.error;
        if (offset == 0) out.logs.push_back({e.created_at, "error", e.error});
        return out;
      }
      if (e.builder_id.empty() || e.builder_id == "starting") return out;  // waiting
      builder_id = e.builder_id;
    }
  }
  if (builder_id.empty()) {
    // Not in memory: a build of an earlier run of the daemon, answered from the store.
    auto rows = store_.ListTemplateOwners(key.is_operator ? "" : key.id);
    if (!rows.ok()) return rows.status();
    for (const auto& r : *rows) {
      if (r.build_id != build_id) continue;
      auto rec = store_.GetTemplate(r.name);
      if (!rec.ok()) return rec.status();
      out.name = r.name;
      if (*rec) {
        out.state = BuildState::kReady;
        out.size_bytes = (*rec)->size_bytes;
      } else {
        out.state = BuildState::kError;
        out.error = "the build did not finish: the daemon restarted during it";
        if (offset == 0) out.logs.push_back({r.updated_at, "error", out.error});
      }
      return out;
    }
    return NoBuild(build_id);
  }
  Builder* b = builder_.load();
  if (!b) return NoBuild(build_id);
  auto st = b->Get(builder_id, offset);
  if (!st.ok() && st.status().err() == ENOENT) {
    // The builder forgot it (it keeps a bounded number of finished builds): as after a restart.
    {
      MutexLock lock(mu_);
      builds_.erase(build_id);
    }
    return Get(key, build_id, offset);
  }
  if (!st.ok()) return st.status();
  st->id = build_id;
  if (Terminal(st->state)) {
    MutexLock lock(mu_);
    auto it = builds_.find(build_id);
    if (it != builds_.end() && !it->second.context_dir.empty()) {
      (void)RemoveTree(it->second.context_dir);
      it->second.context_dir.clear();
    }
  }
  return st;
}

Result<TemplateInfo> TemplateBuilds::Info(const store::ApiKeyRecord& key, const std::string& name) {
  if (!storage::IsValidTemplateName(name)) return BadName(name);
  auto hidden = Hidden(key, name);
  if (!hidden.ok()) return hidden.status();
  if (*hidden) return storage::TemplateNotFound(name);
  auto rec = store_.GetTemplate(name);
  if (!rec.ok()) return rec.status();
  auto row = store_.GetTemplateOwner(name);
  if (!row.ok()) return row.status();
  if (!*rec && !*row) return storage::TemplateNotFound(name);
  TemplateInfo info;
  info.name = name;
  if (*rec) {
    info.record = **rec;
    info.created_at = info.updated_at = (*rec)->created_at;
    info.owner = IsBuiltIn(**rec) ? TemplateOwner::kBuiltIn : TemplateOwner::kOperator;
  }
  if (*row) {
    info.owner = (*row)->owner_key_id == key.id ? TemplateOwner::kYou : TemplateOwner::kOtherKey;
    info.created_at = (*row)->created_at;
    info.updated_at = (*row)->updated_at;
    // The latest build (its id and state), for the key that ran it; others see the template as
    // it is, and no id of another key's object.
    if (info.owner == TemplateOwner::kYou || key.is_operator) {
      info.build_id = (*row)->build_id;
      store::ApiKeyRecord owner = key;
      owner.id = (*row)->owner_key_id;
      auto st = Get(owner, info.build_id, 0);
      if (st.ok()) {
        info.state = st->state;
        info.error = st->error;
      }
    } else if (!*rec) {
      info.state = BuildState::kBuilding;
    }
  }
  return info;
}

Result<std::vector<TemplateInfo>> TemplateBuilds::List(const store::ApiKeyRecord& key) {
  auto recs = store_.ListTemplates();
  if (!recs.ok()) return recs.status();
  auto rows = store_.ListTemplateOwners("");
  if (!rows.ok()) return rows.status();
  std::map<std::string, bool> names;
  for (const auto& r : *recs) names[r.name] = true;
  for (const auto& r : *rows) names[r.name] = true;
  std::vector<TemplateInfo> out;
  for (const auto& [name, _] : names) {
    auto info = Info(key, name);
    if (info.ok()) out.push_back(std::move(*info));  // deleted meanwhile: skipped
  }
  return out;
}

Status TemplateBuilds::MayDelete(const store::ApiKeyRecord& key, const std::string& name) {
  if (!storage::IsValidTemplateName(name)) return BadName(name);
  auto hidden = Hidden(key, name);
  if (!hidden.ok()) return hidden.status();
  auto rec = store_.GetTemplate(name);
  if (!rec.ok()) return rec.status();
  auto row = store_.GetTemplateOwner(name);
  if (!row.ok()) return row.status();
  auto denied = [&](const std::string& why) {
    audit_("template.denied", key.id, {{"template", name}, {"op", "delete"}});
    return Status::Error("template '" + name + "' " + why, EPERM);
  };
  // Another tenant's: not found, as for any name it does not hold; the operator is told.
  if (*hidden) (void)denied("is another key's");
  if (*hidden || (!*rec && !*row))
    return Status::Error("template '" + name + "' not found", ENOENT);
  if (*row) {
    if ((*row)->owner_key_id != key.id && !key.is_operator)
      return denied("was built by another key");
  } else if (IsBuiltIn(**rec)) {
    return denied("is built in");
  } else if (!key.is_operator) {
    return denied("is the operator's: only an operator key may delete it");
  }
  return {};
}

Status TemplateBuilds::NotBeingBuilt(const std::string& name) {
  // Its end would register the template again.
  std::vector<std::string> running;
  {
    MutexLock lock(mu_);
    for (const auto& [id, e] : builds_) {
      bool of_it = e.name == name ||
                   std::find(e.also_names.begin(), e.also_names.end(), name) != e.also_names.end();
      if (of_it && !e.failed && !e.builder_id.empty()) running.push_back(e.builder_id);
    }
  }
  if (Builder* b = builder_.load()) {
    for (const auto& bid : running) {
      if (bid == "starting") return Status::Error("template '" + name + "' is being built", EBUSY);
      auto st = b->Get(bid, INT64_MAX);
      if (st.ok() && !Terminal(st->state))
        return Status::Error("template '" + name + "' is being built", EBUSY);
    }
  }
  return {};
}

Status TemplateBuilds::Delete(const store::ApiKeyRecord& key, const std::string& name) {
  SBX_RETURN_IF_ERROR(MayDelete(key, name));
  // A snapshot goes with all its names, whichever of them is named.
  auto snap = SnapshotOf(name);
  if (!snap.ok()) return snap.status();
  if (*snap) return DeleteSnapshot(key, name);
  SBX_RETURN_IF_ERROR(NotBeingBuilt(name));
  auto rec = store_.GetTemplate(name);
  if (!rec.ok()) return rec.status();
  if (*rec) {
    Status s = storage::RemoveTemplate(templates_, store_, name);
    if (!s.ok() && s.err() != ENOENT) return s;
  }
  SBX_RETURN_IF_ERROR(store_.DeleteTemplateOwner(name));
  {
    // A reserved build of it that has not started would register the name without its hold.
    MutexLock lock(mu_);
    for (auto& [id, e] : builds_) {
      bool of_it = e.name == name ||
                   std::find(e.also_names.begin(), e.also_names.end(), name) != e.also_names.end();
      if (of_it && e.builder_id.empty() && !e.failed) {
        e.failed = true;
        e.error = "the template was deleted before its build started";
      }
    }
  }
  audit_("template.delete", key.id, {{"template", name}});
  return {};
}

Result<std::vector<std::string>> TemplateBuilds::NamesOf(const std::string& base) {
  auto recs = store_.ListTemplates();
  if (!recs.ok()) return recs.status();
  auto rows = store_.ListTemplateOwners("");
  if (!rows.ok()) return rows.status();
  std::vector<std::string> out;
  auto add = [&](const std::string& n) {
    if ((n == base || n.rfind(base + ":", 0) == 0) &&
        std::find(out.begin(), out.end(), n) == out.end())
      out.push_back(n);
  };
  for (const auto& r : *recs) add(r.name);
  for (const auto& r : *rows) add(r.name);
  std::sort(out.begin(), out.end());
  return out;
}

Status TemplateBuilds::DeleteWithTags(const store::ApiKeyRecord& key, const std::string& base) {
  if (!storage::IsValidTemplateName(base)) return BadName(base);
  auto names = NamesOf(base);
  if (!names.ok()) return names.status();
  if (names->empty()) return Status::Error("template '" + base + "' not found", ENOENT);
  // Another key's tags of the same name are theirs: they stay. Nothing is deleted when the key
  // may delete none, or when one of those it may is being built.
  std::vector<std::string> mine;
  Status refused;
  for (const auto& n : *names) {
    Status may = MayDelete(key, n);
    if (may.err() == EPERM) {
      refused = may;
      continue;
    }
    SBX_RETURN_IF_ERROR(may);
    SBX_RETURN_IF_ERROR(NotBeingBuilt(n));
    mine.push_back(n);
  }
  if (mine.empty()) return refused;
  for (const auto& n : mine) {
    Status s = Delete(key, n);
    if (!s.ok() && s.err() != ENOENT) return s;  // ENOENT: deleted meanwhile
  }
  return {};
}

// ---- tags ----

namespace {

Status CheckTag(const std::string& base, const std::string& tag) {
  if (tag != "default" && !storage::IsValidTemplateName(base + ":" + tag))
    return Status::Error("tag '" + tag + "': [a-z0-9][a-z0-9._-]{0,63}", EINVAL);
  return {};
}

}  // namespace

Result<std::string> TemplateBuilds::Tag(const store::ApiKeyRecord& key, const std::string& target,
                                        const std::vector<std::string>& tags) {
  if (!storage::IsValidTemplateName(target))
    return Status::Error("target '" + target + "': a template name, optionally with ':' and a tag",
                         EINVAL);
  if (tags.empty()) return Status::Error("tags: at least one tag is required", EINVAL);
  std::string base = target.substr(0, target.find(':'));
  auto hidden = Hidden(key, target);
  if (!hidden.ok()) return hidden.status();
  auto rec = store_.GetTemplate(target);
  if (!rec.ok()) return rec.status();
  if (!*rec || *hidden) return Status::Error("template '" + target + "' not found", ENOENT);
  auto row = store_.GetTemplateOwner(target);
  if (!row.ok()) return row.status();
  auto denied = [&](const std::string& why) {
    audit_("template.denied", key.id, {{"template", target}, {"op", "tag"}});
    return Status::Error("template '" + target + "' " + why, EPERM);
  };
  auto snap = SnapshotOf(target);
  if (!snap.ok()) return snap.status();
  if (*snap)
    return Status::Error("template '" + target + "' is a snapshot or a name of one: it has no tags",
                         EINVAL);
  if (IsBuiltIn(**rec)) return denied("is built in: it has no tags to change");
  if (*row && (*row)->owner_key_id != key.id && !key.is_operator)
    return denied("was built by another key");
  if (!*row && !key.is_operator)
    return denied("is the operator's: only an operator key may tag it");
  std::vector<std::string> dests;
  for (const std::string& t : tags) {
    SBX_RETURN_IF_ERROR(CheckTag(base, t));
    std::string dest = t == "default" ? base : base + ":" + t;
    if (dest == target || std::find(dests.begin(), dests.end(), dest) != dests.end()) continue;
    SBX_RETURN_IF_ERROR(MayBuild(key, dest, "tag"));
    SBX_RETURN_IF_ERROR(NotBeingBuilt(dest));
    dests.push_back(dest);
  }
  std::string build_id = BuildIdOf(**rec);
  if (build_id.empty() && *row) build_id = (*row)->build_id;
  for (const std::string& dest : dests) {
    store::TemplateRecord copy = **rec;
    copy.name = dest;
    copy.created_at = 0;  // now: when the tag was assigned
    copy.last_used_at = 0;
    SBX_RETURN_IF_ERROR(store_.PutTemplate(copy));
    if (*row) {
      auto c = store_.ClaimTemplate(dest, (*row)->owner_key_id,
                                    build_id.empty() ? (*row)->build_id : build_id, true);
      if (!c.ok()) return c.status();
    } else {
      SBX_RETURN_IF_ERROR(store_.DeleteTemplateOwner(dest));  // the operator's, as its target
    }
  }
  audit_("template.tag", key.id, {{"template", target}, {"tags", tags}, {"build", build_id}});
  return build_id;
}

Status TemplateBuilds::Untag(const store::ApiKeyRecord& key, const std::string& base,
                             const std::vector<std::string>& tags) {
  if (!storage::IsValidTemplateName(base)) return BadName(base);
  if (base.find(':') != std::string::npos)
    return Status::Error("name '" + base + "': a template name without a tag (the tags go in tags)",
                         EINVAL);
  if (!storage::IsValidTemplateName(base))
    return Status::Error("name '" + base + "': not a template name", EINVAL);
  if (tags.empty()) return Status::Error("tags: at least one tag is required", EINVAL);
  for (const std::string& t : tags) {
    SBX_RETURN_IF_ERROR(CheckTag(base, t));
    if (t == "default") return Status::Error("the 'default' tag cannot be removed", EINVAL);
  }
  auto names = NamesOf(base);
  if (!names.ok()) return names.status();
  if (names->empty()) return Status::Error("template '" + base + "' not found", ENOENT);
  std::vector<std::string> gone;
  for (const std::string& t : tags) {
    std::string n = base + ":" + t;
    if (std::find(names->begin(), names->end(), n) == names->end()) continue;  // as E2B: fine
    SBX_RETURN_IF_ERROR(MayDelete(key, n));
    SBX_RETURN_IF_ERROR(NotBeingBuilt(n));
    gone.push_back(n);
  }
  for (const std::string& n : gone) {
    Status s = Delete(key, n);
    if (!s.ok() && s.err() != ENOENT) return s;
  }
  return {};
}

Result<std::vector<TemplateBuilds::TagInfo>> TemplateBuilds::Tags(const store::ApiKeyRecord& key,
                                                                  const std::string& base) {
  if (!storage::IsValidTemplateName(base)) return BadName(base);
  auto names = NamesOf(base);
  if (!names.ok()) return names.status();
  std::erase_if(*names, [&](const std::string& n) {
    auto hidden = Hidden(key, n);
    return !hidden.ok() || *hidden;
  });
  std::vector<TagInfo> out;
  for (const std::string& n : *names) {
    auto rec = store_.GetTemplate(n);
    if (!rec.ok()) return rec.status();
    if (!*rec) continue;  // held by a build that has not made it (yet)
    TagInfo t;
    t.tag = n == base ? "default" : n.substr(base.size() + 1);
    t.build_id = BuildIdOf(**rec);
    if (t.build_id.empty()) {
      auto row = store_.GetTemplateOwner(n);
      if (!row.ok()) return row.status();
      if (*row) t.build_id = (*row)->build_id;
    }
    t.created_at = (*rec)->created_at;
    out.push_back(std::move(t));
  }
  if (out.empty() && names->empty())
    return Status::Error("template '" + base + "' not found", ENOENT);
  return out;
}

// ---- uploads ----

// ---- snapshots ----

bool IsSnapshotId(const std::string& id) {
  constexpr size_t kPrefix = sizeof(kSnapshotPrefix) - 1;
  return id.size() == kPrefix + 20 && id.compare(0, kPrefix, kSnapshotPrefix) == 0 &&
         std::all_of(id.begin() + kPrefix, id.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); });
}

Result<std::optional<store::TemplateRecord>> TemplateBuilds::SnapshotOf(const std::string& name,
                                                                        std::string* alias_of) {
  auto rec = store_.GetTemplate(name);
  if (!rec.ok() || !*rec) return rec;
  if ((*rec)->kind == store::kTemplateAlias) {
    if (alias_of) *alias_of = (*rec)->alias_of;
    rec = store_.GetTemplate((*rec)->alias_of);
    if (!rec.ok() || !*rec) return rec;
  }
  if ((*rec)->kind != store::kTemplateSnapshot) return std::optional<store::TemplateRecord>();
  return rec;
}

Result<bool> TemplateBuilds::HeldByAnotherTenant(const store::ApiKeyRecord& key,
                                                 const std::string& name) {
  auto row = store_.GetTemplateOwner(name);
  if (!row.ok()) return row.status();
  if (!*row || (*row)->owner_key_id == key.id) return false;
  // An operator key's builds are the operator's, shared as its host imports are; a key no
  // longer in the store is no operator.
  auto holder = store_.GetApiKey((*row)->owner_key_id);
  if (!holder.ok()) return holder.status();
  return !*holder || !(*holder)->is_operator;
}

Result<bool> TemplateBuilds::Hidden(const store::ApiKeyRecord& key, const std::string& name) {
  if (key.is_operator) return false;
  std::string alias_of;  // the name's record is read once (every create asks)
  auto snap = SnapshotOf(name, &alias_of);
  if (!snap.ok()) return snap.status();
  if (*snap) {
    // A snapshot without its owner row (a crash between the two writes) is nobody's but the
    // operator's: hidden from every tenant.
    auto row = store_.GetTemplateOwner((*snap)->name);
    if (!row.ok()) return row.status();
    return !*row || (*row)->owner_key_id != key.id;
  }
  // A name another tenant holds, or a name (an alias) of a template another tenant holds.
  auto held = HeldByAnotherTenant(key, name);
  if (!held.ok() || *held || alias_of.empty()) return held;
  return HeldByAnotherTenant(key, alias_of);
}

Result<SnapshotInfo> TemplateBuilds::InfoOf(const store::TemplateRecord& snap,
                                            const std::vector<std::string>* names) {
  SnapshotInfo info;
  info.id = snap.name;
  info.sandbox_id = snap.sandbox_id;
  info.created_at = snap.created_at;
  if (!snap.layers.empty()) {
    auto layer = store_.GetLayer(snap.layers.front());
    if (!layer.ok()) return layer.status();
    if (*layer) info.size_bytes = (*layer)->size_bytes;
  }
  if (names) {
    info.names = *names;
  } else {
    auto all = store_.ListTemplates();
    if (!all.ok()) return all.status();
    for (const auto& t : *all)
      if (t.kind == store::kTemplateAlias && t.alias_of == snap.name) info.names.push_back(t.name);
  }
  return info;
}

Result<SnapshotInfo> TemplateBuilds::AddSnapshot(
    const store::ApiKeyRecord& key, const std::string& id, const std::string& sandbox_id,
    const std::vector<std::string>& layers, const storage::ImageConfig& config,
    const std::string& asked_name, const std::string& runtime) {
  if (!IsSnapshotId(id)) return Status::Error("snapshot id '" + Echo(id) + "': malformed", EINVAL);
  std::string name = asked_name;
  if (name.ends_with(":default")) name.resize(name.size() - 8);
  std::optional<store::TemplateRecord> moved;  // the alias `name` was, when it moves here
  if (!name.empty()) {
    if (!storage::IsValidTemplateName(name) || IsSnapshotId(name)) return BadName(name);
    SBX_RETURN_IF_ERROR(MayUseFamily(key, name, "snapshot"));
    auto existing = store_.GetTemplate(name);
    if (!existing.ok()) return existing.status();
    auto row = store_.GetTemplateOwner(name);
    if (!row.ok()) return row.status();
    if (*row && (*row)->owner_key_id != key.id) return Refused(key, name, "snapshot");
    if (*existing) {
      auto snap = SnapshotOf(name);
      if (!snap.ok()) return snap.status();
      if ((*existing)->kind != store::kTemplateAlias || !*snap || !*row)
        return Status::Error("name '" + name + "' is taken by a template", EEXIST);
      moved = **existing;
    }
  }
  // The owner rows first: a crash before the records leaves only a hold on the names (as a
  // failed build does), never a snapshot some key could see unowned.
  SBX_RETURN_IF_ERROR(store_.ClaimSnapshot(id, key.id, key.max_snapshots));
  if (!name.empty()) {
    auto c = store_.ClaimTemplate(name, key.id, id);
    if (!c.ok()) {
      (void)store_.DeleteTemplateOwner(id);
      return c.status().err() == EPERM ? Refused(key, name, "snapshot") : c.status();
    }
  }
  auto rec = storage::PutImageTemplate(templates_, store_, id, store::kTemplateSnapshot,
                                       "snapshot of sandbox " + sandbox_id, layers, config,
                                       /*replace=*/false, sandbox_id, runtime);
  if (!rec.ok()) {
    (void)store_.DeleteTemplateOwner(id);
    if (!name.empty() && !moved) (void)store_.DeleteTemplateOwner(name);
    return rec.status();
  }
  if (!name.empty()) {
    store::TemplateRecord alias;
    alias.name = name;
    alias.kind = store::kTemplateAlias;
    alias.alias_of = id;
    alias.source = "a name of snapshot " + id;
    Status put = moved ? store_.PutTemplate(alias) : store_.AddTemplate(alias);
    if (!put.ok()) {
      (void)storage::RemoveTemplate(templates_, store_, id);
      (void)store_.DeleteTemplateOwner(id);
      if (!moved) (void)store_.DeleteTemplateOwner(name);
      return put;
    }
  }
  audit_("snapshot.create", key.id, {{"snapshot", id}, {"sandbox", sandbox_id}, {"name", name}});
  return InfoOf(*rec);
}

Result<std::vector<SnapshotInfo>> TemplateBuilds::Snapshots(const store::ApiKeyRecord& key,
                                                            const std::string& sandbox_id,
                                                            const std::string& name) {
  // Every template and the key's snapshots are read once: a listing costs the same whatever
  // other keys hold (one read per snapshot was quadratic in every key's snapshots).
  auto all = store_.ListTemplates();
  if (!all.ok()) return all.status();
  std::set<std::string> mine;  // a tenant's: those its owner rows name (see Hidden)
  if (!key.is_operator) {
    auto rows = store_.ListTemplateOwners(key.id);
    if (!rows.ok()) return rows.status();
    for (const auto& r : *rows) mine.insert(r.name);
  }
  std::map<std::string, std::vector<std::string>> names;  // a snapshot's aliases, by snapshot
  for (const auto& t : *all)
    if (t.kind == store::kTemplateAlias) names[t.alias_of].push_back(t.name);
  const std::vector<std::string> none;
  std::vector<SnapshotInfo> out;
  for (const auto& t : *all) {
    if (t.kind != store::kTemplateSnapshot) continue;
    if (!sandbox_id.empty() && t.sandbox_id != sandbox_id) continue;
    if (!key.is_operator && !mine.contains(t.name)) continue;
    auto named = names.find(t.name);
    auto info = InfoOf(t, named == names.end() ? &none : &named->second);
    if (!info.ok()) return info.status();
    if (!name.empty() && name != info->id &&
        std::find(info->names.begin(), info->names.end(), name) == info->names.end())
      continue;
    out.push_back(std::move(*info));
  }
  std::sort(out.begin(), out.end(), [](const SnapshotInfo& a, const SnapshotInfo& b) {
    return a.created_at != b.created_at ? a.created_at > b.created_at : a.id > b.id;
  });
  return out;
}

Result<SnapshotInfo> TemplateBuilds::Snapshot(const store::ApiKeyRecord& key,
                                              const std::string& id_or_name) {
  auto none = Status::Error("snapshot '" + Echo(id_or_name) + "' not found", ENOENT);
  if (!storage::IsValidTemplateName(id_or_name)) return none;
  auto hidden = Hidden(key, id_or_name);
  if (!hidden.ok()) return hidden.status();
  auto snap = SnapshotOf(id_or_name);
  if (!snap.ok()) return snap.status();
  if (*hidden || !*snap) return none;
  return InfoOf(**snap);
}

Status TemplateBuilds::DeleteSnapshot(const store::ApiKeyRecord& key,
                                      const std::string& id_or_name) {
  auto info = Snapshot(key, id_or_name);
  if (!info.ok()) return info.status();
  // Its names first (the store keeps no alias of a missing template), then the snapshot; the
  // layer stays while a live sandbox or another template uses it (storage::RemoveTemplate).
  for (const auto& n : info->names) {
    Status s = store_.DeleteTemplate(n);
    if (!s.ok() && s.err() != ENOENT) return s;
    SBX_RETURN_IF_ERROR(store_.DeleteTemplateOwner(n));
  }
  Status s = storage::RemoveTemplate(templates_, store_, info->id);
  if (!s.ok() && s.err() != ENOENT) return s;
  SBX_RETURN_IF_ERROR(store_.DeleteTemplateOwner(info->id));
  audit_("snapshot.delete", key.id, {{"snapshot", info->id}});
  return {};
}

std::string TemplateBuilds::UploadDir(const store::ApiKeyRecord& key) const {
  return data_dir_ + "/build-files/" + key.id;
}

Result<bool> TemplateBuilds::HasUpload(const store::ApiKeyRecord& key,
                                       const std::string& files_hash) {
  if (!IsFilesHash(files_hash)) return BadHash();
  if (data_dir_.empty()) return false;
  struct stat st {};
  return ::stat((UploadDir(key) + "/" + files_hash + ".tar").c_str(), &st) == 0 &&
         S_ISREG(st.st_mode);
}

TemplateBuilds::Upload::~Upload() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

Status TemplateBuilds::Upload::Write(std::string_view data) {
  if (fd_ < 0) return Status::Error("upload: already committed", EINVAL);
  bytes_ += static_cast<int64_t>(data.size());
  if (bytes_ > kMaxUploadBytes)
    return Status::Error("upload: larger than " + std::to_string(kMaxUploadBytes >> 20) + " MiB",
                         EFBIG);
  // The disk is shared with every box: look at its free space every 16 MiB written.
  if (bytes_ - checked_at_ >= (int64_t{16} << 20) || checked_at_ == 0) {
    checked_at_ = bytes_;
    struct statvfs fs {};
    if (::fstatvfs(fd_, &fs) == 0)
      SBX_RETURN_IF_ERROR(
          CheckRoom(fs, reserve_bytes_, reserve_percent_, static_cast<int64_t>(data.size())));
  }
  size_t off = 0;
  while (off < data.size()) {
    ssize_t w = ::write(fd_, data.data() + off, data.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Status::Errno("write upload");
    off += static_cast<size_t>(w);
  }
  return {};
}

Status TemplateBuilds::Upload::Commit() {
  if (fd_ < 0) return Status::Error("upload: already committed", EINVAL);
  if (::fsync(fd_) != 0) return Status::Errno("sync upload");
  ::close(fd_);
  fd_ = -1;
  // Never over a stored one (see the top): the first upload of a hash is the one builds read.
  if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, final_.c_str(), RENAME_NOREPLACE) != 0) {
    if (errno != EEXIST) return Status::Errno("store upload");
    return {};  // the destructor removes this one
  }
  tmp_.clear();
  // The key's uploads past the bound go, oldest first (the one just stored stays).
  struct Kept {
    std::string path;
    int64_t size;
    int64_t mtime;
  };
  std::vector<Kept> kept;
  int64_t sum = 0;
  if (DIR* d = ::opendir(dir_.c_str())) {
    while (struct dirent* de = ::readdir(d)) {
      std::string n = de->d_name;
      if (!n.ends_with(".tar")) continue;
      struct stat st {};
      std::string p = dir_ + "/" + n;
      if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      sum += st.st_size;
      if (p != final_) kept.push_back({p, st.st_size, st.st_mtime});
    }
    ::closedir(d);
  }
  std::sort(kept.begin(), kept.end(),
            [](const Kept& a, const Kept& b) { return a.mtime < b.mtime; });
  for (const Kept& k : kept) {
    if (sum <= kMaxUploadsBytesPerKey) break;
    if (::unlink(k.path.c_str()) == 0) sum -= k.size;
  }
  return {};
}

Result<std::unique_ptr<TemplateBuilds::Upload>> TemplateBuilds::BeginUpload(
    const store::ApiKeyRecord& key, const std::string& files_hash, int64_t expected_bytes) {
  if (!IsFilesHash(files_hash)) return BadHash();
  if (data_dir_.empty()) return Status::Error("this sbx keeps no uploads", ENOSYS);
  if (expected_bytes > kMaxUploadBytes)
    return Status::Error("upload: larger than " + std::to_string(kMaxUploadBytes >> 20) + " MiB",
                         EFBIG);
  std::unique_ptr<Upload> u(new Upload());
  u->reserve_bytes_ = reserve_bytes_.load();
  u->reserve_percent_ = reserve_percent_.load();
  if (expected_bytes > 0) {
    struct statvfs fs {};
    if (::statvfs(data_dir_.c_str(), &fs) == 0)
      SBX_RETURN_IF_ERROR(CheckRoom(fs, u->reserve_bytes_, u->reserve_percent_, expected_bytes));
  }
  u->dir_ = UploadDir(key);
  SBX_RETURN_IF_ERROR(MakeDirs(u->dir_, 0700));
  u->final_ = u->dir_ + "/" + files_hash + ".tar";
  std::string tmp = u->dir_ + "/.tmp-" + storage::MakerPrefix() + RandomId(12);
  u->fd_ = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (u->fd_ < 0) return Status::Errno("create upload");
  u->tmp_ = tmp;
  return u;
}

Status TemplateBuilds::PutUpload(const store::ApiKeyRecord& key, const std::string& files_hash,
                                 const std::function<Result<size_t>(char*, size_t)>& read) {
  auto u = BeginUpload(key, files_hash);
  if (!u.ok()) return u.status();
  std::vector<char> buf(1 << 16);
  for (;;) {
    auto n = read(buf.data(), buf.size());
    if (!n.ok()) return n.status();
    if (*n == 0) break;
    SBX_RETURN_IF_ERROR((*u)->Write(std::string_view(buf.data(), *n)));
  }
  return (*u)->Commit();
}

Result<std::string> TemplateBuilds::PrepareContext(const store::ApiKeyRecord& key,
                                                   const std::string& build_id,
                                                   const std::vector<UploadedCopy>& copies) {
  if (data_dir_.empty()) return Status::Error("this sbx keeps no uploads", ENOSYS);
  std::string dir = data_dir_ + "/build-contexts/" + build_id;
  SBX_RETURN_IF_ERROR(MakeDirs(data_dir_ + "/build-contexts", 0700));
  if (::mkdir(dir.c_str(), 0700) != 0) return Status::Errno("make build context");
  auto cleanup = [&](const Status& s) -> Status {
    (void)RemoveTree(dir);
    return s;
  };
  int64_t left = kMaxUploadsBytesPerKey;  // unpacked, for the whole build
  for (const UploadedCopy& c : copies) {
    auto has = HasUpload(key, c.files_hash);
    if (!has.ok()) return cleanup(has.status());
    if (!*has)
      return cleanup(
          Status::Error("the files of hash " + c.files_hash + " were not uploaded", ENOENT));
    std::string dest = c.at_root ? dir : dir + "/" + c.files_hash;
    struct stat st {};
    if (!c.at_root) {
      if (::lstat(dest.c_str(), &st) == 0) continue;  // two steps copying the same files
      if (::mkdir(dest.c_str(), 0755) != 0) return cleanup(Status::Errno("make build context"));
    }
    auto n = storage::UnpackTarball(UploadDir(key) + "/" + c.files_hash + ".tar", dest, left);
    if (!n.ok())
      return cleanup(Status::Error(
          "unpack the files of hash " + c.files_hash + ": " + RedactPaths(n.status().message()),
          n.status().err()));
    left -= *n;
    if (c.mode >= 0) {
      chmod_mode = c.mode & 07777;
      chmod_err = 0;
      if (::nftw(dest.c_str(), ChmodEntry, 16, FTW_PHYS) != 0 || chmod_err != 0)
        return cleanup(Status::Error(
            "chmod copied files: " + std::string(std::strerror(chmod_err ? chmod_err : errno)),
            chmod_err ? chmod_err : errno));
    }
  }
  return dir;
}

void TemplateBuilds::Trim() {
  while (builds_.size() > kMaxBuildsKept) {
    // The oldest build that is not running (never started, failed, or ended: no context left).
    auto victim = builds_.end();
    for (auto it = builds_.begin(); it != builds_.end(); ++it) {
      const Entry& e = it->second;
      bool idle = e.failed || e.builder_id.empty() || e.context_dir.empty();
      if (e.builder_id == "starting") idle = false;
      if (idle && (victim == builds_.end() || e.created_at < victim->second.created_at))
        victim = it;
    }
    if (victim == builds_.end()) return;
    if (!victim->second.context_dir.empty()) (void)RemoveTree(victim->second.context_dir);
    builds_.erase(victim);
  }
}

}  // namespace sbx::sandbox

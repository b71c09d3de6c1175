#include "cli/template.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/units.h"
#include "common/encoding.h"
#include "common/fd.h"
#include "common/fs.h"
#include "runtime/runtime.h"
#include "sandbox/templates.h"
#include "storage/image.h"
#include "store/store.h"

namespace sbx::cli {
namespace {

using nlohmann::json;

std::string CacheBytesFile(const storage::TemplateStore& ts) { return ts.dir + "/cache-bytes"; }

Result<std::unique_ptr<store::Store>> OpenTemplateStore(const GlobalOptions& g) {
  if (::geteuid() != 0)
    return Status::Error(
        "sbx template manages the daemon's template cache and store directly and needs root");
  auto st = store::Store::Open(g.data_dir + "/" + store::kDbFileName);
  if (!st.ok()) return st.status().Wrap("store");
  return st;
}

struct TemplateFlags {
  std::string name, path, cache_size, ref, runtime;
  bool json = false, replace = false;
};

// The bound --template-cache-size gives (0: the recorded one); -1 for a bad value.
int64_t BoundFlag(const std::string& flag) {
  if (flag.empty()) return 0;
  auto n = ParseSize(flag);
  return n.ok() && *n > 0 ? *n : -1;
}

// One progress line per layer on a terminal, redrawn in place ("<digest>: 12.0 MiB / 30.0 MiB,
// 4.2 MiB/s"); nothing when stderr is not one (logs get the final line only).
class LayerProgress {
 public:
  LayerProgress() : tty_(::isatty(STDERR_FILENO) != 0) {}
  void operator()(const storage::Progress& p) {
    if (!tty_) return;
    auto now = std::chrono::steady_clock::now();
    if (p.what != current_) {
      if (!current_.empty()) std::fprintf(stderr, "\n");
      current_ = p.what;
      start_ = now;
    } else if (p.done != p.total && now - last_ < std::chrono::milliseconds(100)) {
      return;
    }
    last_ = now;
    double secs = std::chrono::duration<double>(now - start_).count();
    std::string rate = secs > 0.05 ? FormatSize(static_cast<int64_t>(p.done / secs)) + "/s" : "";
    std::fprintf(stderr, "\r%s: %s%s%s%s\033[K", p.what.c_str(), FormatSize(p.done).c_str(),
                 p.total >= 0 ? (" / " + FormatSize(p.total)).c_str() : "",
                 rate.empty() ? "" : ", ", rate.c_str());
  }
  void Done() {
    if (tty_ && !current_.empty()) std::fprintf(stderr, "\n");
    current_.clear();
  }

 private:
  bool tty_;
  std::string current_;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace

storage::TemplateStore CliTemplateStore(const std::string& data_dir, int64_t cache_bytes) {
  storage::TemplateStore ts;
  ts.dir = data_dir + "/templates";
  if (cache_bytes > 0) {
    ts.cache_bytes = cache_bytes;
  } else if (auto recorded = ReadFile(CacheBytesFile(ts), 64); recorded.ok()) {
    int64_t n = std::strtoll(recorded->c_str(), nullptr, 10);
    if (n > 0) ts.cache_bytes = n;
  }
  return ts;
}

Status RecordTemplateCacheBytes(const storage::TemplateStore& ts) {
  SBX_RETURN_IF_ERROR(MakeDirs(ts.dir, 0700));
  return WriteFileAtomic(CacheBytesFile(ts), std::to_string(ts.cache_bytes) + "\n", 0600);
}

void RegisterTemplateVerbs(CLI::App& app, const GlobalOptions& g, ClientVerbs& verbs) {
  CLI::App* tmpl = app.add_subcommand(
      "template",
      "Manage templates (root; acts on <data dir>/sbx.db and the template cache, also while the "
      "daemon runs)");
  tmpl->require_subcommand(1);
  RegisterTemplatePullVerb(tmpl, g, verbs);
  RegisterTemplateDebianVerb(tmpl, g, verbs);

  auto af = std::make_shared<TemplateFlags>();
  CLI::App* add = tmpl->add_subcommand(
      "add", "Register a rootfs directory (copied) or tarball (unpacked) under a name");
  add->add_option("name", af->name, "Template name: [a-z0-9][a-z0-9._-]* [:TAG]")->required();
  add->add_option("path", af->path, "A rootfs directory or .tar[.gz|.zst|.xz|.bz2] / .tgz")
      ->required();
  add->add_option("--template-cache-size", af->cache_size,
                  "Bound of the template cache, e.g. 20G (default: what sbx serve uses)");
  verbs.Add(add, [af, &g] {
    int64_t bound = 0;
    if (!af->cache_size.empty()) {
      auto n = ParseSize(af->cache_size);
      if (!n.ok() || *n <= 0)
        return Fail(Status::Error("--template-cache-size: expected a size such as 20G, got '" +
                                  af->cache_size + "'"));
      bound = *n;
    }
    auto st = OpenTemplateStore(g);
    if (!st.ok()) return Fail(st.status());
    storage::TemplateStore ts = CliTemplateStore(g.data_dir, bound);
    bool tty = ::isatty(STDERR_FILENO) != 0;
    auto progress = [&](int64_t bytes) {
      std::fprintf(stderr, "%ssbx: %s: unpacked %s%s", tty ? "\r" : "", af->name.c_str(),
                   FormatSize(bytes).c_str(), tty ? "   " : "\n");
    };
    auto t = storage::AddTemplate(ts, **st, af->name, af->path, progress);
    if (tty) std::fprintf(stderr, "\n");
    if (!t.ok()) return Fail(t.status());
    std::printf("%s\n", t->name.c_str());
    std::fprintf(stderr, "sbx: added template %s (%s, %s)\n", t->name.c_str(), t->kind.c_str(),
                 FormatSize(t->size_bytes).c_str());
    return 0;
  });

  auto lf = std::make_shared<TemplateFlags>();
  CLI::App* ls = tmpl->add_subcommand("ls", "List templates and their aliases");
  ls->alias("list");
  ls->add_flag("--json", lf->json, "Print JSON");
  verbs.Add(ls, [lf, &g] {
    auto st = OpenTemplateStore(g);
    if (!st.ok()) return Fail(st.status());
    auto all = (*st)->ListTemplates();
    if (!all.ok()) return Fail(all.status());
    std::map<std::string, std::vector<std::string>> aliases;
    for (const auto& t : *all)
      if (t.kind == store::kTemplateAlias) aliases[t.alias_of].push_back(t.name);
    json items = json::array();
    for (const auto& t : *all) {
      if (t.kind == store::kTemplateAlias) continue;
      items.push_back({{"name", t.name},
                       {"kind", t.kind},
                       {"source", t.source},
                       {"size_bytes", t.size_bytes},
                       {"layers", t.layers},
                       {"runtime", t.runtime},
                       {"aliases", aliases[t.name]}});
    }
    if (lf->json) {
      std::printf("%s\n", json{{"templates", items}}.dump(2).c_str());
      return 0;
    }
    std::vector<std::vector<std::string>> rows = {
        {"NAME", "KIND", "SIZE", "RUNTIME", "SOURCE", "ALIASES"}};
    for (const auto& t : items) {
      std::string a;
      for (const auto& n : t["aliases"]) a += (a.empty() ? "" : ",") + n.get<std::string>();
      int64_t size = t["size_bytes"].get<int64_t>();
      rows.push_back(
          {t["name"].get<std::string>(), t["kind"].get<std::string>(),
           size > 0 ? FormatSize(size) : "-",
           t["runtime"].get<std::string>().empty() ? "-" : t["runtime"].get<std::string>(),
           t["source"].get<std::string>(), a.empty() ? "-" : a});
    }
    std::vector<size_t> width(rows[0].size(), 0);
    for (const auto& r : rows)
      for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
    for (const auto& r : rows) {
      std::string line;
      for (size_t i = 0; i < r.size(); ++i) {
        line += r[i];
        if (i + 1 < r.size()) line.append(width[i] - r[i].size() + 2, ' ');
      }
      std::printf("%s\n", line.c_str());
    }
    return 0;
  });

  auto inf = std::make_shared<TemplateFlags>();
  CLI::App* imp = tmpl->add_subcommand(
      "import", "Register an OCI image layout directory or a docker-archive (docker save) tarball");
  imp->add_option("name", inf->name, "Template name: [a-z0-9][a-z0-9._-]* [:TAG]")->required();
  imp->add_option("path", inf->path, "An OCI image layout directory or a docker save tarball")
      ->required();
  imp->add_option("--ref", inf->ref,
                  "Which image: an OCI layout's ref.name annotation or a docker-archive's tag "
                  "(needed when it holds several)");
  imp->add_flag("--replace", inf->replace, "Replace a template of that name");
  imp->add_option("--template-cache-size", inf->cache_size,
                  "Bound of the template cache, e.g. 20G (default: what sbx serve uses)");
  verbs.Add(imp, [inf, &g] {
    int64_t bound = BoundFlag(inf->cache_size);
    if (bound < 0)
      return Fail(Status::Error("--template-cache-size: expected a size such as 20G, got '" +
                                inf->cache_size + "'"));
    auto st = OpenTemplateStore(g);
    if (!st.ok()) return Fail(st.status());
    storage::TemplateStore ts = CliTemplateStore(g.data_dir, bound);
    LayerProgress progress;
    auto t = storage::ImportImage(ts, **st, inf->name, inf->path, inf->ref, inf->replace,
                                  [&](const storage::Progress& p) { progress(p); });
    progress.Done();
    if (!t.ok()) return Fail(t.status());
    std::printf("%s\n", t->name.c_str());
    std::fprintf(stderr, "sbx: imported template %s (%zu layers, %s)\n", t->name.c_str(),
                 t->layers.size(), FormatSize(t->size_bytes).c_str());
    return 0;
  });

  auto inspf = std::make_shared<TemplateFlags>();
  CLI::App* inspect =
      tmpl->add_subcommand("inspect", "Print a template's layers and config as JSON");
  inspect->add_option("name", inspf->name, "Template name")->required();
  verbs.Add(inspect, [inspf, &g] {
    auto st = OpenTemplateStore(g);
    if (!st.ok()) return Fail(st.status());
    auto rec = (*st)->GetTemplate(inspf->name);
    if (!rec.ok()) return Fail(rec.status());
    if (!*rec) return Fail(Status::Error("no template " + inspf->name, ENOENT));
    json out = {{"name", (*rec)->name},
                {"kind", (*rec)->kind},
                {"source", (*rec)->source},
                {"size_bytes", (*rec)->size_bytes},
                {"created_at", (*rec)->created_at},
                {"last_used_at", (*rec)->last_used_at}};
    auto target = *rec;
    if ((*rec)->kind == store::kTemplateAlias) {
      out["alias_of"] = (*rec)->alias_of;
      auto t = (*st)->GetTemplate((*rec)->alias_of);
      if (!t.ok()) return Fail(t.status());
      if (*t) target = *t;
    }
    json layers = json::array();
    for (const auto& id : target->layers) {
      auto l = (*st)->GetLayer(id);
      json item = {{"id", id}};
      if (l.ok() && *l) item["size_bytes"] = (*l)->size_bytes;
      layers.push_back(item);
    }
    out["layers"] = layers;
    auto cfg = storage::ImageConfigFromJson(target->config);
    if (!cfg.ok()) return Fail(cfg.status());
    out["config"] = json::parse(storage::ImageConfigToJson(*cfg));
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  });

  CLI::App* gc = tmpl->add_subcommand(
      "gc", "Remove every layer no template uses and nothing running holds; print what it freed");
  verbs.Add(gc, [&g] {
    auto st = OpenTemplateStore(g);
    if (!st.ok()) return Fail(st.status());
    auto removed = storage::GcLayers(CliTemplateStore(g.data_dir, 0), **st);
    if (!removed.ok()) return Fail(removed.status());
    // A daemon may be running: only the upload temp files of dead writers go.
    (void)sandbox::TemplateBuilds::SweepUploads(g.data_dir, false);
    int64_t freed = 0;
    for (const auto& l : *removed) {
      std::printf("%s\t%s\n", l.id.c_str(), FormatSize(l.size_bytes).c_str());
      freed += l.size_bytes;
    }
    std::fprintf(stderr, "sbx: removed %zu layers, freed %s\n", removed->size(),
                 FormatSize(freed).c_str());
    return 0;
  });

  auto rtf = std::make_shared<TemplateFlags>();
  CLI::App* rt = tmpl->add_subcommand(
      "runtime",
      "Set what a template's sandboxes run under (native, runc, gvisor, vm; default: the "
      "daemon's); a create names another only with a key that may (sbx key create --runtime)");
  rt->add_option("name", rtf->name, "Template name (not an alias: its template's counts)")
      ->required();
  rt->add_option("runtime", rtf->runtime, "native, runc, gvisor, vm, or default")->required();
  verbs.Add(rt, [rtf, &g] {
    std::string runtime = rtf->runtime == "default" ? "" : rtf->runtime;
    if (!runtime.empty() &&
        std::find(std::begin(runtime::kRuntimeNames), std::end(runtime::kRuntimeNames), runtime) ==
            std::end(runtime::kRuntimeNames))
      return Fail(runtime::UnknownRuntime(runtime));
    auto st = OpenTemplateStore(g);
    if (!st.ok()) return Fail(st.status());
    if (Status s = (*st)->SetTemplateRuntime(rtf->name, runtime); !s.ok()) return Fail(s);
    std::printf("%s\n", rtf->name.c_str());
    std::fprintf(stderr,
                 "sbx: template %s runs under %s (new sandboxes; `sbx runtimes` says "
                 "whether this host has it)\n",
                 rtf->name.c_str(), runtime.empty() ? "the daemon's default" : runtime.c_str());
    return 0;
  });

  auto rf = std::make_shared<TemplateFlags>();
  CLI::App* rm = tmpl->add_subcommand(
      "rm", "Unregister a template (live sandboxes keep its layers until they end)");
  rm->add_option("name", rf->name, "Template name")->required();
  verbs.Add(rm, [rf, &g] {
    auto st = OpenTemplateStore(g);
    if (!st.ok()) return Fail(st.status());
    Status s = storage::RemoveTemplate(CliTemplateStore(g.data_dir, 0), **st, rf->name);
    if (!s.ok()) return Fail(s);
    std::printf("%s\n", rf->name.c_str());
    return 0;
  });
}

}  // namespace sbx::cli

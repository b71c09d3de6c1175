#include "cli/template.h"

#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/units.h"
#include "common/fd.h"
#include "common/fs.h"
#include "store/store.h"

namespace sbx::cli {
namespace {

using nlohmann::json;

std::string CacheBytesFile(const storage::TemplateStore& ts) { return ts.dir + "/cache-bytes"; }

std::string HumanBytes(int64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

Result<std::unique_ptr<store::Store>> OpenTemplateStore(const GlobalOptions& g) {
  if (::geteuid() != 0)
    return Status::Error(
        "sbx template manages the daemon's template cache and store directly and needs root");
  auto st = store::Store::Open(g.data_dir + "/" + store::kDbFileName);
  if (!st.ok()) return st.status().Wrap("store");
  return st;
}

struct TemplateFlags {
  std::string name, path, cache_size;
  bool json = false;
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
                   HumanBytes(bytes).c_str(), tty ? "   " : "\n");
    };
    auto t = storage::AddTemplate(ts, **st, af->name, af->path, progress);
    if (tty) std::fprintf(stderr, "\n");
    if (!t.ok()) return Fail(t.status());
    std::printf("%s\n", t->name.c_str());
    std::fprintf(stderr, "sbx: added template %s (%s, %s)\n", t->name.c_str(), t->kind.c_str(),
                 HumanBytes(t->size_bytes).c_str());
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
                       {"aliases", aliases[t.name]}});
    }
    if (lf->json) {
      std::printf("%s\n", json{{"templates", items}}.dump(2).c_str());
      return 0;
    }
    std::vector<std::vector<std::string>> rows = {{"NAME", "KIND", "SIZE", "SOURCE", "ALIASES"}};
    for (const auto& t : items) {
      std::string a;
      for (const auto& n : t["aliases"]) a += (a.empty() ? "" : ",") + n.get<std::string>();
      int64_t size = t["size_bytes"].get<int64_t>();
      rows.push_back({t["name"].get<std::string>(), t["kind"].get<std::string>(),
                      size > 0 ? HumanBytes(size) : "-", t["source"].get<std::string>(),
                      a.empty() ? "-" : a});
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

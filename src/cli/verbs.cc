#include "cli/verbs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <set>

#include "cli/net.h"
#include "cli/range_flags.h"
#include "cli/units.h"
#include "common/clock.h"
#include "common/fd.h"
#include "runtime/runtime.h"
#include "store/store.h"

namespace sbx::cli {
namespace {

using nlohmann::json;

// ---- output ----

// Left-aligned columns separated by two spaces, like docker ps.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Row(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print() const {
    std::vector<size_t> width;
    for (const auto& r : rows_)
      for (size_t i = 0; i < r.size(); ++i) {
        if (width.size() <= i) width.push_back(0);
        width[i] = std::max(width[i], r[i].size());
      }
    for (const auto& r : rows_) {
      std::string line;
      for (size_t i = 0; i < r.size(); ++i) {
        line += r[i];
        if (i + 1 < r.size()) line.append(width[i] - r[i].size() + 2, ' ');
      }
      std::printf("%s\n", line.c_str());
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

void PrintJson(const json& j) { std::printf("%s\n", j.dump(2).c_str()); }

// "2024-05-01T12:00:03.123Z" (the API's times) or "...Z" / "+HH:MM" offsets -> ms since the epoch.
Result<int64_t> ParseTime(const std::string& text) {
  tm t{};
  int ms = 0;
  const char* rest = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &t);
  if (rest == nullptr) return Status::Error("expected an RFC 3339 time, got '" + text + "'");
  if (*rest == '.') {
    ++rest;
    int digits = 0;
    while (*rest >= '0' && *rest <= '9') {
      if (digits++ < 3) ms = ms * 10 + (*rest - '0');
      ++rest;
    }
    while (digits++ < 3) ms *= 10;
  }
  int64_t offset_s = 0;
  if (*rest == '+' || *rest == '-') {
    int h = 0, m = 0;
    if (std::sscanf(rest + 1, "%d:%d", &h, &m) != 2)
      return Status::Error("bad time zone offset in '" + text + "'");
    offset_s = (*rest == '+' ? 1 : -1) * (h * 3600 + m * 60);
  } else if (*rest != 'Z' && *rest != 'z' && *rest != '\0') {
    return Status::Error("expected an RFC 3339 time, got '" + text + "'");
  }
  return (static_cast<int64_t>(timegm(&t)) - offset_s) * 1000 + ms;
}

// "3m ago", "in 4m" from an API time; "-" when there is none.
std::string Relative(const json& time) {
  if (!time.is_string() || time.get<std::string>().empty()) return "-";
  auto ms = ParseTime(time.get<std::string>());
  if (!ms.ok()) return time.get<std::string>();
  int64_t d = (*ms - NowMs()) / 1000;
  bool future = d > 0;
  int64_t a = future ? d : -d;
  std::string n = a < 60      ? std::to_string(a) + "s"
                  : a < 3600  ? std::to_string(a / 60) + "m"
                  : a < 86400 ? std::to_string(a / 3600) + "h"
                              : std::to_string(a / 86400) + "d";
  return future ? "in " + n : n + " ago";
}

std::string Pairs(const json& obj, size_t max = 60) {
  std::string out;
  if (!obj.is_object()) return "";
  for (const auto& [k, v] : obj.items()) {
    if (!out.empty()) out += ",";
    out += k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
  }
  if (out.size() > max) out = out.substr(0, max - 3) + "...";
  return out;
}

std::string Str(const json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

// ---- verbs on sandboxes ----

const std::vector<std::string> kLiveStates = {store::kStateCreating, store::kStateRunning,
                                              store::kStatePaused};

struct CreateFlags {
  ConnectionFlags conn;
  std::string template_name, memory, cpus, pids, disk, timeout, on_timeout, idempotency_key,
      egress_mbps, runtime;
  std::vector<std::string> env, metadata, net;
};

Result<json> CreateBody(const CreateFlags& f) {
  json body = json::object();
  if (!f.template_name.empty()) body["template"] = f.template_name;
  if (!f.runtime.empty()) body["runtime"] = f.runtime;
  json limits = json::object();
  if (!f.memory.empty()) {
    auto v = ParseSize(f.memory);
    if (!v.ok()) return v.status().Wrap("--memory");
    limits["memory_bytes"] = *v;
  }
  if (!f.disk.empty()) {
    auto v = ParseSize(f.disk);
    if (!v.ok()) return v.status().Wrap("--disk");
    limits["disk_bytes"] = *v;
  }
  if (!f.cpus.empty()) {
    char* end = nullptr;
    double c = std::strtod(f.cpus.c_str(), &end);
    if (end == f.cpus.c_str() || *end != '\0' || !(c > 0))
      return Status::Error("--cpus: a positive number of cores, got '" + f.cpus + "'");
    limits["cpus"] = c;
  }
  if (!f.pids.empty()) {
    char* end = nullptr;
    long long p = std::strtoll(f.pids.c_str(), &end, 10);
    if (end == f.pids.c_str() || *end != '\0' || p < 1)
      return Status::Error("--pids: a whole number from 1, got '" + f.pids + "'");
    limits["pids"] = p;
  }
  if (!f.egress_mbps.empty()) {
    char* end = nullptr;
    double m = std::strtod(f.egress_mbps.c_str(), &end);
    if (end == f.egress_mbps.c_str() || *end != '\0' || !(m > 0))
      return Status::Error("--egress-mbps: a positive number of Mbit/s, got '" + f.egress_mbps +
                           "'");
    limits["egress_mbps"] = m;
  }
  if (!limits.empty()) body["limits"] = limits;
  if (!f.timeout.empty()) {
    auto v = ParseDuration(f.timeout);
    if (!v.ok()) return v.status().Wrap("--timeout");
    if (*v <= 0) return Status::Error("--timeout: must be positive");
    body["timeout"] = static_cast<double>(*v) / 1000.0;
  }
  if (!f.on_timeout.empty()) body["on_timeout"] = f.on_timeout;
  auto env = ParsePairs(f.env, "--env");
  if (!env.ok()) return env.status();
  for (const auto& [k, v] : *env) body["env"][k] = v;
  auto md = ParsePairs(f.metadata, "--metadata");
  if (!md.ok()) return md.status();
  for (const auto& [k, v] : *md) body["metadata"][k] = v;
  if (!f.net.empty()) {
    auto net = ParseNetFlags(f.net);
    if (!net.ok()) return net.status();
    body["network"] = *net;
  }
  return body;
}

void RegisterCreate(CLI::App& app, const GlobalOptions& g, ClientVerbs& verbs) {
  auto f = std::make_shared<CreateFlags>();
  CLI::App* v = app.add_subcommand("create", "Create a sandbox and print its id");
  v->add_option("--template", f->template_name,
                "Template: host (default), a rootfs dir or tarball");
  v->add_option("--runtime", f->runtime,
                "Isolation: native, runc, gvisor or vm (default: the template's; operator keys, "
                "or keys made with --runtime)");
  v->add_option("--memory", f->memory, "Memory limit, e.g. 512M or 2G");
  v->add_option("--cpus", f->cpus, "CPU quota in cores, e.g. 0.5 or 2");
  v->add_option("--pids", f->pids, "Maximum number of processes and threads");
  v->add_option("--disk", f->disk, "Size of the writable layer, e.g. 1G");
  v->add_option("--egress-mbps", f->egress_mbps,
                "Bandwidth through the egress proxy, Mbit/s each way, e.g. 8 (default: no limit)");
  v->add_option("--timeout", f->timeout, "Lifetime before --on-timeout applies, e.g. 30m, 2h");
  v->add_option("--on-timeout", f->on_timeout, "What the timeout does: kill (default) or pause")
      ->check(CLI::IsMember({"kill", "pause"}));
  v->add_option("-e,--env", f->env, "Environment variable K=V for every command (repeatable)");
  v->add_option("--metadata", f->metadata, "Label K=V, for ls filters (repeatable)");
  v->add_option("--idempotency-key", f->idempotency_key,
                "Retrying with the same key returns the same sandbox");
  v->add_option("--net", f->net,
                "Network: none (default), open, allow=pypi.org,*.npmjs.org, deny=CIDR "
                "(repeatable; deny= with open)");
  AddConnectionFlags(v, &f->conn);
  verbs.Add(v, [f, &g] {
    auto body = CreateBody(*f);
    if (!body.ok()) return Fail(body.status());
    auto c = MakeClient(g, f->conn);
    if (!c.ok()) return Fail(c.status());
    http::ClientHeaders h;
    if (!f->idempotency_key.empty()) h.emplace_back("Idempotency-Key", f->idempotency_key);
    auto r = c->Call("POST", "/v1/sandboxes", *body, h);
    if (!r.ok()) return Fail(r.status());
    if (f->conn.json)
      PrintJson(*r);
    else
      std::printf("%s\n", Str(*r, "id").c_str());
    return 0;
  });
}

struct LsFlags {
  ConnectionFlags conn;
  std::vector<std::string> states, metadata;
  int limit = 0;
  bool all = false;
};

void RegisterLs(CLI::App& app, const GlobalOptions& g, ClientVerbs& verbs) {
  auto f = std::make_shared<LsFlags>();
  CLI::App* v = app.add_subcommand(
      "ls", "List live sandboxes (creating, running, paused), newest first; --all for every one");
  v->alias("list");
  v->add_option("--state", f->states,
                "Only in this state, e.g. running, paused, killed (repeatable)");
  v->add_option("--metadata", f->metadata, "Only with this label K=V (repeatable)");
  v->add_option("--limit", f->limit,
                "At most this many, 1 to 1000 (default: every one, fetched 100 at a time)")
      ->check(CLI::Range(1, 1000));
  v->add_flag("-a,--all", f->all,
              "Also ended sandboxes (killed, expired, failed), like docker ps -a");
  AddConnectionFlags(v, &f->conn);
  verbs.Add(v, [f, &g] {
    auto md = ParsePairs(f->metadata, "--metadata");
    if (!md.ok()) return Fail(md.status());
    auto c = MakeClient(g, f->conn);
    if (!c.ok()) return Fail(c.status());
    std::string query;
    // As docker ps: what still lives, unless asked for more.
    const std::vector<std::string>& states = !f->states.empty() || f->all ? f->states : kLiveStates;
    for (const auto& s : states) query += "&state=" + Q(s);
    for (const auto& [k, val] : *md) query += "&metadata." + Q(k) + "=" + Q(val);
    if (f->limit > 0) query += "&limit=" + std::to_string(f->limit);
    json all = json::array();
    json next = nullptr;
    std::string cursor;
    do {
      std::string target = "/v1/sandboxes?" + query.substr(query.empty() ? 0 : 1);
      if (!cursor.empty())
        target += (query.empty() ? "" : "&") + std::string("cursor=") + Q(cursor);
      auto r = c->Call("GET", target);
      if (!r.ok()) return Fail(r.status());
      for (auto& s : (*r)["sandboxes"]) all.push_back(std::move(s));
      next = (*r)["next_cursor"];
      cursor = next.is_string() ? next.get<std::string>() : "";
    } while (f->limit == 0 && !cursor.empty());
    if (!cursor.empty())
      std::fprintf(stderr, "sbx: more sandboxes: raise --limit, or leave it out to list all\n");
    if (f->conn.json) {
      PrintJson({{"sandboxes", all}, {"next_cursor", next}});
      return 0;
    }
    // An operator key lists every key's sandboxes: then say whose each one is.
    std::set<std::string> owners;
    for (const auto& s : all) owners.insert(Str(s, "owner_key_id"));
    std::vector<std::string> header = {"ID",      "STATE",   "TEMPLATE", "CREATED",
                                       "EXPIRES", "NETWORK", "METADATA"};
    if (owners.size() > 1) header.push_back("KEY");
    Table t(header);
    for (const auto& s : all) {
      std::vector<std::string> row = {Str(s, "id"),
                                      Str(s, "state"),
                                      Str(s, "template"),
                                      Relative(s["created_at"]),
                                      Relative(s["expires_at"]),
                                      s.contains("network") ? Str(s["network"], "mode") : "none",
                                      Pairs(s["metadata"])};
      if (owners.size() > 1) row.push_back(Str(s, "owner_key_id"));
      t.Row(row);
    }
    t.Print();
    return 0;
  });
}

// A verb that takes one sandbox id and makes one call.
struct IdFlags {
  ConnectionFlags conn;
  std::string id;
  std::string arg;
  bool no_memory = false;  // pause --no-memory
};

void RegisterInspect(CLI::App& app, const GlobalOptions& g, ClientVerbs& verbs) {
  auto f = std::make_shared<IdFlags>();
  CLI::App* v = app.add_subcommand("inspect", "Show a sandbox as JSON (limits, state, usage)");
  v->add_option("id", f->id, "Sandbox id")->required();
  AddConnectionFlags(v, &f->conn, false);
  verbs.Add(v, [f, &g] {
    auto c = MakeClient(g, f->conn);
    if (!c.ok()) return Fail(c.status());
    auto r = c->Call("GET", SandboxPath(f->id));
    if (!r.ok()) return Fail(r.status());
    PrintJson(*r);
    return 0;
  });
}

void RegisterLifecycle(CLI::App& app, const GlobalOptions& g, ClientVerbs& verbs) {
  struct Action {
    const char* name;
    const char* help;
    const char* method;
    const char* suffix;
  };
  for (const Action& a : {Action{"kill", "Kill a sandbox and remove what it made", "DELETE", ""},
                          Action{"pause", "Freeze every process of a sandbox", "POST", "/pause"},
                          Action{"resume", "Thaw a paused sandbox", "POST", "/resume"}}) {
    auto f = std::make_shared<IdFlags>();
    CLI::App* v = app.add_subcommand(a.name, a.help);
    v->add_option("id", f->id, "Sandbox id")->required();
    if (std::string(a.name) == "pause")
      v->add_flag("--no-memory", f->no_memory,
                  "Keep only its files: its processes end, resume boots it again from them");
    AddConnectionFlags(v, &f->conn);
    verbs.Add(v, [f, &g, a] {
      auto c = MakeClient(g, f->conn);
      if (!c.ok()) return Fail(c.status());
      auto r = f->no_memory
                   ? c->Call(a.method, SandboxPath(f->id) + a.suffix, json{{"memory", false}})
                   : c->Call(a.method, SandboxPath(f->id) + a.suffix);
      if (!r.ok()) return Fail(r.status());
      if (f->conn.json && !r->is_null())
        PrintJson(*r);
      else if (!f->conn.json)
        std::printf("%s\n", f->id.c_str());
      return 0;
    });
  }

  auto f = std::make_shared<IdFlags>();
  CLI::App* v = app.add_subcommand(
      "timeout", "Set a sandbox's remaining lifetime (from now); its --on-timeout then applies");
  v->add_option("id", f->id, "Sandbox id")->required();
  v->add_option("duration", f->arg, "e.g. 30s, 10m, 2h")->required();
  AddConnectionFlags(v, &f->conn);
  verbs.Add(v, [f, &g] {
    auto ms = ParseDuration(f->arg);
    if (!ms.ok()) return Fail(ms.status().Wrap("duration"));
    if (*ms <= 0) return Fail(Status::Error("duration: must be positive"));
    auto c = MakeClient(g, f->conn);
    if (!c.ok()) return Fail(c.status());
    auto r = c->Call("POST", SandboxPath(f->id) + "/timeout",
                     {{"timeout", static_cast<double>(*ms) / 1000.0}});
    if (!r.ok()) return Fail(r.status());
    if (f->conn.json)
      PrintJson(*r);
    else
      std::printf("%s expires %s\n", f->id.c_str(), Relative((*r)["expires_at"]).c_str());
    return 0;
  });
}

void RegisterPs(CLI::App& app, const GlobalOptions& g, ClientVerbs& verbs) {
  auto f = std::make_shared<IdFlags>();
  CLI::App* v = app.add_subcommand("ps", "List a sandbox's commands, running and finished");
  v->add_option("id", f->id, "Sandbox id")->required();
  AddConnectionFlags(v, &f->conn);
  verbs.Add(v, [f, &g] {
    auto c = MakeClient(g, f->conn);
    if (!c.ok()) return Fail(c.status());
    auto r = c->Call("GET", SandboxPath(f->id) + "/commands");
    if (!r.ok()) return Fail(r.status());
    if (f->conn.json) {
      PrintJson(*r);
      return 0;
    }
    Table t({"PID", "STATUS", "STARTED", "TAG", "COMMAND"});
    for (const auto& p : (*r)["commands"]) {
      std::string status = "running";
      if (!p.value("running", false)) {
        status = p.contains("signal") ? "signal " + p["signal"].dump()
                                      : "exited " + p.value("exit_code", json(-1)).dump();
      }
      if (p.value("pty", false)) status += " (pty)";
      std::string cmd;
      for (const auto& a : p["argv"]) cmd += (cmd.empty() ? "" : " ") + a.get<std::string>();
      if (cmd.size() > 60) cmd = cmd.substr(0, 57) + "...";
      t.Row({p["pid"].dump(), status, Relative(p["started_at"]), Str(p, "tag"), cmd});
    }
    t.Print();
    return 0;
  });
}

struct AuditFlags {
  ConnectionFlags conn;
  std::string sandbox, type, since;
  int limit = 0;
  int64_t before = 0;
};

// "10m" (that long ago) or an RFC 3339 time -> ms since the epoch.
Result<int64_t> ParseSince(const std::string& text) {
  if (text.find('T') != std::string::npos) return ParseTime(text);
  auto d = ParseDuration(text);
  if (!d.ok()) return Status::Error("--since: a duration ago (10m, 2h) or an RFC 3339 time");
  return NowMs() - *d;
}

void RegisterAudit(CLI::App& app, const GlobalOptions& g, ClientVerbs& verbs) {
  auto f = std::make_shared<AuditFlags>();
  CLI::App* v = app.add_subcommand(
      "audit", "Show audit events (lifecycle, commands, file writes), newest first");
  v->add_option("--sandbox", f->sandbox, "Only this sandbox's events");
  v->add_option("--type", f->type, "Only this type, e.g. sandbox.create, command.start");
  v->add_option("--since", f->since, "Only newer: a duration ago (10m, 2h) or an RFC 3339 time");
  v->add_option("--limit", f->limit, "At most this many (default 100)")
      ->check(CLI::Range(1, 10000));
  v->add_option("--before", f->before,
                "Only older than this SEQ: the next page, as the previous one says")
      ->check(CLI::PositiveNumber);
  AddConnectionFlags(v, &f->conn);
  verbs.Add(v, [f, &g] {
    std::string query = "&order=desc";
    if (f->before > 0) query += "&before=" + std::to_string(f->before);
    if (!f->sandbox.empty()) query += "&sandbox=" + Q(f->sandbox);
    if (!f->type.empty()) query += "&type=" + Q(f->type);
    if (!f->since.empty()) {
      auto ms = ParseSince(f->since);
      if (!ms.ok()) return Fail(ms.status());
      query += "&since=" + std::to_string(*ms);
    }
    if (f->limit > 0) query += "&limit=" + std::to_string(f->limit);
    auto c = MakeClient(g, f->conn);
    if (!c.ok()) return Fail(c.status());
    auto r = c->Call("GET", "/v1/audit?" + query.substr(1));
    if (!r.ok()) return Fail(r.status());
    // A full page may have older events behind it: say how to get them (on stderr, so that
    // scripts reading --json or the table are not disturbed).
    const json& events = (*r)["events"];
    size_t page = f->limit > 0 ? static_cast<size_t>(f->limit) : 100;
    if (events.is_array() && events.size() == page && events.back().contains("seq"))
      std::fprintf(stderr, "sbx: older events: repeat with --before %s\n",
                   events.back()["seq"].dump().c_str());
    if (f->conn.json) {
      PrintJson(*r);
      return 0;
    }
    Table t({"SEQ", "TIME", "SANDBOX", "TYPE", "DETAIL"});
    for (const auto& e : (*r)["events"]) {
      std::string time = Str(e, "time");
      if (time.size() > 19) time = time.substr(0, 19) + "Z";
      std::string sandbox = Str(e, "sandbox_id");
      t.Row({e["seq"].dump(), time, sandbox.empty() ? "-" : sandbox, Str(e, "type"),
             Pairs(e["detail"], 80)});
    }
    t.Print();
    return 0;
  });
}

// ---- API keys: on the store directly ----

struct KeyFlags {
  RangeFlags ranges;
  std::string name, id;
  int64_t max_sandboxes = 0;
  std::string max_saved;         // a size
  int64_t max_snapshots = 1000;  // sbx key create's default
  double rate = 0;
  bool json = false;
  bool is_operator = false;
  int64_t wait_s = 30;
  std::vector<std::string> runtimes;
};

Result<std::unique_ptr<store::Store>> OpenStore(const GlobalOptions& g) {
  if (::geteuid() != 0)
    return Status::Error("sbx key manages the daemon's store directly and needs root");
  std::string path = g.data_dir + "/" + store::kDbFileName;
  if (::access(path.c_str(), F_OK) != 0)
    return Status::Error("no store at " + path + " (start `sbx serve` with this --data-dir first)");
  auto st = store::Store::Open(path);
  if (!st.ok()) return st.status().Wrap("store");
  return st;
}

json RangesJson(const store::LimitRanges& r);

json KeyJson(const store::ApiKeyRecord& k) {
  auto iso = [](int64_t ms) -> json {
    if (ms <= 0) return nullptr;
    time_t s = static_cast<time_t>(ms / 1000);
    tm t{};
    gmtime_r(&s, &t);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &t);
    return std::string(buf);
  };
  return {{"id", k.id},
          {"name", k.name},
          {"prefix", k.prefix},
          {"created_at", iso(k.created_at)},
          {"revoked_at", iso(k.revoked_at)},
          {"max_sandboxes", k.max_sandboxes},
          {"max_saved_bytes", k.max_saved_bytes},
          {"max_snapshots", k.max_snapshots},
          {"creates_per_second", k.creates_per_second},
          {"operator", k.is_operator},
          {"runtimes", k.runtimes},
          {"limits", RangesJson(k.ranges)}};
}

// A key's bounds, null where it takes the daemon's.
json RangesJson(const store::LimitRanges& r) {
  auto v = [](auto x) -> json {
    if (x == 0) return nullptr;
    return x;
  };
  return {{"min_memory_bytes", v(r.min_memory_bytes)},
          {"max_memory_bytes", v(r.max_memory_bytes)},
          {"min_cpus", v(r.min_cpus)},
          {"max_cpus", v(r.max_cpus)},
          {"min_pids", v(r.min_pids)},
          {"max_pids", v(r.max_pids)},
          {"min_disk_bytes", v(r.min_disk_bytes)},
          {"max_disk_bytes", v(r.max_disk_bytes)},
          {"min_timeout_ms", v(r.min_timeout_ms)},
          {"max_timeout_ms", v(r.max_timeout_ms)}};
}

// "memory ..2 GiB, timeout 30s..1h": the bounds a key sets, "-" for none.
std::string RangesText(const store::LimitRanges& r) {
  auto number = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", x);
    return std::string(buf);
  };
  auto duration = [](int64_t ms) {
    if (ms % 3'600'000 == 0) return std::to_string(ms / 3'600'000) + "h";
    if (ms % 60'000 == 0) return std::to_string(ms / 60'000) + "m";
    if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
    return std::to_string(ms) + "ms";
  };
  std::string out;
  auto add = [&](const char* what, auto min, auto max, auto show) {
    if (min == 0 && max == 0) return;
    out += (out.empty() ? "" : ", ") + std::string(what) + " " + (min ? show(min) : "") + ".." +
           (max ? show(max) : "");
  };
  add("memory", r.min_memory_bytes, r.max_memory_bytes, FormatSize);
  add("cpus", r.min_cpus, r.max_cpus, number);
  add("pids", r.min_pids, r.max_pids, [](int64_t n) { return std::to_string(n); });
  add("disk", r.min_disk_bytes, r.max_disk_bytes, FormatSize);
  add("timeout", r.min_timeout_ms, r.max_timeout_ms, duration);
  return out.empty() ? "-" : out;
}

// True when an `sbx serve` holds this data directory (its lock is taken).
bool DaemonRunning(const GlobalOptions& g) {
  UniqueFd lock(::open((g.data_dir + "/serve.lock").c_str(), O_RDWR | O_CLOEXEC));
  if (!lock) return false;
  if (::flock(lock.get(), LOCK_SH | LOCK_NB) == 0) return false;
  return errno == EWOULDBLOCK;
}

void RegisterKey(CLI::App& app, const GlobalOptions& g, ClientVerbs& verbs) {
  CLI::App* key = app.add_subcommand(
      "key", "Manage API keys (root; acts on <data dir>/sbx.db, also while the daemon runs)");
  key->require_subcommand(1);

  auto f = std::make_shared<KeyFlags>();
  CLI::App* create = key->add_subcommand("create", "Create a key and print its secret (once)");
  create->add_option("--name", f->name, "What the key is for")->required();
  create
      ->add_option("--max-sandboxes", f->max_sandboxes,
                   "Concurrent live sandboxes (default 0: unlimited)")
      ->check(CLI::NonNegativeNumber);
  create->add_option("--rate", f->rate, "Creations per second (default 0: unlimited)")
      ->check(CLI::NonNegativeNumber);
  create->add_option("--max-saved", f->max_saved,
                     "Template cache space this key's snapshots, pauses without memory and "
                     "builds may hold, e.g. 20G (default 0: unlimited, the cache's bound only)");
  create
      ->add_option("--max-snapshots", f->max_snapshots,
                   "Snapshots this key may keep at once (0: unlimited; each is a few rows every "
                   "template listing reads)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  create->add_flag("--operator", f->is_operator,
                   "An operator key: may also list, inspect and kill other keys' sandboxes, and "
                   "read /metrics");
  AddRangeFlags(create, f->ranges,
                "for this key's sandboxes (default: the daemon's; never beyond it)");
  create->add_option("--runtime", f->runtimes,
                     "A runtime this key's creates may ask for beside their template's own "
                     "(native, runc, gvisor, vm; repeatable)");
  create->add_flag("--json", f->json, "Print the key and its secret as JSON");
  verbs.Add(create, [f, &g] {
    auto ranges = ParseRangeFlags(f->ranges);
    if (!ranges.ok()) return Fail(Status::Error(ranges.status().what()));
    int64_t max_saved = 0;
    if (!f->max_saved.empty()) {
      auto n = ParseSize(f->max_saved);
      if (!n.ok()) return Fail(n.status().Wrap("--max-saved"));
      max_saved = *n;
    }
    auto st = OpenStore(g);
    if (!st.ok()) return Fail(st.status());
    for (const auto& r : f->runtimes)
      if (std::find(std::begin(runtime::kRuntimeNames), std::end(runtime::kRuntimeNames), r) ==
          std::end(runtime::kRuntimeNames))
        return Fail(runtime::UnknownRuntime(r).Wrap("--runtime"));
    auto k = (*st)->CreateApiKey(f->name, f->max_sandboxes, f->rate, f->is_operator, *ranges,
                                 max_saved, f->max_snapshots);
    if (!k.ok()) return Fail(k.status());
    if (!f->runtimes.empty()) {
      if (Status s = (*st)->SetApiKeyRuntimes(k->record.id, f->runtimes); !s.ok()) {
        (void)(*st)->RevokeApiKey(k->record.id);  // never a key with less than was asked
        return Fail(s);
      }
      k->record.runtimes = f->runtimes;
    }
    if (f->json) {
      json j = KeyJson(k->record);
      j["secret"] = k->secret;
      PrintJson(j);
    } else {
      std::printf("%s\n", k->secret.c_str());
      std::fprintf(stderr, "sbx: created %skey %s '%s'; the secret above is shown only once\n",
                   k->record.is_operator ? "operator " : "", k->record.id.c_str(),
                   k->record.name.c_str());
    }
    return 0;
  });

  auto lf = std::make_shared<KeyFlags>();
  CLI::App* ls = key->add_subcommand("ls", "List keys, revoked ones included");
  ls->alias("list");
  ls->add_flag("--json", lf->json, "Print JSON");
  verbs.Add(ls, [lf, &g] {
    auto st = OpenStore(g);
    if (!st.ok()) return Fail(st.status());
    auto keys = (*st)->ListApiKeys();
    if (!keys.ok()) return Fail(keys.status());
    json all = json::array();
    for (const auto& k : *keys) {
      json j = KeyJson(k);
      auto held = (*st)->LayerBytesOwnedBy(k.id);
      if (!held.ok()) return Fail(held.status());
      j["saved_bytes"] = *held;
      auto snapshots = (*st)->CountSnapshots(k.id);
      if (!snapshots.ok()) return Fail(snapshots.status());
      j["snapshots"] = *snapshots;
      all.push_back(std::move(j));
    }
    if (lf->json) {
      PrintJson({{"keys", all}});
      return 0;
    }
    Table t({"ID", "NAME", "PREFIX", "CREATED", "REVOKED", "MAX SANDBOXES", "RATE", "SAVED",
             "SNAPSHOTS", "OPERATOR", "LIMITS"});
    for (size_t i = 0; i < all.size(); ++i) {
      const json& k = all[i];
      const store::ApiKeyRecord& r = (*keys)[i];
      int64_t saved = k["saved_bytes"];
      t.Row({Str(k, "id"), Str(k, "name"), Str(k, "prefix"), Relative(k["created_at"]),
             Relative(k["revoked_at"]),
             r.max_sandboxes == 0 ? "-" : std::to_string(r.max_sandboxes),
             k["creates_per_second"] == 0 ? "-" : k["creates_per_second"].dump() + "/s",
             (saved == 0 && r.max_saved_bytes == 0 ? "-" : FormatSize(saved)) +
                 (r.max_saved_bytes == 0 ? "" : " of " + FormatSize(r.max_saved_bytes)),
             k["snapshots"].dump() +
                 (r.max_snapshots == 0 ? "" : " of " + std::to_string(r.max_snapshots)),
             k["operator"] == true ? "yes" : "-", RangesText(r.ranges)});
    }
    t.Print();
    return 0;
  });

  auto rf = std::make_shared<KeyFlags>();
  CLI::App* revoke =
      key->add_subcommand("revoke", "Revoke a key for good; the daemon kills its live sandboxes");
  revoke->add_option("id", rf->id, "Key id (key_...)")->required();
  revoke
      ->add_option("--wait", rf->wait_s,
                   "Seconds to wait for the daemon to kill the key's sandboxes (0: do not wait)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  verbs.Add(revoke, [rf, &g] {
    auto st = OpenStore(g);
    if (!st.ok()) return Fail(st.status());
    auto before = (*st)->CountSandboxes(rf->id, kLiveStates);
    if (!before.ok()) return Fail(before.status());
    Status s = (*st)->RevokeApiKey(rf->id);
    if (!s.ok()) {
      if (s.err() == ENOENT) return Fail(Status::Error("no key " + rf->id));
      return Fail(s);
    }
    // The daemon owns the boxes: its manager notices the revocation on its next scan (twice a
    // second) and kills them. Wait for that, within bounds, to say what happened.
    int64_t left = *before;
    bool daemon = DaemonRunning(g);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(rf->wait_s);
    while (left > 0 && daemon && std::chrono::steady_clock::now() < deadline) {
      ::usleep(100 * 1000);
      auto n = (*st)->CountSandboxes(rf->id, kLiveStates);
      if (!n.ok()) return Fail(n.status());
      left = *n;
    }
    int64_t killed = *before - left;
    std::printf("revoked %s; killed %lld live sandbox%s\n", rf->id.c_str(),
                static_cast<long long>(killed), killed == 1 ? "" : "es");
    if (left > 0)
      std::fprintf(stderr, "sbx: %lld sandbox%s of %s still live: %s\n",
                   static_cast<long long>(left), left == 1 ? "" : "es", rf->id.c_str(),
                   daemon ? "the daemon kills them on its next scans"
                          : "no daemon runs on this data directory; it kills them when it starts");
    return 0;
  });
}

}  // namespace

int Fail(const Status& s) {
  std::fprintf(stderr, "sbx: %s\n", s.message().c_str());
  return kExitSbxError;
}

Result<Client> MakeClient(const GlobalOptions& global, const ConnectionFlags& flags) {
  auto c = ResolveConnection(global.data_dir, flags);
  if (!c.ok()) return c.status();
  return Client(std::move(*c));
}

std::string SandboxPath(const std::string& id) { return "/v1/sandboxes/" + Q(id); }

Result<std::vector<std::pair<std::string, std::string>>> ParsePairs(
    const std::vector<std::string>& items, const char* flag) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : items) {
    auto eq = e.find('=');
    if (eq == std::string::npos || eq == 0)
      return Status::Error(std::string(flag) + ": expected K=V, got '" + e + "'");
    out.emplace_back(e.substr(0, eq), e.substr(eq + 1));
  }
  return out;
}

namespace {

// ---- snapshots and forks (docs/api.md "Snapshots", "Forks") ----

struct SnapshotFlags {
  ConnectionFlags conn;
  std::string id, name, sandbox;
  int count = 1;
  std::string timeout;
};

std::string Names(const json& s) {
  std::string out;
  for (const auto& n : s.value("names", json::array()))
    out += (out.empty() ? "" : ",") + n.get<std::string>();
  return out;
}

void RegisterSnapshotVerbs(CLI::App& app, const GlobalOptions& g, ClientVerbs& verbs) {
  CLI::App* snap = app.add_subcommand(
      "snapshot",
      "Snapshot a sandbox's files as a template only this key sees (sbx create --template ID); "
      "ls, rm");
  snap->require_subcommand(0, 1);

  // The subcommands first: Run takes the first verb parsed, and `snapshot` is parsed with them.
  auto lf = std::make_shared<SnapshotFlags>();
  CLI::App* ls = snap->add_subcommand("ls", "List this key's snapshots, newest first");
  ls->alias("list");
  ls->add_option("--sandbox", lf->sandbox, "Only those taken of this sandbox");
  AddConnectionFlags(ls, &lf->conn);
  verbs.Add(ls, [lf, &g] {
    auto c = MakeClient(g, lf->conn);
    if (!c.ok()) return Fail(c.status());
    std::string target = "/v1/snapshots";
    if (!lf->sandbox.empty()) target += "?sandbox=" + Q(lf->sandbox);
    auto r = c->Call("GET", target);
    if (!r.ok()) return Fail(r.status());
    if (lf->conn.json) {
      PrintJson(*r);
      return 0;
    }
    Table t({"ID", "NAMES", "SANDBOX", "SIZE", "CREATED"});
    for (const auto& s : (*r)["snapshots"])
      t.Row({Str(s, "id"), Names(s), Str(s, "sandbox"),
             std::to_string(s.value("size_bytes", int64_t{0}) >> 10) + "K",
             Relative(s["created_at"])});
    t.Print();
    return 0;
  });

  auto rf = std::make_shared<SnapshotFlags>();
  CLI::App* rm = snap->add_subcommand(
      "rm", "Delete a snapshot and its names (sandboxes made from it keep their files)");
  rm->add_option("id", rf->id, "Snapshot id or name")->required();
  AddConnectionFlags(rm, &rf->conn);
  verbs.Add(rm, [rf, &g] {
    auto c = MakeClient(g, rf->conn);
    if (!c.ok()) return Fail(c.status());
    auto r = c->Call("DELETE", "/v1/snapshots/" + Q(rf->id));
    if (!r.ok()) return Fail(r.status());
    if (!rf->conn.json) std::printf("%s\n", rf->id.c_str());
    return 0;
  });

  auto f = std::make_shared<SnapshotFlags>();
  snap->add_option("id", f->id, "Sandbox id");
  snap->add_option("--name", f->name, "Another name for it, e.g. my-env:v2");
  AddConnectionFlags(snap, &f->conn);
  verbs.Add(snap, [f, &g] {
    if (f->id.empty()) return Fail(Status::Error("snapshot: give a sandbox id, or ls or rm"));
    auto c = MakeClient(g, f->conn);
    if (!c.ok()) return Fail(c.status());
    json body = json::object();
    if (!f->name.empty()) body["name"] = f->name;
    std::fprintf(stderr, "sbx: snapshotting %s (its processes are frozen meanwhile)...\n",
                 f->id.c_str());
    auto r = c->Call("POST", SandboxPath(f->id) + "/snapshots", body);
    if (!r.ok()) return Fail(r.status());
    if (f->conn.json)
      PrintJson(*r);
    else
      std::printf("%s\n", Str(*r, "id").c_str());
    return 0;
  });

  auto ff = std::make_shared<SnapshotFlags>();
  CLI::App* fork = app.add_subcommand(
      "fork",
      "New sandboxes from a snapshot of a running one, which keeps running; they get its files "
      "and settings, not its processes");
  fork->add_option("id", ff->id, "Sandbox id")->required();
  fork->add_option("-n,--count", ff->count, "How many, 1 to 100")->check(CLI::Range(1, 100));
  fork->add_option("--timeout", ff->timeout, "Their lifetime, e.g. 30m (default: the source's)");
  AddConnectionFlags(fork, &ff->conn);
  verbs.Add(fork, [ff, &g] {
    json body = {{"count", ff->count}};
    if (!ff->timeout.empty()) {
      auto ms = ParseDuration(ff->timeout);
      if (!ms.ok()) return Fail(ms.status().Wrap("--timeout"));
      if (*ms <= 0) return Fail(Status::Error("--timeout: must be positive"));
      body["timeout"] = static_cast<double>(*ms) / 1000.0;
    }
    auto c = MakeClient(g, ff->conn);
    if (!c.ok()) return Fail(c.status());
    auto r = c->Call("POST", SandboxPath(ff->id) + "/fork", body);
    if (!r.ok()) return Fail(r.status());
    if (ff->conn.json) {
      PrintJson(*r);
      return 0;
    }
    int failed = 0;
    for (const auto& one : (*r)["forks"]) {
      if (one.contains("sandbox")) {
        std::printf("%s\n", Str(one["sandbox"], "id").c_str());
      } else {
        ++failed;
        std::fprintf(stderr, "sbx: a fork failed: %s\n", Str(one["error"], "message").c_str());
      }
    }
    return failed == 0 ? 0 : kExitSbxError;
  });
}

// ---- warm pools (docs/api.md "Warm pools"; operator keys) ----

struct PoolFlags {
  ConnectionFlags conn;
  std::string tmpl;
  int size = 1;
};

void RegisterRuntimes(CLI::App& app, const GlobalOptions& g, ClientVerbs& verbs) {
  auto f = std::make_shared<ConnectionFlags>();
  CLI::App* v = app.add_subcommand(
      "runtimes", "List the runtimes boxes can run under on the daemon's host, and why not");
  AddConnectionFlags(v, f.get());
  verbs.Add(v, [f, &g] {
    auto c = MakeClient(g, *f);
    if (!c.ok()) return Fail(c.status());
    auto r = c->Call("GET", "/v1/runtimes");
    if (!r.ok()) return Fail(r.status());
    if (f->json) {
      PrintJson(*r);
      return 0;
    }
    Table t({"RUNTIME", "AVAILABLE", "WHY NOT", "ACCELERATOR"});
    for (const auto& rt : (*r)["runtimes"]) {
      std::string accel = Str(rt, "accelerator");
      if (!accel.empty() && !Str(rt, "accelerator_reason").empty())
        accel += " (" + Str(rt, "accelerator_reason") + ")";
      t.Row(
          {Str(rt, "name"), rt.value("available", false) ? "yes" : "no", Str(rt, "reason"), accel});
    }
    t.Print();
    return 0;
  });
}

void RegisterPoolVerbs(CLI::App& app, const GlobalOptions& g, ClientVerbs& verbs) {
  CLI::App* pool = app.add_subcommand(
      "pool",
      "Warm pools: boxes of a template made ahead, for creates that answer at once "
      "(operator keys); ls, set, rm");
  pool->require_subcommand(1);

  auto lf = std::make_shared<PoolFlags>();
  CLI::App* ls = pool->add_subcommand("ls", "List the pools and what they hold");
  ls->alias("list");
  AddConnectionFlags(ls, &lf->conn);
  verbs.Add(ls, [lf, &g] {
    auto c = MakeClient(g, lf->conn);
    if (!c.ok()) return Fail(c.status());
    auto r = c->Call("GET", "/v1/pools");
    if (!r.ok()) return Fail(r.status());
    if (lf->conn.json) {
      PrintJson(*r);
      return 0;
    }
    Table t({"TEMPLATE", "SIZE", "READY", "FILLING", "CLAIMS", "MISSES", "MEMORY", "LAST ERROR"});
    for (const auto& p : (*r)["pools"])
      t.Row({Str(p, "template"), std::to_string(p.value("size", 0)),
             std::to_string(p.value("ready", 0)), std::to_string(p.value("filling", 0)),
             std::to_string(p.value("claims", 0)), std::to_string(p.value("misses", 0)),
             std::to_string(p.value("memory_bytes", int64_t{0}) >> 20) + "M",
             Str(p, "last_error")});
    t.Print();
    return 0;
  });

  auto sf = std::make_shared<PoolFlags>();
  CLI::App* set = pool->add_subcommand(
      "set",
      "Keep SIZE boxes of TEMPLATE ready (until the daemon restarts: --pool on sbx serve "
      "keeps one for good)");
  set->add_option("template", sf->tmpl, "Template name")->required();
  set->add_option("size", sf->size, "Boxes kept ready, 0 to 256")
      ->required()
      ->check(CLI::Range(0, 256));
  AddConnectionFlags(set, &sf->conn);
  verbs.Add(set, [sf, &g] {
    auto c = MakeClient(g, sf->conn);
    if (!c.ok()) return Fail(c.status());
    auto r = c->Call("PUT", "/v1/pools/" + Q(sf->tmpl), json{{"size", sf->size}});
    if (!r.ok()) return Fail(r.status());
    if (sf->conn.json)
      PrintJson(*r);
    else
      std::printf("%s: %d (%d ready; filled in the background)\n", sf->tmpl.c_str(), sf->size,
                  r->value("ready", 0));
    return 0;
  });

  auto rf = std::make_shared<PoolFlags>();
  CLI::App* rm = pool->add_subcommand("rm", "Remove a pool; its boxes are destroyed");
  rm->add_option("template", rf->tmpl, "Template name")->required();
  AddConnectionFlags(rm, &rf->conn);
  verbs.Add(rm, [rf, &g] {
    auto c = MakeClient(g, rf->conn);
    if (!c.ok()) return Fail(c.status());
    auto r = c->Call("DELETE", "/v1/pools/" + Q(rf->tmpl));
    if (!r.ok()) return Fail(r.status());
    if (!rf->conn.json) std::printf("%s\n", rf->tmpl.c_str());
    return 0;
  });
}

}  // namespace

void ClientVerbs::Register(CLI::App& app, const GlobalOptions& global) {
  RegisterCreate(app, global, *this);
  RegisterLs(app, global, *this);
  RegisterInspect(app, global, *this);
  RegisterExecVerbs(app, global, *this);
  RegisterCpVerb(app, global, *this);
  RegisterMcpVerb(app, global, *this);
  RegisterLifecycle(app, global, *this);
  RegisterSnapshotVerbs(app, global, *this);
  RegisterPoolVerbs(app, global, *this);
  RegisterRuntimes(app, global, *this);
  RegisterPs(app, global, *this);
  RegisterAudit(app, global, *this);
  RegisterKey(app, global, *this);
  RegisterSecretVerbs(app, global, *this);
  RegisterNetVerbs(app, global, *this);  // net.cc
}

std::optional<int> ClientVerbs::Run() const {
  for (const auto& v : verbs_)
    if (v.app->parsed()) return v.run();
  return std::nullopt;
}

}  // namespace sbx::cli

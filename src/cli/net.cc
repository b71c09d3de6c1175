#include "cli/net.h"

#include <cstdio>

#include "cli/units.h"

namespace sbx::cli {

using nlohmann::json;

namespace {

void AppendList(std::string_view list, json& into) {
  while (!list.empty()) {
    size_t comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    if (!item.empty()) into.push_back(std::string(item));
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
}

}  // namespace

Result<json> ParseNetFlags(const std::vector<std::string>& items) {
  std::string mode;
  json allow = json::array(), deny = json::array();
  for (const auto& item : items) {
    if (item == "none" || item == "open") {
      if (!mode.empty() && mode != item)
        return Status::Error("--net: '" + mode + "' and '" + item + "' contradict each other");
      mode = item;
    } else if (item.rfind("allow=", 0) == 0) {
      AppendList(std::string_view(item).substr(6), allow);
    } else if (item.rfind("deny=", 0) == 0) {
      AppendList(std::string_view(item).substr(5), deny);
    } else {
      return Status::Error("--net: expected none, open, allow=NAME,... or deny=CIDR,..., got '" +
                           item + "'");
    }
  }
  if (mode == "none" && (!allow.empty() || !deny.empty()))
    return Status::Error("--net: none takes no allow= or deny=");
  if (mode.empty()) {
    if (!deny.empty())
      return Status::Error(
          "--net: deny= needs open (an allowlist already refuses everything not allowed)");
    mode = allow.empty() ? "none" : "allowlist";
  }
  return json{{"mode", mode}, {"allow", allow}, {"deny", deny}};
}

std::string DescribeNetwork(const json& p) {
  if (!p.is_object() || !p.contains("mode") || !p["mode"].is_string()) return "none";
  auto join = [](const json& list) {
    std::string out;
    if (!list.is_array()) return out;
    for (const auto& e : list)
      if (e.is_string()) out += (out.empty() ? "" : ", ") + e.get<std::string>();
    return out;
  };
  std::string mode = p["mode"].get<std::string>();
  std::string allow = join(p.value("allow", json::array()));
  std::string deny = join(p.value("deny", json::array()));
  if (mode == "allowlist") return "allowlist: " + (allow.empty() ? "(nothing)" : allow);
  if (mode == "open") {
    std::string out = "open";
    if (!deny.empty()) out += " (deny: " + deny + ")";
    if (!allow.empty()) out += " (allow: " + allow + ")";
    return out;
  }
  return mode;
}

void RegisterNetVerbs(CLI::App& app, const GlobalOptions& g, ClientVerbs& verbs) {
  struct NetFlags {
    ConnectionFlags conn;
    std::string id;
    std::vector<std::string> policy;
  };
  auto f = std::make_shared<NetFlags>();
  CLI::App* v = app.add_subcommand(
      "net",
      "Show a sandbox's network policy, or replace it live: sbx net ID allow=pypi.org,*.npmjs.org"
      " | open [deny=CIDR,...] | none");
  v->add_option("id", f->id, "Sandbox id")->required();
  v->add_option("policy", f->policy, "The new policy: none, open, allow=..., deny=...");
  AddConnectionFlags(v, &f->conn);
  verbs.Add(v, [f, &g] {
    json body;
    if (!f->policy.empty()) {
      auto p = ParseNetFlags(f->policy);
      if (!p.ok()) return Fail(p.status());
      body = *p;
    }
    auto c = MakeClient(g, f->conn);
    if (!c.ok()) return Fail(c.status());
    auto r = f->policy.empty() ? c->Call("GET", SandboxPath(f->id) + "/network")
                               : c->Call("PUT", SandboxPath(f->id) + "/network", body);
    if (!r.ok()) return Fail(r.status());
    if (f->conn.json)
      std::printf("%s\n", r->dump(2).c_str());
    else
      std::printf("%s\n", DescribeNetwork(*r).c_str());
    return 0;
  });

  struct UrlFlags {
    ConnectionFlags conn;
    std::string id;
    int port = 0;
    std::string ttl = "10m";
  };
  auto u = std::make_shared<UrlFlags>();
  CLI::App* pu = app.add_subcommand(
      "port-url",
      "Print a signed URL that opens one port of a sandbox to whoever holds it, until it expires");
  pu->add_option("id", u->id, "Sandbox id")->required();
  pu->add_option("port", u->port, "Port inside the sandbox")
      ->required()
      ->check(CLI::Range(1, 65535));
  pu->add_option("--ttl", u->ttl, "How long the URL works, e.g. 10m (default), 2h, at most 7d");
  AddConnectionFlags(pu, &u->conn);
  verbs.Add(pu, [u, &g] {
    auto ms = ParseDuration(u->ttl);
    if (!ms.ok()) return Fail(ms.status().Wrap("--ttl"));
    if (*ms < 1000) return Fail(Status::Error("--ttl: at least 1s"));
    auto c = MakeClient(g, u->conn);
    if (!c.ok()) return Fail(c.status());
    auto r = c->Call("POST", SandboxPath(u->id) + "/ports/" + std::to_string(u->port) + "/url",
                     {{"ttl_s", *ms / 1000}});
    if (!r.ok()) return Fail(r.status());
    if (u->conn.json) {
      std::printf("%s\n", r->dump(2).c_str());
      return 0;
    }
    // The daemon's URL as this client reaches it (the Host it was sent); over a unix socket,
    // only the path means anything.
    const json& url = (*r)["url"];
    std::string base = c->connection().url;
    while (!base.empty() && base.back() == '/') base.pop_back();
    bool http = base.rfind("http://", 0) == 0 || base.rfind("https://", 0) == 0;
    std::string path = (*r).value("path", "");
    std::printf("%s\n", http ? (base + path).c_str()
                             : (url.is_string() ? url.get<std::string>() : path).c_str());
    return 0;
  });
}

}  // namespace sbx::cli

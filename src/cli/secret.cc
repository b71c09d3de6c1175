// `sbx secret add|ls|rm`: the daemon's secret store over /v1/secrets (docs/api.md, "Secrets").
// The value is read from stdin or --value-file, never from argv: every user of the host can read
// another process's argv in ps.
#include <termios.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/verbs.h"
#include "common/fd.h"
#include "common/fs.h"

namespace sbx::cli {
namespace {

using nlohmann::json;

constexpr size_t kMaxValue = 16384;

struct SecretFlags {
  std::string name, header, format, value_file;
  std::vector<std::string> hosts;
  bool replace = false;
  ConnectionFlags conn;
};

// Reads the value; one trailing newline (echo's, a file's) is not part of it.
Result<std::string> ReadValue(const std::string& file) {
  Result<std::string> v = std::string();
  if (!file.empty()) {
    v = ReadFile(file, kMaxValue + 2);
  } else {
    bool tty = ::isatty(STDIN_FILENO);
    termios saved{};
    if (tty) {
      std::fprintf(stderr, "value (not echoed): ");
      if (::tcgetattr(STDIN_FILENO, &saved) == 0) {
        termios quiet = saved;
        quiet.c_lflag &= ~static_cast<tcflag_t>(ECHO);
        (void)::tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet);
      }
      std::string line;
      int c;
      while ((c = std::getchar()) != EOF && c != '\n' && line.size() <= kMaxValue)
        line += static_cast<char>(c);
      (void)::tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved);
      std::fprintf(stderr, "\n");
      v = line;
    } else {
      v = ReadAll(STDIN_FILENO, kMaxValue + 2);
    }
  }
  if (!v.ok()) return v.status().Wrap(file.empty() ? "read the value from stdin" : "--value-file");
  if (!v->empty() && v->back() == '\n') v->pop_back();
  if (!v->empty() && v->back() == '\r') v->pop_back();
  if (v->empty()) return Status::Error("the value is empty (give it on stdin or --value-file)");
  if (v->size() > kMaxValue)
    return Status::Error("the value is longer than " + std::to_string(kMaxValue) + " bytes");
  return v;
}

std::string Path(const std::string& name) { return "/v1/secrets/" + Q(name); }

std::string Join(const json& a) {
  std::string out;
  for (const auto& h : a) out += (out.empty() ? "" : ",") + h.get<std::string>();
  return out;
}

}  // namespace

void RegisterSecretVerbs(CLI::App& app, const GlobalOptions& g, ClientVerbs& verbs) {
  CLI::App* secret = app.add_subcommand(
      "secret",
      "Secrets boxes use without seeing them: the egress proxy puts the value into "
      "requests to the secret's hosts");
  secret->require_subcommand(1);

  auto f = std::make_shared<SecretFlags>();
  CLI::App* add = secret->add_subcommand(
      "add", "Add a secret; its value is read from stdin (or --value-file), never from argv");
  add->add_option("name", f->name, "Its name, as creates name it")->required();
  add->add_option("--host", f->hosts,
                  "A host the value may be sent to: api.example.com or *.example.com (repeatable)")
      ->required();
  add->add_option("--header", f->header,
                  "Also set this header on requests to those hosts (e.g. Authorization)");
  add->add_option("--format", f->format, "The header's value; {} stands for the secret")
      ->default_str("{}");
  add->add_option("--value-file", f->value_file, "Read the value from this file instead of stdin");
  add->add_flag("--replace", f->replace, "Replace a secret of that name");
  AddConnectionFlags(add, &f->conn);
  verbs.Add(add, [f, &g] {
    auto value = ReadValue(f->value_file);
    if (!value.ok()) return Fail(value.status());
    auto c = MakeClient(g, f->conn);
    if (!c.ok()) return Fail(c.status());
    json body = {{"name", f->name}, {"value", *value}, {"hosts", f->hosts}};
    if (!f->header.empty()) body["header"] = f->header;
    if (!f->format.empty()) body["format"] = f->format;
    if (f->replace) body["replace"] = true;
    auto r = c->Call("POST", "/v1/secrets", body);
    std::fill(value->begin(), value->end(), '\0');
    body["value"] = "";
    if (!r.ok()) return Fail(r.status());
    if (f->conn.json)
      std::printf("%s\n", r->dump(2).c_str());
    else
      std::printf("%s\n", f->name.c_str());
    return 0;
  });

  auto lf = std::make_shared<ConnectionFlags>();
  CLI::App* ls = secret->add_subcommand("ls", "List secrets (never their values)");
  ls->alias("list");
  AddConnectionFlags(ls, lf.get());
  verbs.Add(ls, [lf, &g] {
    auto c = MakeClient(g, *lf);
    if (!c.ok()) return Fail(c.status());
    auto r = c->Call("GET", "/v1/secrets");
    if (!r.ok()) return Fail(r.status());
    if (lf->json) {
      std::printf("%s\n", r->dump(2).c_str());
      return 0;
    }
    std::printf("%-24s %-40s %-20s %s\n", "NAME", "HOSTS", "HEADER", "UPDATED");
    for (const auto& s : (*r)["secrets"]) {
      std::string header = s.value("header", "");
      if (!header.empty()) header += ": " + s.value("format", "{}");
      std::printf("%-24s %-40s %-20s %s\n", s.value("name", "").c_str(),
                  Join(s.value("hosts", json::array())).c_str(), header.c_str(),
                  s.value("updated_at", "").c_str());
    }
    return 0;
  });

  auto rf = std::make_shared<SecretFlags>();
  CLI::App* rm = secret->add_subcommand("rm", "Delete a secret (boxes made with it keep theirs)");
  rm->add_option("name", rf->name, "Its name")->required();
  AddConnectionFlags(rm, &rf->conn, false);
  verbs.Add(rm, [rf, &g] {
    auto c = MakeClient(g, rf->conn);
    if (!c.ok()) return Fail(c.status());
    auto r = c->Call("DELETE", Path(rf->name));
    if (!r.ok()) return Fail(r.status());
    std::printf("%s\n", rf->name.c_str());
    return 0;
  });
}

}  // namespace sbx::cli

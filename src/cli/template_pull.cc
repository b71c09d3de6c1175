// `sbx template pull NAME REF`: storage::PullImage (registry.h) into <templates dir>/pulls/<hash
// of the reference>, so that running it again after an interruption resumes, then
// storage::ImportImage of that layout as template NAME; the pull directory goes once imported.
// docs/storage.md, "Pulls".
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli/template.h"
#include "cli/units.h"
#include "common/encoding.h"
#include "common/fs.h"
#include "storage/image.h"
#include "storage/registry.h"
#include "store/store.h"

namespace sbx::cli {
namespace {

struct PullFlags {
  std::string name, ref, username, ca_file, cache_size;
  std::vector<std::string> insecure;
  bool password_stdin = false, replace = false;
};

// One line per blob (layers fetch in parallel): on a terminal each line is redrawn in place
// ("fetch 3f4e1a2b9c0d: 12.0 MiB / 30.0 MiB, 4.2 MiB/s"); otherwise a line as each blob ends.
class ProgressLines {
 public:
  explicit ProgressLines(std::string verb)
      : verb_(std::move(verb)), tty_(::isatty(STDERR_FILENO) != 0) {}

  void operator()(const storage::Progress& p) {
    auto now = std::chrono::steady_clock::now();
    auto [it, added] = lines_.try_emplace(p.what);
    Line& l = it->second;
    if (added) {
      l.row = rows_++;
      l.start = now;
      l.first = p.done;
      if (tty_) std::fprintf(stderr, "\n");
    }
    bool end = p.total >= 0 && p.done >= p.total;
    if (l.ended || (!end && !added && now - l.last < std::chrono::milliseconds(100))) return;
    l.last = now;
    l.ended = end;
    double secs = std::chrono::duration<double>(now - l.start).count();
    std::string rate =
        secs > 0.05 ? ", " + FormatSize(static_cast<int64_t>((p.done - l.first) / secs)) + "/s"
                    : "";
    std::string text = verb_ + " " + p.what + ": " + FormatSize(p.done) +
                       (p.total >= 0 ? " / " + FormatSize(p.total) : "") + rate +
                       (end ? ", done" : "");
    if (tty_) {
      int up = rows_ - l.row;  // the cursor sits below the last line
      std::fprintf(stderr, "\033[%dA\r%s\033[K\033[%dB\r", up, text.c_str(), up);
    } else if (end) {
      std::fprintf(stderr, "sbx: %s\n", text.c_str());
    }
    std::fflush(stderr);
  }

 private:
  struct Line {
    int row = 0;
    int64_t first = 0;
    bool ended = false;
    std::chrono::steady_clock::time_point start, last;
  };
  std::string verb_;
  bool tty_;
  int rows_ = 0;
  std::map<std::string, Line> lines_;
};

}  // namespace

std::string DockerConfigPath() {
  if (const char* dc = std::getenv("DOCKER_CONFIG"); dc != nullptr && *dc != '\0')
    return std::string(dc) + "/config.json";
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return std::string(home) + "/.docker/config.json";
  return "";
}

Result<std::string> RegistryPassword(const std::string& username, bool password_stdin) {
  if (password_stdin != !username.empty())
    return Status::Error("--username and --password-stdin go together", EINVAL);
  std::string password;
  if (password_stdin) {
    std::getline(std::cin, password);
    if (!password.empty() && password.back() == '\r') password.pop_back();
  }
  return password;
}

void RegisterTemplatePullVerb(CLI::App* tmpl, const GlobalOptions& g, ClientVerbs& verbs) {
  auto f = std::make_shared<PullFlags>();
  CLI::App* pull = tmpl->add_subcommand(
      "pull", "Pull an image from an OCI distribution registry and register it as a template");
  pull->add_option("name", f->name, "Template name: [a-z0-9][a-z0-9._-]* [:TAG]")->required();
  pull->add_option("ref", f->ref,
                   "Image reference REGISTRY/NAME[:TAG][@sha256:DIGEST], e.g. "
                   "127.0.0.1:5000/python:3.12 (there is no default registry)")
      ->required();
  pull->add_option("--insecure-registry", f->insecure,
                   "Speak plain HTTP to this registry, HOST or HOST:PORT (repeatable); others "
                   "need HTTPS with a certificate the host trusts");
  pull->add_option("--ca-file", f->ca_file,
                   "Verify registries with this PEM bundle instead of the host's CAs");
  pull->add_option("--username", f->username,
                   "Registry user (default: the registry's entry of $DOCKER_CONFIG/config.json "
                   "or ~/.docker/config.json, else anonymous)");
  pull->add_flag("--password-stdin", f->password_stdin,
                 "Read the registry password from the first line of stdin");
  pull->add_flag("--replace", f->replace, "Replace a template of that name");
  pull->add_option("--template-cache-size", f->cache_size,
                   "Bound of the template cache, e.g. 20G (default: what sbx serve uses)");
  verbs.Add(pull, [f, &g] {
    int64_t bound = 0;
    if (!f->cache_size.empty()) {
      auto n = ParseSize(f->cache_size);
      if (!n.ok() || *n <= 0)
        return Fail(Status::Error("--template-cache-size: expected a size such as 20G, got '" +
                                  f->cache_size + "'"));
      bound = *n;
    }
    auto password = RegistryPassword(f->username, f->password_stdin);
    if (!password.ok()) return Fail(password.status());
    if (!storage::IsValidTemplateName(f->name))
      return Fail(Status::Error("template name '" + f->name +
                                "': expected [a-z0-9][a-z0-9._-]* with an optional :TAG"));
    auto ref = storage::ParseImageRef(f->ref);
    if (!ref.ok()) return Fail(ref.status());
    storage::PullOptions o;
    o.insecure_registries = f->insecure;
    o.ca_file = f->ca_file;
    o.username = f->username;
    o.password = std::move(*password);
    o.docker_config = DockerConfigPath();
    if (::geteuid() != 0)
      return Fail(Status::Error(
          "sbx template manages the daemon's template cache and store directly and needs root"));
    auto st = store::Store::Open(g.data_dir + "/" + store::kDbFileName);
    if (!st.ok()) return Fail(st.status().Wrap("store"));
    storage::TemplateStore ts = CliTemplateStore(g.data_dir, bound);
    o.max_total_bytes = ts.cache_bytes;
    // Named by the reference, so that pulling it again continues what an interrupted pull left.
    std::string dir = ts.dir + "/pulls/" + store::Sha256Hex(ref->String()).substr(0, 32);
    if (Status s = MakeDirs(ts.dir + "/pulls", 0700); !s.ok()) return Fail(s);
    // Held until the directory is imported and removed: the sweep of a daemon start or a gc
    // beside this pull leaves it alone.
    auto hold = storage::PullHold::Take(dir);
    if (!hold.ok()) return Fail(hold.status());

    ProgressLines fetch("fetch");
    auto pulled = storage::PullImage(o, f->ref, dir, [&](const storage::Progress& p) { fetch(p); });
    if (!pulled.ok()) return Fail(pulled.status());
    std::fprintf(stderr, "sbx: pulled %s (%s, %s fetched)\n", pulled->ref.c_str(),
                 pulled->manifest_digest.c_str(), FormatSize(pulled->fetched_bytes).c_str());
    ProgressLines unpack("unpack");
    auto t = storage::ImportImage(ts, **st, f->name, dir, pulled->ref_name, f->replace,
                                  [&](const storage::Progress& p) { unpack(p); });
    if (!t.ok()) return Fail(t.status());
    // The layers are in the cache now; the pulled blobs are not needed again.
    (void)RemoveTree(dir);  // a leftover is only disk: the next pull of this reference reuses it
    std::printf("%s\n", t->name.c_str());
    std::fprintf(stderr, "sbx: pulled template %s (%zu layers, %s)\n", t->name.c_str(),
                 t->layers.size(), FormatSize(t->size_bytes).c_str());
    return 0;
  });
}

}  // namespace sbx::cli

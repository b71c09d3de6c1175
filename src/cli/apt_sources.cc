#include "cli/apt_sources.h"

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>

#include "common/fd.h"

namespace sbx::cli {
namespace {

// apt reads small files; a sources file past this is not one.
constexpr size_t kMaxSourcesFile = 1 << 20;

std::vector<std::string> Words(std::string_view s) {
  std::vector<std::string> out;
  std::istringstream in{std::string(s)};
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> Lines(std::string_view text) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos) nl = text.size();
    std::string line(text.substr(at, nl - at));
    if (!line.empty() && line.back() == '\r') line.pop_back();
    out.push_back(std::move(line));
    at = nl + 1;
  }
  return out;
}

bool UsableUri(const std::string& uri) {
  return uri.rfind("http://", 0) == 0 || uri.rfind("https://", 0) == 0 ||
         uri.rfind("file:/", 0) == 0;
}

// Debian's release names, whose archive holds a whole distribution (unlike -security, -updates,
// -backports, which hold only what changed).
bool IsDebianRelease(const std::string& suite) {
  static const std::set<std::string> kReleases = {
      "buster", "bullseye", "bookworm", "trixie",    "forky",        "duke",        "sid",
      "stable", "testing",  "unstable", "oldstable", "oldoldstable", "experimental"};
  return kReleases.count(suite) != 0;
}

}  // namespace

std::vector<AptSource> ParseSourcesList(std::string_view text) {
  std::vector<AptSource> out;
  for (std::string line : Lines(text)) {
    if (size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    // Options ("[arch=amd64 signed-by=...]") say nothing about where packages come from.
    if (size_t open = line.find('['); open != std::string::npos) {
      size_t close = line.find(']', open);
      if (close == std::string::npos) continue;
      line.erase(open, close - open + 1);
    }
    auto w = Words(line);
    if (w.size() < 3 || w[0] != "deb") continue;
    AptSource s;
    s.uri = w[1];
    s.suites = {w[2]};
    s.components.assign(w.begin() + 3, w.end());
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<AptSource> ParseDeb822Sources(std::string_view text) {
  std::vector<AptSource> out;
  std::map<std::string, std::string> fields;
  std::string last;
  auto flush = [&] {
    if (!fields.empty()) {
      auto types = Words(fields["types"]);
      bool deb = std::find(types.begin(), types.end(), "deb") != types.end();
      auto enabled_words = Words(fields["enabled"]);
      bool enabled = enabled_words.empty() || Lower(enabled_words[0]) != "no";
      for (const auto& uri : Words(fields["uris"])) {
        if (!deb || !enabled) break;
        AptSource s;
        s.uri = uri;
        s.suites = Words(fields["suites"]);
        s.components = Words(fields["components"]);
        if (!s.suites.empty()) out.push_back(std::move(s));
      }
    }
    fields.clear();
    last.clear();
  };
  for (const std::string& line : Lines(text)) {
    if (!line.empty() && line[0] == '#') continue;
    if (Words(line).empty()) {
      flush();
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(line[0]))) {  // a continuation line
      if (!last.empty()) fields[last] += " " + line;
      continue;
    }
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    last = Lower(line.substr(0, colon));
    fields[last] = line.substr(colon + 1);
  }
  flush();
  return out;
}

std::vector<AptSource> ReadAptSources(const std::string& etc_apt) {
  std::vector<AptSource> out;
  auto add = [&](std::vector<AptSource> more) {
    out.insert(out.end(), std::make_move_iterator(more.begin()),
               std::make_move_iterator(more.end()));
  };
  if (auto text = ReadFile(etc_apt + "/sources.list", kMaxSourcesFile); text.ok())
    add(ParseSourcesList(*text));
  std::vector<std::string> names;
  if (DIR* d = ::opendir((etc_apt + "/sources.list.d").c_str())) {
    while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  auto ends = [](const std::string& s, std::string_view suffix) {
    return s.size() > suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix.data(), suffix.size()) == 0;
  };
  for (const auto& n : names) {
    bool list = ends(n, ".list"), deb822 = ends(n, ".sources");
    if (!list && !deb822) continue;  // apt too ignores other names (.disabled, .save, ...)
    auto text = ReadFile(etc_apt + "/sources.list.d/" + n, kMaxSourcesFile);
    if (!text.ok()) continue;
    add(list ? ParseSourcesList(*text) : ParseDeb822Sources(*text));
  }
  return out;
}

std::optional<std::string> PickDebianMirror(const std::vector<AptSource>& sources,
                                            const std::string& suite) {
  auto pick = [&](auto&& wanted) -> std::optional<std::string> {
    for (const auto& s : sources) {
      if (!UsableUri(s.uri)) continue;
      if (std::any_of(s.suites.begin(), s.suites.end(), wanted)) {
        std::string uri = s.uri;
        while (uri.size() > 1 && uri.back() == '/') uri.pop_back();
        return uri;
      }
    }
    return std::nullopt;
  };
  if (auto m = pick([&](const std::string& x) { return x == suite; })) return m;
  return pick(IsDebianRelease);
}

}  // namespace sbx::cli

#include "agent/paths.h"

#include <vector>

namespace sbx::agent {

bool CleanPath(std::string_view in, std::string* out) {
  if (in.empty() || in.find('\0') != std::string_view::npos) return false;
  std::string r = "/";
  size_t i = 0;
  while (i < in.size()) {
    size_t j = in.find('/', i);
    if (j == std::string_view::npos) j = in.size();
    std::string_view part = in.substr(i, j - i);
    i = j + 1;
    if (part.empty() || part == ".") continue;
    if (r.size() > 1) r.push_back('/');
    r.append(part);
  }
  *out = std::move(r);
  return true;
}

std::string DirName(std::string_view path) {
  size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

std::string BaseName(std::string_view path) {
  if (path == "/") return "/";
  size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return std::string(path);
  return std::string(path.substr(slash + 1));
}

std::string JoinPath(std::string_view dir, std::string_view name) {
  std::string r(dir);
  if (r.empty() || r.back() != '/') r.push_back('/');
  r.append(name);
  return r;
}

}  // namespace sbx::agent

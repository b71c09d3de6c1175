#include "cli/volumes.h"

#include <sys/stat.h>

namespace sbx::cli {
namespace {

// Absolute, and no component is empty-after-the-first, `.` or `..`: the path means what it says
// (no normalization that a reader of the command line would have to redo).
bool CleanAbsolute(const std::string& p) {
  if (p.empty() || p[0] != '/') return false;
  size_t start = 1;
  while (start < p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos) end = p.size();
    std::string part = p.substr(start, end - start);
    if (part == "." || part == "..") return false;
    if (part.empty() && end != p.size()) return false;  // "//"
    start = end + 1;
  }
  return true;
}

std::string Trimmed(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

bool Under(const std::string& p, const char* dir) {
  std::string d = dir;
  return p == d || p.rfind(d + "/", 0) == 0;
}

}  // namespace

Result<std::vector<runtime::BindMount>> ParseVolumes(const std::vector<std::string>& volumes) {
  std::vector<runtime::BindMount> out;
  for (const auto& v : volumes) {
    auto bad = [&v](const std::string& why) {
      return Status::Error("--volume " + v + ": " + why, EINVAL);
    };
    std::vector<std::string> parts;
    size_t start = 0;
    for (;;) {
      size_t colon = v.find(':', start);
      parts.push_back(v.substr(start, colon == std::string::npos ? colon : colon - start));
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
    if (parts.size() < 2 || parts.size() > 3) return bad("expected HOST:BOX or HOST:BOX:ro");
    runtime::BindMount b;
    b.read_only = false;
    if (parts.size() == 3) {
      if (parts[2] != "ro" && parts[2] != "rw") return bad("the mode is ro or rw");
      b.read_only = parts[2] == "ro";
    }
    if (!CleanAbsolute(parts[0]))
      return bad("HOST must be an absolute path without . or .. (e.g. \"$PWD\")");
    if (!CleanAbsolute(parts[1])) return bad("BOX must be an absolute path without . or ..");
    b.source = Trimmed(parts[0]);
    b.target = Trimmed(parts[1]);
    if (b.target == "/") return bad("BOX cannot be / (the box's root)");
    for (const char* d : {"/proc", "/sys", "/dev"})
      if (Under(b.target, d)) return bad(std::string("BOX cannot be under ") + d);
    struct stat st;
    if (::stat(b.source.c_str(), &st) != 0) return Status::Errno("--volume " + v + ": " + parts[0]);
    if (!S_ISDIR(st.st_mode)) return bad("HOST must be a directory");
    for (const auto& o : out)
      if (o.target == b.target) return bad("BOX " + b.target + " is given twice");
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace sbx::cli

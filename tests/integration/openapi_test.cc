// docs/openapi.yaml against the code: every route the daemon registers is documented, and every
// documented operation is served. Routes come from two places, so neither check trusts the other:
// the registrations in src/api/v1/*.cc read as text (`r.Get("/v1/...")`, ...), and a real
// `sbx serve` asked each documented (method, path) without a key: a route answers 401
// `unauthenticated` (auth runs inside each /v1 handler, after routing), a path the router does
// not know answers 404 or 405.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "api/http/client.h"
#include "common/fs.h"
#include "daemon_process.h"
#include "sbx_process.h"

extern char** environ;

namespace sbx::test {
namespace {

using Route = std::pair<std::string, std::string>;  // {"GET", "/v1/sandboxes/{id}"}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// The (method, path) operations of openapi.yaml's `paths:` section, read by indentation: path
// keys at two spaces, method keys at four (the file's header comment says so).
std::set<Route> OpenApiRoutes(const std::string& yaml) {
  static const std::regex kPath(R"(^  (/[^:\s]*):\s*$)");
  static const std::regex kMethod(R"(^    (get|put|post|delete|patch|head|options):\s*$)");
  std::set<Route> out;
  std::istringstream lines(yaml);
  std::string line, path;
  bool in_paths = false;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] != ' ') {  // a top-level key
      in_paths = line.rfind("paths:", 0) == 0;
      path.clear();
      continue;
    }
    if (!in_paths) continue;
    std::smatch m;
    if (std::regex_match(line, m, kPath)) {
      path = m[1];
    } else if (std::regex_match(line, m, kMethod)) {
      EXPECT_FALSE(path.empty()) << "method outside a path: " << line;
      out.insert({Upper(m[1]), path});
    }
  }
  return out;
}

// The routes registered in one source file. Understands `r.Get("/p", ...)` and the loop form
// `for (const char* v : {"a", "b"}) r.Post(std::string("/p/") + v, ...)`. A registration it
// cannot read fails the test rather than going unchecked.
std::set<Route> SourceRoutes(const std::string& file, const std::string& src) {
  static const std::regex kAny(R"(\br\.(Get|Post|Put|Delete|Handle)\s*\()");
  static const std::regex kLiteral(R"re(\br\.(Get|Post|Put|Delete)\s*\(\s*"([^"]*)")re");
  static const std::regex kJoined(
      R"re(\br\.(Get|Post|Put|Delete)\s*\(\s*std::string\("([^"]*)"\)\s*\+\s*(\w+))re");
  static const std::regex kLoop(R"re(for\s*\(\s*const\s+char\s*\*\s*(\w+)\s*:\s*\{([^}]*)\})re");
  static const std::regex kString(R"re("([^"]*)")re");

  std::map<std::string, std::vector<std::string>> loops;  // loop variable -> its values
  for (std::sregex_iterator it(src.begin(), src.end(), kLoop), end; it != end; ++it) {
    std::string list = (*it)[2];
    for (std::sregex_iterator s(list.begin(), list.end(), kString); s != end; ++s)
      loops[(*it)[1]].push_back((*s)[1]);
  }
  std::set<Route> out;
  size_t calls = static_cast<size_t>(
      std::distance(std::sregex_iterator(src.begin(), src.end(), kAny), std::sregex_iterator()));
  size_t read = 0;
  for (std::sregex_iterator it(src.begin(), src.end(), kLiteral), end; it != end; ++it, ++read)
    out.insert({Upper((*it)[1]), (*it)[2]});
  for (std::sregex_iterator it(src.begin(), src.end(), kJoined), end; it != end; ++it, ++read) {
    auto values = loops.find((*it)[3]);
    EXPECT_NE(values, loops.end()) << file << ": route built from '" << (*it)[3]
                                   << "', which is no `for (const char* x : {...})` variable";
    if (values == loops.end()) continue;
    for (const auto& v : values->second) out.insert({Upper((*it)[1]), std::string((*it)[2]) + v});
  }
  EXPECT_EQ(read, calls) << file << ": " << calls << " route registrations, " << read
                         << " understood; teach openapi_test.cc the new form";
  return out;
}

std::set<Route> RegisteredRoutes() {
  const std::string dir = std::string(SBX_SOURCE_DIR) + "/src/api/v1";
  std::set<Route> out;
  DIR* d = ::opendir(dir.c_str());
  EXPECT_NE(d, nullptr) << dir;
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    bool source = name.size() > 3 && name.compare(name.size() - 3, 3, ".cc") == 0;
    if (!source || name.find("_test.cc") != std::string::npos) continue;
    for (auto& r : SourceRoutes(name, Slurp(dir + "/" + name))) out.insert(r);
  }
  ::closedir(d);
  return out;
}

std::string Show(const std::set<Route>& routes) {
  std::string s;
  for (const auto& [m, p] : routes) s += "\n  " + m + " " + p;
  return s;
}

std::set<Route> Minus(const std::set<Route>& a, const std::set<Route>& b) {
  std::set<Route> out;
  for (const auto& r : a)
    if (!b.count(r)) out.insert(r);
  return out;
}

TEST(OpenApi, ParsersSeeEveryRoute) {
  // Guards the parsers themselves: a silently empty set would make the comparisons vacuous.
  auto doc = OpenApiRoutes(Slurp(std::string(SBX_SOURCE_DIR) + "/docs/openapi.yaml"));
  auto code = RegisteredRoutes();
  EXPECT_GE(doc.size(), 20u) << Show(doc);
  EXPECT_GE(code.size(), 20u) << Show(code);
  EXPECT_TRUE(code.count({"GET", "/healthz"}));
  EXPECT_TRUE(code.count({"POST", "/v1/sandboxes/{id}/pause"})) << "the pause/resume loop";
  EXPECT_TRUE(code.count({"POST", "/v1/sandboxes/{id}/resume"})) << "the pause/resume loop";
}

TEST(OpenApi, MatchesRegisteredRoutes) {
  auto doc = OpenApiRoutes(Slurp(std::string(SBX_SOURCE_DIR) + "/docs/openapi.yaml"));
  auto code = RegisteredRoutes();
  EXPECT_TRUE(Minus(code, doc).empty())
      << "registered in src/api/v1 but missing from docs/openapi.yaml (and docs/api.md):"
      << Show(Minus(code, doc));
  EXPECT_TRUE(Minus(doc, code).empty())
      << "in docs/openapi.yaml but not registered in src/api/v1:" << Show(Minus(doc, code));
}

// A real daemon on a scratch data directory; nothing is created in it.
class OpenApiServeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-openapi-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    ASSERT_EQ(::chmod(tmpl, 0711), 0);
    dir_ = tmpl;
    ::setenv("SBX_CGROUP_PARENT", ("sbx-openapi-test-" + std::to_string(::getpid())).c_str(), 1);
    daemon_ = std::make_unique<DaemonProcess>(dir_);
    daemon_->Start();
    port_ = daemon_->port();
  }
  void TearDown() override {
    daemon_.reset();
    ExpectNoCgroupsAndRemoveParent("sbx-openapi-test-" + std::to_string(::getpid()));
    if (!dir_.empty()) (void)RemoveTree(dir_);
  }

  // Asks for `method target` without a key and no body.
  http::Response Ask(const std::string& method, const std::string& target) {
    auto r = http::Request("127.0.0.1", port_, method, target, {}, "", std::chrono::seconds(10));
    EXPECT_TRUE(r.ok()) << method << " " << target << ": " << r.status().message();
    return r.ok() ? *r : http::Response{};
  }

  std::string dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  uint16_t port_ = 0;
};

// "/v1/sandboxes/{id}/commands/{pid}/output" -> a concrete path that matches it.
std::string Concrete(std::string path) {
  static const std::map<std::string, std::string> kValues = {
      {"{id}", "openapi-test-no-such-sandbox"},
      {"{pid}", "1"},
      {"{name}", "no-such-secret"},
      {"{snapshot}", "snap-openapitestnosuchsnp"},
      {"{template}", "no-such-template"},
      {"{port}", "8000"}};
  for (const auto& [param, value] : kValues)
    for (size_t at; (at = path.find(param)) != std::string::npos;)
      path.replace(at, param.size(), value);
  EXPECT_EQ(path.find('{'), std::string::npos) << "no test value for a parameter in " << path;
  return path;
}

TEST_F(OpenApiServeTest, EveryDocumentedOperationIsServed) {
  auto doc = OpenApiRoutes(Slurp(std::string(SBX_SOURCE_DIR) + "/docs/openapi.yaml"));
  ASSERT_FALSE(doc.empty());
  for (const auto& [method, path] : doc) {
    std::string target = Concrete(path);
    auto r = Ask(method, target);
    if (path == "/healthz") {
      // The only operation that needs no key (/metrics needs an operator key).
      EXPECT_EQ(r.status, 200) << method << " " << path << ": " << r.body;
      continue;
    }
    auto body = nlohmann::json::parse(r.body, nullptr, false);
    std::string code = body.is_object() && body.contains("error") && body["error"].is_object()
                           ? body["error"].value("code", "")
                           : "";
    EXPECT_TRUE(r.status == 401 && code == "unauthenticated")
        << method << " " << path << " is documented but the daemon does not serve it: " << r.status
        << " " << r.body;
  }
}

TEST_F(OpenApiServeTest, UnknownOperationsAreNotServed) {
  // The control for the check above: what the router does not know never answers 401.
  EXPECT_EQ(Ask("GET", "/v1/openapi-test-nope").status, 404);
  EXPECT_EQ(Ask("GET", "/v1/sandboxes/x/openapi-test-nope").status, 404);
  EXPECT_EQ(Ask("PATCH", "/v1/sandboxes/x").status, 405);
}

}  // namespace
}  // namespace sbx::test

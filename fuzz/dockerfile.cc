// Fuzzes the Dockerfile reader of `sbx build` (src/storage/dockerfile.cc, ParseDockerfile: the
// Dockerfile is the user's, and through E2B's template API a tenant's) with and without a build
// argument. Checks that a success starts with FROM, names lines inside the input and stays
// within the parser's bound on substituted text. Regressions go to src/storage/dockerfile_test.cc.
#include "storage/dockerfile.h"

#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto& args : {std::map<std::string, std::string>{},
                           std::map<std::string, std::string>{{"A", "$A${A}x"}}}) {
    auto r = sbx::storage::ParseDockerfile(text, args);
    if (!r.ok()) continue;
    if (r->empty() || r->front().kind != sbx::storage::BuildStep::Kind::kFrom) __builtin_trap();
    size_t total = 0;
    for (const auto& s : *r) {
      if (s.line < 1 || static_cast<size_t>(s.line) > size + 1) __builtin_trap();
      for (const auto& a : s.args) total += a.size();
    }
    if (total > (size_t{8} << 20)) __builtin_trap();
  }
  return 0;
}

// Fuzzes the E2B facade's pure decoders of request fields (src/api/e2b/wire): the `metadata`
// filter of GET /v2/sandboxes, upload metadata headers, the envd Host header, Basic auth, base64,
// and envd's user lookup and path rules (FindUser parses a box's /etc/passwd, which its tenant
// writes). The first byte picks the decoder. Request bodies are json_body's. Regressions go to
// src/api/e2b/wire_test.cc.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/e2b/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace e2b = sbx::api::e2b;
  if (size == 0) return 0;
  const uint8_t which = data[0] % 4;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (which) {
    case 0:
      (void)e2b::DecodeMetadataFilter(in);
      break;
    case 1: {
      // "name: value" lines, as X-Metadata-* headers.
      std::vector<std::pair<std::string, std::string>> headers;
      size_t pos = 0;
      while (pos < in.size()) {
        size_t end = std::min(in.find('\n', pos), in.size());
        std::string_view line = in.substr(pos, end - pos);
        size_t colon = line.find(':');
        if (colon != std::string_view::npos)
          headers.emplace_back(std::string(line.substr(0, colon)),
                               std::string(line.substr(colon + 1)));
        pos = end + 1;
      }
      (void)e2b::UploadMetadata(headers);
      break;
    }
    case 2: {
      (void)e2b::ParseSandboxHost(in);
      (void)e2b::BasicAuthUser(in);
      auto raw = e2b::Unbase64(in);
      if (raw.ok() && e2b::Unbase64(e2b::Base64(*raw)).value() != *raw) __builtin_trap();
      break;
    }
    case 3: {
      // A passwd text, then the name looked up and a path after the last NUL.
      size_t nul = in.rfind('\0');
      std::string_view passwd = in.substr(0, nul == std::string_view::npos ? in.size() : nul);
      std::string_view rest = nul == std::string_view::npos ? "" : in.substr(nul + 1);
      auto u = e2b::FindUser(passwd, rest.substr(0, rest.find('/')));
      (void)e2b::ResolvePath(rest, u ? u->home : std::string("/root"));
      break;
    }
  }
  return 0;
}

// Fuzzes the E2B facade's request parsing that needs no sandbox (src/api/e2b): a control-plane
// POST /sandboxes body (CreateRequestOf, v1 and v2 defaults), an envd process.Process/Start
// request (StartPayload, the SPAWN the agent then parses), the `metadata` filter of
// GET /v2/sandboxes, upload metadata headers, the envd Host header, Basic auth, base64, and the
// user lookup and path rules of envd (FindUser parses a box's /etc/passwd, which its tenant
// writes). The first byte picks the decoder. A nlohmann::json type_error is answered 400 by the
// server (server.cc), so it is allowed. Regressions go to src/api/e2b/wire_test.cc.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/e2b/internal.h"
#include "api/e2b/wire.h"
#include "api/http/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using nlohmann::json;
  namespace e2b = sbx::api::e2b;
  if (size == 0) return 0;
  const uint8_t which = data[0] % 7;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (which) {
    case 0:
    case 1: {
      json j = in.empty() ? json::object() : sbx::http::ParseJsonBody(in);
      if (j.is_discarded() || !j.is_object()) return 0;  // BodyObject answers 400
      try {
        auto req = e2b::CreateRequestOf(j, int64_t{24} * 3600 * 1000, which == 1);
        if (req.ok() && (req->timeout_ms < 1000 || req->template_name.empty())) __builtin_trap();
      } catch (const json::type_error&) {
      }
      break;
    }
    case 2:
      (void)e2b::DecodeMetadataFilter(in);
      break;
    case 3: {
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
    case 4: {
      (void)e2b::ParseSandboxHost(in);
      (void)e2b::BasicAuthUser(in);
      auto raw = e2b::Unbase64(in);
      if (raw.ok() && e2b::Unbase64(e2b::Base64(*raw)).value() != *raw) __builtin_trap();
      break;
    }
    case 5: {
      // A passwd text, then the name looked up and a path after the last NUL.
      size_t nul = in.rfind('\0');
      std::string_view passwd = in.substr(0, nul == std::string_view::npos ? in.size() : nul);
      std::string_view rest = nul == std::string_view::npos ? "" : in.substr(nul + 1);
      auto u = e2b::FindUser(passwd, rest.substr(0, rest.find('/')));
      (void)e2b::ResolvePath(rest, u ? u->home : std::string("/root"));
      break;
    }
    case 6: {
      json j = in.empty() ? json::object() : sbx::http::ParseJsonBody(in);
      if (j.is_discarded() || !j.is_object()) return 0;  // Rpc answers invalid_argument
      e2b::User user{"user", 1000, 1000, "/home/user"};
      try {
        bool pty = false;
        auto w = e2b::StartPayload(j, {{"A", "1"}}, user, 5000, &pty);
        sbx::protocol::Reader r;
        if (w.ok() && !r.Parse(w->payload())) __builtin_trap();
      } catch (const json::type_error&) {
      }
      break;
    }
  }
  return 0;
}

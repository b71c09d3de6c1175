// Fuzzes the native API's request parsing (src/api/v1): a body as Exchange::ReadJson parses it,
// then as POST /v1/sandboxes (ParseCreateBody) and POST /v1/sandboxes/{id}/commands
// (ParseCommandBody) read it. A nlohmann::json type_error is what the server answers 400
// "invalid_argument" to (server.cc), so it is allowed; any other exception, or any sanitizer
// report, is a crash. Regressions go to tests/integration/serve_test.cc's bounds tests.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "api/http/json.h"
#include "api/v1/api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using nlohmann::json;
  std::string_view body(reinterpret_cast<const char*>(data), size);
  json j = sbx::http::ParseJsonBody(body);  // as Exchange::ReadJson
  if (j.is_discarded()) return 0;
  sbx::store::SandboxRecord sb;
  sb.env = {{"HOME", "/root"}, {"PATH", "/bin"}};
  try {
    auto create = sbx::api::ParseCreateBody(j, int64_t{24} * 3600 * 1000);
    if (create.ok() && create->timeout_ms < 0) __builtin_trap();
  } catch (const json::type_error&) {
  }
  try {
    bool background = false;
    auto spawn = sbx::api::ParseCommandBody(j, sb, &background);
    if (spawn.ok()) {
      sbx::protocol::Reader r;
      if (!r.Parse(spawn->payload())) __builtin_trap();  // what the agent will parse
    }
  } catch (const json::type_error&) {
  }
  return 0;
}

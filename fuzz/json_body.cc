// Fuzzes the parser of every JSON request body of both APIs (src/api/http/json.cc, ParseJsonBody:
// Exchange::ReadJson, the E2B control plane's and envd's bodies, Connect envelopes, the PTY
// socket's messages), then what handlers do with the value: copy it, compare it, quote it in an
// error message (JsonSnippet), answer with it (JsonText). A value nested deeply enough to
// overflow the stack in any of these must be refused by the parser. Regressions go to
// src/api/http/json_test.cc.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "api/http/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  nlohmann::json j = sbx::http::ParseJsonBody(body);
  if (j.is_discarded()) return 0;
  nlohmann::json copy = j;
  if (copy != j) __builtin_trap();
  std::string snippet = sbx::http::JsonSnippet(j);
  if (snippet.size() > 1024) __builtin_trap();
  std::string text = sbx::http::JsonText(j);
  if (sbx::http::ParseJsonBody(text).is_discarded()) __builtin_trap();  // what we send parses
  if (j.is_object())
    for (const char* field : {"timeout", "limits", "argv", "env", "process", "pty"})
      if (j.contains(field)) (void)sbx::http::JsonSnippet(j[field]);
  return 0;
}

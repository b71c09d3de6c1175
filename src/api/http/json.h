// JSON helpers shared by the APIs for what clients send: parsing with a bound on nesting, quoting
// a value in an error message, and compact response text. Pure (no I/O).
//
// Why a nesting bound: nlohmann::json parses iteratively, but copying, comparing or dump()ing a
// value recurses once per level, so a 1 MiB body of '[' (500,000 levels) overflows the stack of
// whichever thread touches it next (found writing fuzz/v1_json.cc). Every request body is parsed
// with ParseJsonBody, so no deeper value ever exists in the daemon.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace sbx::http {

// Deepest nesting of arrays and objects a request body may have.
inline constexpr int kMaxJsonDepth = 64;

// The JSON value of `text`, or a discarded value (is_discarded()) when it is not valid JSON or
// nests deeper than kMaxJsonDepth.
nlohmann::json ParseJsonBody(std::string_view text);

// Compact JSON text. Strings that are not valid UTF-8 (a file name made inside a sandbox can be
// any bytes) get U+FFFD for their bad bytes instead of failing the whole response.
std::string JsonText(const nlohmann::json& j);

// A client's JSON value quoted in an error message ("got [1,2]"): about `max_bytes` at most,
// values nested past a few levels shown as "...".
std::string JsonSnippet(const nlohmann::json& j, size_t max_bytes = 128);

}  // namespace sbx::http

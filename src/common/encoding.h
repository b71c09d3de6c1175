// Encodings shared by the API facades and the CLI: base64 (how command output and file bytes
// travel in JSON), RFC 3339 timestamps and sizes for people.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace sbx {

std::string Base64Encode(std::string_view in);
// Accepts standard and URL-safe alphabets, with or without padding (as protobuf JSON does).
Result<std::string> Base64Decode(std::string_view in);
// "2026-11-29T10:13:45.123Z" for milliseconds since the epoch; "" for 0 or less.
std::string Rfc3339Millis(int64_t ms);
// Milliseconds since the epoch of an RFC 3339 time: "2026-11-29T10:13:45Z", with optional
// fractional seconds and a "Z" or "+hh:mm"/"-hh:mm" offset. EINVAL otherwise.
Result<int64_t> ParseRfc3339Millis(std::string_view text);
// "64 MiB", "1.5 GiB", "512 B" (binary units up to EiB).
std::string FormatSize(int64_t bytes);

// `message` with every absolute path in it replaced by "[host path]": for what a host-side
// operation (a runtime's create, freeze or destroy) failed with, before it reaches an API client
// (threats.md: no host path ever reaches a tenant). A path is a run starting with '/' at the
// start or after a space, '(' or '=', up to a space, quote, ')', ',' or ": "; after a quote, up to
// the closing quote.
std::string RedactPaths(std::string_view message);

}  // namespace sbx

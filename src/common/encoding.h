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

}  // namespace sbx

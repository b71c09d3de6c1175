// Parsing of the human units the CLI takes: sizes ("64M", "1.5G", "512k", bytes) and durations
// ("90s", "5m", "1h", "30d", "250ms", plain seconds).
#pragma once

#include <cstdint>
#include <string>

#include "common/encoding.h"  // FormatSize
#include "common/status.h"

namespace sbx::cli {

// Binary multiples: k = 1024, M = 1024^2, G = 1024^3, T = 1024^4; an optional trailing "B"/"iB".
Result<int64_t> ParseSize(const std::string& text);
// Returns milliseconds.
Result<int64_t> ParseDuration(const std::string& text);

}  // namespace sbx::cli

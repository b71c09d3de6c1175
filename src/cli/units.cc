#include "cli/units.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace sbx::cli {
namespace {

// Splits "1.5G" into 1.5 and "G". Fails on an empty or non-numeric prefix.
bool SplitNumber(const std::string& text, double* value, std::string* unit) {
  if (text.empty()) return false;
  char* end = nullptr;
  *value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !std::isfinite(*value) || *value < 0) return false;
  *unit = std::string(end);
  return true;
}

}  // namespace

Result<int64_t> ParseSize(const std::string& text) {
  double v;
  std::string unit;
  if (!SplitNumber(text, &v, &unit)) return Status::Error("invalid size '" + text + "'", EINVAL);
  if (unit.size() >= 2 &&
      (unit.substr(unit.size() - 2) == "iB" || unit.substr(unit.size() - 2) == "ib"))
    unit.resize(unit.size() - 2);
  else if (unit.size() >= 2 && (unit.back() == 'B' || unit.back() == 'b'))
    unit.pop_back();
  double mult;
  if (unit.empty() || unit == "B" || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "K")
    mult = 1024.0;
  else if (unit == "m" || unit == "M")
    mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "G")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "T")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    return Status::Error("invalid size '" + text + "' (use a number with k, M, G or T)", EINVAL);
  double bytes = v * mult;
  if (bytes > 9.0e18) return Status::Error("size too large: '" + text + "'", EINVAL);
  return static_cast<int64_t>(bytes);
}

Result<int64_t> ParseDuration(const std::string& text) {
  double v;
  std::string unit;
  if (!SplitNumber(text, &v, &unit))
    return Status::Error("invalid duration '" + text + "'", EINVAL);
  double mult;
  if (unit.empty() || unit == "s")
    mult = 1000;
  else if (unit == "ms")
    mult = 1;
  else if (unit == "m")
    mult = 60'000;
  else if (unit == "h")
    mult = 3'600'000;
  else if (unit == "d")
    mult = 86'400'000;
  else
    return Status::Error("invalid duration '" + text + "' (use ms, s, m, h or d)", EINVAL);
  double ms = v * mult;
  if (ms > 9.0e15) return Status::Error("duration too large: '" + text + "'", EINVAL);
  return static_cast<int64_t>(std::llround(ms));
}

}  // namespace sbx::cli

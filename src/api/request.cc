#include "api/request.h"

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "api/http/json.h"

namespace sbx::api {

using nlohmann::json;

Result<std::map<std::string, std::string>> StringMap(const json& j, const char* field) {
  std::map<std::string, std::string> out;
  if (!j.contains(field) || j[field].is_null()) return out;
  if (!j[field].is_object())
    return Status::Error(std::string(field) + ": must be an object of strings", EINVAL);
  for (const auto& [k, v] : j[field].items()) {
    if (!v.is_string())
      return Status::Error(std::string(field) + "." + k + ": must be a string", EINVAL);
    out[k] = v.get<std::string>();
  }
  return out;
}

std::string Number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.15g", v);
  return b;
}

// A whole number of `unit` (bytes, processes) for limits.<field>, 0 when absent. Only the type is
// checked here; the manager says the allowed range (which for memory and disk is the host's).
Result<int64_t> SizeField(const json& j, const char* field, const char* unit) {
  if (!j.contains(field) || j[field].is_null()) return int64_t{0};
  const json& v = j[field];
  std::string name = std::string("limits.") + field;
  // An unsigned above INT64_MAX would wrap to a negative int64: say what is wrong with it.
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return Status::Error(name + ": " + http::JsonSnippet(v) + " " + unit + " is out of range",
                         EINVAL);
  if (!v.is_number_integer())
    return Status::Error(name + ": must be a whole number of " + unit +
                             ", 0 for the default (got " + http::JsonSnippet(v) + ")",
                         EINVAL);
  return v.get<int64_t>();
}

// A number of seconds from `min_s` to `max_s`, as milliseconds; 0 when absent. The range is
// checked on the double before any arithmetic, so no value (1e300, -1, 0.0001) can overflow or
// round to 0 (which would mean "the default").
Result<int64_t> SecondsField(const json& j, const char* field, double min_s, double max_s) {
  if (!j.contains(field) || j[field].is_null()) return int64_t{0};
  const json& v = j[field];
  double secs = v.is_number() ? v.get<double>() : std::nan("");
  if (!(secs >= min_s && secs <= max_s))  // also false for NaN and a non-number
    return Status::Error(std::string(field) + ": a number of seconds from " + Number(min_s) +
                             " to " + Number(max_s) + " (got " + http::JsonSnippet(v) + ")",
                         EINVAL);
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(secs * 1000)));
}

Result<bool> BoolField(const json& j, const char* field, bool def) {
  if (!j.contains(field) || j[field].is_null()) return def;
  if (!j[field].is_boolean())
    return Status::Error(std::string(field) + ": must be true or false", EINVAL);
  return j[field].get<bool>();
}

Result<int64_t> IntField(const json& j, const char* field, int64_t def) {
  if (!j.contains(field) || j[field].is_null()) return def;
  if (!j[field].is_number_integer())
    return Status::Error(std::string(field) + ": must be an integer", EINVAL);
  return j[field].get<int64_t>();
}

Result<std::string> PathQuery(const http::Exchange& ex, const char* name) {
  auto p = ex.query().Get(name);
  if (!p || p->empty())
    return Status::Error(std::string("query parameter '") + name + "' is required", EINVAL);
  return *p;
}

Result<int64_t> IntQuery(const http::Exchange& ex, const char* name, int64_t def) {
  auto v = ex.query().Get(name);
  if (!v) return def;
  char* end = nullptr;
  long long n = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0')
    return Status::Error(std::string(name) + ": must be an integer", EINVAL);
  return static_cast<int64_t>(n);
}

bool FlagQuery(const http::Exchange& ex, const char* name) {
  auto v = ex.query().Get(name).value_or("");
  return v == "true" || v == "1";
}

int SignalNumber(const json& j) {
  if (j.is_number_integer()) return j.get<int>();
  if (!j.is_string()) return 0;
  std::string s = j.get<std::string>();
  if (s.rfind("SIG", 0) == 0) s = s.substr(3);
  static const std::map<std::string, int> kSignals = {
      {"HUP", SIGHUP},   {"INT", SIGINT},    {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
      {"TERM", SIGTERM}, {"USR1", SIGUSR1},  {"USR2", SIGUSR2}, {"STOP", SIGSTOP},
      {"CONT", SIGCONT}, {"WINCH", SIGWINCH}};
  auto it = kSignals.find(s);
  return it == kSignals.end() ? 0 : it->second;
}

}  // namespace sbx::api

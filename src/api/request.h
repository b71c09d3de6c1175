// Parsing what a request carries (JSON body fields, query parameters), shared by the facades
// that take these shapes (the native /v1 routes; the session-backed facades as they move onto
// it). Every error is EINVAL naming the field, for api/errors.h's 400; a value is quoted only as
// http::JsonSnippet bounds it.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "api/http/exchange.h"
#include "common/status.h"

namespace sbx::api {

// An object of strings; empty when absent or null.
Result<std::map<std::string, std::string>> StringMap(const nlohmann::json& j, const char* field);
// A number of seconds from `min_s` to `max_s`, as milliseconds (at least 1); 0 when absent.
Result<int64_t> SecondsField(const nlohmann::json& j, const char* field, double min_s,
                             double max_s);
// A whole number of `unit` (bytes, processes) for limits.<field>; 0 when absent. Only the type
// and int64 range are checked: the manager says the allowed range.
Result<int64_t> SizeField(const nlohmann::json& j, const char* field, const char* unit);
Result<bool> BoolField(const nlohmann::json& j, const char* field, bool def);
Result<int64_t> IntField(const nlohmann::json& j, const char* field, int64_t def);
// A required, non-empty query parameter.
Result<std::string> PathQuery(const http::Exchange& ex, const char* name = "path");
Result<int64_t> IntQuery(const http::Exchange& ex, const char* name, int64_t def);
// A flag in the query: "true" or "1" set it.
bool FlagQuery(const http::Exchange& ex, const char* name);
// A signal by number or name ("TERM", "SIGTERM"); 0 for anything else.
int SignalNumber(const nlohmann::json& j);
// "86400", "0.001": a bound as people write it, for error messages.
std::string Number(double v);

}  // namespace sbx::api

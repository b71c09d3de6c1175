// The arguments of an MCP tool, declared once: the JSON Schema a client is shown in tools/list
// and the checks a call's `arguments` pass before the tool runs come from the same list, so what
// a model is told and what the server enforces cannot drift apart. Every argument is an
// attacker's: unknown names, wrong types, NUL bytes, oversized strings and maps, and numbers out
// of range are refused with a message naming the argument and what it must be. Pure (no I/O).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace sbx::api::mcp {

struct Arg {
  enum class Type {
    kString,
    kInteger,
    kNumber,
    kBoolean,
    kStringArray,  // ["ls", "-l"]
    kStringMap,    // {"K": "V"}
  };
  std::string name;
  Type type = Type::kString;
  std::string description;  // for the model: what it is, its default, its limits
  bool required = false;
  // Strings (each element or value for arrays and maps): at most this many bytes.
  size_t max_bytes = 4096;
  bool allow_nul = false;           // strings may contain NUL bytes
  bool non_empty = false;           // strings (and arrays) may not be empty
  std::vector<std::string> one_of;  // strings: the allowed values
  size_t max_items = 256;           // arrays and maps
  std::optional<double> min, max;   // numbers and integers
};

using Args = std::vector<Arg>;

// {"type":"object","properties":{...},"required":[...],"additionalProperties":false}
nlohmann::json InputSchema(const Args& args);

// Checks `arguments` (a tools/call's, null meaning none) against `args`. EINVAL with a message
// for the model ("timeout: must be an integer from 1 to 600, got \"ten\"").
Status CheckArguments(const Args& args, const nlohmann::json& arguments);

// Readers for arguments that passed CheckArguments (absent: the fallback).
std::string StringArg(const nlohmann::json& a, const char* name, std::string fallback = "");
int64_t IntArg(const nlohmann::json& a, const char* name, int64_t fallback = 0);
bool BoolArg(const nlohmann::json& a, const char* name, bool fallback = false);
std::vector<std::string> StringArrayArg(const nlohmann::json& a, const char* name);
std::map<std::string, std::string> StringMapArg(const nlohmann::json& a, const char* name);
bool HasArg(const nlohmann::json& a, const char* name);

}  // namespace sbx::api::mcp

#include "api/mcp/args.h"

#include <cmath>
#include <cstdio>

#include "api/http/json.h"

namespace sbx::api::mcp {
namespace {

using nlohmann::json;

std::string Number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.15g", v);
  return b;
}

const char* TypeName(Arg::Type t) {
  switch (t) {
    case Arg::Type::kString:
      return "a string";
    case Arg::Type::kInteger:
      return "an integer";
    case Arg::Type::kNumber:
      return "a number";
    case Arg::Type::kBoolean:
      return "true or false";
    case Arg::Type::kStringArray:
      return "an array of strings";
    case Arg::Type::kStringMap:
      return "an object of string values";
  }
  return "?";
}

std::string Range(const Arg& a) {
  if (a.min && a.max) return " from " + Number(*a.min) + " to " + Number(*a.max);
  if (a.min) return " of at least " + Number(*a.min);
  if (a.max) return " of at most " + Number(*a.max);
  return "";
}

Status Bad(const std::string& name, const std::string& what, const json& got) {
  return Status::Error(name + ": " + what + ", got " + http::JsonSnippet(got, 64), EINVAL);
}

Status CheckString(const Arg& a, const std::string& name, const json& v) {
  if (!v.is_string()) return Bad(name, "must be a string", v);
  const auto& s = v.get_ref<const std::string&>();
  if (s.size() > a.max_bytes)
    return Status::Error(name + ": at most " + std::to_string(a.max_bytes) + " bytes (got " +
                             std::to_string(s.size()) + ")",
                         EINVAL);
  if (!a.allow_nul && s.find('\0') != std::string::npos)
    return Status::Error(name + ": must not contain NUL bytes", EINVAL);
  if (a.non_empty && s.empty()) return Status::Error(name + ": must not be empty", EINVAL);
  if (!a.one_of.empty()) {
    bool found = false;
    std::string list;
    for (const auto& o : a.one_of) {
      found = found || o == s;
      list += (list.empty() ? "" : ", ") + ("\"" + o + "\"");
    }
    if (!found) return Bad(name, "must be one of " + list, v);
  }
  return {};
}

Status CheckOne(const Arg& a, const json& v) {
  switch (a.type) {
    case Arg::Type::kString:
      return CheckString(a, a.name, v);
    case Arg::Type::kBoolean:
      if (!v.is_boolean()) return Bad(a.name, "must be true or false", v);
      return {};
    case Arg::Type::kInteger:
    case Arg::Type::kNumber: {
      bool integer = a.type == Arg::Type::kInteger;
      // 5.0 is an integer to JSON Schema; 5.5 is not.
      bool ok = v.is_number() && (!integer || v.is_number_integer() ||
                                  std::trunc(v.get<double>()) == v.get<double>());
      double d = ok ? v.get<double>() : 0;
      if (!ok || !std::isfinite(d) || (a.min && d < *a.min) || (a.max && d > *a.max))
        return Bad(a.name, std::string("must be ") + TypeName(a.type) + Range(a), v);
      return {};
    }
    case Arg::Type::kStringArray: {
      if (!v.is_array()) return Bad(a.name, "must be an array of strings", v);
      if (v.size() > a.max_items)
        return Status::Error(a.name + ": at most " + std::to_string(a.max_items) + " items",
                             EINVAL);
      if (a.non_empty && v.empty()) return Status::Error(a.name + ": must not be empty", EINVAL);
      Arg element = a;
      element.non_empty = false;
      for (size_t i = 0; i < v.size(); i++)
        SBX_RETURN_IF_ERROR(CheckString(element, a.name + "[" + std::to_string(i) + "]", v[i]));
      return {};
    }
    case Arg::Type::kStringMap: {
      if (!v.is_object()) return Bad(a.name, "must be an object of string values", v);
      if (v.size() > a.max_items)
        return Status::Error(a.name + ": at most " + std::to_string(a.max_items) + " entries",
                             EINVAL);
      Arg element = a;
      element.non_empty = false;
      for (const auto& [k, e] : v.items()) {
        if (k.empty() || k.size() > 256 || k.find('\0') != std::string::npos)
          return Status::Error(a.name + ": a name must be 1 to 256 bytes without NUL", EINVAL);
        SBX_RETURN_IF_ERROR(CheckString(element, a.name + "." + k, e));
      }
      return {};
    }
  }
  return {};
}

}  // namespace

json InputSchema(const Args& args) {
  json props = json::object(), required = json::array();
  for (const Arg& a : args) {
    json p;
    switch (a.type) {
      case Arg::Type::kString:
        p = {{"type", "string"}};
        if (!a.one_of.empty()) p["enum"] = a.one_of;
        break;
      case Arg::Type::kInteger:
      case Arg::Type::kNumber:
        p = {{"type", a.type == Arg::Type::kInteger ? "integer" : "number"}};
        if (a.min) p["minimum"] = *a.min;
        if (a.max) p["maximum"] = *a.max;
        break;
      case Arg::Type::kBoolean:
        p = {{"type", "boolean"}};
        break;
      case Arg::Type::kStringArray:
        p = {{"type", "array"}, {"items", {{"type", "string"}}}, {"maxItems", a.max_items}};
        if (a.non_empty) p["minItems"] = 1;
        break;
      case Arg::Type::kStringMap:
        p = {{"type", "object"},
             {"additionalProperties", {{"type", "string"}}},
             {"maxProperties", a.max_items}};
        break;
    }
    p["description"] = a.description;
    props[a.name] = std::move(p);
    if (a.required) required.push_back(a.name);
  }
  json schema = {{"type", "object"}, {"properties", props}, {"additionalProperties", false}};
  if (!required.empty()) schema["required"] = required;
  return schema;
}

Status CheckArguments(const Args& args, const json& arguments) {
  if (arguments.is_null()) return CheckArguments(args, json::object());
  if (!arguments.is_object())
    return Status::Error("arguments: must be an object, got " + http::JsonSnippet(arguments, 64),
                         EINVAL);
  for (const auto& [k, v] : arguments.items()) {
    bool known = false;
    for (const Arg& a : args) known = known || a.name == k;
    if (!known) {
      std::string names;
      for (const Arg& a : args) names += (names.empty() ? "" : ", ") + a.name;
      return Status::Error("unknown argument " + http::JsonSnippet(k, 64) +
                               " (this tool takes: " + (names.empty() ? "none" : names) + ")",
                           EINVAL);
    }
  }
  for (const Arg& a : args) {
    auto it = arguments.find(a.name);
    if (it == arguments.end() || it->is_null()) {
      if (a.required) return Status::Error(a.name + ": required", EINVAL);
      continue;
    }
    SBX_RETURN_IF_ERROR(CheckOne(a, *it));
  }
  return {};
}

bool HasArg(const json& a, const char* name) {
  return a.is_object() && a.contains(name) && !a[name].is_null();
}

std::string StringArg(const json& a, const char* name, std::string fallback) {
  return HasArg(a, name) ? a[name].get<std::string>() : fallback;
}

int64_t IntArg(const json& a, const char* name, int64_t fallback) {
  return HasArg(a, name) ? static_cast<int64_t>(a[name].get<double>()) : fallback;
}

bool BoolArg(const json& a, const char* name, bool fallback) {
  return HasArg(a, name) ? a[name].get<bool>() : fallback;
}

std::vector<std::string> StringArrayArg(const json& a, const char* name) {
  return HasArg(a, name) ? a[name].get<std::vector<std::string>>() : std::vector<std::string>{};
}

std::map<std::string, std::string> StringMapArg(const json& a, const char* name) {
  return HasArg(a, name) ? a[name].get<std::map<std::string, std::string>>()
                         : std::map<std::string, std::string>{};
}

}  // namespace sbx::api::mcp

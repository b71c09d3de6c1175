#include "api/mcp/jsonrpc.h"

#include "api/http/json.h"

namespace sbx::api::mcp {
namespace {

using nlohmann::json;

// Longest method name accepted: every MCP method is far shorter, and the name may be echoed in
// an error message.
constexpr size_t kMaxMethodBytes = 128;
// Longest string id accepted (the SDKs send small integers).
constexpr size_t kMaxIdBytes = 256;

bool ValidId(const json& id) {
  if (id.is_string()) return id.get_ref<const std::string&>().size() <= kMaxIdBytes;
  return id.is_number_integer();
}

Item Invalid(const json& id, int code, std::string message) {
  return Item{std::nullopt, ErrorResponse(id, code, message)};
}

}  // namespace

json ResultResponse(const json& id, json result) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
}

json ErrorResponse(const json& id, int code, std::string_view message, const json& data) {
  json error = {{"code", code}, {"message", message}};
  if (!data.is_null()) error["data"] = data;
  return {{"jsonrpc", "2.0"}, {"id", id}, {"error", std::move(error)}};
}

json Notification(std::string_view method, json params) {
  return {{"jsonrpc", "2.0"}, {"method", method}, {"params", std::move(params)}};
}

Item ParseMessage(const json& j) {
  if (!j.is_object()) return Invalid(nullptr, kInvalidRequest, "a message must be a JSON object");
  // The id, once we know it is one, goes into every error about this message.
  json id = nullptr;
  bool has_id = j.contains("id");
  if (has_id) {
    if (!ValidId(j["id"]))
      return Invalid(nullptr, kInvalidRequest,
                     "id: must be a string (at most 256 bytes) or an integer, got " +
                         http::JsonSnippet(j["id"]));
    id = j["id"];
  }
  auto version = j.find("jsonrpc");
  if (version == j.end() || *version != "2.0")
    return Invalid(id, kInvalidRequest, "jsonrpc: must be \"2.0\"");

  bool has_method = j.contains("method");
  bool has_result = j.contains("result"), has_error = j.contains("error");
  if (!has_method) {
    // A response to a request of the server's.
    if (!has_id || has_result == has_error)
      return Invalid(id, kInvalidRequest,
                     "a message needs a method (request or notification), or an id and one of "
                     "result and error (response)");
    Message m;
    m.kind = Message::Kind::kResponse;
    m.id = id;
    m.is_error = has_error;
    m.payload = has_error ? j["error"] : j["result"];
    return Item{std::move(m), nullptr};
  }
  if (has_result || has_error)
    return Invalid(id, kInvalidRequest, "a request has no result or error");
  const json& method = j["method"];
  if (!method.is_string() || method.get_ref<const std::string&>().empty() ||
      method.get_ref<const std::string&>().size() > kMaxMethodBytes)
    return Invalid(id, kInvalidRequest, "method: must be a non-empty string of at most 128 bytes");
  Message m;
  m.kind = has_id ? Message::Kind::kRequest : Message::Kind::kNotification;
  m.id = id;
  m.method = method.get<std::string>();
  m.params = json::object();
  if (auto p = j.find("params"); p != j.end() && !p->is_null()) {
    if (!p->is_object())
      return Invalid(id, kInvalidParams,
                     "params: must be an object (MCP methods take named "
                     "parameters)");
    m.params = *p;
  }
  return Item{std::move(m), nullptr};
}

Body ParseBody(std::string_view text) {
  Body body;
  json j = http::ParseJsonBody(text);
  if (j.is_discarded()) {
    body.fatal = ErrorResponse(nullptr, kParseError,
                               "not valid JSON (or nested deeper than " +
                                   std::to_string(http::kMaxJsonDepth) + " levels)");
    return body;
  }
  if (j.is_array()) {
    if (j.empty()) {
      body.fatal = ErrorResponse(nullptr, kInvalidRequest, "an empty batch");
      return body;
    }
    body.batch = true;
    for (const json& e : j) body.items.push_back(ParseMessage(e));
    return body;
  }
  if (!j.is_object()) {
    body.fatal = ErrorResponse(nullptr, kInvalidRequest, "a message must be a JSON object");
    return body;
  }
  body.items.push_back(ParseMessage(j));
  return body;
}

}  // namespace sbx::api::mcp

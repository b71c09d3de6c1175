// JSON-RPC 2.0 (https://www.jsonrpc.org/specification) as the Model Context Protocol uses it:
// what a client's message is (request, notification, response, or a batch of them), what is
// wrong with one that is none of these, and the response objects the server sends. Pure (no I/O).
//
// MCP narrows JSON-RPC: a request id is a string or an integer, never null or fractional, and
// params, when present, are an object (every MCP method takes named parameters). Everything here
// is a client's input, so every field is checked before any of it is used.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sbx::api::mcp {

// The error codes of JSON-RPC 2.0 section 5.1.
enum ErrorCode : int {
  kParseError = -32700,
  kInvalidRequest = -32600,
  kMethodNotFound = -32601,
  kInvalidParams = -32602,
  kInternalError = -32603,
};

// One valid message of a client.
struct Message {
  enum class Kind { kRequest, kNotification, kResponse };
  Kind kind = Kind::kRequest;
  nlohmann::json id;       // kRequest, kResponse: a string or an integer
  std::string method;      // kRequest, kNotification
  nlohmann::json params;   // an object; an empty object when the message has none
  nlohmann::json payload;  // kResponse: its `result`, or its `error`
  bool is_error = false;   // kResponse: it carries `error`
};

// One element of a body: a message, or the error response owed for an invalid one (with the
// invalid message's id when it had a usable one, else null).
struct Item {
  std::optional<Message> message;
  nlohmann::json error;  // the whole response object, when !message
};

// A POSTed body or a line of stdio.
struct Body {
  bool batch = false;  // it was an array (JSON-RPC batch)
  std::vector<Item> items;
  // A body that is no message at all (not JSON, an empty batch, a scalar): the one error
  // response to answer with, id null. When set, `items` is empty.
  std::optional<nlohmann::json> fatal;
};

// Parses and checks `text`. Nesting past http::kMaxJsonDepth is a parse error, like bad JSON.
Body ParseBody(std::string_view text);

// Checks one already parsed message (an element of a batch, or a whole body).
Item ParseMessage(const nlohmann::json& j);

// {"jsonrpc":"2.0","id":id,"result":result}
nlohmann::json ResultResponse(const nlohmann::json& id, nlohmann::json result);
// {"jsonrpc":"2.0","id":id,"error":{"code":code,"message":message[,"data":data]}}
nlohmann::json ErrorResponse(const nlohmann::json& id, int code, std::string_view message,
                             const nlohmann::json& data = nullptr);
// {"jsonrpc":"2.0","method":method,"params":params}
nlohmann::json Notification(std::string_view method, nlohmann::json params);

}  // namespace sbx::api::mcp

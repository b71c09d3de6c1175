// The server side of the Model Context Protocol (modelcontextprotocol.io/specification, revisions
// 2024-11-05 to 2025-11-25), independent of the transport: version negotiation in `initialize`,
// `ping`, `tools/list` and `tools/call`. A tool's failure (bad arguments included, so a model can
// correct itself) is a result with isError; a malformed call (no such tool, params of the wrong
// shape) is a JSON-RPC error. The transport (http.cc) owns sessions and decides what a message
// may do before initialize; this file owns what each method answers.
//
// Thread-safety: a Server is immutable once made; Handle may run on any number of threads.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on
#include <boost/asio/awaitable.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "api/mcp/args.h"
#include "api/mcp/jsonrpc.h"
#include "common/status.h"
#include "sandbox/manager.h"  // ApiKeyRecord

namespace sbx::api::mcp {

template <typename T>
using Awaitable = boost::asio::awaitable<T>;

// The protocol revisions this server speaks, newest first. Batches exist up to 2025-03-26
// (2025-06-18 removed them).
inline constexpr std::string_view kProtocolVersions[] = {"2025-11-25", "2025-06-18", "2025-03-26",
                                                         "2024-11-05"};
bool SupportedVersion(std::string_view version);
bool BatchesAllowed(std::string_view version);

// What a tool answers: text for the model, optionally the same as structured JSON (an object),
// and whether it is a failure the model should read and act on.
struct ToolResult {
  std::string text;
  nlohmann::json structured;  // null or an object
  bool is_error = false;

  static ToolResult Error(std::string text) { return {std::move(text), nullptr, true}; }
};

// Who calls and how to reach back.
struct CallContext {
  const sandbox::ApiKeyRecord& key;
  // How the client reached the daemon ("http://127.0.0.1:7777"): expose_port's URLs start here.
  std::string base_url;
  // Tells the client the call is still going (notifications/progress) when it asked for that
  // (a progressToken) and the transport can (an SSE response). Never empty: a no-op otherwise.
  std::function<Awaitable<void>(std::string message)> progress;
};

struct Tool {
  std::string name;
  std::string title;
  std::string description;  // for the model: what it does, its limits
  Args args;
  nlohmann::json annotations;  // readOnlyHint, destructiveHint, idempotentHint, openWorldHint
  // Runs with arguments that passed CheckArguments(args).
  std::function<Awaitable<ToolResult>(const nlohmann::json& arguments, CallContext& ctx)> run;
};

struct ServerInfo {
  std::string name = "sbx";
  std::string title = "sbx sandboxes";
  std::string version = "0.1.0";
  std::string instructions;  // shown to the model by clients that use it
};

// What initialize answered: the revision both sides now speak, and the response's result.
struct Initialized {
  std::string version;
  nlohmann::json result;
};

class Server {
 public:
  Server(ServerInfo info, std::vector<Tool> tools);

  // The answer to `initialize` with `params`: the client's protocolVersion when this server
  // speaks it, else this server's newest (the client then decides whether to go on). EINVAL for
  // params without a protocolVersion string.
  Result<Initialized> Initialize(const nlohmann::json& params) const;

  // The response object for request `m` of an initialized session (ping, tools/list,
  // tools/call; initialize itself is the transport's, through Initialize()). Never throws: a
  // tool that throws is an internal error, logged.
  Awaitable<nlohmann::json> Handle(const Message& m, CallContext& ctx) const;

  const std::vector<Tool>& tools() const { return tools_; }

 private:
  nlohmann::json ListTools() const;
  Awaitable<nlohmann::json> CallTool(const Message& m, CallContext& ctx) const;

  ServerInfo info_;
  std::vector<Tool> tools_;
};

// A tool result as MCP's CallToolResult: {"content":[{"type":"text","text":...}],
// "structuredContent":..., "isError":...}.
nlohmann::json ToolResultJson(const ToolResult& r);

}  // namespace sbx::api::mcp

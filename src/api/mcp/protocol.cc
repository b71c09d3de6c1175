#include "api/mcp/protocol.h"

#include <spdlog/spdlog.h>

#include <exception>

#include "api/http/json.h"

namespace sbx::api::mcp {
namespace {

using nlohmann::json;

}  // namespace

bool SupportedVersion(std::string_view version) {
  for (auto v : kProtocolVersions)
    if (v == version) return true;
  return false;
}

bool BatchesAllowed(std::string_view version) {
  return version == "2025-03-26" || version == "2024-11-05";
}

json ToolResultJson(const ToolResult& r) {
  json out = {{"content", json::array({{{"type", "text"}, {"text", r.text}}})},
              {"isError", r.is_error}};
  if (r.structured.is_object()) out["structuredContent"] = r.structured;
  return out;
}

Server::Server(ServerInfo info, std::vector<Tool> tools)
    : info_(std::move(info)), tools_(std::move(tools)) {}

Result<Initialized> Server::Initialize(const json& params) const {
  auto v = params.find("protocolVersion");
  if (v == params.end() || !v->is_string())
    return Status::Error("params.protocolVersion: required, a string such as \"" +
                             std::string(kProtocolVersions[0]) + "\"",
                         EINVAL);
  Initialized out;
  out.version = SupportedVersion(v->get<std::string>()) ? v->get<std::string>()
                                                        : std::string(kProtocolVersions[0]);
  json server_info = {{"name", info_.name}, {"version", info_.version}};
  if (out.version != "2024-11-05" && out.version != "2025-03-26")
    server_info["title"] = info_.title;
  out.result = {{"protocolVersion", out.version},
                {"capabilities", {{"tools", {{"listChanged", false}}}}},
                {"serverInfo", server_info}};
  if (!info_.instructions.empty()) out.result["instructions"] = info_.instructions;
  return out;
}

json Server::ListTools() const {
  json tools = json::array();
  for (const Tool& t : tools_) {
    json j = {{"name", t.name},
              {"title", t.title},
              {"description", t.description},
              {"inputSchema", InputSchema(t.args)}};
    if (t.annotations.is_object()) {
      j["annotations"] = t.annotations;
      j["annotations"]["title"] = t.title;
    }
    tools.push_back(std::move(j));
  }
  return {{"tools", tools}};
}

Awaitable<json> Server::CallTool(const Message& m, CallContext& ctx) const {
  auto name = m.params.find("name");
  if (name == m.params.end() || !name->is_string())
    co_return ErrorResponse(m.id, kInvalidParams, "params.name: required, the tool's name");
  const Tool* tool = nullptr;
  for (const Tool& t : tools_)
    if (t.name == name->get_ref<const std::string&>()) tool = &t;
  if (!tool)
    co_return ErrorResponse(m.id, kInvalidParams,
                            "unknown tool " + http::JsonSnippet(*name, 64) + " (see tools/list)");
  json arguments = m.params.value("arguments", json(nullptr));
  // Bad arguments are the model's to fix: a result it reads, not a protocol error its client
  // may swallow (the 2025-11-25 revision says so; earlier ones allow it).
  if (Status s = CheckArguments(tool->args, arguments); !s.ok())
    co_return ResultResponse(m.id, ToolResultJson(ToolResult::Error(s.what())));
  if (arguments.is_null()) arguments = json::object();
  try {
    ToolResult r = co_await tool->run(arguments, ctx);
    co_return ResultResponse(m.id, ToolResultJson(r));
  } catch (const std::exception& e) {
    spdlog::error("mcp: tool {}: {}", tool->name, e.what());
  }
  co_return ErrorResponse(m.id, kInternalError, "the tool failed unexpectedly; see the daemon log");
}

Awaitable<json> Server::Handle(const Message& m, CallContext& ctx) const {
  if (m.method == "ping") co_return ResultResponse(m.id, json::object());
  if (m.method == "tools/list") co_return ResultResponse(m.id, ListTools());
  if (m.method == "tools/call") co_return co_await CallTool(m, ctx);
  if (m.method == "initialize")
    co_return ErrorResponse(m.id, kInvalidRequest, "this session is already initialized");
  co_return ErrorResponse(m.id, kMethodNotFound,
                          "method not found: " + http::JsonSnippet(m.method, 64) +
                              " (this server offers tools only: ping, tools/list, tools/call)");
}

}  // namespace sbx::api::mcp

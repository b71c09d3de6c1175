// sbx's MCP tools (docs/mcp.md lists them with their limits): sandbox lifecycle on the manager
// (tools.cc), commands and files on the session (tools_session.cc), ports (tools.cc). Each tool
// checks its arguments through its Args (args.h) before it runs, and answers failures as
// results the model can read ("sandbox X is paused; resume it first"), never with host paths.
#pragma once

#include <vector>

#include "api/mcp/mcp.h"
#include "api/mcp/protocol.h"

namespace sbx::api::mcp {

ServerInfo SandboxServerInfo();
std::vector<Tool> SandboxTools(McpContext& ctx);

// The command and file tools (tools_session.cc), on sandbox::Session.
void AddSessionTools(McpContext& ctx, std::vector<Tool>& tools);

// The text of a failed call for the model: the status's own words for input and state errors,
// a generic line (the detail logged) for internal ones, which may name host paths.
std::string FailureText(const Status& s, std::string_view op);

// Limits the tools state in their descriptions.
inline constexpr int64_t kDefaultCommandTimeoutS = 60;
inline constexpr int64_t kMaxCommandTimeoutS = 600;
inline constexpr size_t kDefaultOutputBytes = 32 * 1024;   // per stream, returned to the model
inline constexpr size_t kMaxOutputBytes = 1024 * 1024;     // the most max_output may ask
inline constexpr size_t kDefaultReadBytes = 256 * 1024;    // read_file
inline constexpr size_t kMaxReadBytes = 4 * 1024 * 1024;   // read_file's max_bytes at most
inline constexpr size_t kMaxWriteBytes = 4 * 1024 * 1024;  // write_file's content at most
inline constexpr int kMaxListEntries = 1000;               // list_files

}  // namespace sbx::api::mcp

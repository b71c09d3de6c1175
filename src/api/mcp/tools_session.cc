// The command and file tools, on sandbox::Session (the session layer of issue 11).
#include "api/mcp/tools.h"

namespace sbx::api::mcp {

void AddSessionTools(McpContext&, std::vector<Tool>&) {}

}  // namespace sbx::api::mcp

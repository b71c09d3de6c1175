// Writing a file into a sandbox through its agent (WRITE_BEGIN, WRITE_DATA..., WRITE_END), shared
// by the native and the E2B APIs so that both stream, pace and clean up alike.
#pragma once

// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
// clang-format off
#include <utility>
// clang-format on

#include <boost/asio/awaitable.hpp>
#include <string_view>

#include "api/http/exchange.h"
#include "common/status.h"
#include "protocol/wire.h"
#include "sandbox/agent_channel.h"

namespace sbx::api {

// Writes `data` with the WRITE_BEGIN payload `begin` (path, mode, owner, xattrs...). The result
// is WRITE_END's entry. A failure after WRITE_BEGIN aborts the write (WRITE_ABORT), so no
// temporary file stays in the box.
boost::asio::awaitable<Result<protocol::Frame>> WriteBoxFile(sandbox::AgentChannel& ch,
                                                             protocol::Writer begin,
                                                             std::string_view data);
// The same with the request body as the data, streamed: a body that fails midway (client gone,
// stalled, over the limit) aborts the write and leaves the old file as it was.
boost::asio::awaitable<Result<protocol::Frame>> WriteBoxFileFromBody(http::Exchange& ex,
                                                                     sandbox::AgentChannel& ch,
                                                                     protocol::Writer begin);

}  // namespace sbx::api

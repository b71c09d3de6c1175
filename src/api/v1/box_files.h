// Writing a file into a sandbox through its agent (WRITE_BEGIN, WRITE_DATA..., WRITE_END), shared
// by the native and the E2B APIs so that both stream, pace and clean up alike.
#pragma once

// Boost 1.74's awaitable.hpp uses std::exchange without including <utility>.
// clang-format off
#include <utility>
// clang-format on

#include <boost/asio/awaitable.hpp>
#include <cstdint>
#include <string_view>

#include "api/errors.h"  // kClientGone, BodyReadFailure: api/e2b/envd_files.cc takes them from here
#include "api/http/exchange.h"
#include "common/status.h"
#include "protocol/wire.h"
#include "sandbox/agent_channel.h"

namespace sbx::api {

// One write into the box, fed in pieces. Every write that began must end with End() or Abort():
// an abandoned one would keep its temporary file in the box until the agent connection closes,
// and that connection is shared and long-lived.
class BoxWrite {
 public:
  explicit BoxWrite(sandbox::AgentChannel& ch) : ch_(ch) {}
  // WRITE_BEGIN with `begin` (path, mode, owner, xattrs...).
  boost::asio::awaitable<Status> Begin(protocol::Writer begin);
  // WRITE_DATA in agent-sized pieces; completes when the agent took them (so the caller is
  // paced by the agent).
  boost::asio::awaitable<Status> Append(std::string_view data);
  // WRITE_END: the new file replaces the old; the result is its entry.
  boost::asio::awaitable<Result<protocol::Frame>> End();
  // WRITE_ABORT when a write is open; the old file stays as it was.
  boost::asio::awaitable<void> Abort();
  bool open() const { return open_; }

 private:
  sandbox::AgentChannel& ch_;
  uint32_t id_ = 0;
  bool open_ = false;
};

// The request body, streamed into a file: BoxWrite with the body as the data. A body that fails
// midway (client gone, stalled, over the limit) aborts the write.
boost::asio::awaitable<Result<protocol::Frame>> WriteBoxFileFromBody(http::Exchange& ex,
                                                                     sandbox::AgentChannel& ch,
                                                                     protocol::Writer begin);

}  // namespace sbx::api

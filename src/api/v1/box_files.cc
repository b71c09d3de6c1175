#include "api/v1/box_files.h"

#include <string>

namespace sbx::api {
namespace {

using boost::asio::awaitable;
using protocol::Tag;
using protocol::Type;

// Ends an open write that will not be finished. The agent also drops it when the connection
// closes; telling it now matters because the connection is shared and long-lived.
awaitable<Status> Abort(sandbox::AgentChannel& ch, uint32_t id, Status why) {
  (void)co_await ch.CallWithId(Type::kWriteAbort, id, protocol::Writer());
  co_return why;
}

}  // namespace

awaitable<Result<protocol::Frame>> WriteBoxFile(sandbox::AgentChannel& ch, protocol::Writer begin,
                                                std::string_view data) {
  uint32_t id = ch.NextId();
  auto b = co_await ch.CallWithId(Type::kWriteBegin, id, std::move(begin));
  if (!b.ok()) co_return b.status();
  while (!data.empty()) {
    std::string_view chunk = data.substr(0, protocol::kMaxChunk);
    Status s = co_await ch.Send(Type::kWriteData, id, protocol::Writer().Str(Tag::kData, chunk));
    if (!s.ok()) co_return co_await Abort(ch, id, s);
    data.remove_prefix(chunk.size());
  }
  co_return co_await ch.CallWithId(Type::kWriteEnd, id, protocol::Writer());
}

awaitable<Result<protocol::Frame>> WriteBoxFileFromBody(http::Exchange& ex,
                                                        sandbox::AgentChannel& ch,
                                                        protocol::Writer begin) {
  uint32_t id = ch.NextId();
  auto b = co_await ch.CallWithId(Type::kWriteBegin, id, std::move(begin));
  if (!b.ok()) co_return b.status();
  std::string buf(protocol::kMaxChunk, '\0');
  for (;;) {
    auto n = co_await ex.ReadSome(buf.data(), buf.size());
    if (!n.ok()) co_return co_await Abort(ch, id, n.status());
    if (*n == 0) break;
    Status s = co_await ch.Send(
        Type::kWriteData, id, protocol::Writer().Str(Tag::kData, std::string_view(buf.data(), *n)));
    if (!s.ok()) co_return co_await Abort(ch, id, s);
  }
  co_return co_await ch.CallWithId(Type::kWriteEnd, id, protocol::Writer());
}

}  // namespace sbx::api

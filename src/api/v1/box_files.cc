#include "api/v1/box_files.h"

#include <string>

namespace sbx::api {

using boost::asio::awaitable;
using protocol::Tag;
using protocol::Type;

awaitable<Status> BoxWrite::Begin(protocol::Writer begin) {
  id_ = ch_.NextId();
  auto b = co_await ch_.CallWithId(Type::kWriteBegin, id_, std::move(begin));
  if (!b.ok()) co_return b.status();
  open_ = true;
  co_return Status();
}

awaitable<Status> BoxWrite::Append(std::string_view data) {
  while (!data.empty()) {
    std::string_view chunk = data.substr(0, protocol::kMaxChunk);
    Status s = co_await ch_.Send(Type::kWriteData, id_, protocol::Writer().Str(Tag::kData, chunk));
    if (!s.ok()) co_return s;
    data.remove_prefix(chunk.size());
  }
  co_return Status();
}

awaitable<Result<protocol::Frame>> BoxWrite::End() {
  open_ = false;
  co_return co_await ch_.CallWithId(Type::kWriteEnd, id_, protocol::Writer());
}

awaitable<void> BoxWrite::Abort() {
  if (!open_) co_return;
  open_ = false;
  (void)co_await ch_.CallWithId(Type::kWriteAbort, id_, protocol::Writer());
}

awaitable<Result<protocol::Frame>> WriteBoxFileFromBody(http::Exchange& ex,
                                                        sandbox::AgentChannel& ch,
                                                        protocol::Writer begin) {
  BoxWrite w(ch);
  Status s = co_await w.Begin(std::move(begin));
  if (!s.ok()) co_return s;
  std::string buf(protocol::kMaxChunk, '\0');
  int64_t received = 0;
  for (;;) {
    auto n = co_await ex.ReadSome(buf.data(), buf.size());
    if (!n.ok()) s = BodyReadFailure(ex, n.status(), received);
    if (!s.ok() || *n == 0) break;
    received += static_cast<int64_t>(*n);
    s = co_await w.Append(std::string_view(buf.data(), *n));
  }
  if (!s.ok()) {
    co_await w.Abort();
    co_return s;
  }
  co_return co_await w.End();
}

}  // namespace sbx::api

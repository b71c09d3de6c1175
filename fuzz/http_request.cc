// Fuzzes what `sbx serve` does with a request's bytes before any handler runs (src/api/http):
// Beast's request parser set up as Connection::Run sets it up, fed in socket-sized pieces; the
// framing checks (CheckFraming); the target's length check, query string (ParseQuery) and routing
// with percent-decoding (Router::Find, with the shapes of the API's patterns); then the body,
// read as Exchange::ReadSome reads it. Regressions go to src/api/http/http_test.cc.
#include <cstdint>
#include <limits>
#include <string>

#include "../fuzz/chunks.h"
#include "api/http/connection.h"
#include "api/http/router.h"
#include "api/http/url.h"

namespace {

using namespace sbx::http;

const Router& TheRouter() {
  static const Router* router = [] {
    auto* r = new Router;
    Handler h = [](Exchange&) -> boost::asio::awaitable<void> { co_return; };
    for (const char* p :
         {"/healthz", "/metrics", "/v1/sandboxes", "/v1/sandboxes/{id}",
          "/v1/sandboxes/{id}/commands", "/v1/sandboxes/{id}/commands/{pid}/stdin",
          "/v1/sandboxes/{id}/files/{path...}", "/v1/sandboxes/{id}/ports/{port}/{rest...}",
          "/sandboxes", "/v2/sandboxes", "/sandboxes/{id}/timeout", "/files",
          "/process.Process/{method}", "/filesystem.Filesystem/{method}"}) {
      r->Get(p, h);
      r->Post(p, h);
    }
    r->Delete("/v1/sandboxes/{id}", h);
    return r;
  }();
  return *router;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ServerOptions opt;
  sbx::fuzz::Chunks in(data, size);
  RequestParser parser;
  parser.header_limit(static_cast<uint32_t>(opt.max_header_bytes));
  parser.body_limit(std::numeric_limits<uint64_t>::max());
  std::string buf;
  boost::system::error_code ec;
  // The header, as async_read_header does it: what was read so far, offered again each time.
  while (!parser.is_header_done()) {
    if (in.done()) return 0;
    auto piece = in.Next();
    buf.append(piece.data(), piece.size());
    size_t used = parser.put(boost::asio::buffer(buf), ec);
    buf.erase(0, used);
    if (ec == bhttp::error::need_more) {
      ec = {};
      continue;
    }
    if (ec) return 0;  // 400 / 414 / 431, connection closed
  }
  if (CheckFraming(parser)) return 0;
  std::string_view target(parser.get().target().data(), parser.get().target().size());
  if (target.size() > opt.max_target_bytes) return 0;
  std::string_view path = target;
  if (size_t q = target.find('?'); q != std::string_view::npos) {
    path = target.substr(0, q);
    auto query = ParseQuery(target.substr(q + 1));
    if (query.ok()) (void)query->Get("path");
  }
  std::string_view method(parser.get().method_string().data(), parser.get().method_string().size());
  auto match = TheRouter().Find(method, path);
  for (const auto& [k, v] : match.params.items()) (void)PercentEncode(v, true);
  // The body, as Exchange::ReadSome reads it into a handler's buffer.
  char scratch[512];
  while (!parser.is_done()) {
    parser.get().body().data = scratch;
    parser.get().body().size = sizeof scratch;
    size_t used = parser.put(boost::asio::buffer(buf), ec);
    buf.erase(0, used);
    parser.get().body().data = nullptr;
    if (ec == bhttp::error::need_buffer) ec = {};
    if (ec == bhttp::error::need_more) {
      ec = {};
      if (in.done()) break;
      auto piece = in.Next();
      buf.append(piece.data(), piece.size());
      continue;
    }
    if (ec) break;
  }
  return 0;
}

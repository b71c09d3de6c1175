// Fuzzes what `sbx serve` does with a request's bytes before any handler runs (src/api/http):
// Beast's request parser set up as Connection::Run sets it up, fed in socket-sized pieces; the
// framing checks (CheckFraming); the target's length check, query string (ParseQuery) and the
// percent-decoding of each path segment (what Router::Find does to parameters; the router itself
// is coroutine code, see CMakeLists.txt); then the body, read as Exchange::ReadSome reads it.
// Regressions go to src/api/http/http_test.cc.
#include <boost/beast/http.hpp>
#include <cstdint>
#include <limits>
#include <string>

#include "../fuzz/chunks.h"
#include "api/http/framing.h"
#include "api/http/url.h"

namespace bhttp = boost::beast::http;
using RequestParser = bhttp::request_parser<bhttp::buffer_body>;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sbx::http;
  // ServerOptions' defaults (server.h).
  constexpr size_t kMaxHeaderBytes = 16 * 1024;
  constexpr size_t kMaxTargetBytes = 12 * 1024;
  sbx::fuzz::Chunks in(data, size);
  RequestParser parser;
  parser.header_limit(static_cast<uint32_t>(kMaxHeaderBytes));
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
  if (target.size() > kMaxTargetBytes) return 0;
  std::string_view path = target;
  if (size_t q = target.find('?'); q != std::string_view::npos) {
    path = target.substr(0, q);
    auto query = ParseQuery(target.substr(q + 1));
    if (query.ok()) (void)query->Get("path");
  }
  for (size_t pos = 0; pos < path.size();) {
    size_t slash = std::min(path.find('/', pos), path.size());
    auto segment = PercentDecode(path.substr(pos, slash - pos), false);
    if (segment.ok()) (void)PercentEncode(*segment, true);
    pos = slash + 1;
  }
  // The body, as Exchange::ReadSome reads it into a handler's buffer.
  char scratch[512];
  while (!parser.is_done()) {
    parser.get().body().data = scratch;
    parser.get().body().size = sizeof scratch;
    size_t used = parser.put(boost::asio::buffer(buf), ec);
    buf.erase(0, used);
    parser.get().body().data = nullptr;
    if (ec == bhttp::error::need_buffer) ec = {};
    // Nothing taken and no error: Beast's read_some reads from the socket then; so do we.
    if (ec == bhttp::error::need_more || (!ec && used == 0)) {
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

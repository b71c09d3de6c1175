#include "api/http/framing.h"

#include <algorithm>
#include <vector>

namespace sbx::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

// RFC 9112 section 6 message framing, beyond what Beast checks. Anything a proxy in front of sbx
// could read differently is refused and the connection closed, so no body can be taken for a
// next request (request smuggling):
// - Content-Length more than once, or as a list ("5, 5"): 400 (section 6.3 allows rejecting).
// - Content-Length together with Transfer-Encoding: 400 (section 6.1: "ought to be handled as an
//   error"; Beast rejects some orders, not `Transfer-Encoding: gzip` then Content-Length).
// - Transfer-Encoding in an HTTP/1.0 request: 400 (section 6.1: the framing is faulty).
// - Transfer-Encoding whose final coding is not chunked (`gzip`, `chunked, gzip`), chunked twice,
//   or an empty list: 400 (section 6.3: the length cannot be determined; "MUST respond with 400
//   and then close the connection"). Beast would read such a body as empty and its bytes as the
//   next request.
// - Codings before the final chunked (`gzip, chunked`): the framing is sound but sbx decodes no
//   other transfer coding, so 501 as section 6.1 says for a coding the server does not
//   understand; the connection is closed too, as the body is not read.
std::optional<Refusal> CheckFraming(const bhttp::request_parser<bhttp::buffer_body>& parser) {
  const auto& req = parser.get();
  size_t lengths = 0;
  bool listed_length = false;
  std::vector<std::string> codings;
  bool has_te = false;
  for (const auto& field : req) {
    if (field.name() == bhttp::field::content_length) {
      ++lengths;
      if (field.value().find(',') != beast::string_view::npos) listed_length = true;
    } else if (field.name() == bhttp::field::transfer_encoding) {
      has_te = true;
      auto v = field.value();
      size_t start = 0;
      while (start <= v.size()) {
        size_t comma = std::min(v.find(',', start), v.size());
        auto token = v.substr(start, comma - start);
        while (!token.empty() && (token.front() == ' ' || token.front() == '\t'))
          token.remove_prefix(1);
        while (!token.empty() && (token.back() == ' ' || token.back() == '\t'))
          token.remove_suffix(1);
        if (!token.empty()) codings.emplace_back(token.data(), token.size());
        start = comma + 1;
      }
    }
  }
  if (lengths > 1 || listed_length) {
    return Refusal{400, "bad_request", "more than one Content-Length"};
  }
  if (!has_te) return std::nullopt;
  if (lengths > 0) {
    return Refusal{400, "bad_request", "both Content-Length and Transfer-Encoding"};
  }
  if (req.version() < 11) {
    return Refusal{400, "bad_request", "Transfer-Encoding in an HTTP/1.0 request"};
  }
  auto is_chunked = [](const std::string& c) { return beast::iequals(c, "chunked"); };
  if (codings.empty() || !is_chunked(codings.back())) {
    return Refusal{400, "bad_request", "Transfer-Encoding must end in chunked"};
  }
  if (std::count_if(codings.begin(), codings.end(), is_chunked) > 1) {
    return Refusal{400, "bad_request", "chunked applied more than once"};
  }
  if (codings.size() > 1) {
    return Refusal{
        501, "not_implemented",
        "transfer coding not supported: " + codings.front().substr(0, 64) + " (only chunked is)"};
  }
  if (!parser.chunked()) return Refusal{400, "bad_request", "malformed Transfer-Encoding"};
  return std::nullopt;
}

}  // namespace sbx::http

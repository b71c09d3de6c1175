// Unit tests of the E2B facade's pure encoders (wire.h).
#include "api/e2b/wire.h"

#include <gtest/gtest.h>
#include <zlib.h>

namespace sbx::api::e2b {
namespace {

TEST(E2bWire, EnvelopeRoundTrip) {
  std::string e = Envelope(0, R"({"a":1})");
  ASSERT_EQ(e.size(), 5u + 7u);
  EXPECT_EQ(e[0], 0);
  EXPECT_EQ(e[4], 7);
  auto j = ParseEnvelopeJson(e);
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)["a"], 1);
  EXPECT_EQ(static_cast<uint8_t>(Envelope(2, "{}")[0]), 2);
  EXPECT_FALSE(ParseEnvelopeJson("\x01\0\0\0\x02{}").ok());
  EXPECT_FALSE(ParseEnvelopeJson(std::string("\0\0\0\0\x09{}", 7)).ok());
}

TEST(E2bWire, ConnectCodes) {
  EXPECT_STREQ(ConnectCode(ENOENT), "not_found");
  EXPECT_STREQ(ConnectCode(EEXIST), "already_exists");
  EXPECT_EQ(ConnectHttpStatus("not_found"), 404);
  EXPECT_EQ(ConnectHttpStatus("unauthenticated"), 401);
  EXPECT_EQ(ConnectHttpStatus("deadline_exceeded"), 504);
}

TEST(E2bWire, TripleEncodedMetadataFilter) {
  // What the SDK sends for {user: 'a b', 'k&': 'v=1'} after the server's query decoding
  // (spec 1.4): metadata=user%3Da%252520b%26k%252526%3Dv%25253D1.
  auto m = DecodeMetadataFilter("user=a%2520b&k%2526=v%253D1");
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0], (std::pair<std::string, std::string>{"user", "a b"}));
  EXPECT_EQ((*m)[1], (std::pair<std::string, std::string>{"k&", "v=1"}));
  EXPECT_FALSE(DecodeMetadataFilter("novalue").ok());
}

TEST(E2bWire, SandboxHost) {
  auto h = ParseSandboxHost("49983-abc123.e2b.test:8443");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->first, 49983);
  EXPECT_EQ(h->second, "abc123");
  EXPECT_FALSE(ParseSandboxHost("127.0.0.1:3000"));
  EXPECT_FALSE(ParseSandboxHost("localhost"));
  EXPECT_FALSE(ParseSandboxHost("api.e2b.test"));
  EXPECT_FALSE(ParseSandboxHost("x-abc.e2b.test"));
}

TEST(E2bWire, SignatureAndBasicAuth) {
  std::string s = FileSignature("/home/user/a.txt", "read", "", "tok", std::nullopt);
  EXPECT_EQ(s.rfind("v1_", 0), 0u);
  EXPECT_EQ(s.find('='), std::string::npos);
  EXPECT_NE(s, FileSignature("/home/user/a.txt", "write", "", "tok", std::nullopt));
  EXPECT_NE(s, FileSignature("/home/user/a.txt", "read", "", "tok", 123));
  EXPECT_EQ(BasicAuthUser("Basic cm9vdDo="), "root");
  EXPECT_EQ(BasicAuthUser("Bearer x"), "");
}

TEST(E2bWire, Multipart) {
  std::string body =
      "--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/a%22b.txt\"\r\n"
      "Content-Type: application/octet-stream\r\n\r\nhello\r\n"
      "--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"rel.txt\"\r\n\r\n"
      "two\r\nlines\r\n--XX--\r\n";
  auto parts = ParseMultipart("multipart/form-data; boundary=XX", body);
  ASSERT_TRUE(parts.ok()) << parts.status().message();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].filename, "/a\"b.txt");
  EXPECT_EQ((*parts)[0].data, "hello");
  EXPECT_EQ((*parts)[1].data, "two\r\nlines");
  EXPECT_FALSE(ParseMultipart("multipart/form-data", body).ok());
}

TEST(E2bWire, Gunzip) {
  std::string plain(100000, 'x');
  uLongf n = compressBound(plain.size()) + 32;
  std::string gz(n, '\0');
  z_stream z{};
  ASSERT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  z.next_in = reinterpret_cast<Bytef*>(plain.data());
  z.avail_in = plain.size();
  z.next_out = reinterpret_cast<Bytef*>(gz.data());
  z.avail_out = n;
  ASSERT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  gz.resize(n - z.avail_out);
  deflateEnd(&z);
  auto out = Gunzip(gz, 1 << 20);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, plain);
  EXPECT_FALSE(Gunzip(gz, 10).ok());
  EXPECT_FALSE(Gunzip("not gzip", 100).ok());
}

TEST(E2bWire, UsersAndPaths) {
  std::string passwd =
      "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\n";
  auto u = FindUser(passwd, "user");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->uid, 1000);
  EXPECT_EQ(u->home, "/home/user");
  EXPECT_FALSE(FindUser(passwd, "nobody"));
  EXPECT_EQ(ResolvePath("a.txt", "/home/user"), "/home/user/a.txt");
  EXPECT_EQ(ResolvePath("~/a", "/home/user"), "/home/user/a");
  EXPECT_EQ(ResolvePath("/abs", "/home/user"), "/abs");
  EXPECT_EQ(Permissions(0100644, 1), "-rw-r--r--");
  EXPECT_EQ(Permissions(040755, 2), "drwxr-xr-x");
}

TEST(E2bWire, UploadMetadataHeaders) {
  auto m = UploadMetadata({{"X-Metadata-Owner", "alice"},
                           {"x-metadata-Stage", "draft v2"},
                           {"X-METADATA-owner", "bob"},  // same key again: the first wins
                           {"X-Metadata-", "ignored"}});
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(*m, (FileMetadata{{"owner", "alice"}, {"stage", "draft v2"}}));
  EXPECT_TRUE(UploadMetadata({})->empty());
  EXPECT_FALSE(UploadMetadata({{"X-Metadata-k", "tab\there"}}).ok());
  EXPECT_FALSE(UploadMetadata({{"X-Metadata-k", "caf\xc3\xa9"}}).ok());
  EXPECT_TRUE(UploadMetadata({{"X-Metadata-" + std::string(246, 'k'), "v"}}).ok());
  EXPECT_FALSE(UploadMetadata({{"X-Metadata-" + std::string(247, 'k'), "v"}}).ok());
  // 9 ("user.e2b.") + 1 + 4086 = 4096 fits; one more byte does not.
  EXPECT_TRUE(UploadMetadata({{"X-Metadata-k", std::string(4086, 'v')}}).ok());
  auto big = UploadMetadata({{"X-Metadata-k", std::string(4087, 'v')}});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().err(), EINVAL);
}

TEST(E2bWire, EntryMetadataFromXattrs) {
  auto xattr = [](std::string_view name, std::string_view value) {
    return protocol::Writer().Str(protocol::Tag::kName, name).Str(protocol::Tag::kData, value);
  };
  protocol::Writer w;
  w.Str(protocol::Tag::kName, "a.txt")
      .Int(protocol::Tag::kFileType, 1)
      .Nested(protocol::Tag::kXattr, xattr("user.e2b.owner", "alice"))
      .Nested(protocol::Tag::kXattr, xattr("user.other", "x"))
      .Nested(protocol::Tag::kXattr, xattr("user.e2b.bad", "\xff\xfe"))
      .Nested(protocol::Tag::kXattr, xattr("user.e2b.", "no key"));
  protocol::Reader r;
  ASSERT_TRUE(r.Parse(w.payload()));
  EXPECT_EQ(EntryMetadata(r), (FileMetadata{{"owner", "alice"}}));
  auto j = EntryInfo(r);
  EXPECT_EQ(j["metadata"], (nlohmann::json{{"owner", "alice"}}));
  protocol::Reader none;
  ASSERT_TRUE(none.Parse(protocol::Writer().Str(protocol::Tag::kName, "b").payload()));
  EXPECT_FALSE(EntryInfo(none).contains("metadata"));
}

}  // namespace
}  // namespace sbx::api::e2b

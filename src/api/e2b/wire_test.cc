// Unit tests of the E2B facade's pure encoders (wire.h).
#include "api/e2b/wire.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include "sandbox/session.h"

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

TEST(E2bWire, AgentSocketPathsLeaveNoMessage) {
  EXPECT_EQ(WithoutHostPaths("stat#7: agent /var/lib/sbx/boxes/sbx1/agent.sock: connection closed"),
            "stat#7: the sandbox's agent: connection closed");
  EXPECT_EQ(WithoutHostPaths("sandbox x: connect /d/b/agent.sock: Connection refused"),
            "sandbox x: connect the sandbox's agent: Connection refused");
  // The agent's own messages name box paths, which stay.
  EXPECT_EQ(WithoutHostPaths("stat /home/user/missing: No such file or directory"),
            "stat /home/user/missing: No such file or directory");
  EXPECT_EQ(WithoutHostPaths(""), "");
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

struct Part {
  std::string name, filename, data;
  bool operator==(const Part&) const = default;
};

// Parses `body` fed in pieces of `step` bytes; the parts, or the first error.
Result<std::vector<Part>> ParseInPieces(const std::string& body, size_t step) {
  MultipartParser p("XX");
  std::vector<Part> parts;
  bool open = false;
  for (size_t off = 0; off < body.size(); off += step) {
    std::vector<MultipartParser::Event> events;
    SBX_RETURN_IF_ERROR(p.Feed(std::string_view(body).substr(off, step), &events));
    for (auto& e : events) {
      if (e.kind == MultipartParser::Event::kPartBegin) {
        EXPECT_FALSE(open);
        parts.push_back({e.name, e.filename, ""});
        open = true;
      } else if (e.kind == MultipartParser::Event::kData) {
        EXPECT_TRUE(open);
        parts.back().data += e.data;
      } else {
        EXPECT_TRUE(open);
        open = false;
      }
    }
  }
  SBX_RETURN_IF_ERROR(p.Finish());
  return parts;
}

TEST(E2bWire, MultipartInAnyPieces) {
  std::string body =
      "preamble\r\n--XX\r\nContent-Disposition: form-data; name=\"file\"; "
      "filename=\"/a%22b.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n"
      "--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"rel.txt\"\r\n\r\n"
      "two\r\nlines\r\n--X not yet\r\n--XX  \r\ncontent-disposition: form-data; name=\"other\"\r\n"
      "\r\n\r\n--XX--\r\nepilogue";
  std::vector<Part> want = {{"file", "/a\"b.txt", "hello"},
                            {"file", "rel.txt", "two\r\nlines\r\n--X not yet"},
                            {"other", "", ""}};
  for (size_t step : std::vector<size_t>{1, 2, 3, 5, 7, 13, 64, 100000}) {
    auto parts = ParseInPieces(body, step);
    ASSERT_TRUE(parts.ok()) << step << ": " << parts.status().message();
    EXPECT_EQ(*parts, want) << step;
  }
  EXPECT_EQ(*MultipartParser::Boundary("multipart/form-data; boundary=XX"), "XX");
  EXPECT_FALSE(MultipartParser::Boundary("multipart/form-data").ok());
  // Truncated, missing, malformed.
  EXPECT_FALSE(ParseInPieces(body.substr(0, body.find("--XX--")), 7).ok());
  EXPECT_FALSE(ParseInPieces("no delimiter at all", 4).ok());
  EXPECT_FALSE(ParseInPieces("--XXjunk\r\n\r\n--XX--", 4).ok());
  EXPECT_FALSE(ParseInPieces("--XX\r\n" + std::string(20000, 'h'), 1000).ok());
}

std::string GzipOf(const std::string& plain) {
  uLongf n = compressBound(plain.size()) + 32;
  std::string gz(n, '\0');
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(plain.data()));
  z.avail_in = plain.size();
  z.next_out = reinterpret_cast<Bytef*>(gz.data());
  z.avail_out = n;
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  gz.resize(n - z.avail_out);
  deflateEnd(&z);
  return gz;
}

TEST(E2bWire, GzipInflaterInPieces) {
  std::string plain;
  for (int i = 0; i < 300000; ++i) plain += static_cast<char>('a' + (i * 31 + i / 7) % 26);
  std::string gz = GzipOf(plain);
  for (size_t step : {size_t{1}, size_t{7}, size_t{4096}, size_t{1} << 20}) {
    GzipInflater g;
    std::string out;
    for (size_t off = 0; off < gz.size(); off += step)
      ASSERT_TRUE(g.Feed(std::string_view(gz).substr(off, step), &out).ok()) << step;
    EXPECT_TRUE(g.Finish().ok());
    EXPECT_EQ(out, plain) << step;
  }
  std::string out;
  GzipInflater bad;
  EXPECT_EQ(bad.Feed("not gzip at all", &out).err(), EINVAL);
  GzipInflater cut;
  out.clear();
  ASSERT_TRUE(cut.Feed(std::string_view(gz).substr(0, gz.size() / 2), &out).ok());
  EXPECT_FALSE(cut.Finish().ok());
}

TEST(E2bWire, GzipDeflaterRoundTripAndDownloadEncoding) {
  std::string plain;
  for (int i = 0; i < 200000; ++i) plain += static_cast<char>('a' + (i * 13 + i / 5) % 26);
  GzipDeflater d;
  std::string gz;
  for (size_t off = 0; off < plain.size(); off += 65536)
    ASSERT_TRUE(d.Feed(std::string_view(plain).substr(off, 65536), &gz).ok());
  ASSERT_TRUE(d.Finish(&gz).ok());
  EXPECT_LT(gz.size(), plain.size());
  GzipInflater i;
  std::string back;
  ASSERT_TRUE(i.Feed(gz, &back).ok());
  EXPECT_TRUE(i.Finish().ok());
  EXPECT_EQ(back, plain);

  EXPECT_EQ(ContentTypeFor("a.JSON"), "application/json");
  EXPECT_EQ(ContentTypeFor("index.html"), "text/html; charset=utf-8");
  EXPECT_EQ(ContentTypeFor("data.bin"), "application/octet-stream");
  EXPECT_EQ(ContentTypeFor("noext"), "application/octet-stream");
  EXPECT_EQ(DownloadEncoding(""), "");
  EXPECT_EQ(DownloadEncoding("gzip"), "gzip");
  EXPECT_EQ(DownloadEncoding("br, GZIP;q=0.5"), "gzip");
  EXPECT_EQ(DownloadEncoding("gzip;q=0, identity"), "");
  EXPECT_EQ(DownloadEncoding("br"), "");
  EXPECT_EQ(DownloadEncoding("*"), "gzip");
  EXPECT_EQ(DownloadEncoding("br, identity;q=0"), std::nullopt);
  EXPECT_EQ(DownloadEncoding("*;q=0"), std::nullopt);
}

TEST(E2bWire, Permissions) {
  EXPECT_EQ(Permissions(0100644, 1), "-rw-r--r--");
  EXPECT_EQ(Permissions(040755, 2), "drwxr-xr-x");
  EXPECT_EQ(Permissions(0120777, 3), "Lrwxrwxrwx");
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

TEST(E2bWire, EntryInfoOfAnEntry) {
  sandbox::FileEntry e;
  e.name = "a.txt";
  e.path = "/home/user/a.txt";
  e.type = sandbox::FileEntry::Type::kFile;
  e.mode = 0100644;
  e.size = 3;
  // Values that are not UTF-8 are left out (the SDKs decode metadata as JSON strings).
  e.metadata = {{"owner", "alice"}, {"bad", "\xff\xfe"}};
  EXPECT_EQ(EntryMetadata(e), (FileMetadata{{"owner", "alice"}}));
  auto j = EntryInfo(e);
  EXPECT_EQ(j["metadata"], (nlohmann::json{{"owner", "alice"}}));
  EXPECT_EQ(j["permissions"], "-rw-r--r--");
  EXPECT_EQ(j["size"], "3");
  EXPECT_FALSE(j.contains("symlinkTarget"));
  // A followed symlink: its target's type, the link's own permissions, the resolved target.
  e.type = sandbox::FileEntry::Type::kDir;
  e.mode = 040755;
  e.link_target = "/tmp/d";
  e.metadata.clear();
  j = EntryInfo(e);
  EXPECT_EQ(j["type"], "FILE_TYPE_DIRECTORY");
  EXPECT_EQ(j["permissions"], "Lrwxrwxrwx");
  EXPECT_EQ(j["symlinkTarget"], "/tmp/d");
  EXPECT_FALSE(j.contains("metadata"));
}

// ---- network (spec 6): E2B's egress fields onto a policy ----

nlohmann::json J(const char* text) { return nlohmann::json::parse(text); }

std::string EgressError(const char* net, std::optional<bool> internet = std::nullopt) {
  auto e = ParseEgress(J(net), internet);
  EXPECT_FALSE(e.ok()) << net;
  EXPECT_EQ(e.status().err(), EINVAL) << net;
  return e.ok() ? "" : e.status().message();
}

TEST(E2bNetwork, NothingSaidIsNotGivenAndNoInternetIsAnEmptyAllowlist) {
  auto e = ParseEgress(nlohmann::json(), std::nullopt);
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE(e->given);
  // true is E2B's default, which SDKs send on every create.
  e = ParseEgress(nlohmann::json(), true);
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE(e->given);
  e = ParseEgress(J(R"({"allowPublicTraffic": false, "maskRequestHost": "x:${PORT}"})"),
                  std::nullopt);
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE(e->given);
  // allow_internet_access: false => denyOut [0.0.0.0/0]: nothing out.
  e = ParseEgress(nlohmann::json(), false);
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->given);
  EXPECT_EQ(e->policy.mode, network::Mode::kAllowlist);
  EXPECT_TRUE(e->policy.allow.empty());
  EXPECT_FALSE(AllowsInternet(e->policy));
  EXPECT_EQ(EgressJson(e->policy, e->rules), J(R"({"allowOut": [], "denyOut": ["0.0.0.0/0"]})"));
  // true, and updateNetwork({}): open, everything cleared.
  for (auto internet : {std::optional<bool>(true), std::optional<bool>()}) {
    e = ParseEgress(J(R"({"allowOut": []})"), internet);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->policy.mode, network::Mode::kOpen);
    EXPECT_TRUE(AllowsInternet(e->policy));
  }
}

TEST(E2bNetwork, DenyAllMakesAnAllowlistOfAllowOut) {
  auto e = ParseEgress(J(R"({"allowOut": ["pypi.org", "*.npmjs.org", "140.82.112.0/20"],
            "denyOut": ["0.0.0.0/0", "198.18.0.0/15"]})"),
                       std::nullopt);
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(e->policy.mode, network::Mode::kAllowlist);
  ASSERT_EQ(e->policy.allow.size(), 3u);
  EXPECT_EQ(e->policy.allow[1].text, "*.npmjs.org");
  ASSERT_EQ(e->policy.deny.size(), 1u);
  EXPECT_EQ(EgressJson(e->policy, e->rules),
            J(R"({"allowOut": ["pypi.org", "*.npmjs.org", "140.82.112.0/20"],
                  "denyOut": ["0.0.0.0/0", "198.18.0.0/15"]})"));
  // allow_internet_access: false with a domain in allowOut is the same.
  e = ParseEgress(J(R"({"allowOut": ["pypi.org"]})"), false);
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(e->policy.mode, network::Mode::kAllowlist);
}

TEST(E2bNetwork, OtherwiseOpenMinusDenyOutWithAllowOutWinning) {
  auto e = ParseEgress(J(R"({"allowOut": ["8.8.4.4"], "denyOut": ["8.8.0.0/16"]})"), true);
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(e->policy.mode, network::Mode::kOpen);
  ASSERT_EQ(e->policy.allow.size(), 1u);
  ASSERT_EQ(e->policy.deny.size(), 1u);
  EXPECT_EQ(EgressJson(e->policy, e->rules),
            J(R"({"allowOut": ["8.8.4.4"], "denyOut": ["8.8.0.0/16"]})"));
  // The round trip through the record's JSON.
  auto back = network::Policy::FromJson(e->policy.ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(EgressJson(*back, e->rules), EgressJson(e->policy, e->rules));
}

TEST(E2bNetwork, ADomainInAllowOutNeedsDenyAll) {
  std::string m = EgressError(R"({"allowOut": ["x.com"]})");
  EXPECT_NE(m.find("x.com"), std::string::npos) << m;
  EXPECT_NE(m.find("0.0.0.0/0"), std::string::npos) << m;
  EgressError(R"({"allowOut": ["*"], "denyOut": ["10.0.0.0/8"]})");
  EgressError(R"({"allowOut": ["*.x.com"]})", true);
}

TEST(E2bNetwork, DenyOutTakesAddressesOnly) {
  std::string m = EgressError(R"({"denyOut": ["evil.com"]})");
  EXPECT_NE(m.find("evil.com"), std::string::npos) << m;
  EgressError(R"({"denyOut": ["*.evil.com"]})");
  EgressError(R"({"denyOut": ["1.2.3.4:443"]})");
  EgressError(R"({"denyOut": ["1.2.3.4/33"]})");
  EgressError(R"({"denyOut": "1.2.3.4"})");
  EgressError(R"({"denyOut": [1234]})");
}

TEST(E2bNetwork, BadEntriesAndFieldsAreNamed) {
  std::string m = EgressError(R"({"allowOut": ["bad name!"], "denyOut": ["0.0.0.0/0"]})");
  EXPECT_NE(m.find("allowOut"), std::string::npos) << m;
  EXPECT_NE(m.find("bad name!"), std::string::npos) << m;
  EgressError(R"({"allowOut": {"x": 1}})");
  EgressError(R"({"egressProxy": {"address": "p:1080"}})");
  EgressError(R"({"allowOutt": []})");
  EgressError(R"([])");
  std::string many = R"({"denyOut": [)";
  for (size_t i = 0; i <= network::kMaxRules; ++i)
    many += (i ? ",\"" : "\"") + std::string("1.2.3.4\"");
  many += "]}";
  EgressError(many.c_str());
}

TEST(E2bNetwork, RulesFollowE2bsLimits) {
  auto ok = ParseEgress(J(R"({"allowOut": ["api.x.com"], "denyOut": ["0.0.0.0/0"],
      "rules": {"api.x.com": [{"transform": {"headers":
        {"Authorization": "Bearer ${e2b.secrets.openai}"}}}], "b.x.com": [{}]}})"),
                        std::nullopt);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->rules["api.x.com"][0]["transform"]["headers"]["Authorization"],
            "Bearer ${e2b.secrets.openai}");
  EXPECT_EQ(EgressJson(ok->policy, ok->rules)["rules"], ok->rules);

  // 11 domains.
  std::string many = R"({"rules": {)";
  for (int i = 0; i <= static_cast<int>(kMaxRuleDomains); ++i)
    many += (i ? "," : "") + std::string("\"d") + std::to_string(i) + ".x.com\": []";
  many += "}}";
  EXPECT_NE(EgressError(many.c_str()).find("10 domains"), std::string::npos);
  // A domain over 128 characters, not a domain.
  std::string longd = R"({"rules": {")" + std::string(125, 'a') + R"(.com": []}})";
  EgressError(longd.c_str());
  EgressError(R"({"rules": {"1.2.3.0/24": []}})");
  // Two transforms for one domain.
  EgressError(R"({"rules": {"x.com": [{}, {}]}})");
  // 21 headers.
  std::string hs = R"({"rules": {"x.com": [{"transform": {"headers": {)";
  for (int i = 0; i <= static_cast<int>(kMaxRuleHeaders); ++i)
    hs += (i ? "," : "") + std::string("\"H") + std::to_string(i) + "\": \"v\"";
  hs += "}}}]}}";
  EXPECT_NE(EgressError(hs.c_str()).find("20 headers"), std::string::npos);
  // A header name over 64, not a token; a value over 2048, with a line break, not a string.
  std::string longname = R"({"rules": {"x.com": [{"transform": {"headers": {")" +
                         std::string(65, 'h') + R"(": "v"}}}]}})";
  EgressError(longname.c_str());
  EgressError(R"({"rules": {"x.com": [{"transform": {"headers": {"A B": "v"}}}]}})");
  std::string longvalue = R"({"rules": {"x.com": [{"transform": {"headers": {"A": ")" +
                          std::string(2049, 'v') + R"("}}}]}})";
  EgressError(longvalue.c_str());
  EgressError(R"({"rules": {"x.com": [{"transform": {"headers": {"A": "a\r\nB: c"}}}]}})");
  EgressError(R"({"rules": {"x.com": [{"transform": {"headers": {"A": 1}}}]}})");
  EgressError(R"({"rules": {"x.com": [{"transform": {"body": {}}}]}})");
  EgressError(R"({"rules": ["x.com"]})");
}

}  // namespace
}  // namespace sbx::api::e2b

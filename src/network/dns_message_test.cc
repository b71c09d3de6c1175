#include "network/dns_message.h"

#include <ares.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sbx::network::dns {
namespace {

using Bytes = std::vector<uint8_t>;

void Put16(Bytes& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v >> 8));
  b.push_back(static_cast<uint8_t>(v));
}

Bytes Wire(const std::string& dotted) {
  Bytes out;
  size_t start = 0;
  while (start < dotted.size()) {
    size_t dot = dotted.find('.', start);
    if (dot == std::string::npos) dot = dotted.size();
    out.push_back(static_cast<uint8_t>(dot - start));
    out.insert(out.end(), dotted.begin() + static_cast<long>(start),
               dotted.begin() + static_cast<long>(dot));
    start = dot + 1;
  }
  out.push_back(0);
  return out;
}

// A query as a stub resolver sends it; `opt_size` 0: no EDNS.
Bytes MakeQuery(uint16_t id, const std::string& name, uint16_t type, uint16_t opt_size = 0,
                uint16_t qclass = kClassIn, uint16_t flags = 0x0100) {
  Bytes b;
  Put16(b, id);
  Put16(b, flags);
  Put16(b, 1);
  Put16(b, 0);
  Put16(b, 0);
  Put16(b, opt_size ? 1 : 0);
  Bytes w = Wire(name);
  b.insert(b.end(), w.begin(), w.end());
  Put16(b, type);
  Put16(b, qclass);
  if (opt_size) {
    b.push_back(0);
    Put16(b, kTypeOpt);
    Put16(b, opt_size);
    Put16(b, 0);
    Put16(b, 0x8000);  // DO
    Put16(b, 0);
  }
  return b;
}

TEST(DnsMessage, ParsesAPlainQuery) {
  Parsed p = ParseQuery(MakeQuery(0x1234, "PyPI.org", kTypeA));
  ASSERT_EQ(p.outcome, Parsed::Outcome::kOk) << p.error;
  EXPECT_EQ(p.query.id, 0x1234);
  EXPECT_TRUE(p.query.rd);
  ASSERT_TRUE(p.query.question);
  EXPECT_EQ(p.query.question->name, "PyPI.org");  // case kept: the answer echoes it
  EXPECT_EQ(p.query.question->type, kTypeA);
  EXPECT_FALSE(p.query.edns);
  EXPECT_EQ(p.query.MaxUdpAnswer(), 512u);
}

TEST(DnsMessage, ReadsEdnsPayloadSizeAndDo) {
  Parsed p = ParseQuery(MakeQuery(1, "a.example", kTypeTxt, 4096));
  ASSERT_EQ(p.outcome, Parsed::Outcome::kOk) << p.error;
  EXPECT_TRUE(p.query.edns);
  EXPECT_EQ(p.query.udp_size, 4096);
  EXPECT_TRUE(p.query.dnssec_ok);
  EXPECT_EQ(p.query.MaxUdpAnswer(), kMaxUdpSize);  // capped: no fragments
  EXPECT_EQ(ParseQuery(MakeQuery(1, "a.example", kTypeA, 100)).query.udp_size, 512);
}

TEST(DnsMessage, RefusesWhatIsNotAStandardInQuery) {
  EXPECT_EQ(ParseQuery(Bytes(11, 0)).outcome, Parsed::Outcome::kDrop);
  // A response: never answered (two resolvers could answer each other forever).
  EXPECT_EQ(ParseQuery(MakeQuery(1, "a.b", kTypeA, 0, kClassIn, 0x8100)).outcome,
            Parsed::Outcome::kDrop);
  Parsed p = ParseQuery(MakeQuery(1, "a.b", kTypeA, 0, kClassIn, 0x2800));  // opcode 5, UPDATE
  EXPECT_EQ(p.outcome, Parsed::Outcome::kAnswer);
  EXPECT_EQ(p.rcode, Rcode::kNotImp);
  p = ParseQuery(MakeQuery(1, "version.bind", kTypeTxt, 0, 3));  // CHAOS
  EXPECT_EQ(p.rcode, Rcode::kRefused);
  ASSERT_TRUE(p.query.question);  // echoed in the REFUSED
  Bytes two = MakeQuery(1, "a.b", kTypeA);
  two[5] = 2;
  EXPECT_EQ(ParseQuery(two).rcode, Rcode::kFormErr);
  Bytes cut = MakeQuery(1, "a.b", kTypeA);
  cut.resize(cut.size() - 1);
  EXPECT_EQ(ParseQuery(cut).rcode, Rcode::kFormErr);
}

TEST(DnsMessage, NamesAreBounded) {
  std::string label63(63, 'a');
  EXPECT_EQ(ParseQuery(MakeQuery(1, label63 + ".b", kTypeA)).outcome, Parsed::Outcome::kOk);
  // 64: the 0x40 label type, refused.
  EXPECT_EQ(ParseQuery(MakeQuery(1, std::string(64, 'a') + ".b", kTypeA)).rcode, Rcode::kFormErr);
  // 4 * 64 = 256 wire bytes plus the root: too long; 3 * 64 + 62 + 1 = 255: fine.
  std::string three = label63 + "." + label63 + "." + label63 + ".";
  EXPECT_EQ(ParseQuery(MakeQuery(1, three + std::string(61, 'c'), kTypeA)).outcome,
            Parsed::Outcome::kOk);
  EXPECT_EQ(ParseQuery(MakeQuery(1, three + std::string(62, 'c'), kTypeA)).rcode, Rcode::kFormErr);
}

TEST(DnsMessage, CompressionPointersCannotLoopOrReachForward) {
  Bytes self = MakeQuery(1, "a", kTypeA);
  // Replace the name by a pointer to itself (offset 12).
  Bytes b(self.begin(), self.begin() + 12);
  b.push_back(0xc0);
  b.push_back(12);
  Put16(b, kTypeA);
  Put16(b, kClassIn);
  Parsed p = ParseQuery(b);
  EXPECT_EQ(p.rcode, Rcode::kFormErr);
  EXPECT_NE(p.error.find("backwards"), std::string::npos);
  b[13] = 200;  // forward, past the end
  EXPECT_EQ(ParseQuery(b).rcode, Rcode::kFormErr);
  b.resize(13);  // a pointer cut in half
  EXPECT_EQ(ParseQuery(b).rcode, Rcode::kFormErr);

  // A chain of backward pointers in the answer section's record names is followed, bounded.
  Bytes msg = MakeQuery(1, "x.example", kTypeA);
  msg[7] = 1;  // ancount 1: the record's name points at the question's "example"
  msg.push_back(0xc0);
  msg.push_back(14);
  Put16(msg, kTypeA);
  Put16(msg, kClassIn);
  Put16(msg, 0);
  Put16(msg, 0);
  Put16(msg, 4);
  msg.insert(msg.end(), {1, 2, 3, 4});
  EXPECT_EQ(ParseQuery(msg).outcome, Parsed::Outcome::kOk);
  Question q;
  std::string error;
  auto end = ReadName(msg, msg.size() - 16, &q, &error);
  ASSERT_TRUE(end) << error;
  EXPECT_EQ(q.name, "example");
  EXPECT_EQ(*end, msg.size() - 14);
}

TEST(DnsMessage, OddBytesInALabelAreEscaped) {
  Bytes b = MakeQuery(1, "ab.c", kTypeA);
  b[13] = '.';  // one label "." + "b": it must not read as two labels
  Parsed p = ParseQuery(b);
  ASSERT_EQ(p.outcome, Parsed::Outcome::kOk);
  EXPECT_EQ(p.query.question->name, "\\046b.c");
}

TEST(DnsMessage, EdnsMustBeSingleVersion0AtTheRoot) {
  Bytes b = MakeQuery(1, "a.b", kTypeA, 1232);
  Bytes opt(b.end() - 11, b.end());
  Bytes twice = b;
  twice.insert(twice.end(), opt.begin(), opt.end());
  twice[11] = 2;
  EXPECT_EQ(ParseQuery(twice).rcode, Rcode::kFormErr);
  Bytes v1 = b;
  v1[v1.size() - 5] = 1;  // version byte of the TTL
  EXPECT_EQ(ParseQuery(v1).rcode, Rcode::kFormErr);
}

TEST(DnsMessage, BuiltAnswersEchoTheQuestion) {
  Parsed p = ParseQuery(MakeQuery(0xbeef, "Denied.Example", kTypeA, 1400));
  ASSERT_EQ(p.outcome, Parsed::Outcome::kOk);
  for (Rcode rcode :
       {Rcode::kNxDomain, Rcode::kRefused, Rcode::kServFail, Rcode::kFormErr, Rcode::kNoError}) {
    Bytes a = BuildAnswer(p.query, rcode);
    EXPECT_EQ(a[0], 0xbe);
    EXPECT_EQ(a[1], 0xef);
    EXPECT_EQ(a[2] & 0x80, 0x80);  // QR
    EXPECT_EQ(AnswerRcode(a), rcode);
    // c-ares reads it as an answer to the same question.
    struct hostent* host = nullptr;
    int status = ares_parse_a_reply(a.data(), static_cast<int>(a.size()), &host, nullptr, nullptr);
    if (host) ares_free_hostent(host);
    EXPECT_EQ(status, ARES_ENODATA) << RcodeName(rcode);
    // The answer parses back (as a query would, but for QR) to the same question and EDNS.
    Bytes as_query = a;
    as_query[2] &= 0x7f;
    as_query[3] &= 0xf0;
    Parsed back = ParseQuery(as_query);
    ASSERT_EQ(back.outcome, Parsed::Outcome::kOk) << back.error;
    EXPECT_EQ(back.query.question->name, "Denied.Example");
    EXPECT_TRUE(back.query.edns);
  }
  // FORMERR without a question read: just the header.
  Parsed bad = ParseQuery(Bytes{0, 7, 1, 0, 0, 2, 0, 0, 0, 0, 0, 0});
  ASSERT_EQ(bad.outcome, Parsed::Outcome::kAnswer);
  Bytes a = BuildAnswer(bad.query, bad.rcode);
  EXPECT_EQ(a.size(), kHeaderSize);
  EXPECT_EQ(AnswerRcode(a), Rcode::kFormErr);
}

// RFC 8914: the Extended DNS Error goes in the answer's OPT record (only when the query had one),
// as one option: code 15, length, INFO-CODE, EXTRA-TEXT; the reader is bounded by the message.
TEST(DnsMessage, ExtendedErrorsRideInTheOptRecordOfEdnsAnswersOnly) {
  Parsed p = ParseQuery(MakeQuery(9, "files.example", kTypeA, 1232));
  ASSERT_EQ(p.outcome, Parsed::Outcome::kOk);
  ExtendedError ede{kEdeBlocked, "blocked by policy"};
  Bytes a = BuildAnswer(p.query, Rcode::kNxDomain, &ede);
  // The last bytes: OPT (root, type 41, size, ttl, rdlength 4+2+17) then the option.
  Bytes tail(a.end() - (11 + 4 + 2 + 17), a.end());
  EXPECT_EQ(tail[0], 0);
  EXPECT_EQ(tail[1] << 8 | tail[2], kTypeOpt);
  EXPECT_EQ(tail[9] << 8 | tail[10], 4 + 2 + 17);
  EXPECT_EQ(tail[11] << 8 | tail[12], kOptionEde);
  EXPECT_EQ(tail[13] << 8 | tail[14], 2 + 17);
  EXPECT_EQ(tail[15] << 8 | tail[16], kEdeBlocked);
  auto back = ReadExtendedError(a);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->info_code, kEdeBlocked);
  EXPECT_EQ(back->extra_text, "blocked by policy");
  // The answer still parses as a message with one OPT record.
  Bytes as_query = a;
  as_query[2] &= 0x7f;
  as_query[3] &= 0xf0;
  EXPECT_EQ(ParseQuery(as_query).outcome, Parsed::Outcome::kOk);

  // No OPT in the query: none in the answer, so no EDE.
  Parsed plain = ParseQuery(MakeQuery(10, "files.example", kTypeA));
  Bytes b = BuildAnswer(plain.query, Rcode::kNxDomain, &ede);
  EXPECT_EQ(b, BuildAnswer(plain.query, Rcode::kNxDomain));
  EXPECT_FALSE(ReadExtendedError(b).has_value());

  // A text longer than the bound is cut; every truncation of the answer reads as nothing.
  ExtendedError big{kEdeBlocked, std::string(1000, 'x')};
  Bytes c = BuildAnswer(p.query, Rcode::kNxDomain, &big);
  auto cut = ReadExtendedError(c);
  ASSERT_TRUE(cut.has_value());
  EXPECT_EQ(cut->extra_text.size(), kMaxEdeText);
  for (size_t n = 0; n < a.size(); n++)
    EXPECT_FALSE(ReadExtendedError(std::span<const uint8_t>(a.data(), n)).has_value()) << n;
  // An option length past its record is malformed, not read.
  Bytes bad = a;
  bad[bad.size() - 19 - 2] = 0xff;
  EXPECT_FALSE(ReadExtendedError(bad).has_value());
}

TEST(DnsMessage, UpstreamQueryCarriesOnlyTheQuestion) {
  Bytes q = MakeQuery(5, "Files.PythonHosted.org", kTypeAaaa, 4096);
  q[7] = 0;
  Parsed p = ParseQuery(q);
  ASSERT_EQ(p.outcome, Parsed::Outcome::kOk);
  Bytes up = BuildUpstreamQuery(p.query, 0x4242);
  Parsed back = ParseQuery(up);
  ASSERT_EQ(back.outcome, Parsed::Outcome::kOk) << back.error;
  EXPECT_EQ(back.query.id, 0x4242);
  EXPECT_TRUE(back.query.rd);
  EXPECT_EQ(back.query.question->name, "Files.PythonHosted.org");
  EXPECT_EQ(back.query.question->type, kTypeAaaa);
  EXPECT_EQ(back.query.udp_size, kMaxUdpSize);
  EXPECT_TRUE(back.query.dnssec_ok);
}

TEST(DnsMessage, FitAnswerTruncatesWithTc) {
  Parsed p = ParseQuery(MakeQuery(9, "big.example", kTypeTxt));
  ASSERT_EQ(p.outcome, Parsed::Outcome::kOk);
  Bytes answer = BuildAnswer(p.query, Rcode::kNoError);
  answer.resize(2000, 0xaa);  // stands for records that do not fit
  answer[0] = 0x77;           // the upstream's own ID
  Bytes fit = FitAnswer(p.query, answer, p.query.MaxUdpAnswer());
  EXPECT_LE(fit.size(), 512u);
  EXPECT_EQ(fit[0], 0);
  EXPECT_EQ(fit[1], 9);
  EXPECT_EQ(fit[2] & 0x02, 0x02);  // TC
  EXPECT_EQ(fit[4] << 8 | fit[5], 1);
  EXPECT_EQ(fit[6] << 8 | fit[7], 0);
  Bytes small = BuildAnswer(p.query, Rcode::kNoError);
  EXPECT_EQ(FitAnswer(p.query, small, 512), small);
  EXPECT_EQ(AnswerRcode(FitAnswer(p.query, Bytes{1, 2}, 512)), Rcode::kServFail);
  Bytes relayed = small;
  ASSERT_TRUE(SetId(relayed, 0x0102));
  EXPECT_EQ(relayed[0], 1);
  EXPECT_EQ(relayed[1], 2);
  Bytes tiny{1};
  EXPECT_FALSE(SetId(tiny, 3));
}

}  // namespace
}  // namespace sbx::network::dns

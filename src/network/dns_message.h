// DNS messages as sbx's resolver sees them (RFC 1035 section 4, RFC 6891 for EDNS): the parser of
// a box's query and the builders of the answers the resolver gives without asking upstream. Every
// byte of a query is the box's, so the parser bounds everything: exactly one question, names with
// labels of at most 63 bytes and at most 255 bytes in all, compression pointers that only point
// backwards (no loops) and at most kMaxPointers of them, no read past the buffer.
//
// Why hand-written: c-ares 1.18 parses answers (ares_parse_*_reply, used by the tests and by
// ares_getaddrinfo in cares_lookup.h) but has no query parser and no EDNS reader, and its
// ares_expand_name gives an escaped string, not the labels the policy decides on. The fuzz target
// (fuzz/dns_message.cc) checks this parser's names against ares_expand_name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace sbx::network::dns {

enum class Rcode : uint8_t {
  kNoError = 0,
  kFormErr = 1,
  kServFail = 2,
  kNxDomain = 3,
  kNotImp = 4,
  kRefused = 5,
};
const char* RcodeName(Rcode rcode);  // "NOERROR", "FORMERR", ...

// Record types the resolver treats specially (every other type is forwarded as it is).
inline constexpr uint16_t kTypeA = 1;
inline constexpr uint16_t kTypePtr = 12;
inline constexpr uint16_t kTypeTxt = 16;
inline constexpr uint16_t kTypeAaaa = 28;
inline constexpr uint16_t kTypeOpt = 41;
inline constexpr uint16_t kTypeIxfr = 251;
inline constexpr uint16_t kTypeAxfr = 252;
inline constexpr uint16_t kTypeAny = 255;
inline constexpr uint16_t kClassIn = 1;

// RFC 8914 Extended DNS Errors: an EDNS option in an answer's OPT record saying why it is what it
// is. sbx puts one (INFO-CODE 15, "Blocked") in the NXDOMAIN it gives for a name the box's policy
// refuses, so a resolver's client that reads EDE (dig, kdig, unbound-host) sees the reason.
inline constexpr uint16_t kOptionEde = 15;
inline constexpr uint16_t kEdeBlocked = 15;
inline constexpr size_t kMaxEdeText = 256;  // what sbx writes and what ReadExtendedError keeps
struct ExtendedError {
  uint16_t info_code = 0;
  std::string extra_text;  // UTF-8, no NUL (RFC 8914 2); cut to kMaxEdeText bytes
};

inline constexpr size_t kHeaderSize = 12;
inline constexpr size_t kMaxNameWire = 255;  // RFC 1035 2.3.4, length bytes and the root included
inline constexpr size_t kMaxLabel = 63;
inline constexpr int kMaxPointers = 32;     // compression jumps followed in one name
inline constexpr size_t kMinUdpSize = 512;  // without EDNS (RFC 1035 4.2.1)
// The most sbx answers over UDP whatever a client advertises: the DNS flag day 2020 size, which
// avoids IP fragmentation; a longer answer is truncated (TC) and the client retries over TCP.
inline constexpr size_t kMaxUdpSize = 1232;
inline constexpr size_t kMaxMessage = 65535;  // a TCP message's 2-byte length

struct Question {
  // Dotted, case kept as sent, no trailing dot; "" for the root. A byte outside [A-Za-z0-9-_] in a
  // label is written \DDD (decimal), so a '.' or '\' inside a label can never pass for a separator.
  std::string name;
  std::vector<uint8_t> wire;  // the name in wire form, uncompressed, with its final 0
  uint16_t type = 0;
  uint16_t qclass = 0;
};

struct Query {
  uint16_t id = 0;
  uint8_t opcode = 0;
  bool rd = false;                   // recursion desired
  bool cd = false;                   // checking disabled (DNSSEC)
  std::optional<Question> question;  // set whenever it was read, even in a failed parse
  bool edns = false;                 // an OPT record was present
  uint16_t udp_size = kMinUdpSize;   // the client's EDNS payload size (512 without EDNS)
  bool dnssec_ok = false;            // the OPT record's DO bit

  // The longest answer this client takes over UDP: its size, at least 512, at most kMaxUdpSize.
  size_t MaxUdpAnswer() const;
};

struct Parsed {
  enum class Outcome {
    kOk,      // a well-formed standard query with one IN question
    kDrop,    // not worth an answer: shorter than a header, or a response (QR set)
    kAnswer,  // answer `rcode` (FORMERR, NOTIMP or REFUSED) at once, echoing `query`
  };
  Outcome outcome = Outcome::kDrop;
  Rcode rcode = Rcode::kNoError;
  Query query;
  std::string error;  // what was wrong, for the debug log (no bytes of the message in it)
};

// Parses a box's query. Never reads outside `msg`; never allocates more than a few names' worth.
Parsed ParseQuery(std::span<const uint8_t> msg);

// Reads the name at `pos` of `msg` (compression followed, bounded as above). On success returns
// the offset just past the name where it sits (past its first pointer) and fills `out` (name and
// wire); nullopt with `error` set otherwise. Public for the fuzz target and for TruncateAnswer.
std::optional<size_t> ReadName(std::span<const uint8_t> msg, size_t pos, Question* out,
                               std::string* error);

// An answer to `query` that sbx gives itself: the header (the query's ID, opcode, RD and CD; QR
// and RA set) with `rcode`, the question echoed when there is one, no records, and an OPT record
// (payload kMaxUdpSize, DO echoed) when the query had one. NOERROR is NODATA: the name exists but
// has no record of the type asked (AAAA with IPv6 off). With `ede`, the OPT record carries it as
// an Extended DNS Error option; a query without OPT gets no OPT and so no EDE (RFC 6891 7: an
// OPT only in answer to one).
std::vector<uint8_t> BuildAnswer(const Query& query, Rcode rcode,
                                 const ExtendedError* ede = nullptr);

// The first Extended DNS Error option of `msg`'s OPT record, nullopt when there is none or the
// message is malformed (bounded like ParseQuery: every offset checked against `msg`).
std::optional<ExtendedError> ReadExtendedError(std::span<const uint8_t> msg);

// The query sbx sends upstream for `query` (which must have its question): a fresh message with
// RD set, CD copied, the question as the client sent it (case kept), and an OPT record (payload
// kMaxUdpSize, DO copied) when the client used EDNS. Nothing else the client put in its message
// (other records, EDNS options) goes upstream.
std::vector<uint8_t> BuildUpstreamQuery(const Query& query, uint16_t id);

// Sets the ID of a message (an upstream answer about to be relayed). False when `msg` is shorter
// than a header.
bool SetId(std::vector<uint8_t>& msg, uint16_t id);

// `answer` (an upstream answer to `query`) made to fit `max` bytes: unchanged when it fits;
// otherwise its header (flags and rcode kept, TC set) with the query's ID and question and, when
// the query had EDNS, an OPT record, and no other record, so the client retries over TCP.
// An answer shorter than a header becomes a SERVFAIL.
std::vector<uint8_t> FitAnswer(const Query& query, std::vector<uint8_t> answer, size_t max);

// The rcode of a message (its header's low 4 bits); kServFail when shorter than a header.
Rcode AnswerRcode(std::span<const uint8_t> msg);

}  // namespace sbx::network::dns

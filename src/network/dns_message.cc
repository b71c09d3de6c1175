#include "network/dns_message.h"

#include <algorithm>
#include <string_view>

namespace sbx::network::dns {
namespace {

// Header flag bits (RFC 1035 4.1.1), in the 16-bit flags word.
constexpr uint16_t kQr = 0x8000;
constexpr uint16_t kTc = 0x0200;
constexpr uint16_t kRd = 0x0100;
constexpr uint16_t kRa = 0x0080;
constexpr uint16_t kCd = 0x0010;
constexpr uint16_t kDo = 0x8000;  // in the OPT record's TTL, low 16 bits (RFC 3225)
constexpr uint8_t kOpcodeQuery = 0;

uint16_t Get16(std::span<const uint8_t> msg, size_t pos) {
  return static_cast<uint16_t>(msg[pos] << 8 | msg[pos + 1]);
}

void Put16(std::vector<uint8_t>& out, uint16_t v) {
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v & 0xff));
}

bool PlainByte(uint8_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

void PutHeader(std::vector<uint8_t>& out, uint16_t id, uint16_t flags, uint16_t qd, uint16_t an,
               uint16_t ns, uint16_t ar) {
  Put16(out, id);
  Put16(out, flags);
  Put16(out, qd);
  Put16(out, an);
  Put16(out, ns);
  Put16(out, ar);
}

void PutQuestion(std::vector<uint8_t>& out, const Question& q) {
  out.insert(out.end(), q.wire.begin(), q.wire.end());
  Put16(out, q.type);
  Put16(out, q.qclass);
}

// An OPT pseudo-record (RFC 6891 6.1.2): root name, type 41, class = payload size, TTL = extended
// rcode 0, version 0, flags (DO); options: an Extended DNS Error (RFC 8914 2) when given.
void PutOpt(std::vector<uint8_t>& out, bool dnssec_ok, const ExtendedError* ede = nullptr) {
  out.push_back(0);
  Put16(out, kTypeOpt);
  Put16(out, static_cast<uint16_t>(kMaxUdpSize));
  Put16(out, 0);
  Put16(out, dnssec_ok ? kDo : 0);
  if (!ede) {
    Put16(out, 0);
    return;
  }
  std::string_view text = ede->extra_text;
  text = text.substr(0, std::min(text.size(), kMaxEdeText));
  text = text.substr(0, text.find('\0'));                  // NUL-terminated text is not EXTRA-TEXT
  Put16(out, static_cast<uint16_t>(4 + 2 + text.size()));  // RDLENGTH: one option
  Put16(out, kOptionEde);
  Put16(out, static_cast<uint16_t>(2 + text.size()));
  Put16(out, ede->info_code);
  out.insert(out.end(), text.begin(), text.end());
}

// The header of an answer sbx makes for `query`.
uint16_t AnswerFlags(const Query& query, Rcode rcode) {
  uint16_t flags = kQr | kRa | static_cast<uint16_t>((query.opcode & 0xf) << 11);
  if (query.rd) flags |= kRd;
  if (query.cd) flags |= kCd;
  return flags | static_cast<uint16_t>(static_cast<uint8_t>(rcode) & 0xf);
}

// Skips one resource record at `pos` (name, type, class, TTL, RDATA); returns the offset after it.
// Fills `type`, `rclass` and `ttl`.
// `rdata`, when given, gets the offset of the record's data.
std::optional<size_t> SkipRecord(std::span<const uint8_t> msg, size_t pos, uint16_t* type,
                                 uint16_t* rclass, uint32_t* ttl, std::string* error,
                                 size_t* rdata = nullptr) {
  Question name;
  auto after = ReadName(msg, pos, &name, error);
  if (!after) return std::nullopt;
  pos = *after;
  if (msg.size() - pos < 10) {
    *error = "record header past the end";
    return std::nullopt;
  }
  *type = Get16(msg, pos);
  *rclass = Get16(msg, pos + 2);
  *ttl = static_cast<uint32_t>(Get16(msg, pos + 4)) << 16 | Get16(msg, pos + 6);
  size_t rdlength = Get16(msg, pos + 8);
  pos += 10;
  if (rdata) *rdata = pos;
  if (msg.size() - pos < rdlength) {
    *error = "record data past the end";
    return std::nullopt;
  }
  return pos + rdlength;
}

}  // namespace

const char* RcodeName(Rcode rcode) {
  switch (rcode) {
    case Rcode::kNoError:
      return "NOERROR";
    case Rcode::kFormErr:
      return "FORMERR";
    case Rcode::kServFail:
      return "SERVFAIL";
    case Rcode::kNxDomain:
      return "NXDOMAIN";
    case Rcode::kNotImp:
      return "NOTIMP";
    case Rcode::kRefused:
      return "REFUSED";
  }
  return "RCODE?";
}

size_t Query::MaxUdpAnswer() const {
  return std::clamp<size_t>(udp_size, kMinUdpSize, kMaxUdpSize);
}

std::optional<size_t> ReadName(std::span<const uint8_t> msg, size_t pos, Question* out,
                               std::string* error) {
  out->name.clear();
  out->wire.clear();
  std::optional<size_t> end;  // where the name ends in place: set at the first pointer
  int pointers = 0;
  int labels = 0;
  // Every pointer must point before the label that holds it, so each jump strictly decreases
  // `pos`: no loop is possible, and kMaxPointers bounds the work besides.
  for (;;) {
    if (pos >= msg.size()) {
      *error = "name past the end";
      return std::nullopt;
    }
    uint8_t len = msg[pos];
    if ((len & 0xc0) == 0xc0) {
      if (pos + 1 >= msg.size()) {
        *error = "compression pointer past the end";
        return std::nullopt;
      }
      size_t target = static_cast<size_t>(len & 0x3f) << 8 | msg[pos + 1];
      if (target >= pos) {
        *error = "compression pointer does not point backwards";
        return std::nullopt;
      }
      if (++pointers > kMaxPointers) {
        *error = "too many compression pointers";
        return std::nullopt;
      }
      if (!end) end = pos + 2;
      pos = target;
      continue;
    }
    if ((len & 0xc0) != 0) {
      *error = "unknown label type";  // 0x40 and 0x80: extended labels (RFC 6891 obsoleted them)
      return std::nullopt;
    }
    if (out->wire.size() + 1 + len > kMaxNameWire) {
      *error = "name longer than 255 bytes";
      return std::nullopt;
    }
    if (len == 0) {
      out->wire.push_back(0);
      return end ? *end : pos + 1;
    }
    if (msg.size() - pos - 1 < len) {
      *error = "label past the end";
      return std::nullopt;
    }
    out->wire.insert(out->wire.end(), msg.begin() + static_cast<ptrdiff_t>(pos),
                     msg.begin() + static_cast<ptrdiff_t>(pos + 1 + len));
    if (labels++ > 0) out->name.push_back('.');
    for (size_t i = pos + 1; i <= pos + len; i++) {
      uint8_t c = msg[i];
      if (PlainByte(c)) {
        out->name.push_back(static_cast<char>(c));
      } else {
        char esc[5] = {'\\', static_cast<char>('0' + c / 100), static_cast<char>('0' + c / 10 % 10),
                       static_cast<char>('0' + c % 10), 0};
        out->name += esc;
      }
    }
    pos += 1 + len;
  }
}

Parsed ParseQuery(std::span<const uint8_t> msg) {
  Parsed p;
  if (msg.size() < kHeaderSize) {
    p.error = "shorter than a header";
    return p;
  }
  uint16_t flags = Get16(msg, 2);
  p.query.id = Get16(msg, 0);
  p.query.opcode = static_cast<uint8_t>((flags >> 11) & 0xf);
  p.query.rd = (flags & kRd) != 0;
  p.query.cd = (flags & kCd) != 0;
  if (flags & kQr) {
    p.error = "a response, not a query";  // answering one could start a loop between resolvers
    return p;
  }
  auto answer = [&](Rcode rcode, std::string error) {
    p.outcome = Parsed::Outcome::kAnswer;
    p.rcode = rcode;
    p.error = std::move(error);
    return p;
  };
  if (p.query.opcode != kOpcodeQuery) return answer(Rcode::kNotImp, "opcode is not QUERY");
  uint16_t qdcount = Get16(msg, 4);
  uint16_t ancount = Get16(msg, 6);
  uint16_t nscount = Get16(msg, 8);
  uint16_t arcount = Get16(msg, 10);
  if (qdcount != 1) return answer(Rcode::kFormErr, "not exactly one question");

  Question q;
  std::string error;
  auto pos = ReadName(msg, kHeaderSize, &q, &error);
  if (!pos) return answer(Rcode::kFormErr, "question: " + error);
  if (msg.size() - *pos < 4) return answer(Rcode::kFormErr, "question past the end");
  q.type = Get16(msg, *pos);
  q.qclass = Get16(msg, *pos + 2);
  size_t at = *pos + 4;
  p.query.question = std::move(q);

  // Answer and authority records have no place in a query; they are skipped (bounded by the
  // buffer: each takes at least 11 bytes), then the additional section is read for OPT.
  uint32_t records = uint32_t{ancount} + nscount + arcount;
  for (uint32_t i = 0; i < records; i++) {
    uint16_t type = 0, rclass = 0;
    uint32_t ttl = 0;
    size_t start = at;
    auto next = SkipRecord(msg, at, &type, &rclass, &ttl, &error);
    if (!next) return answer(Rcode::kFormErr, "record: " + error);
    at = *next;
    if (i < uint32_t{ancount} + nscount || type != kTypeOpt) continue;
    if (p.query.edns) return answer(Rcode::kFormErr, "more than one OPT record");
    if (msg[start] != 0) return answer(Rcode::kFormErr, "OPT record not at the root");
    if ((ttl >> 16 & 0xff) != 0) return answer(Rcode::kFormErr, "EDNS version is not 0");
    p.query.edns = true;
    p.query.udp_size = std::max<uint16_t>(rclass, kMinUdpSize);
    p.query.dnssec_ok = (ttl & kDo) != 0;
  }
  if (p.query.question->qclass != kClassIn) return answer(Rcode::kRefused, "class is not IN");
  p.outcome = Parsed::Outcome::kOk;
  return p;
}

std::vector<uint8_t> BuildAnswer(const Query& query, Rcode rcode, const ExtendedError* ede) {
  std::vector<uint8_t> out;
  out.reserve(kHeaderSize + kMaxNameWire + 4 + 11 + (ede ? 6 + kMaxEdeText : 0));
  PutHeader(out, query.id, AnswerFlags(query, rcode), query.question ? 1 : 0, 0, 0,
            query.edns ? 1 : 0);
  if (query.question) PutQuestion(out, *query.question);
  if (query.edns) PutOpt(out, query.dnssec_ok, ede);
  return out;
}

std::optional<ExtendedError> ReadExtendedError(std::span<const uint8_t> msg) {
  if (msg.size() < kHeaderSize) return std::nullopt;
  uint16_t qdcount = Get16(msg, 4);
  uint32_t before = uint32_t{Get16(msg, 6)} + Get16(msg, 8);  // answer and authority records
  uint32_t records = before + Get16(msg, 10);
  std::string error;
  size_t at = kHeaderSize;
  // Each question takes at least 5 bytes and each record 11: the loops are bounded by `msg`.
  for (uint16_t i = 0; i < qdcount; i++) {
    Question q;
    auto next = ReadName(msg, at, &q, &error);
    if (!next || msg.size() - *next < 4) return std::nullopt;
    at = *next + 4;
  }
  for (uint32_t i = 0; i < records; i++) {
    uint16_t type = 0, rclass = 0;
    uint32_t ttl = 0;
    size_t rdata = 0;
    auto next = SkipRecord(msg, at, &type, &rclass, &ttl, &error, &rdata);
    if (!next) return std::nullopt;
    at = *next;
    if (i < before || type != kTypeOpt) continue;
    // Options: code, length, data (RFC 6891 6.1.2), inside the record's data.
    for (size_t o = rdata; o + 4 <= *next;) {
      uint16_t code = Get16(msg, o);
      size_t len = Get16(msg, o + 2);
      o += 4;
      if (*next - o < len) return std::nullopt;
      if (code == kOptionEde && len >= 2) {
        ExtendedError ede;
        ede.info_code = Get16(msg, o);
        size_t text = std::min(len - 2, kMaxEdeText);
        ede.extra_text.assign(reinterpret_cast<const char*>(msg.data() + o + 2), text);
        return ede;
      }
      o += len;
    }
    return std::nullopt;  // one OPT record only
  }
  return std::nullopt;
}

std::vector<uint8_t> BuildUpstreamQuery(const Query& query, uint16_t id) {
  std::vector<uint8_t> out;
  out.reserve(kHeaderSize + kMaxNameWire + 4 + 11);
  uint16_t flags = kRd | (query.cd ? kCd : 0);
  PutHeader(out, id, flags, 1, 0, 0, query.edns ? 1 : 0);
  if (query.question) PutQuestion(out, *query.question);
  if (query.edns) PutOpt(out, query.dnssec_ok);
  return out;
}

bool SetId(std::vector<uint8_t>& msg, uint16_t id) {
  if (msg.size() < kHeaderSize) return false;
  msg[0] = static_cast<uint8_t>(id >> 8);
  msg[1] = static_cast<uint8_t>(id & 0xff);
  return true;
}

std::vector<uint8_t> FitAnswer(const Query& query, std::vector<uint8_t> answer, size_t max) {
  if (answer.size() < kHeaderSize) return BuildAnswer(query, Rcode::kServFail);
  if (answer.size() <= max) return answer;
  // The upstream's flags (AA, RA, AD, its rcode) stand; its records do not fit, so none is sent.
  uint16_t flags = static_cast<uint16_t>(Get16(answer, 2) | kTc | kQr);
  std::vector<uint8_t> out;
  PutHeader(out, query.id, flags, query.question ? 1 : 0, 0, 0, query.edns ? 1 : 0);
  if (query.question) PutQuestion(out, *query.question);
  if (query.edns) PutOpt(out, query.dnssec_ok);
  return out;
}

Rcode AnswerRcode(std::span<const uint8_t> msg) {
  if (msg.size() < kHeaderSize) return Rcode::kServFail;
  return static_cast<Rcode>(msg[3] & 0xf);
}

}  // namespace sbx::network::dns

// Fuzzes the parser of a box's DNS query (src/network/dns_message.cc, ParseQuery and ReadName:
// every byte a box sends to sbx's resolver), then what the resolver does with the result: build the
// answer it gives itself, the query it sends upstream, and fit an answer to the client's UDP size.
// A name the parser accepts must read the same through c-ares's ares_expand_name (differential),
// every built message must parse back to the same question, and none may exceed its bound.
// Regressions go to src/network/dns_message_test.cc.
#include "network/dns_message.h"

#include <ares.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

using namespace sbx::network::dns;

namespace {

bool Plain(const std::string& name) {
  for (char c : name) {
    if (c == '\\') return false;
  }
  return true;
}

void CheckBuilt(const Query& query, const std::vector<uint8_t>& msg) {
  if (msg.size() > kHeaderSize + kMaxNameWire + 4 + 11) __builtin_trap();
  if (!query.question) return;
  std::vector<uint8_t> as_query = msg;
  as_query[2] &= 0x7f;  // clear QR and the rcode so it reads as a query again
  as_query[3] &= 0xf0;
  as_query[2] &= 0x87;  // opcode 0
  Parsed back = ParseQuery(as_query);
  if (back.outcome == Parsed::Outcome::kDrop) __builtin_trap();
  if (!back.query.question || back.query.question->wire != query.question->wire) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> msg(data, size);
  Parsed p = ParseQuery(msg);
  if (p.outcome == Parsed::Outcome::kDrop) return 0;
  const Query& q = p.query;
  if (q.MaxUdpAnswer() < kMinUdpSize || q.MaxUdpAnswer() > kMaxUdpSize) __builtin_trap();
  if (q.question) {
    if (q.question->wire.size() > kMaxNameWire) __builtin_trap();
    if (Plain(q.question->name)) {
      char* expanded = nullptr;
      long len = 0;
      int status =
          ares_expand_name(data + kHeaderSize, data, static_cast<int>(size), &expanded, &len);
      if (status != ARES_SUCCESS) __builtin_trap();
      bool same = strcasecmp(expanded, q.question->name.c_str()) == 0;
      ares_free_string(expanded);
      if (!same) __builtin_trap();
    }
  }
  CheckBuilt(q, BuildAnswer(q, p.outcome == Parsed::Outcome::kOk ? Rcode::kNxDomain : p.rcode));
  if (p.outcome != Parsed::Outcome::kOk) return 0;
  CheckBuilt(q, BuildUpstreamQuery(q, 1));
  std::vector<uint8_t> answer(msg.begin(), msg.end());
  std::vector<uint8_t> fit = FitAnswer(q, answer, q.MaxUdpAnswer());
  if (fit.size() > q.MaxUdpAnswer()) __builtin_trap();
  return 0;
}

// Fuzzes the daemon's decoding of what a sandbox's agent sends (the agent runs inside the box and
// is as untrusted as the box): the frame splitter fed in socket-sized pieces, as AgentChannel's
// reader and AgentConnection feed it (src/protocol/wire, src/sandbox/agent_channel.cc ReadLoop),
// each payload's fields, the nested records (WATCH_EVENT entries, xattrs), and the JSON the E2B
// facade makes of an ENTRY (EntryInfo, written with JsonText). Also checks that HasFrame() agrees
// with Next(). Regressions go to src/protocol/wire_test.cc or src/api/e2b/wire_test.cc.
#include <cstdint>
#include <string>

#include "../fuzz/chunks.h"
#include "api/e2b/wire.h"
#include "api/http/json.h"
#include "protocol/client.h"
#include "protocol/wire.h"

namespace {

using namespace sbx::protocol;

void Use(const Reader& r, int depth) {
  for (const auto& f : r.fields()) {
    (void)r.Int(f.tag);
    (void)r.Str(f.tag);
    (void)r.All(f.tag);
    if ((f.tag == Tag::kEntry || f.tag == Tag::kXattr) && depth < 4) {
      Reader inner;
      if (inner.Parse(f.value)) Use(inner, depth + 1);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sbx::fuzz::Chunks in(data, size);
  FrameBuffer buf;
  while (!in.done()) {
    auto piece = in.Next();
    buf.Append(piece.data(), piece.size());
    for (;;) {
      bool has = buf.HasFrame();
      Frame f;
      int r = buf.Next(&f.header, &f.payload);
      if (has != (r != 0)) __builtin_trap();
      if (r < 0) return 0;  // oversized: the channel closes
      if (r == 0) break;
      if (!f.fields.Parse(f.payload)) return 0;  // malformed: the channel closes
      Frame moved(std::move(f));                 // what Deliver queues
      Use(moved.fields, 0);
      if (moved.header.type == Type::kEntry || moved.header.type == Type::kOk) {
        (void)sbx::http::JsonText(sbx::api::e2b::EntryInfo(moved.fields));
        (void)sbx::api::e2b::EntryMetadata(moved.fields);
      }
    }
  }
  return 0;
}

// Fuzzes the agent's decoding of what the daemon sends (src/agent, built as the agent is: wire.cc
// compiled in, no exceptions): the frame splitter fed in pieces as Agent::ProcessFrames feeds it,
// HandleFrame's checks (HELLO first, its version, a payload that parses), the fields every
// request reads, the nested xattr records of WRITE_BEGIN, and CleanPath on kPath and kNewPath.
// The handlers' system calls are not run (they would act on this machine). Regressions go to
// src/protocol/wire_test.cc or src/agent/paths_test.cc.
#include <cstdint>
#include <string>

#include "../fuzz/chunks.h"
#include "agent/paths.h"
#include "protocol/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sbx::protocol;
  sbx::fuzz::Chunks in(data, size);
  FrameBuffer buf;
  bool hello_done = false;
  while (!in.done()) {
    auto piece = in.Next();
    buf.Append(piece.data(), piece.size());
    Header h;
    std::string payload;
    for (;;) {
      int r = buf.Next(&h, &payload);
      if (r < 0) return 0;  // oversized frame: the connection is closed
      if (r == 0) break;
      Reader fields;
      bool parsed = fields.Parse(payload);
      if (!hello_done) {
        if (h.type != Type::kHello || !parsed) return 0;
        hello_done = true;
        if (fields.Int(Tag::kVersion, -1) != kProtocolVersion) return 0;
        continue;
      }
      if (!parsed) continue;  // answered EINVAL
      std::string path;
      if (sbx::agent::CleanPath(fields.Str(Tag::kPath), &path) && path.empty()) __builtin_trap();
      (void)sbx::agent::CleanPath(fields.Str(Tag::kNewPath), &path);
      (void)fields.All(Tag::kArgv);
      (void)fields.All(Tag::kEnv);
      (void)fields.Int(Tag::kDepth, 1);
      (void)fields.Int(Tag::kOffset, 0);
      (void)fields.Int(Tag::kLength, 0);
      for (std::string_view x : fields.All(Tag::kXattr)) {
        Reader xr;
        if (xr.Parse(x)) (void)xr.Str(Tag::kName);
      }
    }
  }
  return 0;
}

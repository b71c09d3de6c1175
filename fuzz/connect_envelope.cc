// Fuzzes the Connect protocol decoders of envd (src/api/e2b/wire): a client stream of envelopes
// split as it arrives (EnvelopeReader, StreamInput's body), the first envelope of a streaming
// request (ParseEnvelopeJson), and a multipart upload body (MultipartParser, fed in pieces, with
// the boundary the SDK uses). Regressions go to src/api/e2b/wire_test.cc.
#include <cstdint>
#include <string>
#include <vector>

#include "../fuzz/chunks.h"
#include "api/e2b/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace e2b = sbx::api::e2b;
  sbx::fuzz::Chunks in(data, size);
  (void)e2b::ParseEnvelopeJson(in.stream());
  {
    sbx::fuzz::Chunks pieces = in;
    e2b::EnvelopeReader reader;
    bool failed = false;
    while (!pieces.done() && !failed) {
      reader.Feed(pieces.Next());
      for (;;) {
        auto msg = reader.Next();
        if (!msg.ok()) {
          failed = true;  // the stream is answered invalid_argument and closed
          break;
        }
        if (!*msg) break;
        if (!(*msg)->is_object()) __builtin_trap();
      }
    }
  }
  {
    sbx::fuzz::Chunks pieces = in;
    e2b::MultipartParser parser("sbxboundary");
    std::vector<e2b::MultipartParser::Event> events;
    bool failed = false;
    while (!pieces.done() && !failed) {
      events.clear();
      failed = !parser.Feed(pieces.Next(), &events).ok();
    }
    if (!failed) (void)parser.Finish();
  }
  (void)e2b::MultipartParser::Boundary(in.stream());
  return 0;
}

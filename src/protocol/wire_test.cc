#include "protocol/wire.h"

#include <gtest/gtest.h>

namespace sbx::protocol {
namespace {

TEST(Wire, RoundTripsFieldsThroughAFrame) {
  Writer w;
  w.Int(Tag::kPid, -42).Str(Tag::kArgv, "ls").Str(Tag::kArgv, std::string("a\0b", 3));
  std::string frame = EncodeFrame(Type::kSpawn, 7, w, 3);
  ASSERT_EQ(frame.size(), kHeaderSize + w.size());

  FrameBuffer fb;
  // Feed one byte at a time: the splitter must not produce a frame early.
  Header h;
  std::string payload;
  for (size_t i = 0; i + 1 < frame.size(); ++i) {
    fb.Append(&frame[i], 1);
    ASSERT_FALSE(fb.HasFrame());
    ASSERT_EQ(fb.Next(&h, &payload), 0);
  }
  fb.Append(&frame.back(), 1);
  ASSERT_TRUE(fb.HasFrame());
  ASSERT_EQ(fb.Next(&h, &payload), 1);
  EXPECT_EQ(h.type, Type::kSpawn);
  EXPECT_EQ(h.id, 7u);
  EXPECT_EQ(h.flags, 3);

  Reader r;
  ASSERT_TRUE(r.Parse(payload));
  EXPECT_EQ(r.Int(Tag::kPid), -42);
  auto argv = r.All(Tag::kArgv);
  ASSERT_EQ(argv.size(), 2u);
  EXPECT_EQ(argv[0], "ls");
  EXPECT_EQ(argv[1], std::string_view("a\0b", 3));
  EXPECT_FALSE(r.Has(Tag::kCwd));
  EXPECT_EQ(r.Int(Tag::kUid, 99), 99);
}

TEST(Wire, RejectsTruncatedField) {
  Writer w;
  w.Str(Tag::kPath, "/etc/passwd");
  std::string p = w.payload();
  Reader r;
  EXPECT_FALSE(r.Parse(std::string_view(p).substr(0, p.size() - 1)));
  EXPECT_FALSE(r.Parse(std::string_view(p).substr(0, 3)));
  EXPECT_TRUE(r.Parse(p));
}

TEST(Wire, IntOfWrongWidthReadsAsAbsent) {
  Writer w;
  w.Str(Tag::kPid, "abc");
  Reader r;
  ASSERT_TRUE(r.Parse(w.payload()));
  EXPECT_FALSE(r.OptInt(Tag::kPid).has_value());
}

TEST(Wire, OversizedFrameIsCorrupt) {
  std::string hdr = EncodeFrame(Type::kData, 1, std::string_view());
  hdr[0] = hdr[1] = hdr[2] = hdr[3] = '\xff';
  FrameBuffer fb;
  fb.Append(hdr.data(), hdr.size());
  Header h;
  std::string payload;
  EXPECT_EQ(fb.Next(&h, &payload), -1);
}

TEST(Wire, SeveralFramesInOneRead) {
  std::string both = EncodeFrame(Type::kOk, 1, std::string_view("")) +
                     EncodeFrame(Type::kError, 2, Writer().Int(Tag::kErrno, 2));
  FrameBuffer fb;
  fb.Append(both.data(), both.size());
  Header h;
  std::string payload;
  ASSERT_EQ(fb.Next(&h, &payload), 1);
  EXPECT_EQ(h.id, 1u);
  ASSERT_EQ(fb.Next(&h, &payload), 1);
  EXPECT_EQ(h.type, Type::kError);
  EXPECT_EQ(fb.Next(&h, &payload), 0);
  EXPECT_EQ(fb.buffered(), 0u);
}

}  // namespace
}  // namespace sbx::protocol

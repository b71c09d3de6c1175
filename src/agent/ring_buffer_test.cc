#include "agent/ring_buffer.h"

#include <gtest/gtest.h>

#include <string>

namespace sbx::agent {
namespace {

std::string ReadAllFrom(const RingBuffer& r, uint64_t offset, uint64_t* first) {
  std::string out;
  *first = r.Read(offset, 1 << 30, &out);
  return out;
}

TEST(RingBuffer, KeepsEverythingBelowCapacity) {
  RingBuffer r(16);
  r.Append("hello ");
  r.Append("world");
  EXPECT_EQ(r.start(), 0u);
  EXPECT_EQ(r.end(), 11u);
  uint64_t first;
  EXPECT_EQ(ReadAllFrom(r, 0, &first), "hello world");
  EXPECT_EQ(first, 0u);
  EXPECT_EQ(ReadAllFrom(r, 6, &first), "world");
  EXPECT_EQ(first, 6u);
  EXPECT_EQ(ReadAllFrom(r, 11, &first), "");
}

TEST(RingBuffer, DropsOldestAndReportsTheGap) {
  RingBuffer r(8);
  r.Append("0123456789");  // larger than capacity in one go
  EXPECT_EQ(r.start(), 2u);
  EXPECT_EQ(r.end(), 10u);
  uint64_t first;
  EXPECT_EQ(ReadAllFrom(r, 0, &first), "23456789");
  EXPECT_EQ(first, 2u);
  r.Append("abc");
  EXPECT_EQ(r.start(), 5u);
  EXPECT_EQ(ReadAllFrom(r, 0, &first), "56789abc");
  EXPECT_EQ(first, 5u);
  EXPECT_EQ(ReadAllFrom(r, 9, &first), "9abc");
}

TEST(RingBuffer, WrapsManyTimesWithSmallWrites) {
  RingBuffer r(7);
  std::string all;
  for (int i = 0; i < 100; ++i) {
    std::string piece(static_cast<size_t>(i % 5 + 1), static_cast<char>('a' + i % 26));
    r.Append(piece);
    all += piece;
    uint64_t first;
    std::string got = ReadAllFrom(r, 0, &first);
    ASSERT_EQ(r.end(), all.size());
    ASSERT_EQ(got, all.substr(static_cast<size_t>(first))) << i;
    ASSERT_EQ(got.size(), std::min<size_t>(7, all.size()));
  }
}

TEST(RingBuffer, ReadHonoursMax) {
  RingBuffer r(100);
  r.Append("abcdefghij");
  std::string out;
  EXPECT_EQ(r.Read(3, 4, &out), 3u);
  EXPECT_EQ(out, "defg");
}

}  // namespace
}  // namespace sbx::agent

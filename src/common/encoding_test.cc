#include "common/encoding.h"

#include <gtest/gtest.h>

namespace sbx {
namespace {

TEST(Encoding, Base64RoundTripsEveryByte) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  for (size_t len : {0u, 1u, 2u, 3u, 4u, 255u, 256u}) {
    std::string in = all.substr(0, len);
    auto out = Base64Decode(Base64Encode(in));
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(*out, in) << len;
  }
  EXPECT_EQ(Base64Encode("hi\n"), "aGkK");
  EXPECT_EQ(*Base64Decode("aGkK"), "hi\n");
  EXPECT_EQ(*Base64Decode("_-8"), "\xff\xef");  // URL-safe, unpadded
  EXPECT_FALSE(Base64Decode("a$b=").ok());
}

TEST(Encoding, Rfc3339) {
  EXPECT_EQ(Rfc3339Millis(0), "");
  EXPECT_EQ(Rfc3339Millis(1795860825123), "2026-11-28T10:13:45.123Z");
  EXPECT_EQ(*ParseRfc3339Millis("2026-11-28T10:13:45.123Z"), 1795860825123);
  EXPECT_EQ(*ParseRfc3339Millis("2026-11-28T10:13:45Z"), 1795860825000);
  EXPECT_EQ(*ParseRfc3339Millis("2026-11-28T11:13:45.1234+01:00"), 1795860825123);
  EXPECT_EQ(*ParseRfc3339Millis("2026-11-28T09:43:45.123-00:30"), 1795860825123);
  for (const char* bad : {"", "2026-11-28", "2026-11-28T10:13:45", "2026-13-28T10:13:45Z",
                          "2026-11-28T10:13:45.Z", "2026-11-28T10:13:45Zjunk", "yesterday"})
    EXPECT_FALSE(ParseRfc3339Millis(bad).ok()) << bad;
}

TEST(Encoding, FormatSize) {
  EXPECT_EQ(FormatSize(64 << 20), "64 MiB");
  EXPECT_EQ(FormatSize(1536LL << 20), "1.5 GiB");
  EXPECT_EQ(FormatSize(10), "10 B");
  EXPECT_EQ(FormatSize(int64_t{1} << 50), "1 PiB");
}

TEST(RedactPaths, ReplacesEveryAbsolutePathAndKeepsTheRest) {
  EXPECT_EQ(
      RedactPaths("box setup: mount overlay on /var/lib/sbx/run/ab/fs/rootfs: Invalid argument"),
      "box setup: mount overlay on [host path]: Invalid argument");
  EXPECT_EQ(RedactPaths("/sys/fs/cgroup/sbx/x/cgroup.freeze: Device or resource busy"),
            "[host path]: Device or resource busy");
  EXPECT_EQ(RedactPaths("open '/d/a b' (at /d/x), then /e=/f"),
            "open '[host path]' (at [host path]), then [host path]");
  EXPECT_EQ(RedactPaths("free in the data directory: 1/2 of it"),
            "free in the data directory: 1/2 of it");
  EXPECT_EQ(RedactPaths("path=/a:b/c: gone"), "path=[host path]: gone");
  EXPECT_EQ(RedactPaths(""), "");
  EXPECT_EQ(RedactPaths("/"), "[host path]");
}

}  // namespace
}  // namespace sbx

#include "cli/volumes.h"

#include <gtest/gtest.h>

namespace sbx::cli {
namespace {

TEST(Volumes, Parses) {
  auto v = ParseVolumes({"/tmp:/work", "/tmp/:/data/:ro", "/:/host:rw"});
  ASSERT_TRUE(v.ok()) << v.status().message();
  ASSERT_EQ(v->size(), 3u);
  EXPECT_EQ((*v)[0].source, "/tmp");
  EXPECT_EQ((*v)[0].target, "/work");
  EXPECT_FALSE((*v)[0].read_only);
  EXPECT_EQ((*v)[1].source, "/tmp");
  EXPECT_EQ((*v)[1].target, "/data");
  EXPECT_TRUE((*v)[1].read_only);
  EXPECT_FALSE((*v)[2].read_only);
  EXPECT_TRUE(ParseVolumes({}).ok());
}

TEST(Volumes, RejectsWithTheReason) {
  struct Case {
    const char* volume;
    const char* why;
  };
  for (const Case& c : {Case{"/tmp", "expected HOST:BOX"}, Case{"/tmp:/a:ro:x", "expected"},
                        Case{"/tmp:/a:rx", "ro or rw"}, Case{"tmp:/a", "HOST must be an absolute"},
                        Case{"/tmp/../etc:/a", "HOST must be an absolute"},
                        Case{"/tmp:a", "BOX must be an absolute"},
                        Case{"/tmp:/a/../etc", "BOX must be an absolute"},
                        Case{"/tmp:/a//b", "BOX must be an absolute"},
                        Case{"/tmp:/", "cannot be /"}, Case{"/tmp:/proc", "under /proc"},
                        Case{"/tmp:/dev/x", "under /dev"}, Case{"/etc/passwd:/a", "a directory"},
                        Case{"/nonexistent-sbx-volume:/a", "No such file"}}) {
    auto v = ParseVolumes({c.volume});
    ASSERT_FALSE(v.ok()) << c.volume;
    EXPECT_NE(v.status().message().find(c.why), std::string::npos)
        << c.volume << ": " << v.status().message();
    EXPECT_NE(v.status().message().find(c.volume), std::string::npos) << v.status().message();
  }
  auto twice = ParseVolumes({"/tmp:/a", "/var:/a"});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("twice"), std::string::npos);
}

}  // namespace
}  // namespace sbx::cli

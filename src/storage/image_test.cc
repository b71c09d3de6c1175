#include "storage/image.h"

#include <gtest/gtest.h>

namespace sbx::storage {
namespace {
TEST(ImageTest, Placeholder) { EXPECT_TRUE(LayerIdForDiffId("x").status().err() == EINVAL); }
}  // namespace
}  // namespace sbx::storage

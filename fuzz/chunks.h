// Shared by the fuzz targets: cuts an input into the pieces a socket might deliver, so that
// decoders fed incrementally are tested at every split point, not only with the whole input.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace sbx::fuzz {

// The first byte picks the piece sizes (1 to 64 bytes, varying); the rest is the stream.
class Chunks {
 public:
  Chunks(const uint8_t* data, size_t size)
      : seed_(size ? data[0] : 0),
        rest_(reinterpret_cast<const char*>(data) + (size ? 1 : 0), size ? size - 1 : 0) {}
  bool done() const { return rest_.empty(); }
  std::string_view stream() const { return rest_; }
  std::string_view Next() {
    seed_ = static_cast<uint8_t>(seed_ * 37 + 11);
    size_t n = std::min<size_t>(rest_.size(), (seed_ % 64) + 1);
    std::string_view piece = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return piece;
  }

 private:
  uint8_t seed_;
  std::string_view rest_;
};

}  // namespace sbx::fuzz

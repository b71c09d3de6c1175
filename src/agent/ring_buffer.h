// RingBuffer: the bounded tail of one output stream of a process. Every byte written to the stream
// has an absolute offset from the stream's start; the buffer keeps the newest `capacity` bytes,
// so a client can (re)attach from any offset that is still buffered (docs/agent-protocol.md,
// "Processes").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sbx::agent {

class RingBuffer {
 public:
  explicit RingBuffer(size_t capacity);

  // Appends bytes, dropping the oldest ones past capacity.
  void Append(std::string_view data);

  // Offset of the oldest byte still buffered, and one past the newest.
  uint64_t start() const { return end_ - size_; }
  uint64_t end() const { return end_; }
  size_t capacity() const { return cap_; }

  // Copies up to `max` bytes starting at `offset` (clamped up to start()) into `out`; returns the
  // offset of the first byte copied. Copies nothing when offset >= end().
  uint64_t Read(uint64_t offset, size_t max, std::string* out) const;

 private:
  std::string buf_;  // allocated lazily up to cap_, then used circularly
  size_t cap_;
  size_t size_ = 0;   // bytes buffered
  uint64_t end_ = 0;  // absolute offset one past the newest byte
};

}  // namespace sbx::agent

#include "agent/ring_buffer.h"

#include <algorithm>

namespace sbx::agent {

RingBuffer::RingBuffer(size_t capacity) : cap_(capacity == 0 ? 1 : capacity) {}

void RingBuffer::Append(std::string_view data) {
  if (data.empty()) return;
  if (data.size() >= cap_) {
    // Only the last cap_ bytes survive. The byte at absolute offset o lives at index o % cap_.
    buf_.resize(cap_);
    end_ += data.size();
    data = data.substr(data.size() - cap_);
    size_t pos = static_cast<size_t>((end_ - cap_) % cap_);
    size_t first = cap_ - pos;
    buf_.replace(pos, first, data.substr(0, first));
    buf_.replace(0, cap_ - first, data.substr(first));
    size_ = cap_;
    return;
  }
  if (buf_.size() < cap_) {
    // Not wrapped yet (buf_.size() == end_): grow lazily, since most processes write little.
    if (end_ + data.size() <= cap_) {
      buf_.append(data);
      end_ += data.size();
      size_ += data.size();
      return;
    }
    buf_.resize(cap_);
  }
  size_t pos = static_cast<size_t>(end_ % cap_);
  size_t first = std::min(data.size(), cap_ - pos);
  buf_.replace(pos, first, data.substr(0, first));
  if (first < data.size()) buf_.replace(0, data.size() - first, data.substr(first));
  end_ += data.size();
  size_ = std::min(cap_, size_ + data.size());
}

uint64_t RingBuffer::Read(uint64_t offset, size_t max, std::string* out) const {
  out->clear();
  if (offset < start()) offset = start();
  if (offset >= end_) return offset;
  size_t n = static_cast<size_t>(std::min<uint64_t>(max, end_ - offset));
  out->reserve(n);
  size_t pos = static_cast<size_t>(offset % cap_);
  size_t first = std::min(n, cap_ - pos);
  out->append(buf_, pos, first);
  out->append(buf_, 0, n - first);
  return offset;
}

}  // namespace sbx::agent

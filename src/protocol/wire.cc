#include "protocol/wire.h"

#include <cstring>

namespace sbx::protocol {
namespace {

void PutU16(std::string& b, uint16_t v) {
  b.push_back(static_cast<char>(v & 0xff));
  b.push_back(static_cast<char>(v >> 8));
}
void PutU32(std::string& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint16_t GetU16(const char* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

Writer& Writer::Int(Tag tag, int64_t v) {
  PutU16(buf_, static_cast<uint16_t>(tag));
  PutU32(buf_, 8);
  auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  return *this;
}

Writer& Writer::Str(Tag tag, std::string_view v) {
  PutU16(buf_, static_cast<uint16_t>(tag));
  PutU32(buf_, static_cast<uint32_t>(v.size()));
  buf_.append(v);
  return *this;
}

bool Reader::Parse(std::string_view payload) {
  fields_.clear();
  size_t pos = 0;
  while (pos < payload.size()) {
    if (payload.size() - pos < 6) return false;
    uint16_t tag = GetU16(payload.data() + pos);
    uint32_t size = GetU32(payload.data() + pos + 2);
    pos += 6;
    if (size > payload.size() - pos) return false;
    fields_.push_back({static_cast<Tag>(tag), payload.substr(pos, size)});
    pos += size;
  }
  return true;
}

bool Reader::Has(Tag tag) const {
  for (const auto& f : fields_)
    if (f.tag == tag) return true;
  return false;
}

std::optional<int64_t> Reader::OptInt(Tag tag) const {
  for (const auto& f : fields_) {
    if (f.tag != tag) continue;
    if (f.value.size() != 8) return std::nullopt;
    uint64_t u = 0;
    for (int i = 7; i >= 0; --i)
      u = (u << 8) | static_cast<uint8_t>(f.value[static_cast<size_t>(i)]);
    return static_cast<int64_t>(u);
  }
  return std::nullopt;
}

int64_t Reader::Int(Tag tag, int64_t def) const { return OptInt(tag).value_or(def); }

std::string_view Reader::Str(Tag tag, std::string_view def) const {
  for (const auto& f : fields_)
    if (f.tag == tag) return f.value;
  return def;
}

std::vector<std::string_view> Reader::All(Tag tag) const {
  std::vector<std::string_view> out;
  for (const auto& f : fields_)
    if (f.tag == tag) out.push_back(f.value);
  return out;
}

std::string EncodeFrame(Type type, uint32_t id, std::string_view payload, uint16_t flags) {
  if (payload.size() > kMaxPayload) {
    type = Type::kError;
    payload = {};
  }
  std::string out;
  out.reserve(kHeaderSize + payload.size());
  PutU32(out, static_cast<uint32_t>(payload.size()));
  PutU16(out, static_cast<uint16_t>(type));
  PutU16(out, flags);
  PutU32(out, id);
  out.append(payload);
  return out;
}

std::string EncodeFrame(Type type, uint32_t id, const Writer& payload, uint16_t flags) {
  return EncodeFrame(type, id, std::string_view(payload.payload()), flags);
}

bool DecodeHeader(const char* p, Header* h) {
  h->len = GetU32(p);
  h->type = static_cast<Type>(GetU16(p + 4));
  h->flags = GetU16(p + 6);
  h->id = GetU32(p + 8);
  return h->len <= kMaxPayload;
}

bool FrameBuffer::HasFrame() const {
  if (buffered() < kHeaderSize) return false;
  Header h;
  if (!DecodeHeader(buf_.data() + pos_, &h)) return true;
  return buffered() - kHeaderSize >= h.len;
}

int FrameBuffer::Next(Header* h, std::string* payload) {
  if (buf_.size() - pos_ < kHeaderSize) return 0;
  if (!DecodeHeader(buf_.data() + pos_, h)) return -1;
  if (buf_.size() - pos_ - kHeaderSize < h->len) return 0;
  payload->assign(buf_, pos_ + kHeaderSize, h->len);
  pos_ += kHeaderSize + h->len;
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > (1u << 20)) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  return 1;
}

}  // namespace sbx::protocol

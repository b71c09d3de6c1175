#include "api/http/url.h"

namespace sbx::http {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Result<std::string> PercentDecode(std::string_view in, bool plus_is_space) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) {
        return Status::Error("bad percent-escape in \"" + std::string(in) + "\"");
      }
      int hi = HexValue(in[i + 1]);
      int lo = HexValue(in[i + 2]);
      if (hi < 0 || lo < 0)
        return Status::Error("bad percent-escape in \"" + std::string(in) + "\"");
      char decoded = static_cast<char>(hi * 16 + lo);
      if (decoded == '\0') return Status::Error("encoded NUL in \"" + std::string(in) + "\"");
      out.push_back(decoded);
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string PercentEncode(std::string_view in, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(in.size());
  for (unsigned char c : in) {
    bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/');
    if (unreserved) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::optional<std::string> Query::Get(std::string_view key) const {
  for (const auto& [k, v] : items_) {
    if (k == key) return v;
  }
  return std::nullopt;
}

std::vector<std::string> Query::GetAll(std::string_view key) const {
  std::vector<std::string> out;
  for (const auto& [k, v] : items_) {
    if (k == key) out.push_back(v);
  }
  return out;
}

Result<Query> ParseQuery(std::string_view raw) {
  Query::Items items;
  while (!raw.empty()) {
    size_t amp = raw.find('&');
    std::string_view pair = raw.substr(0, amp);
    raw = amp == std::string_view::npos ? std::string_view() : raw.substr(amp + 1);
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    std::string_view key = pair.substr(0, eq);
    std::string_view value =
        eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    auto k = PercentDecode(key, true);
    if (!k.ok()) return k.status().Wrap("query key");
    auto v = PercentDecode(value, true);
    if (!v.ok()) return v.status().Wrap("query value of \"" + *k + "\"");
    items.emplace_back(std::move(*k), std::move(*v));
  }
  return Query(std::move(items));
}

}  // namespace sbx::http

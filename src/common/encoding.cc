#include "common/encoding.h"

#include <openssl/evp.h>

#include <cmath>
#include <cstdio>
#include <ctime>

namespace sbx {

std::string Base64Encode(std::string_view in) {
  std::string out(4 * ((in.size() + 2) / 3), '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

Result<std::string> Base64Decode(std::string_view in) {
  std::string s(in);
  for (char& c : s) {
    if (c == '-') c = '+';
    if (c == '_') c = '/';
  }
  while (s.size() % 4) s.push_back('=');
  std::string out(s.size() / 4 * 3, '\0');
  int n =
      EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  if (n < 0) return Status::Error("not valid base64", EINVAL);
  size_t pad = 0;
  if (!s.empty() && s.back() == '=') ++pad;
  if (s.size() > 1 && s[s.size() - 2] == '=') ++pad;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

Result<int64_t> ParseRfc3339Millis(std::string_view text) {
  auto bad = [&] {
    return Status::Error("not an RFC 3339 time: '" + std::string(text) + "'", EINVAL);
  };
  size_t pos = 0;
  auto digits = [&](size_t n, int* out) {
    if (pos + n > text.size()) return false;
    int v = 0;
    for (size_t i = 0; i < n; ++i) {
      char c = text[pos + i];
      if (c < '0' || c > '9') return false;
      v = v * 10 + (c - '0');
    }
    pos += n;
    *out = v;
    return true;
  };
  auto expect = [&](std::string_view chars) {
    if (pos >= text.size() || chars.find(text[pos]) == std::string_view::npos) return false;
    ++pos;
    return true;
  };
  tm t{};
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  if (!digits(4, &year) || !expect("-") || !digits(2, &month) || !expect("-") || !digits(2, &day) ||
      !expect("Tt ") || !digits(2, &hour) || !expect(":") || !digits(2, &minute) || !expect(":") ||
      !digits(2, &second))
    return bad();
  if (month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || second > 60)
    return bad();
  int64_t millis = 0;
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    int64_t scale = 100;
    size_t start = pos;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      millis += (text[pos] - '0') * scale;
      scale /= 10;
      ++pos;
    }
    if (pos == start) return bad();
  }
  int64_t offset_s = 0;
  if (expect("Zz")) {
  } else if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) {
    int sign = text[pos++] == '-' ? -1 : 1;
    int oh = 0, om = 0;
    if (!digits(2, &oh) || !expect(":") || !digits(2, &om) || oh > 23 || om > 59) return bad();
    offset_s = int64_t{sign} * (oh * 3600 + om * 60);
  } else {
    return bad();
  }
  if (pos != text.size()) return bad();
  t.tm_year = year - 1900;
  t.tm_mon = month - 1;
  t.tm_mday = day;
  t.tm_hour = hour;
  t.tm_min = minute;
  t.tm_sec = second;
  int64_t s = static_cast<int64_t>(timegm(&t)) - offset_s;
  return s * 1000 + millis;
}

std::string Rfc3339Millis(int64_t ms) {
  if (ms <= 0) return "";
  time_t s = static_cast<time_t>(ms / 1000);
  tm t{};
  gmtime_r(&s, &t);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", t.tm_year + 1900,
                t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec,
                static_cast<int>(ms % 1000));
  return buf;
}

std::string FormatSize(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0 || v == std::floor(v))
    std::snprintf(buf, sizeof buf, "%.0f %s", v, kUnits[u]);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

std::string RedactPaths(std::string_view message) {
  auto starts = [&](size_t i) {
    if (message[i] != '/') return false;
    if (i == 0) return true;
    char before = message[i - 1];
    return before == ' ' || before == '\'' || before == '"' || before == '(' || before == '=';
  };
  auto ends = [&](size_t i) {
    char c = message[i];
    return c == ' ' || c == '\'' || c == '"' || c == ')' || c == ',' ||
           (c == ':' && (i + 1 == message.size() || message[i + 1] == ' '));
  };
  std::string out;
  out.reserve(message.size());
  for (size_t i = 0; i < message.size();) {
    if (!starts(i)) {
      out += message[i++];
      continue;
    }
    // A quoted path runs to its closing quote, spaces and all.
    char quote = i > 0 && (message[i - 1] == '\'' || message[i - 1] == '"') ? message[i - 1] : 0;
    while (i < message.size() && (quote ? message[i] != quote : !ends(i))) ++i;
    out += "[host path]";
  }
  return out;
}

}  // namespace sbx

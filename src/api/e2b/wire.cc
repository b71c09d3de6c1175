#include "api/e2b/wire.h"

#include <openssl/evp.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <ctime>
#include <set>

#include "api/errors.h"
#include "api/http/json.h"
#include "api/http/url.h"
#include "common/encoding.h"
#include "sandbox/session.h"

namespace sbx::api::e2b {

using nlohmann::json;

std::string Envelope(uint8_t flags, std::string_view payload) {
  std::string out;
  out.reserve(5 + payload.size());
  out.push_back(static_cast<char>(flags));
  uint32_t n = static_cast<uint32_t>(payload.size());
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((n >> shift) & 0xff));
  out.append(payload);
  return out;
}

Result<json> ParseEnvelopeJson(std::string_view body) {
  EnvelopeReader r;
  r.Feed(body);
  auto j = r.Next();
  if (!j.ok()) return j.status();
  if (!*j) return Status::Error("connect: request envelope truncated", EINVAL);
  return std::move(**j);
}

Result<std::optional<json>> EnvelopeReader::Next() {
  if (buf_.size() < 5) return std::optional<json>();
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(buf_[i])); };
  if (b(0) & 0x01) return Status::Error("connect: compressed messages are not supported", EINVAL);
  uint32_t n = (b(1) << 24) | (b(2) << 16) | (b(3) << 8) | b(4);
  if (n > kMaxMessage) return Status::Error("connect: request message too large", EINVAL);
  if (buf_.size() < 5 + static_cast<size_t>(n)) return std::optional<json>();
  std::string_view payload = std::string_view(buf_).substr(5, n);
  json j = payload.empty() ? json::object() : http::ParseJsonBody(payload);
  buf_.erase(0, 5 + static_cast<size_t>(n));
  if (j.is_discarded() || !j.is_object())
    return Status::Error("connect: request message is not a JSON object", EINVAL);
  return std::optional<json>(std::move(j));
}

const char* ConnectCode(int err) { return api::AnswerFor(err).connect_code; }

int ConnectHttpStatus(std::string_view code) {
  static const std::pair<std::string_view, int> kMap[] = {{"canceled", 499},
                                                          {"unknown", 500},
                                                          {"invalid_argument", 400},
                                                          {"deadline_exceeded", 504},
                                                          {"not_found", 404},
                                                          {"already_exists", 409},
                                                          {"permission_denied", 403},
                                                          {"resource_exhausted", 429},
                                                          {"failed_precondition", 400},
                                                          {"aborted", 409},
                                                          {"out_of_range", 400},
                                                          {"unimplemented", 501},
                                                          {"internal", 500},
                                                          {"unavailable", 503},
                                                          {"data_loss", 500},
                                                          {"unauthenticated", 401}};
  for (const auto& [c, s] : kMap)
    if (c == code) return s;
  return 500;
}

Result<std::vector<std::pair<std::string, std::string>>> DecodeMetadataFilter(
    std::string_view value) {
  std::vector<std::pair<std::string, std::string>> out;
  auto whole = http::PercentDecode(value, true);
  if (!whole.ok()) return Status::Error("metadata: malformed encoding", EINVAL);
  std::string_view rest = *whole;
  while (!rest.empty()) {
    size_t amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    if (eq == std::string_view::npos)
      return Status::Error("metadata: expected key=value pairs", EINVAL);
    auto k = http::PercentDecode(pair.substr(0, eq), true);
    auto v = http::PercentDecode(pair.substr(eq + 1), true);
    if (!k.ok() || !v.ok() || k->empty())
      return Status::Error("metadata: malformed key=value pair", EINVAL);
    out.emplace_back(*k, *v);
  }
  return out;
}

std::string Rfc3339(int64_t ms) { return Rfc3339Millis(ms); }

std::string WithoutHostPaths(std::string_view message) {
  constexpr std::string_view kSocket = "/agent.sock";
  std::string out;
  size_t pos = 0;
  for (size_t end; (end = message.find(kSocket, pos)) != std::string_view::npos;) {
    // The path is the run of non-space characters that ends in kSocket and starts with '/'.
    size_t start = end;
    while (start > pos && message[start - 1] != ' ' && message[start - 1] != '\'') --start;
    out.append(message.substr(pos, start - pos));
    out += message[start] == '/' ? "the sandbox's agent"
                                 : std::string(message.substr(start, end + kSocket.size() - start));
    pos = end + kSocket.size();
  }
  out.append(message.substr(pos));
  // "agent <path>: ..." (AgentChannel's form) reads "the sandbox's agent: ...".
  for (size_t at; (at = out.find("agent the sandbox's agent")) != std::string::npos;)
    out.erase(at, 6);
  return out;
}

std::optional<std::pair<int, std::string>> ParseSandboxHost(std::string_view host) {
  size_t dot = host.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  std::string_view label = host.substr(0, dot);
  size_t dash = label.find('-');
  if (dash == 0 || dash == std::string_view::npos || dash > 5) return std::nullopt;
  int port = 0;
  for (char c : label.substr(0, dash)) {
    if (c < '0' || c > '9') return std::nullopt;
    port = port * 10 + (c - '0');
  }
  std::string_view id = label.substr(dash + 1);
  if (id.empty() || id.size() > 64) return std::nullopt;
  for (char c : id)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return std::nullopt;
  if (port <= 0 || port > 65535) return std::nullopt;
  return std::make_pair(port, std::string(id));
}

std::string Base64(std::string_view in) { return Base64Encode(in); }

Result<std::string> Unbase64(std::string_view in) {
  auto out = Base64Decode(in);
  if (!out.ok()) return Status::Error("bytes: not valid base64", EINVAL);
  return out;
}

std::string FileSignature(std::string_view path, std::string_view op, std::string_view user,
                          std::string_view token, std::optional<int64_t> expiry) {
  std::string raw = std::string(path) + ":" + std::string(op) + ":" + std::string(user) + ":" +
                    std::string(token);
  if (expiry) raw += ":" + std::to_string(*expiry);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(raw.data(), raw.size(), md, &n, EVP_sha256(), nullptr);
  std::string b64 = Base64(std::string_view(reinterpret_cast<char*>(md), n));
  while (!b64.empty() && b64.back() == '=') b64.pop_back();
  return "v1_" + b64;
}

std::string BasicAuthUser(std::string_view auth) {
  if (auth.size() < 6) return "";
  std::string scheme(auth.substr(0, 6));
  for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (scheme != "basic ") return "";
  auto decoded = Unbase64(auth.substr(6));
  if (!decoded.ok()) return "";
  return decoded->substr(0, decoded->find(':'));
}

std::string Permissions(int64_t mode, int64_t file_type) {
  // Go's FileMode.String(), which envd sends: 'L' for a symlink.
  std::string p = file_type == 2 ? "d" : file_type == 3 ? "L" : "-";
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) p.push_back((mode & (0400 >> i)) ? rwx[i] : '-');
  return p;
}

namespace {

bool IsUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) return false;
    i += n;
  }
  return true;
}

bool PrintableAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

}  // namespace

FileMetadata EntryMetadata(const sandbox::FileEntry& e) {
  FileMetadata out;
  for (const auto& [name, value] : e.metadata)
    if (!name.empty() && IsUtf8(name) && IsUtf8(value)) out.emplace(name, value);
  return out;
}

Result<FileMetadata> UploadMetadata(
    const std::vector<std::pair<std::string, std::string>>& headers) {
  constexpr size_t kPrefixLen = sizeof("X-Metadata-") - 1;
  constexpr size_t kMaxKey = 255 - (sizeof(kMetadataXattrPrefix) - 1);
  constexpr size_t kMaxTotal = 4096;
  FileMetadata out;
  for (const auto& [header, value] : headers) {
    std::string key = header.substr(std::min(kPrefixLen, header.size()));
    if (key.empty()) continue;
    std::transform(key.begin(), key.end(), key.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    out.emplace(key, value);
  }
  size_t total = 0;
  for (const auto& [key, value] : out) {
    if (key.size() > kMaxKey)
      return Status::Error("invalid metadata: key \"" + key + "\" exceeds 246 bytes", EINVAL);
    if (!PrintableAscii(key) || !PrintableAscii(value))
      return Status::Error(
          "invalid metadata: the key or value of \"" + key + "\" is not printable ASCII", EINVAL);
    total += sizeof(kMetadataXattrPrefix) - 1 + key.size() + value.size();
  }
  if (total > kMaxTotal)
    return Status::Error(
        "invalid metadata: total metadata size " + std::to_string(total) + " exceeds 4096 bytes",
        EINVAL);
  return out;
}

json EntryInfo(const sandbox::FileEntry& e) {
  static const char* kTypes[] = {"FILE_TYPE_UNSPECIFIED", "FILE_TYPE_FILE", "FILE_TYPE_DIRECTORY",
                                 "FILE_TYPE_SYMLINK"};
  int t = static_cast<int>(e.type);
  json j = {{"name", e.name},
            {"type", kTypes[(t >= 1 && t <= 3) ? t : 0]},
            {"path", e.path},
            {"size", std::to_string(e.size)},
            {"mode", e.mode & 0777},
            // A followed symlink (Stat with follow) has its target's type and mode, but envd's
            // permissions are the link's own, which Linux always makes 0777.
            {"permissions", !e.link_target.empty() ? Permissions(0777, 3) : Permissions(e.mode, t)},
            {"owner", e.owner},
            {"group", e.group}};
  if (e.mtime_ns > 0) j["modifiedTime"] = Rfc3339(e.mtime_ns / 1000000);
  if (!e.link_target.empty()) j["symlinkTarget"] = e.link_target;
  if (FileMetadata m = EntryMetadata(e); !m.empty()) j["metadata"] = m;
  return j;
}

namespace {

// The value of `param` in a header like `form-data; name="file"; filename="/a b"`.
std::optional<std::string> HeaderParam(std::string_view header, std::string_view param) {
  size_t pos = 0;
  while ((pos = header.find(param, pos)) != std::string_view::npos) {
    bool boundary_ok = pos == 0 || header[pos - 1] == ' ' || header[pos - 1] == ';';
    size_t after = pos + param.size();
    if (!boundary_ok || after >= header.size() || header[after] != '=') {
      pos = after;
      continue;
    }
    std::string_view v = header.substr(after + 1);
    if (!v.empty() && v[0] == '"') {
      std::string out;
      for (size_t i = 1; i < v.size(); ++i) {
        if (v[i] == '\\' && i + 1 < v.size()) {
          out.push_back(v[++i]);
        } else if (v[i] == '"') {
          break;
        } else {
          out.push_back(v[i]);
        }
      }
      return out;
    }
    size_t end = v.find(';');
    std::string out(v.substr(0, end));
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out;
  }
  return std::nullopt;
}

// Browsers and undici escape '"', CR and LF in multipart file names as %22, %0D, %0A.
std::string UnescapeFilename(std::string s) {
  static const std::pair<std::string_view, char> kEsc[] = {
      {"%22", '"'}, {"%0D", '\r'}, {"%0A", '\n'}};
  for (const auto& [from, to] : kEsc) {
    size_t p = 0;
    while ((p = s.find(from, p)) != std::string::npos) {
      s.replace(p, from.size(), 1, to);
      ++p;
    }
  }
  return s;
}

}  // namespace

Result<std::string> MultipartParser::Boundary(std::string_view content_type) {
  auto boundary = HeaderParam(content_type, "boundary");
  if (!boundary || boundary->empty() || boundary->size() > 200)
    return Status::Error("multipart: no boundary in Content-Type", EINVAL);
  return *boundary;
}

MultipartParser::MultipartParser(const std::string& boundary) : delimiter_("\r\n--" + boundary) {
  // The first delimiter may open the body without the CRLF before it.
  buf_ = "\r\n";
}

Status MultipartParser::Feed(std::string_view in, std::vector<Event>* events) {
  constexpr size_t kMaxPartHeader = 16 << 10;
  buf_.append(in);
  size_t pos = 0;
  for (;;) {
    if (state_ == State::kPreamble) {
      size_t d = buf_.find(delimiter_, pos);
      if (d == std::string::npos) {
        // Keep what could be the start of a delimiter.
        pos = buf_.size() > delimiter_.size() ? buf_.size() - delimiter_.size() : pos;
        break;
      }
      pos = d + delimiter_.size();
      state_ = State::kAfterDelimiter;
    } else if (state_ == State::kAfterDelimiter) {
      if (buf_.size() - pos < 2) break;
      if (buf_.compare(pos, 2, "--") == 0) {
        state_ = State::kDone;
        pos = buf_.size();  // the epilogue is ignored
        break;
      }
      // Transport padding (spaces, tabs) may sit before the CRLF.
      size_t eol = buf_.find("\r\n", pos);
      if (eol == std::string::npos) {
        if (buf_.size() - pos > 256) return Status::Error("multipart: malformed delimiter", EINVAL);
        break;
      }
      if (buf_.find_first_not_of(" \t", pos) != eol)
        return Status::Error("multipart: malformed delimiter", EINVAL);
      pos = eol + 2;
      state_ = State::kHeaders;
    } else if (state_ == State::kHeaders) {
      size_t end = buf_.find("\r\n\r\n", pos);
      bool empty_headers = buf_.compare(pos, 2, "\r\n") == 0;
      if (end == std::string::npos && !empty_headers) {
        if (buf_.size() - pos > kMaxPartHeader)
          return Status::Error("multipart: part header too large", EINVAL);
        break;
      }
      std::string_view headers =
          empty_headers ? std::string_view() : std::string_view(buf_).substr(pos, end - pos);
      Event e{Event::kPartBegin, "", "", ""};
      size_t line_start = 0;
      while (line_start <= headers.size() && !headers.empty()) {
        size_t eol = headers.find("\r\n", line_start);
        std::string_view line = headers.substr(line_start, eol - line_start);
        size_t colon = line.find(':');
        if (colon != std::string_view::npos) {
          std::string name(line.substr(0, colon));
          for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          if (name == "content-disposition") {
            std::string_view value = line.substr(colon + 1);
            e.name = HeaderParam(value, "name").value_or("");
            e.filename = UnescapeFilename(HeaderParam(value, "filename").value_or(""));
          }
        }
        if (eol == std::string_view::npos) break;
        line_start = eol + 2;
      }
      events->push_back(std::move(e));
      pos = empty_headers ? pos + 2 : end + 4;
      state_ = State::kBody;
    } else if (state_ == State::kBody) {
      size_t d = buf_.find(delimiter_, pos);
      // Data up to the delimiter, or all but what could be its start.
      size_t until = d != std::string::npos                  ? d
                     : buf_.size() - pos > delimiter_.size() ? buf_.size() - delimiter_.size()
                                                             : pos;
      if (until > pos)
        events->push_back(Event{Event::kData, "", "", buf_.substr(pos, until - pos)});
      pos = until;
      if (d == std::string::npos) break;
      events->push_back(Event{Event::kPartEnd, "", "", ""});
      pos = d + delimiter_.size();
      state_ = State::kAfterDelimiter;
    } else {  // kDone
      pos = buf_.size();
      break;
    }
  }
  buf_.erase(0, pos);
  return {};
}

Status MultipartParser::Finish() const {
  if (state_ == State::kDone) return {};
  return Status::Error(
      state_ == State::kPreamble ? "multipart: no parts" : "multipart: truncated body", EINVAL);
}

struct GzipDeflater::Impl {
  z_stream z{};
  bool ok = false;
};

GzipDeflater::GzipDeflater() : impl_(std::make_unique<Impl>()) {
  impl_->ok = deflateInit2(&impl_->z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8,
                           Z_DEFAULT_STRATEGY) == Z_OK;
}

GzipDeflater::~GzipDeflater() {
  if (impl_->ok) deflateEnd(&impl_->z);
}

Status GzipDeflater::Run(std::string_view in, int flush, std::string* out) {
  if (!impl_->ok) return Status::Error("gzip: init failed", EIO);
  z_stream& z = impl_->z;
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  char buf[64 * 1024];
  for (;;) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    int rc = deflate(&z, flush);
    if (rc == Z_STREAM_ERROR) return Status::Error("gzip: deflate failed", EIO);
    out->append(buf, sizeof buf - z.avail_out);
    if (flush == Z_FINISH ? rc == Z_STREAM_END : (z.avail_in == 0 && z.avail_out != 0)) break;
  }
  return {};
}

Status GzipDeflater::Feed(std::string_view in, std::string* out) {
  return Run(in, Z_NO_FLUSH, out);
}
Status GzipDeflater::Finish(std::string* out) { return Run({}, Z_FINISH, out); }

std::string ContentTypeFor(std::string_view name) {
  static const std::map<std::string, std::string, std::less<>> kTypes = {
      {".avif", "image/avif"},
      {".css", "text/css; charset=utf-8"},
      {".csv", "text/csv; charset=utf-8"},
      {".gif", "image/gif"},
      {".htm", "text/html; charset=utf-8"},
      {".html", "text/html; charset=utf-8"},
      {".jpeg", "image/jpeg"},
      {".jpg", "image/jpeg"},
      {".js", "text/javascript; charset=utf-8"},
      {".json", "application/json"},
      {".md", "text/markdown; charset=utf-8"},
      {".mjs", "text/javascript; charset=utf-8"},
      {".pdf", "application/pdf"},
      {".png", "image/png"},
      {".svg", "image/svg+xml"},
      {".txt", "text/plain; charset=utf-8"},
      {".wasm", "application/wasm"},
      {".webp", "image/webp"},
      {".xml", "text/xml; charset=utf-8"},
      {".zip", "application/zip"},
  };
  size_t dot = name.rfind('.');
  if (dot != std::string_view::npos && name.find('/', dot) == std::string_view::npos) {
    std::string ext(name.substr(dot));
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (auto it = kTypes.find(ext); it != kTypes.end()) return it->second;
  }
  return "application/octet-stream";
}

std::optional<std::string> DownloadEncoding(std::string_view accept_encoding) {
  // RFC 9110 12.5.3: "coding;q=x" items; identity is acceptable unless refused.
  std::optional<double> gzip, identity, any;
  size_t pos = 0;
  while (pos <= accept_encoding.size()) {
    size_t comma = accept_encoding.find(',', pos);
    std::string_view item = accept_encoding.substr(pos, comma - pos);
    pos = comma == std::string_view::npos ? accept_encoding.size() + 1 : comma + 1;
    size_t semi = item.find(';');
    std::string coding(item.substr(0, semi));
    coding.erase(0, coding.find_first_not_of(" \t"));
    coding.erase(coding.find_last_not_of(" \t") + 1);
    for (char& c : coding) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    double q = 1;
    if (semi != std::string_view::npos) {
      size_t qpos = item.find("q=", semi);
      if (qpos != std::string_view::npos) q = std::atof(std::string(item.substr(qpos + 2)).c_str());
    }
    if (coding == "gzip" || coding == "x-gzip") gzip = q;
    if (coding == "identity") identity = q;
    if (coding == "*") any = q;
  }
  if (gzip.value_or(any.value_or(0)) > 0) return std::string("gzip");
  if (identity.value_or(any.value_or(1)) > 0) return std::string();
  return std::nullopt;
}

struct GzipInflater::Impl {
  z_stream z{};
  bool ok = false;
  bool ended = false;
};

GzipInflater::GzipInflater() : impl_(std::make_unique<Impl>()) {
  impl_->ok = inflateInit2(&impl_->z, 15 + 16) == Z_OK;  // gzip only
}

GzipInflater::~GzipInflater() {
  if (impl_->ok) inflateEnd(&impl_->z);
}

Status GzipInflater::Feed(std::string_view in, std::string* out) {
  if (!impl_->ok) return Status::Error("gzip: init failed", EIO);
  z_stream& z = impl_->z;
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  char buf[64 * 1024];
  while (z.avail_in > 0 && !impl_->ended) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    int rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
      return Status::Error("gzip: corrupt body", EINVAL);
    size_t n = sizeof buf - z.avail_out;
    out->append(buf, n);
    if (rc == Z_STREAM_END) impl_->ended = true;
    if (rc == Z_BUF_ERROR && n == 0) break;
  }
  return {};
}

Status GzipInflater::Finish() const {
  if (!impl_->ended) return Status::Error("gzip: truncated body", EINVAL);
  return {};
}

// ---- network (spec 6) ----

namespace {

constexpr char kAllIpv4[] = "0.0.0.0/0";

// `field` of `j` as an array of strings (absent or null: nullopt).
Result<std::optional<std::vector<std::string>>> StringList(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return std::optional<std::vector<std::string>>();
  if (!it->is_array()) return Status::Error(std::string(field) + ": must be an array", EINVAL);
  if (it->size() > network::kMaxRules)
    return Status::Error(
        std::string(field) + ": at most " + std::to_string(network::kMaxRules) + " entries",
        EINVAL);
  std::vector<std::string> out;
  for (size_t i = 0; i < it->size(); ++i) {
    if (!(*it)[i].is_string())
      return Status::Error(std::string(field) + "[" + std::to_string(i) + "]: must be a string",
                           EINVAL);
    out.push_back((*it)[i].get<std::string>());
  }
  return std::optional<std::vector<std::string>>(std::move(out));
}

bool IsName(const network::Rule& r) { return r.kind != network::Rule::Kind::kCidr; }

Status CheckRules(const json& rules) {
  if (!rules.is_object())
    return Status::Error("rules: an object of domain -> [{transform: {headers: {...}}}]", EINVAL);
  if (rules.size() > kMaxRuleDomains)
    return Status::Error("rules: at most " + std::to_string(kMaxRuleDomains) + " domains", EINVAL);
  for (const auto& [domain, list] : rules.items()) {
    std::string where = "rules[\"" + domain.substr(0, 128) + "\"]";
    if (domain.empty() || domain.size() > 128)
      return Status::Error(
          "rules: a domain of 1 to 128 characters (got \"" + domain.substr(0, 128) + "\")", EINVAL);
    if (auto r = network::ParseRule(domain); !r.ok() || !IsName(*r))
      return Status::Error(where + ": not a domain name", EINVAL);
    if (!list.is_array()) return Status::Error(where + ": must be an array", EINVAL);
    if (list.size() > 1) return Status::Error(where + ": at most 1 transform", EINVAL);
    for (const auto& rule : list) {
      if (!rule.is_object()) return Status::Error(where + ": a rule is an object", EINVAL);
      for (const auto& [k, v] : rule.items())
        if (k != "transform") return Status::Error(where + ": unknown field '" + k + "'", EINVAL);
      auto t = rule.find("transform");
      if (t == rule.end() || t->is_null()) continue;
      if (!t->is_object()) return Status::Error(where + ".transform: must be an object", EINVAL);
      for (const auto& [k, v] : t->items())
        if (k != "headers")
          return Status::Error(where + ".transform: unknown field '" + k + "'", EINVAL);
      auto h = t->find("headers");
      if (h == t->end() || h->is_null()) continue;
      if (!h->is_object())
        return Status::Error(where + ".transform.headers: must be an object", EINVAL);
      if (h->size() > kMaxRuleHeaders)
        return Status::Error(
            where + ".transform.headers: at most " + std::to_string(kMaxRuleHeaders) + " headers",
            EINVAL);
      for (const auto& [name, value] : h->items()) {
        bool token = !name.empty() && name.size() <= 64;
        for (char c : name)
          token = token && (std::isalnum(static_cast<unsigned char>(c)) ||
                            std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos);
        if (!token)
          return Status::Error(where +
                                   ".transform.headers: a header name of 1 to 64 token "
                                   "characters (got \"" +
                                   name.substr(0, 64) + "\")",
                               EINVAL);
        if (!value.is_string() || value.get<std::string>().size() > 2048)
          return Status::Error(
              where + ".transform.headers." + name + ": a string of at most 2048 characters",
              EINVAL);
        for (char c : value.get<std::string>())
          if (c == '\r' || c == '\n' || c == '\0')
            return Status::Error(
                where + ".transform.headers." + name + ": no line breaks or NUL in a header value",
                EINVAL);
      }
    }
  }
  return {};
}

}  // namespace

Result<Egress> ParseEgress(const json& net, std::optional<bool> allow_internet_access) {
  static const json kEmpty = json::object();
  const json& j = net.is_null() ? kEmpty : net;
  if (!j.is_object()) return Status::Error("network: must be an object", EINVAL);
  for (const auto& [k, v] : j.items()) {
    if (k == "egressProxy" && !v.is_null())
      return Status::Error("network.egressProxy: not supported by sbx", EINVAL);
    static const std::set<std::string> kKnown = {
        "allowOut",           "denyOut",         "rules",      "egressProxy",
        "allowPublicTraffic", "maskRequestHost", "httpsPorts", "allow_internet_access"};
    if (!kKnown.count(k)) return Status::Error("network: unknown field '" + k + "'", EINVAL);
  }
  auto allow_out = StringList(j, "allowOut");
  if (!allow_out.ok()) return allow_out.status();
  auto deny_out = StringList(j, "denyOut");
  if (!deny_out.ok()) return deny_out.status();
  Egress out;
  // allow_internet_access: true alone is E2B's default (SDKs send it on every create), not a
  // request for a network this daemon may not have.
  out.given = allow_internet_access == false || allow_out->has_value() || deny_out->has_value();
  std::vector<std::string> allow = allow_out->value_or(std::vector<std::string>{});
  std::vector<std::string> deny = deny_out->value_or(std::vector<std::string>{});
  if (allow_internet_access == false && std::find(deny.begin(), deny.end(), kAllIpv4) == deny.end())
    deny.push_back(kAllIpv4);

  bool deny_all = false;
  std::vector<network::Rule> deny_rules;
  for (const auto& d : deny) {
    auto cidr = network::ParseCidr(d);
    if (!cidr.ok())
      return Status::Error("denyOut: '" + d.substr(0, 256) +
                               "' is not an IP address or CIDR (denyOut takes no domains)",
                           EINVAL);
    if (cidr->prefix == 0 && cidr->base.is_v4()) {
      deny_all = true;
      continue;
    }
    auto rule = network::ParseRule(d);
    if (!rule.ok()) return Status::Error("denyOut: " + rule.status().message(), EINVAL);
    deny_rules.push_back(*rule);
  }
  std::vector<network::Rule> allow_rules;
  for (const auto& a : allow) {
    auto rule = network::ParseRule(a);
    if (!rule.ok()) return Status::Error("allowOut: " + rule.status().message(), EINVAL);
    if (IsName(*rule) && !deny_all)
      return Status::Error("allowOut: the domain '" + a.substr(0, 256) +
                               "' needs denyOut to contain 0.0.0.0/0 (a domain can only be "
                               "allowed when all other traffic is denied)",
                           EINVAL);
    allow_rules.push_back(*rule);
  }
  if (auto r = j.find("rules"); r != j.end() && !r->is_null()) {
    SBX_RETURN_IF_ERROR(CheckRules(*r));
    out.rules = *r;
  }
  out.policy.mode = deny_all ? network::Mode::kAllowlist : network::Mode::kOpen;
  out.policy.allow = std::move(allow_rules);
  out.policy.deny = std::move(deny_rules);
  return out;
}

bool AllowsInternet(const network::Policy& policy) { return policy.mode == network::Mode::kOpen; }

json EgressJson(const network::Policy& policy, const json& rules) {
  json allow = json::array(), deny = json::array();
  for (const auto& r : policy.allow) allow.push_back(r.text);
  if (!AllowsInternet(policy)) deny.push_back(kAllIpv4);
  for (const auto& r : policy.deny) deny.push_back(r.text);
  json j = {{"allowOut", allow}, {"denyOut", deny}};
  if (rules.is_object() && !rules.empty()) j["rules"] = rules;
  return j;
}

}  // namespace sbx::api::e2b

#include "storage/registry.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <cctype>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>

#include "common/encoding.h"
#include "common/fd.h"
#include "common/fs.h"
#include "common/thread_annotations.h"

namespace sbx::storage {
namespace {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using boost::system::error_code;
using nlohmann::json;

constexpr char kOciIndex[] = "application/vnd.oci.image.index.v1+json";
constexpr char kOciManifest[] = "application/vnd.oci.image.manifest.v1+json";
constexpr char kDockerList[] = "application/vnd.docker.distribution.manifest.list.v2+json";
constexpr char kDockerManifest[] = "application/vnd.docker.distribution.manifest.v2+json";
constexpr size_t kMaxLayers = 1000;
constexpr size_t kMaxErrorBody = 64 << 10;  // what is read of an error answer, for its message
constexpr size_t kMaxTokenBody = 1 << 20;
constexpr int64_t kProgressStep = 256 << 10;  // bytes between progress calls of one blob
constexpr int kBlobAttempts = 3;              // per blob, while each attempt makes progress

// ---- small helpers ----

bool IsLowerHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool IsSha256Digest(std::string_view d) {
  return d.size() == 71 && d.substr(0, 7) == "sha256:" && IsLowerHex(d.substr(7));
}

std::string Short(const std::string& digest) { return digest.substr(7, 12); }

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Incremental sha256 (OpenSSL EVP), for blobs verified as they stream.
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) { Reset(); }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Reset() { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
  void Update(const void* p, size_t n) { EVP_DigestUpdate(ctx_, p, n); }
  std::string Digest() {  // "sha256:<hex>"; the context must be Reset before reuse
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_, md, &len);
    static const char kHex[] = "0123456789abcdef";
    std::string out = "sha256:";
    for (unsigned int i = 0; i < len; ++i) {
      out += kHex[md[i] >> 4];
      out += kHex[md[i] & 15];
    }
    return out;
  }

 private:
  EVP_MD_CTX* ctx_;
};

std::string DigestOf(std::string_view data) {
  Sha256 h;
  h.Update(data.data(), data.size());
  return h.Digest();
}

// Hostnames (labels of letters, digits, '-', '_'), IPv4 and bracketed IPv6, then ":port".
struct HostPort {
  std::string host;   // without brackets
  uint16_t port = 0;  // 0: the scheme's
};

Result<HostPort> ParseHostPort(std::string_view s) {
  HostPort hp;
  std::string_view port;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string_view::npos || close < 2) return Status::Error("bad host", EINVAL);
    hp.host = std::string(s.substr(1, close - 1));
    for (char c : hp.host)
      if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.')
        return Status::Error("bad host", EINVAL);
    std::string_view rest = s.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return Status::Error("bad host", EINVAL);
      port = rest.substr(1);
      if (port.empty()) return Status::Error("bad port", EINVAL);
    }
  } else {
    size_t colon = s.find(':');
    hp.host = std::string(s.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = s.substr(colon + 1);
      if (port.empty()) return Status::Error("bad port", EINVAL);
    }
    if (hp.host.empty() || hp.host.size() > 253) return Status::Error("bad host", EINVAL);
    for (char c : hp.host)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_')
        return Status::Error("bad host", EINVAL);
  }
  if (!port.empty()) {
    if (port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit))
      return Status::Error("bad port", EINVAL);
    int p = std::stoi(std::string(port));
    if (p < 1 || p > 65535) return Status::Error("bad port", EINVAL);
    hp.port = static_cast<uint16_t>(p);
  }
  return hp;
}

struct Url {
  bool tls = true;
  std::string host;
  uint16_t port = 443;
  std::string target = "/";  // path and query

  bool IsIpv6() const { return host.find(':') != std::string::npos; }
  std::string Authority() const {  // for the Host header and messages
    std::string h = IsIpv6() ? "[" + host + "]" : host;
    if (port != (tls ? 443 : 80)) h += ":" + std::to_string(port);
    return h;
  }
  std::string String() const { return (tls ? "https://" : "http://") + Authority() + target; }
};

Result<Url> ParseUrl(std::string_view s) {
  Url u;
  if (s.substr(0, 8) == "https://") {
    s.remove_prefix(8);
  } else if (s.substr(0, 7) == "http://") {
    u.tls = false;
    s.remove_prefix(7);
  } else {
    return Status::Error("not an http(s) URL", EINVAL);
  }
  size_t end = s.find_first_of("/?#");
  std::string_view authority = s.substr(0, end);
  if (authority.find('@') != std::string_view::npos)
    return Status::Error("URL with user info", EINVAL);
  auto hp = ParseHostPort(authority);
  if (!hp.ok()) return hp.status();
  u.host = hp->host;
  u.port = hp->port != 0 ? hp->port : (u.tls ? 443 : 80);
  if (end != std::string_view::npos) {
    std::string_view rest = s.substr(end);
    rest = rest.substr(0, rest.find('#'));
    u.target = rest[0] == '/' ? std::string(rest) : "/" + std::string(rest);
  }
  for (char c : u.target)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      return Status::Error("URL with spaces or control characters", EINVAL);
  return u;
}

// A Location header against the URL it answered: absolute, scheme-relative or path-absolute.
Result<Url> ResolveLocation(const Url& base, std::string_view location) {
  if (location.substr(0, 2) == "//")
    return ParseUrl((base.tls ? "https:" : "http:") + std::string(location));
  if (!location.empty() && location[0] == '/') {
    Url u = base;
    u.target = std::string(location.substr(0, location.find('#')));
    for (char c : u.target)
      if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
        return Status::Error("URL with spaces or control characters", EINVAL);
    return u;
  }
  return ParseUrl(location);
}

bool ValidHeaderValue(std::string_view v) {
  return std::all_of(v.begin(), v.end(), [](char c) {
    auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u != 0x7f;
  });
}

// errno-carrying Status for system errors; other categories (Beast, Asio misc, SSL) as text.
Status NetError(const std::string& what, const error_code& ec) {
  if (ec == net::error::timed_out || ec == beast::error::timeout)
    return Status::Error(what + ": timed out", ETIMEDOUT);
  if (ec.category() == boost::system::system_category() ||
      ec.category() == boost::system::generic_category())
    return Status::Error(what, ec.value());
  return Status::Error(what + ": " + ec.message(), ECONNRESET);
}

// ---- HTTP: one request per connection, blocking, each network step bounded ----

using Headers = std::vector<std::pair<std::string, std::string>>;
using ConnectCheck = std::function<Status(const std::string& host, uint16_t port,
                                          const std::vector<std::string>& addresses)>;

// One response whose body is read on demand. Owns its connection and its private io_context:
// asynchronous operations with Beast's timeouts, run to completion one at a time, give a blocking
// client whose every step is bounded.
class HttpResponse {
 public:
  HttpResponse(ssl::context& tls_ctx, bool tls, std::chrono::milliseconds timeout,
               const ConnectCheck& check)
      : timeout_(timeout), check_(check) {
    if (tls)
      tls_.emplace(ioc_, tls_ctx);
    else
      tcp_.emplace(ioc_);
  }

  Status Send(const Url& url, const Headers& headers) {
    what_ = "GET " + url.String();
    beast::tcp_stream& tcp = Tcp();
    net::ip::tcp::resolver resolver(ioc_);
    net::ip::tcp::resolver::results_type endpoints;
    error_code ec = Wait([&](auto done) {
      resolver.async_resolve(url.host, std::to_string(url.port),
                             [&endpoints, done](error_code e, auto results) {
                               endpoints = results;
                               done(e);
                             });
    });
    if (ec) return NetError("resolve " + url.Authority(), ec);
    if (check_) {
      // Checked on what is connected to below: no second resolution can change it.
      std::vector<std::string> addresses;
      for (const auto& e : endpoints) addresses.push_back(e.endpoint().address().to_string());
      SBX_RETURN_IF_ERROR(check_(url.host, url.port, addresses));
    }
    tcp.expires_after(timeout_);
    ec = Wait([&](auto done) {
      tcp.async_connect(endpoints, [done](error_code e, const auto&) { done(e); });
    });
    if (ec) return NetError("connect " + url.Authority(), ec);
    if (tls_) {
      SSL* s = tls_->native_handle();
      error_code addr_ec;
      net::ip::make_address(url.host, addr_ec);
      bool ip = !addr_ec;
      if (!ip) SSL_set_tlsext_host_name(s, url.host.c_str());
      X509_VERIFY_PARAM* param = SSL_get0_param(s);
      X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      if (ip)
        X509_VERIFY_PARAM_set1_ip_asc(param, url.host.c_str());
      else
        X509_VERIFY_PARAM_set1_host(param, url.host.c_str(), 0);
      tcp.expires_after(timeout_);
      ec = Wait([&](auto done) { tls_->async_handshake(ssl::stream_base::client, done); });
      if (ec) {
        long verify = SSL_get_verify_result(s);
        std::string why =
            verify != X509_V_OK ? X509_verify_cert_error_string(verify) : ec.message();
        ERR_clear_error();
        return Status::Error("TLS with " + url.Authority() + ": " + why, ECONNREFUSED);
      }
    }
    bhttp::request<bhttp::empty_body> req{bhttp::verb::get, url.target, 11};
    req.set(bhttp::field::host, url.Authority());
    req.set(bhttp::field::user_agent, "sbx");
    for (const auto& [k, v] : headers) req.set(k, v);
    req.keep_alive(false);
    tcp.expires_after(timeout_);
    ec = WithStream([&](auto& stream) {
      return Wait([&](auto done) {
        bhttp::async_write(stream, req, [done](error_code e, size_t) { done(e); });
      });
    });
    if (ec) return NetError(what_ + ": send", ec);
    parser_.header_limit(64 << 10);
    parser_.body_limit(std::numeric_limits<uint64_t>::max());  // bounded by the callers
    tcp.expires_after(timeout_);
    ec = WithStream([&](auto& stream) {
      return Wait([&](auto done) {
        bhttp::async_read_header(stream, buf_, parser_, [done](error_code e, size_t) { done(e); });
      });
    });
    if (ec) return NetError(what_ + ": read answer", ec);
    return {};
  }

  int status() const { return static_cast<int>(parser_.get().result_int()); }
  std::string Header(beast::string_view name) const {
    auto it = parser_.get().find(name);
    return it == parser_.get().end() ? "" : std::string(it->value());
  }
  std::optional<uint64_t> ContentLength() const {
    auto n = parser_.content_length();
    if (!n) return std::nullopt;
    return *n;
  }

  // Up to `n` bytes of the body; 0 at its end.
  Result<size_t> Read(char* buf, size_t n) {
    while (!parser_.is_done()) {
      parser_.get().body().data = buf;
      parser_.get().body().size = n;
      Tcp().expires_after(timeout_);
      error_code ec = WithStream([&](auto& stream) {
        return Wait([&](auto done) {
          bhttp::async_read_some(stream, buf_, parser_, [done](error_code e, size_t) { done(e); });
        });
      });
      if (ec == bhttp::error::need_buffer) ec = {};
      size_t got = n - parser_.get().body().size;
      if (ec) return NetError(what_ + ": read body", ec);
      if (got > 0) return got;
    }
    return size_t{0};
  }

  // The whole body, EFBIG beyond `limit`.
  Result<std::string> ReadAll(size_t limit) {
    if (auto cl = ContentLength(); cl && *cl > limit)
      return Status::Error(what_ + ": answer of " + std::to_string(*cl) + " bytes, more than " +
                               std::to_string(limit),
                           EFBIG);
    std::string out;
    char chunk[16 << 10];
    for (;;) {
      auto got = Read(chunk, sizeof chunk);
      if (!got.ok()) return got.status();
      if (*got == 0) break;
      if (out.size() + *got > limit)
        return Status::Error(what_ + ": answer longer than " + std::to_string(limit) + " bytes",
                             EFBIG);
      out.append(chunk, *got);
    }
    return out;
  }

  const std::string& what() const { return what_; }

 private:
  beast::tcp_stream& Tcp() { return tls_ ? tls_->next_layer() : *tcp_; }

  template <typename F>
  error_code WithStream(F f) {
    if (tls_) return f(*tls_);
    return f(*tcp_);
  }

  // Starts one asynchronous operation and runs the io_context until it completes.
  template <typename Start>
  error_code Wait(Start start) {
    error_code out = net::error::operation_aborted;
    start([&out](error_code ec) { out = ec; });
    ioc_.restart();
    ioc_.run();
    return out;
  }

  net::io_context ioc_{1};
  std::optional<beast::tcp_stream> tcp_;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_;
  beast::flat_buffer buf_;
  bhttp::response_parser<bhttp::buffer_body> parser_;
  std::chrono::milliseconds timeout_;
  const ConnectCheck& check_;
  std::string what_;
};

// ---- the registry session: where to connect, auth, redirects ----

struct Descriptor {
  std::string media_type;
  std::string digest;
  int64_t size = 0;
};

Result<Descriptor> ParseDescriptor(const json& j, const std::string& what) {
  if (!j.is_object() || !j.contains("digest") || !j["digest"].is_string() || !j.contains("size") ||
      !j["size"].is_number_integer())
    return Status::Error(what + ": a descriptor without digest and size", EINVAL);
  Descriptor d;
  d.digest = j["digest"].get<std::string>();
  if (!IsSha256Digest(d.digest))
    return Status::Error(what + ": digest is not sha256:<64 lowercase hex>", EINVAL);
  d.size = j["size"].get<int64_t>();
  if (d.size < 0 || d.size > (int64_t{1} << 50))
    return Status::Error(what + ": size out of range", EINVAL);
  if (j.contains("mediaType") && j["mediaType"].is_string())
    d.media_type = j["mediaType"].get<std::string>();
  return d;
}

std::string AcceptAll() {
  return std::string(kOciIndex) + ", " + kOciManifest + ", " + kDockerList + ", " + kDockerManifest;
}

class Registry {
 public:
  Registry(const PullOptions& o, const ImageRef& ref, ssl::context& tls_ctx)
      : o_(o), ref_(ref), tls_ctx_(tls_ctx) {}

  Status Init() {
    auto hp = ParseHostPort(ref_.registry);
    if (!hp.ok()) return Status::Error("registry host '" + ref_.registry + "'", EINVAL);
    if (!o_.endpoint.empty()) {
      hp = ParseHostPort(o_.endpoint);
      if (!hp.ok()) return Status::Error("registry endpoint '" + o_.endpoint + "'", EINVAL);
    }
    base_.host = hp->host == "docker.io" ? "registry-1.docker.io" : hp->host;
    base_.tls = !Insecure(hp->host, hp->port);
    base_.port = hp->port != 0 ? hp->port : (base_.tls ? 443 : 80);
    if (!o_.username.empty()) {
      user_ = o_.username;
      password_ = o_.password;
    } else if (!o_.docker_config.empty()) {
      if (auto cfg = ReadFile(o_.docker_config, 1 << 20); cfg.ok()) {
        auto creds = DockerConfigAuth(*cfg, ref_.registry);
        if (creds.ok()) {
          user_ = creds->first;
          password_ = creds->second;
        } else if (creds.status().err() != ENOENT) {
          return creds.status().Wrap("docker config");
        }
      }
    }
    return {};
  }

  const std::string& name() const { return ref_.registry; }

  // GET <path> on the registry: authenticates when challenged (once per request) and, with
  // `follow`, follows redirects. Answers of any status are returned.
  Result<std::unique_ptr<HttpResponse>> Get(const std::string& path, const Headers& extra,
                                            bool follow) {
    Url url = base_;
    url.target = path;
    bool retried_auth = false;
    for (int hops = 0;; ++hops) {
      SBX_RETURN_IF_ERROR(Allowed(url));
      bool on_registry = url.host == base_.host && url.port == base_.port && url.tls == base_.tls;
      Headers h = extra;
      std::string auth;
      if (on_registry) {
        auth = Authorization();
        if (!auth.empty()) h.emplace_back("Authorization", auth);
      }
      auto r = std::make_unique<HttpResponse>(tls_ctx_, url.tls, o_.timeout, o_.check_connect);
      if (Status sent = r->Send(url, h); !sent.ok()) {
        if (url.tls && on_registry && sent.what().rfind("TLS", 0) == 0)
          return Status::Error(sent.what() +
                                   " (a registry that speaks plain HTTP must be named with "
                                   "--insecure-registry)",
                               sent.err());
        return sent;
      }
      int status = r->status();
      if (status == 401 && on_registry && !retried_auth) {
        retried_auth = true;
        std::string challenge = r->Header("WWW-Authenticate");
        SBX_RETURN_IF_ERROR(Authenticate(challenge, auth));
        --hops;
        continue;
      }
      if (status == 401 || status == 403) {
        return Status::Error(
            "registry " + name() +
                (user_.empty() ? " wants credentials: pass --username and --password-stdin"
                               : " refused the credentials"),
            EACCES);
      }
      if (follow &&
          (status == 301 || status == 302 || status == 303 || status == 307 || status == 308)) {
        if (hops >= kMaxRedirects)
          return Status::Error(
              "registry " + name() + ": more than " + std::to_string(kMaxRedirects) + " redirects",
              EPROTO);
        auto next = ResolveLocation(url, r->Header("Location"));
        if (!next.ok())
          return Status::Error("registry " + name() + ": redirect to an unusable location", EPROTO);
        // No downgrade: a registry reached over HTTPS may send the client only to HTTPS.
        if (url.tls && !next->tls)
          return Status::Error("registry " + name() + ": redirect from HTTPS to plain HTTP", EPERM);
        url = *next;
        continue;
      }
      return r;
    }
  }

 private:
  bool Insecure(const std::string& host, uint16_t port) const {
    std::string bracketed = host.find(':') != std::string::npos ? "[" + host + "]" : host;
    for (const auto& entry : o_.insecure_registries) {
      if (entry == host || entry == bracketed) return true;
      if (port != 0 && entry == bracketed + ":" + std::to_string(port)) return true;
      if (port == 0 && entry == bracketed + ":80") return true;
    }
    return false;
  }

  Status Allowed(const Url& url) const {
    if (url.tls || Insecure(url.host, url.port)) return {};
    return Status::Error("plain HTTP to " + url.Authority() +
                             " refused: it is not a registry named with --insecure-registry",
                         EPERM);
  }

  std::string Authorization() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return authorization_;
  }

  std::string BasicCredentials() const { return "Basic " + Base64Encode(user_ + ":" + password_); }

  // Answers a 401's challenge. `failed` is the Authorization the refused request carried: when
  // another thread has replaced it since, its new value is tried first.
  Status Authenticate(const std::string& header, const std::string& failed) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (authorization_ != failed) return {};
    auto c = ParseAuthChallenge(header);
    if (!c.ok())
      return Status::Error("registry " + name() + " answered 401 without a usable challenge",
                           EACCES);
    if (c->scheme == "basic") {
      if (user_.empty())
        return Status::Error(
            "registry " + name() + " wants credentials: pass --username and --password-stdin",
            EACCES);
      if (!failed.empty())
        return Status::Error("registry " + name() + " refused the credentials", EACCES);
      authorization_ = BasicCredentials();
      return {};
    }
    if (c->scheme != "bearer")
      return Status::Error("registry " + name() + " wants '" + c->scheme +
                               "' authentication, which sbx does not speak",
                           EACCES);
    auto realm = ParseUrl(c->Param("realm"));
    if (!realm.ok())
      return Status::Error("registry " + name() + ": the token realm is not an http(s) URL",
                           EPROTO);
    SBX_RETURN_IF_ERROR(Allowed(*realm));
    std::string scope = c->Param("scope");
    if (scope.empty()) scope = "repository:" + ref_.repository + ":pull";
    std::string q;
    if (!c->Param("service").empty()) q += "service=" + Encode(c->Param("service"));
    for (size_t start = 0; start <= scope.size();) {  // scopes are space-separated
      size_t sp = scope.find(' ', start);
      std::string one = scope.substr(start, sp == std::string::npos ? sp : sp - start);
      if (!one.empty()) q += (q.empty() ? "" : "&") + std::string("scope=") + Encode(one);
      if (sp == std::string::npos) break;
      start = sp + 1;
    }
    Url token_url = *realm;
    if (!q.empty())
      token_url.target += (token_url.target.find('?') == std::string::npos ? "?" : "&") + q;
    Headers h;
    if (!user_.empty()) h.emplace_back("Authorization", BasicCredentials());
    HttpResponse r(tls_ctx_, token_url.tls, o_.timeout, o_.check_connect);
    Status sent = r.Send(token_url, h);
    if (!sent.ok())
      return Status::Error("token from " + realm->Authority() + ": " + sent.message(), sent.err());
    if (r.status() == 401 || r.status() == 403)
      return Status::Error("the token server of registry " + name() +
                               (user_.empty() ? " wants credentials: pass --username and "
                                                "--password-stdin"
                                              : " refused the credentials"),
                           EACCES);
    if (r.status() != 200)
      return Status::Error(
          "the token server of registry " + name() + " answered HTTP " + std::to_string(r.status()),
          EACCES);
    auto body = r.ReadAll(kMaxTokenBody);
    if (!body.ok()) return body.status();
    json j = json::parse(*body, nullptr, false);
    std::string token;
    if (j.is_object() && j.contains("token") && j["token"].is_string())
      token = j["token"].get<std::string>();
    else if (j.is_object() && j.contains("access_token") && j["access_token"].is_string())
      token = j["access_token"].get<std::string>();
    if (token.empty() || token.size() > 64 << 10 || !ValidHeaderValue(token))
      return Status::Error("the token server of registry " + name() + " sent no usable token",
                           EPROTO);
    if (failed == "Bearer " + token)
      return Status::Error("registry " + name() + " refused its own token server's token", EACCES);
    authorization_ = "Bearer " + token;
    return {};
  }

  static std::string Encode(const std::string& s) {
    static const char kHex[] = "0123456789ABCDEF";
    std::string out;
    for (unsigned char c : s) {
      if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
        out += static_cast<char>(c);
      } else {
        out += '%';
        out += kHex[c >> 4];
        out += kHex[c & 15];
      }
    }
    return out;
  }

  const PullOptions& o_;
  const ImageRef& ref_;
  ssl::context& tls_ctx_;
  Url base_;
  std::string user_, password_;
  Mutex mu_;
  std::string authorization_ GUARDED_BY(mu_);
};

// ---- manifests ----

struct Fetched {
  std::string media_type;
  std::string body;
  std::string digest;
};

Result<Fetched> FetchManifest(Registry& reg, const ImageRef& ref, const std::string& reference,
                              const std::string& expected_digest, int64_t expected_size) {
  auto r =
      reg.Get("/v2/" + ref.repository + "/manifests/" + reference, {{"Accept", AcceptAll()}}, true);
  if (!r.ok()) return r.status();
  int status = (*r)->status();
  if (status == 404)
    return Status::Error(
        "registry " + reg.name() + " has no image " + ref.repository + ":" + reference, ENOENT);
  if (status != 200)
    return Status::Error("registry " + reg.name() + " answered HTTP " + std::to_string(status) +
                             " for the manifest of " + ref.repository + ":" + reference,
                         EPROTO);
  auto body = (*r)->ReadAll(kMaxManifestBytes);
  if (!body.ok())
    return Status::Error("the manifest of " + ref.repository + ":" + reference +
                             " is larger than " + std::to_string(kMaxManifestBytes) + " bytes",
                         body.status().err());
  Fetched f;
  f.body = std::move(*body);
  f.digest = DigestOf(f.body);
  if (!expected_digest.empty() && f.digest != expected_digest)
    return Status::Error(
        "the manifest " + expected_digest + " the registry sent has digest " + f.digest, EBADMSG);
  if (expected_size >= 0 && static_cast<int64_t>(f.body.size()) != expected_size)
    return Status::Error("the manifest " + expected_digest + " is not the size its index says",
                         EBADMSG);
  std::string header_digest = (*r)->Header("Docker-Content-Digest");
  if (IsSha256Digest(header_digest) && header_digest != f.digest)
    return Status::Error("registry " + reg.name() + " says the manifest is " + header_digest +
                             " but sent " + f.digest,
                         EBADMSG);
  json j = json::parse(f.body, nullptr, false);
  if (!j.is_object()) return Status::Error("the manifest is not a JSON object", EINVAL);
  if (j.contains("mediaType") && j["mediaType"].is_string()) {
    f.media_type = j["mediaType"].get<std::string>();
  } else {
    std::string ct = (*r)->Header("Content-Type");
    f.media_type = ct.substr(0, ct.find(';'));
    while (!f.media_type.empty() && f.media_type.back() == ' ') f.media_type.pop_back();
  }
  if (!j.contains("schemaVersion") || j["schemaVersion"] != 2)
    return Status::Error("the manifest is not schema version 2 (Docker schema 1 is not supported)",
                         EINVAL);
  if (f.media_type.empty()) {  // OCI allows leaving it out; tell by the shape
    f.media_type = j.contains("manifests") ? kOciIndex : kOciManifest;
  }
  if (f.media_type != kOciIndex && f.media_type != kOciManifest && f.media_type != kDockerList &&
      f.media_type != kDockerManifest)
    return Status::Error("the manifest has media type '" + f.media_type.substr(0, 100) +
                             "', which is neither an image manifest nor an index",
                         EINVAL);
  return f;
}

bool IsIndex(const std::string& media_type) {
  return media_type == kOciIndex || media_type == kDockerList;
}

// The index entry for os/architecture (variant: none preferred, else the first).
Result<Descriptor> PickPlatform(const std::string& body, const PullOptions& o,
                                const std::string& what) {
  json j = json::parse(body, nullptr, false);
  if (!j.contains("manifests") || !j["manifests"].is_array())
    return Status::Error(what + ": an index without manifests", EINVAL);
  std::vector<std::string> seen;
  std::optional<Descriptor> pick;
  bool pick_has_variant = true;
  for (const auto& m : j["manifests"]) {
    if (!m.is_object() || !m.contains("platform") || !m["platform"].is_object()) continue;
    const json& p = m["platform"];
    std::string os = p.value("os", ""), arch = p.value("architecture", "");
    if (!p["os"].is_string() || !p["architecture"].is_string()) continue;
    if (seen.size() < 16) seen.push_back(os + "/" + arch);
    if (os != o.os || arch != o.architecture) continue;
    auto d = ParseDescriptor(m, what);
    if (!d.ok()) return d.status();
    bool has_variant = p.contains("variant");
    if (!pick || (pick_has_variant && !has_variant)) {
      pick = *d;
      pick_has_variant = has_variant;
    }
  }
  if (!pick) {
    std::string have;
    for (const auto& s : seen) have += (have.empty() ? "" : ", ") + s;
    return Status::Error(what + " has no " + o.os + "/" + o.architecture + " image" +
                             (have.empty() ? "" : " (it has " + have + ")"),
                         ENOENT);
  }
  return *pick;
}

// ---- blobs ----

class Blobs {
 public:
  Blobs(Registry& reg, const ImageRef& ref, std::string dir, const ProgressFn& progress)
      : reg_(reg), ref_(ref), dir_(std::move(dir)), progress_(progress) {}

  // Fetches `d` into <dir>/<hex> (unless it is there and whole), resuming <hex>.partial.
  Status Fetch(const Descriptor& d, const std::atomic<bool>& stop) {
    const std::string hex = d.digest.substr(7);
    const std::string final_path = dir_ + "/" + hex, partial = final_path + ".partial";
    const std::string what = "blob " + d.digest;
    Report(d, 0, true);
    Sha256 hash;
    // A complete blob from an earlier pull: kept if it is what it says.
    if (int64_t have = Hash(final_path, &hash); have >= 0) {
      if (have == d.size && hash.Digest() == d.digest) {
        Report(d, d.size, true);
        return {};
      }
      ::unlink(final_path.c_str());
    }
    for (int attempt = 0;; ++attempt) {
      hash.Reset();
      int64_t have = Hash(partial, &hash);
      if (have > d.size) {
        ::unlink(partial.c_str());
        hash.Reset();
        have = -1;
      }
      int64_t before = std::max<int64_t>(have, 0);
      Status s = Attempt(d, partial, final_path, &hash, before, stop);
      if (s.ok() || stop.load()) return s;
      // Transport failures that made progress are tried again from where they stopped; every
      // other failure is final.
      struct stat stb {};
      int64_t after = ::stat(partial.c_str(), &stb) == 0 ? stb.st_size : 0;
      bool transport = s.err() == ECONNRESET || s.err() == ETIMEDOUT || s.err() == EPIPE ||
                       s.err() == ECONNABORTED || s.err() == EPROTO;
      if (!transport || after <= before || attempt + 1 >= attempts_) return s;
    }
  }

  void set_attempts(int n) { attempts_ = std::max(n, 1); }
  int64_t fetched() const { return fetched_.load(); }

 private:
  // Hashes an existing file into `hash`; its size, or -1 when it does not exist.
  static int64_t Hash(const std::string& path, Sha256* hash) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd) return -1;
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return -1;
    std::vector<char> buf(1 << 20);
    int64_t total = 0;
    for (;;) {
      ssize_t n = ::read(fd.get(), buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      hash->Update(buf.data(), static_cast<size_t>(n));
      total += n;
    }
    return total;
  }

  Status Attempt(const Descriptor& d, const std::string& partial, const std::string& final_path,
                 Sha256* hash, int64_t have, const std::atomic<bool>& stop) {
    const std::string what = "blob " + d.digest;
    UniqueFd fd(
        ::open(partial.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) return Status::Errno("write " + what);
    std::unique_ptr<HttpResponse> r;
    if (have < d.size || d.size == 0) {
      Headers h;
      if (have > 0) h.emplace_back("Range", "bytes=" + std::to_string(have) + "-");
      auto got = reg_.Get("/v2/" + ref_.repository + "/blobs/" + d.digest, h, true);
      if (!got.ok()) return got.status();
      r = std::move(*got);
      int status = r->status();
      if (status == 416 && have > 0) {  // what we have does not fit what it has: start over
        SBX_RETURN_IF_ERROR(Restart(fd.get(), hash, what));
        have = 0;
        auto again = reg_.Get("/v2/" + ref_.repository + "/blobs/" + d.digest, {}, true);
        if (!again.ok()) return again.status();
        r = std::move(*again);
        status = r->status();
      }
      if (status == 200 && have > 0) {  // no ranges here: the whole blob again
        SBX_RETURN_IF_ERROR(Restart(fd.get(), hash, what));
        have = 0;
      } else if (status == 206) {
        std::string range = r->Header("Content-Range");
        std::string want = "bytes " + std::to_string(have) + "-";
        if (have == 0 || range.compare(0, want.size(), want) != 0)
          return Status::Error("registry " + reg_.name() + " answered a range of " + what +
                                   " that was not asked for",
                               EPROTO);
      } else if (status == 404) {
        return Status::Error("registry " + reg_.name() + " has no " + what, ENOENT);
      } else if (status != 200) {
        return Status::Error(
            "registry " + reg_.name() + " answered HTTP " + std::to_string(status) + " for " + what,
            EPROTO);
      }
      if (auto cl = r->ContentLength(); cl && *cl > static_cast<uint64_t>(d.size - have)) {
        Drop(partial);
        return Status::Error("registry " + reg_.name() + " sends " + what + " as " +
                                 std::to_string(have + static_cast<int64_t>(*cl)) +
                                 " bytes, more than the " + std::to_string(d.size) +
                                 " its manifest says",
                             EFBIG);
      }
      std::vector<char> buf(256 << 10);
      int64_t reported = have;
      for (;;) {
        if (stop.load()) return Status::Error(what + ": stopped", ECANCELED);
        auto n = r->Read(buf.data(), buf.size());
        if (!n.ok()) return n.status();
        if (*n == 0) break;
        if (have + static_cast<int64_t>(*n) > d.size) {
          Drop(partial);
          return Status::Error("registry " + reg_.name() + " sent more of " + what + " than the " +
                                   std::to_string(d.size) + " bytes its manifest says",
                               EFBIG);
        }
        SBX_RETURN_IF_ERROR(WriteAll(fd.get(), std::string_view(buf.data(), *n)));
        hash->Update(buf.data(), *n);
        have += static_cast<int64_t>(*n);
        fetched_ += static_cast<int64_t>(*n);
        if (have - reported >= kProgressStep) {
          Report(d, have, false);
          reported = have;
        }
      }
    }
    if (have != d.size)
      return Status::Error("registry " + reg_.name() + " ended " + what + " after " +
                               std::to_string(have) + " of " + std::to_string(d.size) + " bytes",
                           EPROTO);
    if (hash->Digest() != d.digest) {
      Drop(partial);
      return Status::Error(
          "registry " + reg_.name() + " sent " + what + " with different content (digest mismatch)",
          EBADMSG);
    }
    fd.reset();
    if (::rename(partial.c_str(), final_path.c_str()) != 0) return Status::Errno("rename " + what);
    Report(d, d.size, true);
    return {};
  }

  static Status Restart(int fd, Sha256* hash, const std::string& what) {
    if (::ftruncate(fd, 0) != 0) return Status::Errno("truncate " + what);
    hash->Reset();
    return {};
  }

  static void Drop(const std::string& partial) { ::unlink(partial.c_str()); }

  void Report(const Descriptor& d, int64_t done, bool /*edge*/) {
    if (!progress_) return;
    MutexLock lock(progress_mu_);  // the callback hears one blob at a time
    progress_(Progress{Short(d.digest), done, d.size});
  }

  Registry& reg_;
  const ImageRef& ref_;
  const std::string dir_;
  const ProgressFn& progress_;
  Mutex progress_mu_;
  std::atomic<int64_t> fetched_{0};
  int attempts_ = kBlobAttempts;
};

// Runs `jobs` on up to `parallel` threads; the first failure stops the others.
Status FetchAll(Blobs& blobs, const std::vector<Descriptor>& jobs, int parallel) {
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  Mutex mu;
  Status first;  // under mu
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < jobs.size();) {
      if (stop.load()) return;
      Status s = blobs.Fetch(jobs[i], stop);
      if (!s.ok()) {
        MutexLock lock(mu);
        if (first.ok() && !stop.load()) first = s;
        stop = true;
        return;
      }
    }
  };
  size_t n = std::min<size_t>(static_cast<size_t>(std::max(parallel, 1)), jobs.size());
  std::vector<std::thread> threads;
  for (size_t i = 1; i < n; ++i) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  MutexLock lock(mu);
  return first;
}

Status WriteBlob(const std::string& dir, const std::string& digest, const std::string& body) {
  Status s = WriteFileAtomic(dir + "/" + digest.substr(7), body, 0600);
  if (!s.ok()) return Status::Error("write blob " + digest, s.err());
  return {};
}

}  // namespace

// ---- public ----

std::string ImageRef::String() const {
  std::string s = registry + "/" + repository;
  if (!tag.empty()) s += ":" + tag;
  if (!digest.empty()) s += "@" + digest;
  return s;
}

Result<ImageRef> ParseImageRef(std::string_view in, bool docker_hub) {
  auto bad = [&](const std::string& why) {
    return Status::Error("image reference '" + std::string(in.substr(0, 300)) + "': " + why,
                         EINVAL);
  };
  if (in.empty() || in.size() > 512) return bad("expected REGISTRY/NAME[:TAG][@sha256:DIGEST]");
  ImageRef r;
  std::string_view name = in;
  if (size_t at = in.find('@'); at != std::string_view::npos) {
    r.digest = std::string(in.substr(at + 1));
    name = in.substr(0, at);
    if (r.digest.rfind("sha256:", 0) != 0) return bad("only sha256 digests are supported");
    if (!IsSha256Digest(r.digest)) return bad("a digest is sha256: and 64 lowercase hex digits");
  }
  size_t slash = name.find('/');
  std::string_view first = name.substr(0, slash);
  bool host = slash != std::string_view::npos &&
              (first.find('.') != std::string_view::npos ||
               first.find(':') != std::string_view::npos || first == "localhost");
  if (!host && !docker_hub)
    return bad(
        "name the registry: sbx has no default registry, write HOST[:PORT]/NAME[:TAG] (e.g. "
        "127.0.0.1:5000/python:3.12)");
  if (host && !ParseHostPort(first).ok())
    return bad("'" + std::string(first) + "' is not a host[:port]");
  r.registry = host ? std::string(first) : "docker.io";
  std::string_view rest = host ? name.substr(slash + 1) : name;
  // Docker Hub's official images live under library/.
  std::string library;
  if (r.registry == "docker.io" && docker_hub && rest.find('/') == std::string_view::npos &&
      !rest.empty()) {
    library = "library/" + std::string(rest);
    rest = library;
  }
  if (size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    r.tag = std::string(rest.substr(colon + 1));
    rest = rest.substr(0, colon);
    if (r.tag.empty() || r.tag.size() > 128) return bad("a tag is 1 to 128 characters");
    auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
    if (!word(r.tag[0])) return bad("a tag starts with a letter, digit or '_'");
    for (char c : r.tag)
      if (!word(c) && c != '.' && c != '-') return bad("a tag is letters, digits, '_', '.', '-'");
  }
  if (rest.empty() || rest.size() > 255) return bad("the repository name is 1 to 255 characters");
  // Components [a-z0-9]+ joined by '.', '_', '__' or runs of '-'.
  for (size_t start = 0; start <= rest.size();) {
    size_t end = rest.find('/', start);
    std::string_view comp = rest.substr(start, end == std::string_view::npos ? end : end - start);
    auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
    if (comp.empty() || !alnum(comp.front()) || !alnum(comp.back()))
      return bad("repository components are lowercase letters and digits, joined by . _ __ or -");
    for (size_t i = 0; i < comp.size(); ++i) {
      char c = comp[i];
      if (alnum(c) || c == '-') continue;
      if (c == '.' && alnum(comp[i + 1])) continue;
      if (c == '_' && (alnum(comp[i + 1]) || (comp[i + 1] == '_' && alnum(comp[i + 2])))) {
        if (comp[i + 1] == '_') ++i;
        continue;
      }
      return bad("repository components are lowercase letters and digits, joined by . _ __ or -");
    }
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  r.repository = std::string(rest);
  if (r.tag.empty() && r.digest.empty()) r.tag = "latest";
  return r;
}

std::string AuthChallenge::Param(std::string_view name) const {
  for (const auto& [k, v] : params)
    if (k == name) return v;
  return "";
}

Result<AuthChallenge> ParseAuthChallenge(std::string_view h) {
  AuthChallenge c;
  size_t i = 0;
  auto skip_ws = [&] {
    while (i < h.size() && (h[i] == ' ' || h[i] == '\t')) ++i;
  };
  skip_ws();
  size_t start = i;
  while (i < h.size() && h[i] != ' ' && h[i] != '\t') ++i;
  c.scheme = Lower(std::string(h.substr(start, i - start)));
  if (c.scheme.empty()) return Status::Error("empty challenge", EINVAL);
  for (;;) {
    skip_ws();
    if (i >= h.size()) break;
    start = i;
    while (i < h.size() && h[i] != '=' && h[i] != ',' && h[i] != ' ') ++i;
    std::string key = Lower(std::string(h.substr(start, i - start)));
    skip_ws();
    if (i >= h.size() || h[i] != '=') return Status::Error("challenge parameter without =", EINVAL);
    ++i;
    skip_ws();
    std::string value;
    if (i < h.size() && h[i] == '"') {
      ++i;
      bool closed = false;
      while (i < h.size()) {
        char ch = h[i++];
        if (ch == '\\' && i < h.size()) {
          value += h[i++];
        } else if (ch == '"') {
          closed = true;
          break;
        } else {
          value += ch;
        }
      }
      if (!closed) return Status::Error("unterminated quoted value", EINVAL);
    } else {
      start = i;
      while (i < h.size() && h[i] != ',' && h[i] != ' ') ++i;
      value = std::string(h.substr(start, i - start));
    }
    if (key.empty()) return Status::Error("challenge parameter without a name", EINVAL);
    c.params.emplace_back(std::move(key), std::move(value));
    skip_ws();
    if (i < h.size() && h[i] == ',') ++i;
  }
  return c;
}

Result<std::pair<std::string, std::string>> DockerConfigAuth(std::string_view config_json,
                                                             std::string_view registry) {
  json j = json::parse(config_json, nullptr, false);
  if (!j.is_object()) return Status::Error("not a JSON object", EINVAL);
  if (!j.contains("auths") || !j["auths"].is_object())
    return Status::Error("no credentials for " + std::string(registry), ENOENT);
  for (const auto& [key, entry] : j["auths"].items()) {
    std::string k = key;
    for (const char* scheme : {"https://", "http://"})
      if (k.rfind(scheme, 0) == 0) k = k.substr(std::strlen(scheme));
    k = k.substr(0, k.find('/'));
    if (k != registry || !entry.is_object()) continue;
    if (entry.contains("auth") && entry["auth"].is_string()) {
      auto decoded = Base64Decode(entry["auth"].get<std::string>());
      if (!decoded.ok()) return Status::Error("'auth' of an entry is not base64", EINVAL);
      size_t colon = decoded->find(':');
      if (colon == std::string::npos)
        return Status::Error("'auth' of an entry is not user:password", EINVAL);
      return std::make_pair(decoded->substr(0, colon), decoded->substr(colon + 1));
    }
    if (entry.contains("username") && entry["username"].is_string() && entry.contains("password") &&
        entry["password"].is_string())
      return std::make_pair(entry["username"].get<std::string>(),
                            entry["password"].get<std::string>());
  }
  return Status::Error("no credentials for " + std::string(registry), ENOENT);
}

Result<PulledImage> PullImage(const PullOptions& o, const std::string& ref_text,
                              const std::string& layout_dir, const ProgressFn& progress) {
  auto ref = ParseImageRef(ref_text);
  if (!ref.ok()) return ref.status();
  const std::string what = "pull " + ref->String();

  ssl::context tls_ctx(ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(tls_ctx.native_handle(), TLS1_2_VERSION);
  static const unsigned char kH1[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  SSL_CTX_set_alpn_protos(tls_ctx.native_handle(), kH1, sizeof kH1);
  tls_ctx.set_verify_mode(ssl::verify_peer);
  error_code ec;
  if (o.ca_file.empty())
    tls_ctx.set_default_verify_paths(ec);
  else
    tls_ctx.load_verify_file(o.ca_file, ec);
  if (ec) {
    ERR_clear_error();
    return Status::Error(what + ": CA bundle " +
                             (o.ca_file.empty() ? std::string("of the host") : "--ca-file") + ": " +
                             ec.message(),
                         EINVAL);
  }

  Registry reg(o, *ref, tls_ctx);
  SBX_RETURN_IF_ERROR(reg.Init().Wrap(what));

  const std::string blobs_dir = layout_dir + "/blobs/sha256";
  {
    Status s = MakeDirs(blobs_dir, 0700);
    if (!s.ok()) return Status::Error(what + ": make the layout directory", s.err());
  }
  UniqueFd lock(::open(layout_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!lock) return Status::Errno(what + ": open the layout directory");
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0)
    return Status::Error(what + ": another pull into the same directory is running", EBUSY);

  // The reference -> (an index ->) the platform's manifest.
  const std::string reference = ref->digest.empty() ? ref->tag : ref->digest;
  auto top = FetchManifest(reg, *ref, reference, ref->digest, -1);
  if (!top.ok()) return top.status().Wrap(what);
  PulledImage out;
  out.ref = ref->String();
  out.ref_name = out.ref;
  out.digest = top->digest;
  Fetched manifest = *top;
  if (IsIndex(top->media_type)) {
    SBX_RETURN_IF_ERROR(WriteBlob(blobs_dir, top->digest, top->body).Wrap(what));
    auto pick = PickPlatform(top->body, o, "image " + ref->String());
    if (!pick.ok()) return pick.status().Wrap(what);
    if (pick->size > kMaxManifestBytes)
      return Status::Error(what + ": the platform manifest is larger than " +
                               std::to_string(kMaxManifestBytes) + " bytes",
                           EFBIG);
    auto m = FetchManifest(reg, *ref, pick->digest, pick->digest, pick->size);
    if (!m.ok()) return m.status().Wrap(what);
    if (IsIndex(m->media_type))
      return Status::Error(
          what + ": the index's " + o.os + "/" + o.architecture + " entry is another index",
          EINVAL);
    manifest = *m;
  }
  out.manifest_digest = manifest.digest;
  json mj = json::parse(manifest.body, nullptr, false);
  auto config = ParseDescriptor(mj.value("config", json()), "the manifest's config");
  if (!config.ok()) return config.status().Wrap(what);
  if (config->size > kMaxManifestBytes)
    return Status::Error(
        what + ": the image config is larger than " + std::to_string(kMaxManifestBytes) + " bytes",
        EFBIG);
  if (!mj.contains("layers") || !mj["layers"].is_array())
    return Status::Error(what + ": the manifest has no layers list", EINVAL);
  if (mj["layers"].size() > kMaxLayers)
    return Status::Error(what + ": more than " + std::to_string(kMaxLayers) + " layers", EINVAL);
  out.config_digest = config->digest;
  std::vector<Descriptor> jobs;
  out.total_bytes = config->size;
  for (const auto& l : mj["layers"]) {
    auto d = ParseDescriptor(l, "a layer of the manifest");
    if (!d.ok()) return d.status().Wrap(what);
    out.layers.push_back(d->digest);
    if (std::none_of(jobs.begin(), jobs.end(),
                     [&](const Descriptor& j) { return j.digest == d->digest; })) {
      jobs.push_back(*d);
      out.total_bytes += d->size;
    }
  }
  if (o.max_total_bytes > 0 && out.total_bytes > o.max_total_bytes)
    return Status::Error(what + ": the image is " + FormatSize(out.total_bytes) +
                             " compressed, more than the " + FormatSize(o.max_total_bytes) +
                             " allowed",
                         ENOSPC);

  SBX_RETURN_IF_ERROR(WriteBlob(blobs_dir, manifest.digest, manifest.body).Wrap(what));
  Blobs blobs(reg, *ref, blobs_dir, progress);
  blobs.set_attempts(o.blob_attempts);
  // The config first: it says which layers (diff_ids) the image is, which the caller may have.
  Status fetched = FetchAll(blobs, {*config}, 1);
  out.fetched_bytes = blobs.fetched();
  if (!fetched.ok()) return fetched.Wrap(what);
  auto config_json = ReadFile(blobs_dir + "/" + config->digest.substr(7), kMaxManifestBytes);
  if (!config_json.ok()) return config_json.status().Wrap(what + ": read the image config");
  out.config_json = std::move(*config_json);
  if (o.have_layers && o.have_layers(out.config_json)) {
    out.layers_fetched = false;
    return out;
  }
  fetched = FetchAll(blobs, jobs, o.parallel);
  out.fetched_bytes = blobs.fetched();
  if (!fetched.ok()) return fetched.Wrap(what);

  // The layout's entry points, last: a directory without index.json is not a pulled image.
  Status s = WriteFileAtomic(layout_dir + "/oci-layout", R"({"imageLayoutVersion":"1.0.0"})", 0600);
  if (!s.ok()) return Status::Error(what + ": write oci-layout", s.err());
  json index = {
      {"schemaVersion", 2},
      {"mediaType", kOciIndex},
      {"manifests", json::array({{{"mediaType", manifest.media_type},
                                  {"digest", manifest.digest},
                                  {"size", manifest.body.size()},
                                  {"platform", {{"os", o.os}, {"architecture", o.architecture}}},
                                  {"annotations", {{kRefNameAnnotation, out.ref_name}}}}})}};
  s = WriteFileAtomic(layout_dir + "/index.json", index.dump(), 0600);
  if (!s.ok()) return Status::Error(what + ": write index.json", s.err());
  return out;
}

}  // namespace sbx::storage

#include "cli/client.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "api/http/url.h"
#include "cli/serve.h"
#include "common/encoding.h"
#include "common/fd.h"

namespace sbx::cli {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using nlohmann::json;

// Requests that answer at once; streams may stay quiet as long as the command does.
constexpr auto kCallTimeout = std::chrono::seconds(120);
constexpr auto kStreamTimeout = std::chrono::hours(24 * 365);

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

Result<Connection> ParseUrl(const std::string& url) {
  Connection c;
  c.url = url;
  std::string rest;
  if (url.rfind("unix:", 0) == 0) {
    c.endpoint.unix_socket = url.substr(url.rfind("unix://", 0) == 0 ? 7 : 5);
    if (c.endpoint.unix_socket.empty() || c.endpoint.unix_socket[0] != '/')
      return Status::Error("--url: expected unix:/absolute/path, got '" + url + "'");
    return c;
  }
  if (url.rfind("http://", 0) != 0)
    return Status::Error("--url: expected http://HOST:PORT or unix:/path, got '" + url + "'");
  rest = url.substr(7);
  if (auto slash = rest.find('/'); slash != std::string::npos) rest.resize(slash);
  std::string host = rest, port = "80";
  if (!rest.empty() && rest[0] == '[') {  // [::1]:7777
    auto close = rest.find(']');
    if (close == std::string::npos)
      return Status::Error("--url: bad IPv6 address in '" + url + "'");
    host = rest.substr(1, close - 1);
    if (close + 1 < rest.size() && rest[close + 1] == ':') port = rest.substr(close + 2);
  } else if (auto colon = rest.rfind(':'); colon != std::string::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (host.empty() || port.empty() || *end != '\0' || p < 1 || p > 65535)
    return Status::Error("--url: expected http://HOST:PORT, got '" + url + "'");
  c.endpoint.host = host;
  c.endpoint.port = static_cast<uint16_t>(p);
  return c;
}

// Sync Beast on a generic stream socket: TCP or unix, as the endpoint says.
using Socket = net::generic::stream_protocol::socket;

Status Connect(Socket& sock, const http::Endpoint& e) {
  boost::system::error_code ec;
  if (!e.unix_socket.empty()) {
    net::local::stream_protocol::endpoint ep(e.unix_socket);
    sock.connect(ep, ec);
    if (ec) return Status::Error("connect unix:" + e.unix_socket, ec.value());
    return {};
  }
  net::ip::tcp::resolver resolver(sock.get_executor());
  auto results = resolver.resolve(e.host, std::to_string(e.port), ec);
  if (ec) return Status::Error("resolve " + e.host + ": " + ec.message());
  ec = net::error::host_not_found;
  for (const auto& r : results) {
    ec = {};
    sock.close(ec);
    sock.connect(r.endpoint(), ec);
    if (!ec) break;
  }
  if (ec) return Status::Error("connect " + e.host + ":" + std::to_string(e.port), ec.value());
  return {};
}

// A 429 with `Retry-After: N` (seconds) is retried this many times, waiting at most this long
// each time: a key's creation rate refills within seconds, and a wait beyond that is better left
// to the user than hidden.
constexpr int kMaxRetries = 3;
constexpr int kMaxRetryWaitS = 10;
std::atomic<bool> told_retrying{false};  // say it once per process, not once per try

// True (after waiting) when the answer asks to come back later and tries remain.
bool WaitToRetry(int status, std::string_view retry_after, int* tries) {
  if (status != 429 || retry_after.empty() || *tries >= kMaxRetries) return false;
  int seconds = 0;
  for (char ch : retry_after) {
    if (ch < '0' || ch > '9') return false;  // an HTTP date: not sent by sbx, not worth guessing
    seconds = std::min(seconds * 10 + (ch - '0'), 1000);
  }
  seconds = std::min(seconds, kMaxRetryWaitS);
  ++*tries;
  if (!told_retrying.exchange(true))
    std::fprintf(stderr, "sbx: the daemon asks to slow down (HTTP 429); retrying in %ds\n",
                 seconds);
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  return true;
}

// The daemon's sentences about a sandbox ("sandbox X is paused; resume it first") read better
// without the errno text the API appends ("...: Device or resource busy"); messages of system
// calls in the box ("spawn x: No such file or directory") need theirs.
std::string Sentence(std::string m) {
  if (m.rfind("sandbox ", 0) != 0 && m.rfind("no sandbox ", 0) != 0) return m;
  for (int e : {ENOENT, ESRCH, EBUSY, EEXIST}) {
    std::string suffix = std::string(": ") + std::strerror(e);
    if (m.size() > suffix.size() && m.compare(m.size() - suffix.size(), suffix.size(), suffix) == 0)
      return m.substr(0, m.size() - suffix.size());
  }
  return m;
}

}  // namespace

void AddConnectionFlags(CLI::App* verb, ConnectionFlags* flags, bool with_json) {
  verb->add_option("--url", flags->url,
                   "Daemon address, http://HOST:PORT or unix:/path ($SBX_URL; default: "
                   "127.0.0.1 and the port in <data dir>/serve.port, else 7777)");
  verb->add_option("--api-key", flags->api_key,
                   "API key ($SBX_API_KEY; default: the key in <data dir>/api-key)");
  if (with_json) verb->add_flag("--json", flags->json, "Print the API's JSON instead of a table");
}

Result<Connection> ResolveConnection(const std::string& data_dir, const ConnectionFlags& flags) {
  std::string url = flags.url;
  if (url.empty())
    if (const char* u = std::getenv("SBX_URL")) url = u;
  if (url.empty()) {
    std::string port = "7777";
    if (auto p = ReadFile(data_dir + "/serve.port", 64); p.ok() && !Trim(*p).empty())
      port = Trim(*p);
    url = "http://127.0.0.1:" + port;
  }
  auto c = ParseUrl(url);
  if (!c.ok()) return c.status();
  c->api_key = flags.api_key;
  if (c->api_key.empty())
    if (const char* k = std::getenv("SBX_API_KEY")) c->api_key = k;
  if (c->api_key.empty()) {
    auto k = ReadFile(ApiKeyFile(data_dir), 4096);
    if (!k.ok())
      return Status::Error(
          "no API key: pass --api-key or set $SBX_API_KEY (the daemon's first key "
          "is in " +
          ApiKeyFile(data_dir) + ", readable by root: " + k.status().message() + ")");
    c->api_key = Trim(*k);
  }
  return c;
}

Status ApiError(int status, const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() &&
      j["error"].contains("message") && j["error"]["message"].is_string())
    return Status::Error(Sentence(j["error"]["message"].get<std::string>()));
  std::string text = Trim(body.substr(0, 200));
  return Status::Error("the daemon answered HTTP " + std::to_string(status) +
                       (text.empty() ? "" : ": " + text));
}

http::ClientHeaders Client::Headers(bool json_body) const {
  http::ClientHeaders h = {{"Authorization", "Bearer " + c_.api_key}};
  if (json_body) h.emplace_back("Content-Type", "application/json");
  return h;
}

Status Client::Unreachable(const Status& transport) const {
  return Status::Error("cannot reach the sbx daemon at " + c_.url +
                       " (is `sbx serve` running?): " + transport.message());
}

Result<ApiResponse> Client::Send(std::string_view method, const std::string& target,
                                 const json& body, const http::ClientHeaders& extra) {
  std::string payload = body.is_null() ? "" : body.dump();
  http::ClientHeaders h = Headers(!body.is_null());
  h.insert(h.end(), extra.begin(), extra.end());
  auto r = http::Request(c_.endpoint, method, target, h, payload, kCallTimeout);
  for (int tries = 0; r.ok() && WaitToRetry(r->status, r->Header("Retry-After"), &tries);)
    r = http::Request(c_.endpoint, method, target, h, payload, kCallTimeout);
  if (!r.ok()) return Unreachable(r.status());
  ApiResponse out;
  out.status = r->status;
  out.raw = std::move(r->body);
  if (!out.raw.empty()) {
    out.body = json::parse(out.raw, nullptr, false);
    if (out.body.is_discarded()) out.body = nullptr;
  }
  return out;
}

Result<ApiResponse> Client::SendBytes(std::string_view method, const std::string& target,
                                      std::string_view body) {
  http::ClientHeaders h = Headers(false);
  h.emplace_back("Content-Type", "application/octet-stream");
  auto r = http::Request(c_.endpoint, method, target, h, body, kCallTimeout);
  for (int tries = 0; r.ok() && WaitToRetry(r->status, r->Header("Retry-After"), &tries);)
    r = http::Request(c_.endpoint, method, target, h, body, kCallTimeout);
  if (!r.ok()) return Unreachable(r.status());
  ApiResponse out;
  out.status = r->status;
  out.raw = std::move(r->body);
  return out;
}

Result<json> Client::Call(std::string_view method, const std::string& target, const json& body,
                          const http::ClientHeaders& extra) {
  auto r = Send(method, target, body, extra);
  if (!r.ok()) return r.status();
  if (r->status < 200 || r->status > 299) return ApiError(r->status, r->raw);
  return std::move(r->body);
}

Status Client::StreamEvents(std::string_view method, const std::string& target, const json& body,
                            const std::function<bool(const json&)>& on_event) {
  std::string pending, error_body;
  bool stopped = false;
  auto on_data = [&](std::string_view data) {
    pending.append(data);
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string_view line(pending.data() + start, nl - start);
      json e = json::parse(line, nullptr, false);
      if (e.is_object() && e.contains("type")) {
        if (!on_event(e)) {
          stopped = true;
          return false;
        }
      } else if (error_body.size() < 65536) {
        error_body.append(line);
      }
    }
    pending.erase(0, start);
    return true;
  };
  std::string payload = body.is_null() ? "" : body.dump();
  auto r = http::RequestStream(c_.endpoint, method, target, Headers(!body.is_null()), payload,
                               kStreamTimeout, on_data);
  // A 429 carries no events, only its error body: start over clean.
  for (int tries = 0; r.ok() && WaitToRetry(r->status, r->Header("Retry-After"), &tries);) {
    pending.clear();
    error_body.clear();
    r = http::RequestStream(c_.endpoint, method, target, Headers(!body.is_null()), payload,
                            kStreamTimeout, on_data);
  }
  if (!r.ok()) return Unreachable(r.status());
  if (r->status < 200 || r->status > 299) return ApiError(r->status, error_body + pending);
  if (!stopped && !pending.empty()) {
    json e = json::parse(pending, nullptr, false);
    if (e.is_object() && e.contains("type")) on_event(e);
  }
  return {};
}

Result<int> Client::Download(const std::string& target, const http::DataCallback& on_data) {
  auto r =
      http::RequestStream(c_.endpoint, "GET", target, Headers(false), "", kStreamTimeout, on_data);
  if (!r.ok()) return Unreachable(r.status());
  return r->status;
}

Result<ApiResponse> Client::Upload(std::string_view method, const std::string& target,
                                   const std::string& content_type, const Producer& produce) {
  net::io_context ioc;
  Socket sock(ioc);
  Status s = Connect(sock, c_.endpoint);
  if (!s.ok()) return Unreachable(s);
  bhttp::request<bhttp::empty_body> req;
  req.method_string(beast::string_view(method.data(), method.size()));
  req.target(target);
  req.version(11);
  req.set(bhttp::field::host, c_.endpoint.unix_socket.empty() ? c_.endpoint.host : "localhost");
  req.set(bhttp::field::authorization, "Bearer " + c_.api_key);
  req.set(bhttp::field::content_type, content_type);
  req.keep_alive(false);
  req.chunked(true);
  boost::system::error_code ec;
  bhttp::request_serializer<bhttp::empty_body> sr(req);
  bhttp::write_header(sock, sr, ec);
  // A daemon that refuses the upload (401, 404) answers early and may close: stop sending and read
  // its answer.
  std::string buf(256 * 1024, '\0');
  Status produced;
  while (!ec) {
    auto n = produce(buf.data(), buf.size());
    if (!n.ok()) {
      produced = n.status();
      break;
    }
    if (*n == 0) {
      net::write(sock, bhttp::make_chunk_last(), ec);
      break;
    }
    net::write(sock, bhttp::make_chunk(net::buffer(buf.data(), *n)), ec);
  }
  if (!produced.ok()) return produced;  // closing the socket mid-body aborts the upload
  boost::system::error_code rec;
  beast::flat_buffer rbuf;
  bhttp::response<bhttp::string_body> res;
  bhttp::read(sock, rbuf, res, rec);
  if (rec) {
    if (ec) return Unreachable(Status::Error("send " + target, ec.value()));
    return Unreachable(Status::Error("read the answer to " + target + ": " + rec.message()));
  }
  ApiResponse out;
  out.status = static_cast<int>(res.result_int());
  out.raw = std::move(res.body());
  if (!out.raw.empty()) {
    out.body = json::parse(out.raw, nullptr, false);
    if (out.body.is_discarded()) out.body = nullptr;
  }
  return out;
}

Status Client::ConnectSocket(Socket& socket) const {
  Status s = Connect(socket, c_.endpoint);
  return s.ok() ? s : Unreachable(s);
}

Result<std::string> DecodeBase64(std::string_view in) { return Base64Decode(in); }

std::string Q(std::string_view value) { return http::PercentEncode(value, true); }

}  // namespace sbx::cli

#include "network/mitm.h"

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/compose.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_prefix.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <set>
#include <vector>

namespace sbx::network {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::error_code;
using tcp = asio::ip::tcp;

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// A socket whose first reads return `prefix` (the bytes the proxy peeked: a ClientHello, the
// start of a request), and whose reads after that are paced by the box's bandwidth budget in one
// direction (`up`: what the box sends), for streams layered on it (ssl::stream, Beast's parsers).
// Reads are what is paced: every byte read from one socket is written to the other, so this
// bounds both, and a read never takes more than the budget grants.
class PacedSocket {
 public:
  using executor_type = tcp::socket::executor_type;
  using lowest_layer_type = tcp::socket::lowest_layer_type;
  PacedSocket(tcp::socket s, std::string prefix, std::shared_ptr<BoxBandwidth> bandwidth, bool up)
      : s_(std::move(s)),
        timer_(s_.get_executor()),
        prefix_(std::move(prefix)),
        bandwidth_(std::move(bandwidth)),
        up_(up) {}
  executor_type get_executor() { return s_.get_executor(); }
  lowest_layer_type& lowest_layer() { return s_.lowest_layer(); }
  const lowest_layer_type& lowest_layer() const { return s_.lowest_layer(); }
  // Ends a read waiting for the budget (the session is closing; the socket is closed already).
  void CancelWait() { timer_.cancel(); }

  template <class Buffers, class Token>
  auto async_read_some(const Buffers& buffers, Token&& token) {
    return asio::async_compose<Token, void(error_code, size_t)>(ReadOp<Buffers>{this, buffers},
                                                                token, s_);
  }
  template <class Buffers, class Token>
  auto async_write_some(const Buffers& buffers, Token&& token) {
    return s_.async_write_some(buffers, std::forward<Token>(token));
  }

 private:
  template <class Buffers>
  struct ReadOp {
    PacedSocket* p;
    Buffers buffers;
    enum { kStart, kPrefixed, kWaited, kRead } state = kStart;
    size_t copied = 0;
    int64_t granted = 0;  // taken from the budget for the read under way

    template <class Self>
    void operator()(Self& self, error_code ec = {}, size_t n = 0) {
      switch (state) {
        case kStart:
          if (!p->prefix_.empty() && asio::buffer_size(buffers) > 0) {
            copied = asio::buffer_copy(buffers, asio::buffer(p->prefix_));
            p->prefix_.erase(0, copied);
            state = kPrefixed;
            asio::post(p->s_.get_executor(), std::move(self));  // never complete inline
            return;
          }
          [[fallthrough]];
        case kWaited: {
          const int64_t want = static_cast<int64_t>(asio::buffer_size(buffers));
          if (!p->bandwidth_ || want == 0) {
            state = kRead;
            p->s_.async_read_some(buffers, std::move(self));
            return;
          }
          if (state == kWaited && !p->s_.is_open()) {
            self.complete(asio::error::operation_aborted, 0);
            return;
          }
          granted = p->bandwidth_->Take(p->up_, want);
          if (granted == 0) {
            state = kWaited;
            p->timer_.expires_after(p->bandwidth_->Wait(p->up_, want));
            p->timer_.async_wait(std::move(self));
            return;
          }
          state = kRead;
          p->s_.async_read_some(beast::buffers_prefix(static_cast<size_t>(granted), buffers),
                                std::move(self));
          return;
        }
        case kPrefixed:
          self.complete(error_code(), copied);
          return;
        case kRead:
          if (p->bandwidth_ && granted > static_cast<int64_t>(n))
            p->bandwidth_->Give(p->up_, granted - static_cast<int64_t>(n));
          granted = 0;
          self.complete(ec, n);
          return;
      }
    }
  };

  tcp::socket s_;
  asio::steady_timer timer_;
  std::string prefix_;
  std::shared_ptr<BoxBandwidth> bandwidth_;  // null: unlimited
  bool up_;
};

PacedSocket& Paced(PacedSocket& s) { return s; }
PacedSocket& Paced(ssl::stream<PacedSocket>& s) { return s.next_layer(); }

int SelectHttp11(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in,
                 unsigned int inlen, void*) {
  static const unsigned char kH1[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  unsigned char* chosen = nullptr;
  if (SSL_select_next_proto(&chosen, outlen, kH1, sizeof kH1, in, inlen) ==
      OPENSSL_NPN_NEGOTIATED) {
    *out = chosen;
    return SSL_TLSEXT_ERR_OK;
  }
  return SSL_TLSEXT_ERR_NOACK;  // no ALPN: the client speaks HTTP/1.1 or gives up
}

size_t ReplaceAll(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return 0;
  size_t n = 0;
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size())) {
    s.replace(pos, from.size(), to);
    ++n;
  }
  return n;
}

// Bodies are streamed, so their size costs no memory. Not boost::none: Beast 1.74 compares a
// Content-Length with the optional limit, and any length is more than none.
constexpr uint64_t kNoBodyLimit = std::numeric_limits<uint64_t>::max();

bool IsIp(const std::string& s) {
  error_code ec;
  (void)asio::ip::make_address(s, ec);
  return !ec;
}

}  // namespace

bool SecretHostMatches(std::string_view entry, std::string_view name_in) {
  std::string e = Lower(entry), name = Lower(name_in);
  if (!name.empty() && name.back() == '.') name.pop_back();
  if (e == "*") return true;
  if (e.size() > 2 && e[0] == '*' && e[1] == '.') {
    std::string_view suffix = std::string_view(e).substr(1);  // ".example.com"
    return name.size() > suffix.size() && name.ends_with(suffix);
  }
  return !name.empty() && e == name;
}

struct Mitm::Impl {
  MitmConfig config;
  std::shared_ptr<Ca> ca;
  EventSink on_event;
  ssl::context server_ctx{ssl::context::tls_server};
  ssl::context client_ctx{ssl::context::tls_client};

  void Event(const std::string& type, const BoxNet& box, nlohmann::json detail) const {
    if (on_event) on_event(NetEvent{type, box.id, std::move(detail)});
  }
};

namespace {

// One intercepted connection. Both coroutines (Run and the watchdog) run on one strand and hold
// a reference to the session, so it lives until both end.
template <class Client, class Upstream>
struct Session : std::enable_shared_from_this<Session<Client, Upstream>> {
  Session(std::shared_ptr<Mitm::Impl> i, asio::strand<asio::any_io_executor> s,
          std::shared_ptr<const BoxNet> b, std::string n, Client c, Upstream u)
      : impl(std::move(i)),
        strand(s),
        timer(s),
        box(std::move(b)),
        name(std::move(n)),
        client(std::move(c)),
        upstream(std::move(u)) {
    for (const SecretBinding& sb : box->secrets) {
      bool matches = false;
      for (const std::string& h : sb.hosts) matches = matches || SecretHostMatches(h, name);
      (matches ? bound : unbound).push_back(&sb);
    }
  }

  std::shared_ptr<Mitm::Impl> impl;
  asio::strand<asio::any_io_executor> strand;
  asio::steady_timer timer;
  std::shared_ptr<const BoxNet> box;
  std::string name;
  Client client;
  Upstream upstream;
  std::vector<const SecretBinding*> bound, unbound;
  std::chrono::steady_clock::time_point deadline;
  bool finished = false;
  std::shared_ptr<void> hold;  // the connection's place in its box's cap, until the session ends

  void Touch(std::chrono::milliseconds d) { deadline = std::chrono::steady_clock::now() + d; }
  void Touch() { Touch(impl->config.idle_timeout); }

  void Close() {
    finished = true;
    timer.cancel();
    error_code ec;
    client.lowest_layer().shutdown(tcp::socket::shutdown_both, ec);
    client.lowest_layer().close(ec);
    upstream.lowest_layer().close(ec);
    Paced(client).CancelWait();
    Paced(upstream).CancelWait();
  }

  awaitable<void> Watchdog() {
    auto self = this->shared_from_this();
    while (!finished) {
      timer.expires_at(deadline);
      error_code ec;
      co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
      if (finished) co_return;
      if (std::chrono::steady_clock::now() >= deadline) {
        spdlog::debug("mitm {} {}: idle, closed", box->id, name);
        Close();
        co_return;
      }
    }
  }

  // Replaces the placeholders of the bound secrets in the header values and the query, sets the
  // bound secrets' headers and audits what it did and what it saw leave unreplaced.
  void Rewrite(http::request<http::buffer_body>& req) {
    std::set<std::string> used, leaked;
    std::vector<std::pair<std::string, std::string>> fields;
    std::set<std::string> changed_names;
    for (const auto& f : req) {
      std::string v(f.value());
      for (const SecretBinding* b : bound)
        if (ReplaceAll(v, b->placeholder, b->value) > 0) {
          used.insert(b->name);
          changed_names.insert(Lower(std::string(f.name_string())));
        }
      for (const SecretBinding* b : unbound)
        if (v.find(b->placeholder) != std::string::npos) leaked.insert(b->name);
      fields.emplace_back(std::string(f.name_string()), std::move(v));
    }
    for (const std::string& n : changed_names) req.erase(n);
    for (const auto& [n, v] : fields)
      if (changed_names.count(Lower(n))) req.insert(n, v);

    std::string target(req.target());
    for (const SecretBinding* b : unbound)
      if (target.find(b->placeholder) != std::string::npos) leaked.insert(b->name);
    if (size_t q = target.find('?'); q != std::string::npos) {
      std::string query = target.substr(q + 1);
      size_t n = 0;
      for (const SecretBinding* b : bound) {
        size_t k = ReplaceAll(query, b->placeholder, b->value);
        if (k > 0) used.insert(b->name);
        n += k;
      }
      if (n > 0) req.target(target.substr(0, q + 1) + query);
    }
    for (const SecretBinding* b : bound) {
      if (b->header.empty()) continue;
      std::string v = b->format.empty() ? "{}" : b->format;
      ReplaceAll(v, "{}", b->value);
      req.set(b->header, v);
      // A header of E2B's rules may use several secrets ("a,b") or none (""); each is a use.
      for (size_t at = 0; at <= b->name.size();) {
        size_t comma = std::min(b->name.find(',', at), b->name.size());
        if (comma > at) used.insert(b->name.substr(at, comma - at));
        at = comma + 1;
      }
    }
    for (const std::string& s : used)
      impl->Event("secret.use", *box, {{"secret", s}, {"host", name}});
    for (const std::string& s : leaked)
      impl->Event("secret.leak", *box, {{"secret", s}, {"host", name}});
  }

  // Beast's relay: the head (already parsed into `p`), then the body as it comes, piece by piece.
  template <bool isRequest, class Out, class In>
  awaitable<error_code> Relay(Out& out, In& in, beast::flat_buffer& buf,
                              http::parser<isRequest, http::buffer_body>& p) {
    char piece[16384];
    http::serializer<isRequest, http::buffer_body> sr{p.get()};
    error_code ec;
    do {
      if (!p.is_done()) {
        p.get().body().data = piece;
        p.get().body().size = sizeof piece;
        co_await http::async_read(in, buf, p, asio::redirect_error(use_awaitable, ec));
        if (ec == http::error::need_buffer) ec = {};
        if (ec) co_return ec;
        Touch();
        p.get().body().size = sizeof piece - p.get().body().size;
        p.get().body().data = piece;
        p.get().body().more = !p.is_done();
      } else {
        p.get().body().data = nullptr;
        p.get().body().size = 0;
        p.get().body().more = false;
      }
      co_await http::async_write(out, sr, asio::redirect_error(use_awaitable, ec));
      if (ec == http::error::need_buffer) ec = {};
      if (ec) co_return ec;
      Touch();
    } while (!p.is_done() && !sr.is_done());
    co_return ec;
  }

  // After a 101: bytes both ways as they come, until either side ends.
  template <class From, class To>
  awaitable<void> Pump(From& from, To& to, std::string leftover) {
    auto self = this->shared_from_this();
    error_code ec;
    if (!leftover.empty())
      co_await asio::async_write(to, asio::buffer(leftover),
                                 asio::redirect_error(use_awaitable, ec));
    char b[16384];
    while (!ec && !finished) {
      size_t n =
          co_await from.async_read_some(asio::buffer(b), asio::redirect_error(use_awaitable, ec));
      if (ec) break;
      Touch();
      co_await asio::async_write(to, asio::buffer(b, n), asio::redirect_error(use_awaitable, ec));
      Touch();
    }
    Close();
  }

  static std::string Rest(beast::flat_buffer& b) {
    std::string s(static_cast<const char*>(b.data().data()), b.size());
    b.consume(b.size());
    return s;
  }

  awaitable<void> Http() {
    const size_t limit = impl->config.max_header_bytes;
    beast::flat_buffer cbuf, ubuf;
    for (;;) {
      http::request_parser<http::buffer_body> rp;
      rp.header_limit(static_cast<uint32_t>(limit));
      rp.body_limit(kNoBodyLimit);
      error_code ec;
      co_await http::async_read_header(client, cbuf, rp, asio::redirect_error(use_awaitable, ec));
      if (ec) {
        if (ec != http::error::end_of_stream && ec != asio::error::eof)
          spdlog::debug("mitm {} {}: request: {}", box->id, name, ec.message());
        co_return;
      }
      Touch();
      auto& req = rp.get();
      bool head = req.method() == http::verb::head;
      bool keep = req.keep_alive();
      Rewrite(req);
      // Answered here, so the client sends its body while upstream sees a plain request.
      if (beast::iequals(req[http::field::expect], "100-continue")) {
        req.erase(http::field::expect);
        static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
        co_await asio::async_write(client, asio::buffer(kContinue, sizeof kContinue - 1),
                                   asio::redirect_error(use_awaitable, ec));
        if (ec) co_return;
      }
      ec = co_await Relay<true>(upstream, client, cbuf, rp);
      if (ec) {
        spdlog::debug("mitm {} {}: request body: {}", box->id, name, ec.message());
        co_return;
      }
      for (;;) {
        http::response_parser<http::buffer_body> sp;
        sp.header_limit(static_cast<uint32_t>(limit));
        sp.body_limit(kNoBodyLimit);
        if (head) sp.skip(true);
        co_await http::async_read_header(upstream, ubuf, sp,
                                         asio::redirect_error(use_awaitable, ec));
        if (ec) {
          spdlog::debug("mitm {} {}: response: {}", box->id, name, ec.message());
          co_return;
        }
        Touch();
        unsigned status = sp.get().result_int();
        ec = co_await Relay<false>(client, upstream, ubuf, sp);
        if (ec) co_return;
        if (status == 101) {
          asio::co_spawn(strand, Pump(upstream, client, Rest(ubuf)), asio::detached);
          co_await Pump(client, upstream, Rest(cbuf));
          co_return;
        }
        if (status >= 100 && status < 200) continue;  // 100, 103: the final answer follows
        keep = keep && sp.get().keep_alive();
        break;
      }
      if (!keep) co_return;
    }
  }
};

using TlsSession = Session<ssl::stream<PacedSocket>, ssl::stream<PacedSocket>>;
using PlainSession = Session<PacedSocket, PacedSocket>;

awaitable<void> RunTls(std::shared_ptr<TlsSession> s, std::string dst) {
  Mitm::Impl& impl = *s->impl;
  auto denied = [&](const std::string& reason) {
    impl.Event("net.connect_denied", *s->box,
               {{"dst", dst}, {"name", s->name}, {"reason", reason}});
  };
  // Upstream first: an upstream that is not who `name` says is never spoken to, and the box's
  // handshake is not completed for it.
  SSL* up = s->upstream.native_handle();
  bool ip = IsIp(s->name);
  if (!ip) SSL_set_tlsext_host_name(up, s->name.c_str());
  X509_VERIFY_PARAM* param = SSL_get0_param(up);
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  if (ip)
    X509_VERIFY_PARAM_set1_ip_asc(param, s->name.c_str());
  else
    X509_VERIFY_PARAM_set1_host(param, s->name.c_str(), 0);
  error_code ec;
  s->Touch(impl.config.handshake_timeout);
  co_await s->upstream.async_handshake(ssl::stream_base::client,
                                       asio::redirect_error(use_awaitable, ec));
  if (ec) {
    long verify = SSL_get_verify_result(up);
    std::string why = verify != X509_V_OK ? X509_verify_cert_error_string(verify) : ec.message();
    ERR_clear_error();
    denied("upstream TLS: " + why);
    s->Close();
    co_return;
  }
  auto leaf = impl.ca->LeafFor(s->name);
  if (!leaf.ok()) {
    denied("no certificate for the name: " + leaf.status().message());
    s->Close();
    co_return;
  }
  SSL* down = s->client.native_handle();
  if (SSL_use_certificate(down, (*leaf)->cert) != 1 ||
      SSL_use_PrivateKey(down, (*leaf)->key) != 1) {
    ERR_clear_error();
    denied("cannot use the leaf certificate");
    s->Close();
    co_return;
  }
  co_await s->client.async_handshake(ssl::stream_base::server,
                                     asio::redirect_error(use_awaitable, ec));
  if (ec) {
    // Most often a box that does not trust the CA (no bundle): nothing was sent anywhere.
    spdlog::debug("mitm {} {}: box's TLS handshake: {}", s->box->id, s->name, ec.message());
    ERR_clear_error();
    s->Close();
    co_return;
  }
  s->Touch();
  co_await s->Http();
  // Upstream is done with; the box gets a close_notify (so a body read to the end is known to
  // be whole), bounded by the watchdog.
  s->upstream.lowest_layer().close(ec);
  s->Touch(impl.config.handshake_timeout);
  co_await s->client.async_shutdown(asio::redirect_error(use_awaitable, ec));
  s->Close();
}

awaitable<void> RunPlain(std::shared_ptr<PlainSession> s) {
  s->Touch();
  co_await s->Http();
  s->Close();
}

template <class S>
awaitable<void> Guarded(std::shared_ptr<S> s, awaitable<void> body) {
  try {
    co_await std::move(body);
  } catch (const std::exception& e) {
    spdlog::warn("mitm {} {}: {}", s->box->id, s->name, e.what());
    s->Close();
  }
}

}  // namespace

Result<std::shared_ptr<Mitm>> Mitm::Make(MitmConfig config, std::shared_ptr<Ca> ca,
                                         EventSink on_event) {
  auto impl = std::make_shared<Impl>();
  impl->config = std::move(config);
  impl->ca = std::move(ca);
  impl->on_event = std::move(on_event);
  SSL_CTX* server = impl->server_ctx.native_handle();
  SSL_CTX_set_min_proto_version(server, TLS1_2_VERSION);
  SSL_CTX_set_alpn_select_cb(server, SelectHttp11, nullptr);
  SSL_CTX_set_options(server, SSL_OP_NO_RENEGOTIATION);
  SSL_CTX* client = impl->client_ctx.native_handle();
  SSL_CTX_set_min_proto_version(client, TLS1_2_VERSION);
  static const unsigned char kH1[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  SSL_CTX_set_alpn_protos(client, kH1, sizeof kH1);
  impl->client_ctx.set_verify_mode(ssl::verify_peer);
  error_code ec;
  if (impl->config.upstream_ca.empty())
    impl->client_ctx.set_default_verify_paths(ec);
  else
    impl->client_ctx.load_verify_file(impl->config.upstream_ca, ec);
  if (ec) {
    ERR_clear_error();
    return Status::Error("upstream CA " +
                             (impl->config.upstream_ca.empty() ? std::string("(the host's store)")
                                                               : impl->config.upstream_ca) +
                             ": " + ec.message(),
                         EINVAL);
  }
  return std::shared_ptr<Mitm>(new Mitm(std::move(impl)));
}

bool Mitm::Wants(const BoxNet& box, std::string_view) const { return !box.secrets.empty(); }

void Mitm::Serve(tcp::socket client, std::string peeked, tcp::socket upstream, std::string name,
                 bool tls, std::shared_ptr<const BoxNet> box,
                 std::shared_ptr<BoxBandwidth> bandwidth, std::shared_ptr<void> hold) {
  auto strand = asio::make_strand(client.get_executor());
  error_code ec;
  auto remote = upstream.remote_endpoint(ec);
  std::string dst =
      ec ? std::string() : remote.address().to_string() + ":" + std::to_string(remote.port());
  name = Lower(name);
  if (!name.empty() && name.back() == '.') name.pop_back();
  if (name.empty() && !ec) name = remote.address().to_string();  // no SNI: the address it went to
  if (tls) {
    auto s = std::make_shared<TlsSession>(
        impl_, strand, std::move(box), std::move(name),
        ssl::stream<PacedSocket>(
            PacedSocket(std::move(client), std::move(peeked), bandwidth, /*up=*/true),
            impl_->server_ctx),
        ssl::stream<PacedSocket>(PacedSocket(std::move(upstream), {}, bandwidth, /*up=*/false),
                                 impl_->client_ctx));
    s->hold = std::move(hold);
    s->Touch(impl_->config.handshake_timeout);
    asio::co_spawn(strand, s->Watchdog(), asio::detached);
    asio::co_spawn(strand, Guarded(s, RunTls(s, dst)), asio::detached);
  } else {
    auto s = std::make_shared<PlainSession>(
        impl_, strand, std::move(box), std::move(name),
        PacedSocket(std::move(client), std::move(peeked), bandwidth, /*up=*/true),
        PacedSocket(std::move(upstream), {}, bandwidth,
                    /*up=*/false));
    s->hold = std::move(hold);
    s->Touch();
    asio::co_spawn(strand, s->Watchdog(), asio::detached);
    asio::co_spawn(strand, Guarded(s, RunPlain(s)), asio::detached);
  }
}

}  // namespace sbx::network

// Mitm over real TCP on loopback: a test upstream HTTPS server (its certificate from a test CA
// given as the upstream CA) that echoes what it got, a client that trusts the sbx CA, and
// Mitm::Serve called with an accepted socket pair and a connected upstream socket, as the proxy
// calls it.
#include "network/mitm.h"

// clang-format off
#include <utility>
// clang-format on

#include <gtest/gtest.h>
#include <openssl/ssl.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/fs.h"

namespace sbx::network {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using nlohmann::json;
using tcp = asio::ip::tcp;

const std::string kValue = "sk-REAL-openai-value-0123456789";
const std::string kHeaderValue = "hv-REAL-header-value-9876543210";
const std::string kPlaceholder = "sbx_secret_0123456789abcdef0123456789abcdef";
const std::string kHeaderPlaceholder = "sbx_secret_ffffffffffffffffffffffffffffffff";

// The "internet" end: echoes each request's target, headers and body as JSON; HTTPS with a leaf
// of the test CA for the SNI (or for a configured other name, to test mismatches), or plain.
class Upstream {
 public:
  Upstream(Ca& ca, bool tls) : ca_(ca), tls_(tls), ctx_(ssl::context::tls_server) {
    acceptor_.open(tcp::v4());
    acceptor_.bind({asio::ip::make_address("127.0.0.1"), 0});
    acceptor_.listen();
    SSL_CTX_set_tlsext_servername_callback(ctx_.native_handle(), &Upstream::OnSni);
    SSL_CTX_set_tlsext_servername_arg(ctx_.native_handle(), this);
    thread_ = std::thread([this] { Accept(); });
  }
  ~Upstream() {
    stop_ = true;
    tcp::socket s(ioc_);
    beast::error_code ec;
    s.connect(acceptor_.local_endpoint(), ec);
    thread_.join();
    for (auto& t : conns_) t.join();
  }
  tcp::endpoint endpoint() const { return acceptor_.local_endpoint(); }
  int requests() const { return requests_; }
  std::map<std::string, std::string> cert_for;  // SNI -> the name of the leaf it gets

 private:
  static int OnSni(SSL* ssl, int*, void* arg) {
    auto* self = static_cast<Upstream*>(arg);
    const char* sni = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
    std::string name = sni ? sni : "127.0.0.1";
    if (auto it = self->cert_for.find(name); it != self->cert_for.end()) name = it->second;
    auto leaf = self->ca_.LeafFor(name);
    if (!leaf.ok()) return SSL_TLSEXT_ERR_ALERT_FATAL;
    SSL_use_certificate(ssl, (*leaf)->cert);
    SSL_use_PrivateKey(ssl, (*leaf)->key);
    return SSL_TLSEXT_ERR_OK;
  }
  void Accept() {
    for (;;) {
      tcp::socket s(ioc_);
      beast::error_code ec;
      acceptor_.accept(s, ec);
      if (stop_ || ec) return;
      conns_.emplace_back([this, s = std::move(s)]() mutable {
        if (!tls_) return Serve(s);
        ssl::stream<tcp::socket> st(std::move(s), ctx_);
        beast::error_code hec;
        auto leaf = ca_.LeafFor("127.0.0.1");  // for clients without SNI
        SSL_use_certificate(st.native_handle(), (*leaf)->cert);
        SSL_use_PrivateKey(st.native_handle(), (*leaf)->key);
        st.handshake(ssl::stream_base::server, hec);
        if (!hec) Serve(st);
      });
    }
  }
  template <class S>
  void Serve(S& s) {
    beast::flat_buffer buf;
    int n = 0;
    for (;;) {
      http::request<http::string_body> req;
      beast::error_code ec;
      http::read(s, buf, req, ec);
      if (ec) return;
      ++requests_;
      json headers = json::object();
      for (const auto& f : req) headers[std::string(f.name_string())] = std::string(f.value());
      json out = {{"target", std::string(req.target())},
                  {"headers", headers},
                  {"body", req.body()},
                  {"requests_on_connection", ++n}};
      http::response<http::string_body> res{http::status::ok, 11};
      res.set(http::field::content_type, "application/json");
      res.keep_alive(req.keep_alive());
      res.body() = out.dump();
      res.prepare_payload();
      http::write(s, res, ec);
      if (ec || !req.keep_alive()) return;
    }
  }

  Ca& ca_;
  bool tls_;
  ssl::context ctx_;
  asio::io_context ioc_;
  tcp::acceptor acceptor_{ioc_};
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::thread thread_;
  std::vector<std::thread> conns_;
};

class MitmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-mitm-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(::mkdir((dir_ + "/sbx").c_str(), 0700), 0);
    ASSERT_EQ(::mkdir((dir_ + "/up").c_str(), 0700), 0);
    auto sbx = Ca::LoadOrCreate(dir_ + "/sbx");
    auto up = Ca::LoadOrCreate(dir_ + "/up");
    ASSERT_TRUE(sbx.ok() && up.ok());
    sbx_ca_ = std::move(*sbx);
    up_ca_ = std::move(*up);
    // Every log line of the interceptor, at every level, to check no value is in one.
    log_sink_ = std::make_shared<spdlog::sinks::ostream_sink_mt>(log_);
    old_logger_ = spdlog::default_logger();
    auto logger = std::make_shared<spdlog::logger>("test", log_sink_);
    logger->set_level(spdlog::level::trace);
    spdlog::set_default_logger(logger);
    MitmConfig config;
    config.upstream_ca = dir_ + "/up/ca.crt";
    auto m = Mitm::Make(config, sbx_ca_, [this](NetEvent e) {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(std::move(e));
      cv_.notify_all();
    });
    ASSERT_TRUE(m.ok()) << m.status().message();
    mitm_ = *m;
    box_ = std::make_shared<BoxNet>();
    box_->id = "sb_test";
    SecretBinding openai;
    openai.name = "openai";
    openai.placeholder = kPlaceholder;
    openai.value = kValue;
    openai.hosts = {"api.test"};
    SecretBinding keyed;
    keyed.name = "keyed";
    keyed.placeholder = kHeaderPlaceholder;
    keyed.value = kHeaderValue;
    keyed.hosts = {"*.api.test", "api.test"};
    keyed.header = "X-Api-Key";
    keyed.format = "Key {}";
    box_->secrets = {openai, keyed};
    runner_ = std::thread([this] { ioc_.run(); });
  }
  void TearDown() override {
    work_.reset();
    ioc_.stop();
    runner_.join();
    spdlog::set_default_logger(old_logger_);
    std::string logs = log_.str();
    if (HasFailure()) std::fprintf(stderr, "interceptor log:\n%s\n", logs.c_str());
    EXPECT_EQ(logs.find(kValue), std::string::npos) << logs;
    EXPECT_EQ(logs.find(kHeaderValue), std::string::npos) << logs;
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : events_) {
      std::string d = e.type + " " + e.detail.dump();
      EXPECT_EQ(d.find(kValue), std::string::npos) << d;
      EXPECT_EQ(d.find(kHeaderValue), std::string::npos) << d;
    }
    (void)RemoveTree(dir_);
  }

  // The box's end, connected through Mitm::Serve to `up` for `name`. For TLS, the box's
  // handshake is started first and part of its ClientHello is "peeked", as the proxy does.
  struct BoxConn {
    std::unique_ptr<ssl::context> ctx;
    std::unique_ptr<ssl::stream<tcp::socket>> tls;
    std::unique_ptr<tcp::socket> plain;
    beast::error_code handshake;
  };
  BoxConn Connect(Upstream& up, const std::string& name, bool tls,
                  const std::string& plain_request = "") {
    tcp::acceptor acceptor(ioc_);
    acceptor.open(tcp::v4());
    acceptor.bind({asio::ip::make_address("127.0.0.1"), 0});
    acceptor.listen();
    BoxConn c;
    tcp::socket box_side(cioc_);
    box_side.connect(acceptor.local_endpoint());
    tcp::socket proxied(ioc_);
    acceptor.accept(proxied);
    tcp::socket upstream(ioc_);
    upstream.connect(up.endpoint());
    std::string peeked(64, '\0');
    if (tls) {
      c.ctx = std::make_unique<ssl::context>(ssl::context::tls_client);
      c.ctx->load_verify_file(dir_ + "/sbx/ca.crt");
      c.ctx->set_verify_mode(ssl::verify_peer);
      c.tls = std::make_unique<ssl::stream<tcp::socket>>(std::move(box_side), *c.ctx);
      SSL_set_tlsext_host_name(c.tls->native_handle(), name.c_str());
      SSL_set1_host(c.tls->native_handle(), name.c_str());
      auto done = std::async(std::launch::async, [&] {
        beast::error_code ec;
        c.tls->handshake(ssl::stream_base::client, ec);
        return ec;
      });
      size_t n = proxied.read_some(asio::buffer(peeked));
      peeked.resize(n);
      mitm_->Serve(std::move(proxied), peeked, std::move(upstream), name, true, box_, bandwidth_,
                   hold_);
      c.handshake = done.get();
    } else {
      c.plain = std::make_unique<tcp::socket>(std::move(box_side));
      asio::write(*c.plain, asio::buffer(plain_request));
      size_t n = proxied.read_some(asio::buffer(peeked));
      peeked.resize(n);
      mitm_->Serve(std::move(proxied), peeked, std::move(upstream), name, false, box_, bandwidth_,
                   hold_);
    }
    return c;
  }

  template <class S>
  json Get(S& s, const std::string& target, const std::string& host,
           std::map<std::string, std::string> headers = {}, bool keep_alive = true) {
    http::request<http::string_body> req{http::verb::get, target, 11};
    req.set(http::field::host, host);
    for (const auto& [k, v] : headers) req.set(k, v);
    req.keep_alive(keep_alive);
    http::write(s, req);
    return Read(s);
  }
  template <class S>
  json Read(S& s) {
    http::response<http::string_body> res;
    http::read(s, buf_, res);
    EXPECT_EQ(res.result_int(), 200u);
    return json::parse(res.body());
  }

  // Waits (bounded) for an event of `type` about `secret`.
  bool WaitEvent(const std::string& type, const std::string& key, const std::string& value) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] {
      for (const auto& e : events_)
        if (e.type == type && e.detail.value(key, "") == value) return true;
      return false;
    });
  }
  int CountEvents(const std::string& type) {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& e : events_) n += e.type == type;
    return n;
  }

  std::string dir_;
  std::shared_ptr<Ca> sbx_ca_, up_ca_;
  std::ostringstream log_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> log_sink_;
  std::shared_ptr<spdlog::logger> old_logger_;
  std::shared_ptr<Mitm> mitm_;
  std::shared_ptr<BoxNet> box_;
  std::shared_ptr<BoxBandwidth> bandwidth_;  // what Connect gives Serve (null: unlimited)
  std::shared_ptr<void> hold_;               // what Connect gives Serve as its hold
  asio::io_context ioc_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_{
      ioc_.get_executor()};
  std::thread runner_;
  asio::io_context cioc_;  // the box's side: blocking calls only
  beast::flat_buffer buf_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<NetEvent> events_;
};

TEST(SecretHostMatches, ExactOrBelowAWildcard) {
  EXPECT_TRUE(SecretHostMatches("api.test", "API.test"));
  EXPECT_TRUE(SecretHostMatches("api.test", "api.test."));
  EXPECT_FALSE(SecretHostMatches("api.test", "x.api.test"));
  EXPECT_TRUE(SecretHostMatches("*.api.test", "x.api.test"));
  EXPECT_TRUE(SecretHostMatches("*.api.test", "a.b.api.test"));
  EXPECT_FALSE(SecretHostMatches("*.api.test", "api.test"));
  EXPECT_FALSE(SecretHostMatches("*.api.test", "evilapi.test"));
  EXPECT_TRUE(SecretHostMatches("*", "anything.test"));
  EXPECT_FALSE(SecretHostMatches("api.test", ""));
}

TEST_F(MitmTest, ReplacesPlaceholdersForTheBoundHostOverKeepAlive) {
  Upstream up(*up_ca_, true);
  BoxConn c = Connect(up, "api.test", true);
  ASSERT_FALSE(c.handshake) << c.handshake.message();
  // The box verified a leaf for api.test under the sbx CA, with ALPN absent or http/1.1.
  const unsigned char* alpn = nullptr;
  unsigned alpn_len = 0;
  SSL_get0_alpn_selected(c.tls->native_handle(), &alpn, &alpn_len);
  EXPECT_TRUE(alpn_len == 0 ||
              std::string(reinterpret_cast<const char*>(alpn), alpn_len) == "http/1.1");
  json r = Get(*c.tls, "/v1/models?key=" + kPlaceholder + "&x=1", "api.test",
               {{"Authorization", "Bearer " + kPlaceholder}});
  EXPECT_EQ(r["target"], "/v1/models?key=" + kValue + "&x=1");
  EXPECT_EQ(r["headers"]["Authorization"], "Bearer " + kValue);
  EXPECT_EQ(r["headers"]["X-Api-Key"], "Key " + kHeaderValue);
  // The second request on the same connection (keep-alive), with the path's placeholder left.
  json r2 = Get(*c.tls, "/p/" + kPlaceholder, "api.test", {}, false);
  EXPECT_EQ(r2["requests_on_connection"], 2);
  EXPECT_EQ(r2["target"], "/p/" + kPlaceholder);
  EXPECT_EQ(r2["headers"]["X-Api-Key"], "Key " + kHeaderValue);
  EXPECT_TRUE(WaitEvent("secret.use", "secret", "openai"));
  EXPECT_TRUE(WaitEvent("secret.use", "secret", "keyed"));
  EXPECT_EQ(CountEvents("secret.leak"), 0);
}

TEST_F(MitmTest, APlaceholderToAnUnboundHostGoesOutUnreplacedAndIsAudited) {
  Upstream up(*up_ca_, true);
  BoxConn c = Connect(up, "other.test", true);
  ASSERT_FALSE(c.handshake) << c.handshake.message();
  json r = Get(*c.tls, "/x?k=" + kPlaceholder, "other.test",
               {{"Authorization", "Bearer " + kPlaceholder}}, false);
  EXPECT_EQ(r["headers"]["Authorization"], "Bearer " + kPlaceholder);
  EXPECT_EQ(r["target"], "/x?k=" + kPlaceholder);
  EXPECT_FALSE(r["headers"].contains("X-Api-Key"));
  ASSERT_TRUE(WaitEvent("secret.leak", "secret", "openai"));
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& e : events_) {
    EXPECT_NE(e.type, "secret.use");
    if (e.type == "secret.leak") {
      EXPECT_EQ(e.detail["host"], "other.test");
      EXPECT_EQ(e.box_id, "sb_test");
    }
  }
}

TEST_F(MitmTest, AnUpstreamWhoseCertificateDoesNotMatchIsRefused) {
  Upstream up(*up_ca_, true);
  up.cert_for["api.test"] = "wrong.test";
  BoxConn c = Connect(up, "api.test", true);
  EXPECT_TRUE(c.handshake);  // the box's connection is closed before its handshake ends
  ASSERT_TRUE(WaitEvent("net.connect_denied", "name", "api.test"));
  EXPECT_EQ(up.requests(), 0);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& e : events_) {
    if (e.type == "net.connect_denied") {
      EXPECT_NE(e.detail["reason"].get<std::string>().find("upstream TLS"), std::string::npos);
    }
  }
}

TEST_F(MitmTest, AChunkedUploadIsRelayedWhole) {
  Upstream up(*up_ca_, true);
  BoxConn c = Connect(up, "api.test", true);
  ASSERT_FALSE(c.handshake) << c.handshake.message();
  std::string body;
  for (int i = 0; body.size() < 200000; ++i) body += std::to_string(i) + ",";
  body += kPlaceholder;  // bodies are relayed as they are
  http::request<http::string_body> req{http::verb::post, "/upload", 11};
  req.set(http::field::host, "api.test");
  req.chunked(true);
  req.body() = body;
  req.keep_alive(false);
  http::write(*c.tls, req);
  json r = Read(*c.tls);
  EXPECT_EQ(r["body"].get<std::string>().size(), body.size());
  EXPECT_EQ(r["body"], body);
  EXPECT_EQ(r["headers"]["Transfer-Encoding"], "chunked");
}

TEST_F(MitmTest, PlainHttpIsRewrittenToo) {
  Upstream up(*up_ca_, false);
  std::string request = "GET /q?key=" + kPlaceholder +
                        " HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + kPlaceholder +
                        "\r\nConnection: close\r\n\r\n";
  BoxConn c = Connect(up, "api.test", false, request);
  json r = Read(*c.plain);
  EXPECT_EQ(r["target"], "/q?key=" + kValue);
  EXPECT_EQ(r["headers"]["Authorization"], "Bearer " + kValue);
  EXPECT_TRUE(WaitEvent("secret.use", "secret", "openai"));
}

// The proxy's hold (the connection's place in its box's cap) is kept while the session serves
// the connection, over keep-alive, and let go once both ends are closed.
TEST_F(MitmTest, TheHoldIsKeptUntilTheSessionEnds) {
  for (bool tls : {true, false}) {
    SCOPED_TRACE(tls ? "tls" : "plain");
    Upstream up(*up_ca_, tls);
    auto marker = std::make_shared<int>(0);
    std::weak_ptr<int> held = marker;
    hold_ = std::move(marker);
    std::string request = "GET /a HTTP/1.1\r\nHost: api.test\r\n\r\n";
    BoxConn c = Connect(up, "api.test", tls, tls ? "" : request);
    hold_.reset();  // only the session has it now
    if (tls) {
      ASSERT_FALSE(c.handshake) << c.handshake.message();
      EXPECT_EQ(Get(*c.tls, "/a", "api.test")["target"], "/a");
      EXPECT_EQ(Get(*c.tls, "/b", "api.test")["target"], "/b");
    } else {
      EXPECT_EQ(Read(*c.plain)["target"], "/a");
    }
    EXPECT_FALSE(held.expired()) << "let go while the connection is served";
    beast::error_code ec;
    if (tls) c.tls->lowest_layer().close(ec);
    if (c.plain) c.plain->close(ec);
    for (int i = 0; i < 3000 && !held.expired(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // bounded poll of a condition
    EXPECT_TRUE(held.expired()) << "kept after the session ended";
  }
}

TEST_F(MitmTest, OversizedHeadersCloseTheConnection) {
  Upstream up(*up_ca_, true);
  BoxConn c = Connect(up, "api.test", true);
  ASSERT_FALSE(c.handshake);
  http::request<http::string_body> req{http::verb::get, "/", 11};
  req.set(http::field::host, "api.test");
  for (int i = 0; i < 100; ++i) req.set("X-Big-" + std::to_string(i), std::string(1024, 'a'));
  beast::error_code ec;
  http::write(*c.tls, req, ec);
  http::response<http::string_body> res;
  http::read(*c.tls, buf_, res, ec);
  EXPECT_TRUE(ec);
  EXPECT_EQ(up.requests(), 0);
}

// limits.egress_mbps through the interceptor: two HTTPS connections of one box, each sending
// and getting back 512 KiB, share the box's budget of 1 MiB/s. Over any time T the budget
// grants at most its burst (256 KiB) plus 1 MiB/s * T per direction, and what the box sent (1
// MiB, more on the wire) was all read through it: a lower bound on the time, which a slow
// machine only makes easier to meet.
TEST_F(MitmTest, InterceptedConnectionsArePacedByTheBoxsSharedBudget) {
  const int64_t rate = 1 << 20;
  const size_t each = 512 << 10;
  Upstream up(*up_ca_, true);
  auto start = std::chrono::steady_clock::now();
  bandwidth_ = std::make_shared<BoxBandwidth>(rate);
  BoxConn a = Connect(up, "api.test", true);
  BoxConn b = Connect(up, "api.test", true);
  ASSERT_FALSE(a.handshake) << a.handshake.message();
  ASSERT_FALSE(b.handshake) << b.handshake.message();
  std::string body(each, 'x');
  auto post = [&](BoxConn& c) {
    http::request<http::string_body> req{http::verb::post, "/up", 11};
    req.set(http::field::host, "api.test");
    req.body() = body;
    req.prepare_payload();
    req.keep_alive(false);
    http::write(*c.tls, req);
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    res.body().reserve(each + 4096);
    http::response_parser<http::string_body> p(std::move(res));
    p.body_limit(4 << 20);
    http::read(*c.tls, buf, p);
    return json::parse(p.get().body())["body"].get<std::string>().size();
  };
  auto other = std::async(std::launch::async, [&] { return post(b); });
  EXPECT_EQ(post(a), each);
  EXPECT_EQ(other.get(), each);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Both directions went through the budget: at least the bodies, each way.
  EXPECT_GE(bandwidth_->granted(), 4 * each);
  const double burst = 256 << 10;
  EXPECT_GE(seconds, (2.0 * each - burst) / rate - 0.05) << seconds;
}

}  // namespace
}  // namespace sbx::network

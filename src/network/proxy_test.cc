// The egress proxy against a fake internet, in network namespaces this test makes (never the
// machine's own): a "box" namespace whose TCP is redirected by nftables to the proxy in a "host"
// namespace, and an "upstream" namespace at 198.18.0.10 and .11 with HTTP, HTTPS (a certificate
// from a CA made here) and a server-speaks-first banner service. Names resolve through a fixed
// map (the real resolver is the DNS piece's).
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include "network/proxy.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/write.hpp>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "common/fd.h"
#include "common/fs.h"

namespace sbx::network {
namespace {

using namespace std::chrono_literals;
namespace net = boost::asio;

const std::string kPid = std::to_string(getpid());

int Sh(const std::string& cmd) {
  int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

address A(const char* text) { return net::ip::make_address(text); }

// Runs `fn` on a thread that has joined network namespace `ns` (sockets it makes live there).
template <typename Fn>
auto InNs(const std::string& ns, Fn fn) {
  std::packaged_task<decltype(fn())()> task(std::move(fn));
  auto result = task.get_future();
  std::thread t([&] {
    UniqueFd fd(open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd || setns(fd.get(), CLONE_NEWNET) != 0) std::abort();  // never run in the wrong one
    task();
  });
  t.join();
  return result.get();
}

// The test's namespaces, veths and table; gone with the namespaces, even on failure.
struct Topology {
  std::string host = "sbxph" + kPid, box = "sbxpb" + kPid, up = "sbxpu" + kPid;
  bool ok = false;
  Topology() {
    std::string h = "ip -n " + host + " ", b = "ip -n " + box + " ", u = "ip -n " + up + " ";
    ok = Sh("ip netns add " + host) == 0 && Sh("ip netns add " + box) == 0 &&
         Sh("ip netns add " + up) == 0 && Sh(h + "link set lo up") == 0 &&
         Sh(b + "link set lo up") == 0 && Sh(u + "link set lo up") == 0 &&
         Sh(h + "link add hb type veth peer name bh netns " + box) == 0 &&
         Sh(h + "link add hu type veth peer name uh netns " + up) == 0 &&
         Sh(h + "addr add 10.213.0.1/30 dev hb") == 0 && Sh(h + "link set hb up") == 0 &&
         Sh(b + "addr add 10.213.0.2/30 dev bh") == 0 && Sh(b + "link set bh up") == 0 &&
         Sh(b + "route add default via 10.213.0.1") == 0 &&
         Sh(h + "addr add 198.18.0.1/24 dev hu") == 0 && Sh(h + "link set hu up") == 0 &&
         Sh(u + "addr add 198.18.0.10/24 dev uh") == 0 &&
         Sh(u + "addr add 198.18.0.11/24 dev uh") == 0 && Sh(u + "link set uh up") == 0 &&
         // IPv6 (nodad: usable at once): the box at fd00:213::2, the upstream at 2001:db8::10.
         Sh(h + "addr add fd00:213::1/64 dev hb nodad") == 0 &&
         Sh(b + "addr add fd00:213::2/64 dev bh nodad") == 0 &&
         Sh(b + "route add default via fd00:213::1") == 0 &&
         Sh(h + "addr add 2001:db8::1/64 dev hu nodad") == 0 &&
         Sh(u + "addr add 2001:db8::10/64 dev uh nodad") == 0;
  }
  ~Topology() {
    for (const std::string& ns : {host, box, up}) (void)Sh("ip netns del " + ns);
  }
  // Redirects the box's TCP to `port` in the host namespace (what the firewall piece does).
  bool Redirect(uint16_t port) {
    std::string file = "/tmp/sbx-proxy-test-" + kPid + ".nft";
    std::ofstream(file) << "flush ruleset\n"
                           "table inet sbxtest {\n"
                           "  chain pre {\n"
                           "    type nat hook prerouting priority dstnat;\n"
                           "    iifname \"hb\" meta l4proto tcp redirect to :" +
                               std::to_string(port) +
                               "\n"
                               "  }\n"
                               "}\n";
    int rc = Sh("ip netns exec " + host + " nft -f " + file);
    std::remove(file.c_str());
    return rc == 0;
  }
};

bool WriteExt(const std::string& path) {
  std::ofstream out(path);
  out << "subjectAltName=DNS:pypi.test,DNS:evil.test,DNS:*.files.test\n";
  out.close();
  return !out.fail();
}

// A CA and a leaf for pypi.test and *.files.test, made with the openssl tool.
struct Certs {
  std::string dir = "/tmp/sbx-proxy-test-certs-" + kPid;
  bool ok = false;
  Certs() {
    std::string d = dir + "/";
    ok = Sh("mkdir -p " + dir) == 0 &&
         Sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 "
            "-subj /CN=sbx-test-ca -keyout " +
            d + "ca.key -out " + d + "ca.pem") == 0 &&
         Sh("openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
            "-subj /CN=pypi.test -keyout " +
            d + "leaf.key -out " + d + "leaf.csr") == 0 &&
         WriteExt(d + "ext") &&
         Sh("openssl x509 -req -in " + d + "leaf.csr -CA " + d + "ca.pem -CAkey " + d +
            "ca.key -CAcreateserial -days 2 -extfile " + d + "ext -out " + d + "leaf.pem") == 0;
  }
  ~Certs() { (void)Sh("rm -rf " + dir); }
};

// The pattern of a large body: every byte depends on its offset.
std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + i / 4099) & 0xff);
  return s;
}

// Blocking byte streams over a plain socket or TLS, for the servers and the clients.
struct Stream {
  int fd = -1;
  SSL* ssl = nullptr;
  ssize_t Read(char* buf, size_t n) {
    return ssl ? SSL_read(ssl, buf, static_cast<int>(n)) : ::recv(fd, buf, n, 0);
  }
  bool Write(std::string_view data) {
    while (!data.empty()) {
      ssize_t w = ssl ? SSL_write(ssl, data.data(), static_cast<int>(data.size()))
                      : ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (w <= 0) return false;
      data.remove_prefix(static_cast<size_t>(w));
    }
    return true;
  }
  std::string ReadAll(size_t limit = 64 << 20) {
    std::string out;
    char buf[65536];
    while (out.size() < limit) {
      ssize_t n = Read(buf, sizeof buf);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
};

// The upstream servers: thread per connection, all joined at the end.
class Upstream {
 public:
  explicit Upstream(const std::string& ns, const Certs& certs) {
    ctx_ = SSL_CTX_new(TLS_server_method());
    SSL_CTX_use_certificate_chain_file(ctx_, (certs.dir + "/leaf.pem").c_str());
    SSL_CTX_use_PrivateKey_file(ctx_, (certs.dir + "/leaf.key").c_str(), SSL_FILETYPE_PEM);
    for (const char* ip : {"198.18.0.10", "198.18.0.11", "2001:db8::10"}) {
      for (auto [port, kind] : {std::pair{80, 'h'}, std::pair{443, 't'}, std::pair{7000, 'b'}}) {
        int fd = InNs(ns, [&] { return Listen(ip, static_cast<uint16_t>(port)); });
        if (fd < 0) continue;
        listeners_.emplace_back(fd);
        threads_.emplace_back([this, fd, k = kind] { AcceptLoop(fd, k); });
        ++listening_;
      }
    }
  }
  ~Upstream() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      for (int fd : live_) ::shutdown(fd, SHUT_RDWR);
    }
    for (UniqueFd& l : listeners_) ::shutdown(l.get(), SHUT_RDWR);
    for (std::thread& t : threads_) t.join();
    // No new handlers now; join them without the lock, which each takes on its way out.
    std::vector<std::thread> handlers;
    {
      std::lock_guard lock(mu_);
      handlers.swap(handlers_);
    }
    for (std::thread& t : handlers) t.join();
    SSL_CTX_free(ctx_);
  }
  int listening() const { return listening_; }
  int accepted() const { return accepted_; }  // connections ever accepted

 private:
  static int Listen(const char* ip, uint16_t port) {
    boost::asio::ip::tcp::endpoint e(A(ip), port);
    int fd = ::socket(e.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, e.data(), static_cast<socklen_t>(e.size())) != 0 || listen(fd, 64) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }
  void AcceptLoop(int listener, char kind) {
    for (;;) {
      int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      ++accepted_;
      std::lock_guard lock(mu_);
      if (stopping_) {
        ::close(fd);
        return;
      }
      live_.push_back(fd);
      handlers_.emplace_back([this, fd, kind] {
        Serve(fd, kind);
        std::lock_guard l(mu_);
        live_.erase(std::find(live_.begin(), live_.end(), fd));
        ::close(fd);
      });
    }
  }
  void Serve(int fd, char kind) {
    boost::asio::ip::tcp::endpoint local;
    socklen_t len = static_cast<socklen_t>(local.capacity());
    getsockname(fd, local.data(), &len);
    local.resize(len);
    const std::string ip = local.address().to_string();
    Stream s{fd, nullptr};
    if (kind == 'b') {  // speaks first, then echoes
      if (!s.Write("banner " + ip + "\n")) return;
      char buf[4096];
      for (ssize_t n; (n = s.Read(buf, sizeof buf)) > 0;)
        if (!s.Write(std::string_view(buf, static_cast<size_t>(n)))) return;
      return;
    }
    if (kind == 't') {
      s.ssl = SSL_new(ctx_);
      SSL_set_fd(s.ssl, fd);
      if (SSL_accept(s.ssl) != 1) {
        SSL_free(s.ssl);
        return;
      }
    }
    ServeHttp(s, ip);
    if (s.ssl) {
      SSL_shutdown(s.ssl);
      SSL_free(s.ssl);
    }
  }
  // GET /whoami, GET /big/N, POST /echo; one request, then close.
  static void ServeHttp(Stream& s, const std::string& ip) {
    std::string in;
    char buf[65536];
    size_t end;
    while ((end = in.find("\r\n\r\n")) == std::string::npos) {
      ssize_t n = s.Read(buf, sizeof buf);
      if (n <= 0) return;
      in.append(buf, static_cast<size_t>(n));
    }
    std::string head = in.substr(0, end), body = in.substr(end + 4);
    std::string host;
    if (size_t h = head.find("\r\nHost: "); h != std::string::npos)
      host = head.substr(h + 8, head.find("\r\n", h + 8) - h - 8);
    std::string answer;
    if (head.starts_with("POST /echo ")) {
      size_t cl = head.find("Content-Length: ");
      size_t want = cl == std::string::npos ? 0 : std::stoul(head.substr(cl + 16));
      while (body.size() < want) {
        ssize_t n = s.Read(buf, sizeof buf);
        if (n <= 0) return;
        body.append(buf, static_cast<size_t>(n));
      }
      answer = body;
    } else if (head.starts_with("GET /big/")) {
      answer = Pattern(std::stoul(head.substr(9)));
    } else {
      answer = "server " + ip + " host " + host;
    }
    s.Write("HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(answer.size()) +
            "\r\nConnection: close\r\n\r\n" + answer);
  }

  SSL_CTX* ctx_ = nullptr;
  std::vector<UniqueFd> listeners_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  bool stopping_ = false;
  std::vector<int> live_;
  std::vector<std::thread> handlers_;
  int listening_ = 0;
  std::atomic<int> accepted_{0};
};

// A fixed name -> addresses map, answering at once.
class MapLookup : public HostLookup {
 public:
  std::map<std::string, std::vector<address>> names;
  std::atomic<int> queries{0};
  void Resolve(const std::string& name,
               std::function<void(Result<std::vector<address>>)> done) override {
    ++queries;
    auto it = names.find(name);
    if (it == names.end()) return done(Status::Error("resolve " + name + ": NXDOMAIN", ENOENT));
    done(it->second);
  }
};

class Events {
 public:
  void Add(NetEvent e) {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
    cv_.notify_all();
  }
  // The first event of `type` after the first `skip` of them; waits for it (bounded).
  std::optional<NetEvent> Wait(const std::string& type, size_t skip = 0) {
    std::unique_lock lock(mu_);
    std::optional<NetEvent> found;
    cv_.wait_for(lock, 30s, [&] {
      size_t seen = 0;
      for (const NetEvent& e : events_)
        if (e.type == type && seen++ == skip) {
          found = e;
          return true;
        }
      return false;
    });
    return found;
  }
  size_t Count() {
    std::lock_guard lock(mu_);
    return events_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<NetEvent> events_;
};

size_t OpenFds() {
  size_t n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

class ProxyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!topo_.ok) GTEST_SKIP() << "cannot make network namespaces and veths here";
    ASSERT_TRUE(certs_.ok);
    upstream_ = std::make_unique<Upstream>(topo_.up, certs_);
    ASSERT_EQ(upstream_->listening(), 9);
    lookup_.names = {{"pypi.test", {A("198.18.0.10")}},
                     {"evil.test", {A("198.18.0.11")}},
                     {"a.files.test", {A("10.99.0.1"), A("198.18.0.11")}},
                     {"private.test", {A("10.1.2.3")}},
                     {"meta.test", {A("169.254.169.254"), A("::ffff:127.0.0.1")}},
                     {"host.test", {A("198.18.0.1")}}};
    Put({"pypi.test", "*.files.test", "198.18.0.11/32:7000"});
  }
  void TearDown() override {
    StopProxy();
    upstream_.reset();
  }

  void Put(std::vector<const char*> allow, Mode mode = Mode::kAllowlist, int max_connections = 64,
           int64_t rate = 0, const char* box_ip = "10.213.0.2") {
    auto b = std::make_shared<BoxNet>();
    b->id = "box1";
    b->box_ip = A(box_ip);
    b->host_ip = A("10.213.0.1");
    b->policy.mode = mode;
    for (const char* a : allow) b->policy.allow.push_back(*ParseRule(a));
    b->max_connections = max_connections;
    b->egress_bytes_per_s = rate;
    boxes_.Put(b);
  }

  void StartProxy(int64_t peek_timeout_ms = 200, Interceptor* interceptor = nullptr,
                  std::shared_ptr<Ca> ca = nullptr) {
    ProxyConfig config;
    config.interceptor = interceptor;
    config.ca = std::move(ca);
    config.on_event = [this](NetEvent e) { events_.Add(std::move(e)); };
    config.lookup = &lookup_;
    config.peek_timeout_ms = peek_timeout_ms;
    std::promise<Result<std::unique_ptr<EgressProxy>>> started;
    auto future = started.get_future();
    io_ = std::thread([this, config, &started] {
      UniqueFd fd(open(("/run/netns/" + topo_.host).c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd || setns(fd.get(), CLONE_NEWNET) != 0) std::abort();
      started.set_value(EgressProxy::Start(ioc_.get_executor(),
                                           net::ip::tcp::endpoint(net::ip::address_v6::any(), 0),
                                           boxes_, config));
      ioc_.run();
    });
    Result<std::unique_ptr<EgressProxy>> proxy = future.get();
    ASSERT_TRUE(proxy.ok()) << proxy.status().message();
    proxy_ = std::move(*proxy);
    ASSERT_TRUE(topo_.Redirect(proxy_->port()));
  }
  void StopProxy() {
    if (proxy_) proxy_->Stop();
    if (io_.joinable()) io_.join();  // run() returns once every connection is gone
    proxy_.reset();
  }

  // A connected socket from inside the box.
  UniqueFd Connect(const char* ip, uint16_t port) {
    return InNs(topo_.box, [&] {
      boost::asio::ip::tcp::endpoint e(A(ip), port);
      UniqueFd fd(::socket(e.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
      timeval tv{20, 0};
      setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      if (::connect(fd.get(), e.data(), static_cast<socklen_t>(e.size())) != 0) fd.reset();
      return fd;
    });
  }
  std::string Http(const char* ip, const std::string& request) {
    UniqueFd fd = Connect(ip, 80);
    if (!fd) return "connect failed";
    Stream s{fd.get(), nullptr};
    s.Write(request);
    return s.ReadAll();
  }
  static std::string Get(const std::string& host, const std::string& path = "/whoami") {
    return "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: test\r\n\r\n";
  }
  // HTTPS from the box with `sni`, verifying the upstream's certificate for it. "" on any failure
  // of the handshake.
  std::string Https(const char* ip, const std::string& sni, const std::string& request,
                    const std::string& ca_file = "") {
    UniqueFd fd = Connect(ip, 443);
    if (!fd) return "";
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_load_verify_locations(ctx, (ca_file.empty() ? certs_.dir + "/ca.pem" : ca_file).c_str(),
                                  nullptr);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd.get());
    if (sni.empty()) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), ip);
    } else {
      SSL_set_tlsext_host_name(ssl, sni.c_str());
      SSL_set1_host(ssl, sni.c_str());
    }
    std::string out;
    if (SSL_connect(ssl) == 1) {
      Stream s{fd.get(), ssl};
      s.Write(request);
      out = s.ReadAll();
      if (out.empty()) out = "(empty)";
    } else {
      char err[256];
      ERR_error_string_n(ERR_get_error(), err, sizeof err);
      last_tls_error_ =
          std::string(err) + " " + X509_verify_cert_error_string(SSL_get_verify_result(ssl));
    }
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    ERR_clear_error();
    return out;
  }
  static std::string Body(const std::string& response) {
    size_t end = response.find("\r\n\r\n");
    return end == std::string::npos ? "" : response.substr(end + 4);
  }

  std::string last_tls_error_;
  Topology topo_;
  Certs certs_;
  std::unique_ptr<Upstream> upstream_;
  MapLookup lookup_;
  BoxRegistry boxes_;
  Events events_;
  net::io_context ioc_;
  std::thread io_;
  std::unique_ptr<EgressProxy> proxy_;
};

TEST_F(ProxyTest, AllowedNameOverHttpIsRelayedIntactBothWays) {
  StartProxy();
  std::string r = Http("198.18.0.10", Get("pypi.test"));
  EXPECT_TRUE(r.starts_with("HTTP/1.1 200 OK")) << r;
  EXPECT_EQ(Body(r), "server 198.18.0.10 host pypi.test");
  std::optional<NetEvent> e = events_.Wait("net.connect");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->box_id, "box1");
  EXPECT_EQ(e->detail["dst"], "198.18.0.10:80");
  EXPECT_EQ(e->detail["name"], "pypi.test");
  EXPECT_EQ(e->detail["received"], r.size());
  EXPECT_EQ(e->detail["sent"], Get("pypi.test").size());

  // Large both ways: 3 MiB up, echoed back; 5 MiB down.
  std::string up = Pattern(3 << 20);
  r = Http("198.18.0.10", "POST /echo HTTP/1.1\r\nHost: pypi.test\r\nContent-Length: " +
                              std::to_string(up.size()) + "\r\n\r\n" + up);
  EXPECT_TRUE(Body(r) == up) << r.size();
  r = Http("198.18.0.10", Get("pypi.test", "/big/5242880"));
  EXPECT_TRUE(Body(r) == Pattern(5 << 20)) << r.size();
  e = events_.Wait("net.connect", 1);
  ASSERT_TRUE(e);
  EXPECT_GT(e->detail["sent"].get<uint64_t>(), up.size());
}

TEST_F(ProxyTest, AllowedNameOverHttps) {
  StartProxy();
  std::string r = Https("198.18.0.10", "pypi.test", Get("pypi.test", "/big/2097152"));
  ASSERT_FALSE(r.empty()) << "handshake failed";
  EXPECT_TRUE(Body(r) == Pattern(2 << 20)) << r.size();
  std::optional<NetEvent> e = events_.Wait("net.connect");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->detail["name"], "pypi.test");
  EXPECT_GT(e->detail["received"].get<uint64_t>(), 2u << 20);
  // A wildcard's name, to an address of its own.
  r = Https("198.18.0.11", "a.files.test", Get("a.files.test"));
  EXPECT_EQ(Body(r), "server 198.18.0.11 host a.files.test") << last_tls_error_;
}

TEST_F(ProxyTest, NameNotAllowedGets403OverHttpAndACloseOverTls) {
  StartProxy();
  std::string r = Http("198.18.0.11", Get("evil.test"));
  EXPECT_TRUE(
      r.starts_with("HTTP/1.1 403 Forbidden by this sandbox's network policy (mode allowlist)\r\n"))
      << r;
  EXPECT_EQ(Body(r),
            "sbx: egress to evil.test:80 denied by this sandbox's network policy (mode allowlist; "
            "allowed: pypi.test, *.files.test, 198.18.0.11:7000): not in the allowlist. Change it "
            "with `sbx net box1` or PUT /v1/sandboxes/box1/network.\n");
  std::optional<NetEvent> e = events_.Wait("net.connect_denied");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->box_id, "box1");
  EXPECT_EQ(e->detail["dst"], "198.18.0.11:80");
  EXPECT_EQ(e->detail["name"], "evil.test");
  EXPECT_EQ(e->detail["reason"], "not in the allowlist");

  EXPECT_EQ(Https("198.18.0.11", "evil.test", Get("evil.test")), "");
  e = events_.Wait("net.connect_denied", 1);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->detail["dst"], "198.18.0.11:443");
  EXPECT_EQ(e->detail["name"], "evil.test");
}

// With sbx's CA (every box trusts it), a refused TLS client gets the 403 inside a handshake the
// proxy finishes itself; the upstream never sees a connection.
TEST_F(ProxyTest, NameNotAllowedOverTlsGets403InsideAHandshakeWithSbxsCa) {
  char tmpl[] = "/tmp/sbx-proxy-ca-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() { (void)RemoveTree(dir); }
  } cleanup{dir};
  auto ca = Ca::LoadOrCreate(dir);
  ASSERT_TRUE(ca.ok()) << ca.status().message();
  StartProxy(200, nullptr, std::shared_ptr<Ca>(std::move(*ca)));
  int before = upstream_->accepted();
  std::string r = Https("198.18.0.11", "evil.test", Get("evil.test"), dir + "/ca.crt");
  EXPECT_TRUE(
      r.starts_with("HTTP/1.1 403 Forbidden by this sandbox's network policy (mode allowlist)\r\n"))
      << r << last_tls_error_;
  EXPECT_EQ(Body(r),
            "sbx: egress to evil.test:443 denied by this sandbox's network policy (mode allowlist; "
            "allowed: pypi.test, *.files.test, 198.18.0.11:7000): not in the allowlist. Change it "
            "with `sbx net box1` or PUT /v1/sandboxes/box1/network.\n");
  std::optional<NetEvent> e = events_.Wait("net.connect_denied");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->detail["name"], "evil.test");
  // A raw address without SNI is only closed (as on E2B: `curl https://IP` must fail).
  r = Https("198.18.0.12", "", Get("198.18.0.12"), dir + "/ca.crt");
  EXPECT_EQ(r, "");
  EXPECT_EQ(upstream_->accepted(), before) << "a refused connection reached the upstream";
  // A client that does not trust sbx's CA sees only a failed handshake.
  EXPECT_EQ(Https("198.18.0.11", "evil.test", Get("evil.test")), "");
  // The proxy closes its side after the client gave up: a bounded poll of that condition.
  for (int i = 0; i < 3000 && proxy_->OpenConnections("box1") != 0; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(proxy_->OpenConnections("box1"), 0);
}

TEST_F(ProxyTest, RawAddressesNeedACidrRule) {
  StartProxy();
  // Not in the policy: the banner server speaks first, the client says nothing; after the peek
  // timeout the address alone decides, and it is refused.
  UniqueFd fd = Connect("198.18.0.10", 7000);
  ASSERT_TRUE(fd);
  Stream s{fd.get(), nullptr};
  EXPECT_EQ(s.ReadAll(), "");
  std::optional<NetEvent> e = events_.Wait("net.connect_denied");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->detail["dst"], "198.18.0.10:7000");
  EXPECT_EQ(e->detail["reason"], "not in the allowlist");
  // An IP literal as Host is no name either.
  std::string r = Http("198.18.0.10", Get("198.18.0.10"));
  EXPECT_TRUE(r.starts_with("HTTP/1.1 403")) << r;

  // Allowed by 198.18.0.11/32:7000: relayed, banner and echo.
  fd = Connect("198.18.0.11", 7000);
  ASSERT_TRUE(fd);
  Stream ok{fd.get(), nullptr};
  char buf[64];
  ssize_t n = ok.Read(buf, sizeof buf);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), "banner 198.18.0.11\n");
  ok.Write("ping");
  ::shutdown(fd.get(), SHUT_WR);  // the half-close reaches the server, which ends
  EXPECT_EQ(ok.ReadAll(), "ping");
  e = events_.Wait("net.connect");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->detail["dst"], "198.18.0.11:7000");
  EXPECT_EQ(e->detail["sent"], 4);
  EXPECT_EQ(e->detail["received"], 23);
}

TEST_F(ProxyTest, ForgedHostOrSniGoesToTheNamesRealAddress) {
  StartProxy();
  // The box asks for .11 but names pypi.test: it gets pypi.test's real address, .10.
  std::string r = Http("198.18.0.11", Get("pypi.test"));
  EXPECT_EQ(Body(r), "server 198.18.0.10 host pypi.test");
  std::optional<NetEvent> e = events_.Wait("net.connect");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->detail["dst"], "198.18.0.10:80");
  EXPECT_EQ(e->detail["requested"], "198.18.0.11:80");
  r = Https("198.18.0.11", "pypi.test", Get("pypi.test"));
  EXPECT_EQ(Body(r), "server 198.18.0.10 host pypi.test");
  // Open mode re-resolves names the same way.
  Put({}, Mode::kOpen);
  r = Http("198.18.0.11", Get("pypi.test"));
  EXPECT_EQ(Body(r), "server 198.18.0.10 host pypi.test");
  // A name that resolves to several addresses, one private: only the public one is used.
  r = Http("198.18.0.10", Get("a.files.test"));
  EXPECT_EQ(Body(r), "server 198.18.0.11 host a.files.test");
}

TEST_F(ProxyTest, AllowedNamesResolvingIntoDeniedRangesAreRefused) {
  Put({"private.test", "meta.test", "host.test", "nowhere.test"});
  StartProxy();
  std::string r = Http("198.18.0.10", Get("private.test"));
  EXPECT_TRUE(r.starts_with("HTTP/1.1 403")) << r;
  EXPECT_NE(Body(r).find("resolves into 10.0.0.0/8"), std::string::npos) << r;
  r = Http("198.18.0.10", Get("meta.test"));
  EXPECT_NE(Body(r).find("resolves into 169.254.0.0/16"), std::string::npos) << r;
  r = Http("198.18.0.10", Get("host.test"));
  EXPECT_NE(Body(r).find("resolves to the host's own address or a box's"), std::string::npos) << r;
  r = Http("198.18.0.10", Get("nowhere.test"));
  EXPECT_NE(Body(r).find("cannot resolve nowhere.test"), std::string::npos) << r;
  std::optional<NetEvent> e = events_.Wait("net.connect_denied");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->detail["name"], "private.test");
  EXPECT_EQ(e->detail["reason"], "resolves into 10.0.0.0/8");
}

TEST_F(ProxyTest, TheHostsOwnAddressIsRefusedWhateverThePolicy) {
  Put({"198.18.0.0/15", "10.213.0.0/16"}, Mode::kOpen);
  StartProxy();
  std::string r = Http("198.18.0.1", Get("198.18.0.1"));
  EXPECT_TRUE(r.starts_with("HTTP/1.1 403")) << r;
  EXPECT_NE(Body(r).find("the host's own address"), std::string::npos) << r;
  // The gateway (the proxy's own address), on the proxy's own port.
  UniqueFd fd = Connect("10.213.0.1", proxy_->port());
  ASSERT_TRUE(fd);
  EXPECT_EQ((Stream{fd.get(), nullptr}.ReadAll()), "");
  std::optional<NetEvent> e = events_.Wait("net.connect_denied", 1);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->detail["dst"], "10.213.0.1:" + std::to_string(proxy_->port()));
  EXPECT_EQ(e->detail["reason"], "the host's own address");
  // Another box's address, whatever the policy (here a box registered at an address the policy
  // allows; real ones are in private ranges, which --allow-range may open).
  auto other = std::make_shared<BoxNet>();
  other->id = "box2";
  other->box_ip = A("198.18.0.11");
  boxes_.Put(other);
  r = Http("198.18.0.11", Get("198.18.0.11"));
  EXPECT_NE(Body(r).find("another box's address"), std::string::npos) << r;
}

TEST_F(ProxyTest, AnUnknownSourceIsClosedWithoutAudit) {
  StartProxy();
  boxes_.Remove("box1");
  std::string r = Http("198.18.0.10", Get("pypi.test"));
  EXPECT_EQ(r, "");
  EXPECT_EQ(events_.Count(), 0u);  // a refusal's event is sent before its close
}

TEST_F(ProxyTest, ConnectionCapPerBox) {
  Put({"198.18.0.11/32:7000"}, Mode::kAllowlist, /*max_connections=*/2);
  StartProxy();
  std::vector<UniqueFd> held;
  char buf[64];
  for (int i = 0; i < 2; ++i) {
    held.push_back(Connect("198.18.0.11", 7000));
    ASSERT_GT(::recv(held.back().get(), buf, sizeof buf, 0), 0);  // relayed: the banner came
  }
  EXPECT_EQ(proxy_->OpenConnections("box1"), 2);
  UniqueFd third = Connect("198.18.0.11", 7000);
  ASSERT_TRUE(third);
  EXPECT_EQ((Stream{third.get(), nullptr}.ReadAll()), "");
  std::optional<NetEvent> e = events_.Wait("net.connect_denied");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->detail["reason"], "too many connections");
  held.pop_back();
  for (int i = 0; i < 3000 && proxy_->OpenConnections("box1") != 1; ++i)
    std::this_thread::sleep_for(10ms);  // bounded poll of a condition
  ASSERT_EQ(proxy_->OpenConnections("box1"), 1);
  UniqueFd again = Connect("198.18.0.11", 7000);
  EXPECT_GT(::recv(again.get(), buf, sizeof buf, 0), 0);
}

TEST_F(ProxyTest, Ipv6ConnectionsAreRedirectedAndDecidedTheSameWay) {
  lookup_.names["v6.test"] = {A("2001:db8::10")};
  lookup_.names["ula.test"] = {A("fd00:1::1")};
  Put({"v6.test", "[2001:db8::10]:7000", "ula.test"}, Mode::kAllowlist, 64, 0, "fd00:213::2");
  StartProxy();
  UniqueFd fd = Connect("2001:db8::10", 7000);
  ASSERT_TRUE(fd);
  Stream s{fd.get(), nullptr};
  char buf[64];
  ssize_t n = s.Read(buf, sizeof buf);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(std::max<ssize_t>(n, 0))),
            "banner 2001:db8::10\n");
  fd.reset();
  std::optional<NetEvent> e = events_.Wait("net.connect");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->detail["dst"], "[2001:db8::10]:7000");
  std::string r = Http("2001:db8::10", Get("v6.test"));
  EXPECT_EQ(Body(r), "server 2001:db8::10 host v6.test") << r;
  r = Http("2001:db8::10", Get("ula.test"));
  EXPECT_NE(Body(r).find("resolves into fc00::/7"), std::string::npos) << r;
  r = Http("2001:db8::10", Get("pypi.test"));
  EXPECT_NE(Body(r).find("not in the allowlist"), std::string::npos) << r;
  // The box's IPv4 address is no box now: closed without a word.
  EXPECT_EQ(Http("198.18.0.10", Get("v6.test")), "");
}

// Takes the connections of names it wants, as the secrets' TLS termination will.
class TestInterceptor : public Interceptor {
 public:
  bool Wants(const BoxNet&, std::string_view name) const override { return name == "pypi.test"; }
  void Serve(net::ip::tcp::socket client, std::string peeked, net::ip::tcp::socket upstream,
             std::string name, bool tls, std::shared_ptr<const BoxNet> box,
             std::shared_ptr<BoxBandwidth> bandwidth, std::shared_ptr<void> hold) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      budgets.push_back(std::move(bandwidth));
      holds.push_back(std::move(hold));  // as if every connection were still being served
    }
    boost::system::error_code ec;
    std::string upstream_at = upstream.remote_endpoint(ec).address().to_string();
    std::string line = "intercepted " + name + (tls ? " tls " : " http ") + box->id + " " +
                       upstream_at + " " + std::to_string(peeked.size()) + "\n";
    net::write(client, net::buffer(line), ec);
    ++served;
  }
  std::atomic<int> served{0};
  std::mutex mu;
  std::vector<std::shared_ptr<BoxBandwidth>> budgets;  // what each Serve was given
  std::vector<std::shared_ptr<void>> holds;
};

TEST_F(ProxyTest, AnInterceptorGetsTheConnectionsItWants) {
  TestInterceptor interceptor;
  StartProxy(200, &interceptor);
  std::string request = Get("pypi.test");
  // Forged: asked for .11, the interceptor's upstream is pypi.test's .10.
  EXPECT_EQ(Http("198.18.0.11", request),
            "intercepted pypi.test http box1 198.18.0.10 " + std::to_string(request.size()) + "\n");
  EXPECT_EQ(interceptor.served, 1);
  // Names it does not want are relayed as usual.
  EXPECT_EQ(Body(Http("198.18.0.11", Get("a.files.test"))), "server 198.18.0.11 host a.files.test");
  EXPECT_EQ(interceptor.served, 1);
}

// Intercepted connections count against the box's cap for as long as the interceptor serves
// them, as relayed ones do: a box with secrets cannot open more than its cap either.
TEST_F(ProxyTest, InterceptedConnectionsCountAgainstTheBoxsCap) {
  TestInterceptor interceptor;
  Put({"pypi.test"}, Mode::kAllowlist, /*max_connections=*/2);
  StartProxy(200, &interceptor);
  for (int i = 0; i < 2; ++i)
    EXPECT_NE(Http("198.18.0.10", Get("pypi.test")).find("intercepted"), std::string::npos);
  EXPECT_EQ(proxy_->OpenConnections("box1"), 2);
  EXPECT_EQ(Http("198.18.0.10", Get("pypi.test")).find("intercepted"), std::string::npos);
  std::optional<NetEvent> e = events_.Wait("net.connect_denied");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->detail["reason"], "too many connections");
  EXPECT_EQ(interceptor.served, 2);
  {
    std::lock_guard<std::mutex> lock(interceptor.mu);
    interceptor.holds.clear();  // the interceptor lets go: the places come back
  }
  for (int i = 0; i < 3000 && proxy_->OpenConnections("box1") != 0; ++i)
    std::this_thread::sleep_for(10ms);  // bounded poll of a condition
  EXPECT_EQ(proxy_->OpenConnections("box1"), 0);
  EXPECT_NE(Http("198.18.0.10", Get("pypi.test")).find("intercepted"), std::string::npos);
}

// limits.egress_mbps through the interceptor: it gets the box's one budget, the one the proxy's
// own relays take from, with the box's current rate (and a rate change reaches it).
TEST_F(ProxyTest, AnInterceptorSharesTheBoxsBandwidthBudget) {
  Put({"pypi.test", "*.files.test"}, Mode::kAllowlist, 64, 1 << 20);
  TestInterceptor interceptor;
  StartProxy(200, &interceptor);
  Http("198.18.0.10", Get("pypi.test"));
  Http("198.18.0.10", Get("pypi.test"));
  EXPECT_TRUE(Body(Http("198.18.0.11", Get("a.files.test"))).starts_with("server"));  // relayed
  ASSERT_EQ(interceptor.served, 2);
  std::vector<std::shared_ptr<BoxBandwidth>> budgets;
  {
    std::lock_guard<std::mutex> lock(interceptor.mu);
    budgets = interceptor.budgets;
  }
  ASSERT_EQ(budgets.size(), 2u);
  ASSERT_TRUE(budgets[0]);
  EXPECT_EQ(budgets[0], budgets[1]);
  EXPECT_EQ(budgets[0]->rate(), 1 << 20);
  // What the relayed connection took came out of the same budget.
  EXPECT_GT(budgets[0]->granted(), 0u);
  EXPECT_EQ(budgets[0]->granted(), proxy_->LimitedBytes("box1"));
  // A new entry's rate applies to the budget the intercepted connections hold.
  Put({"pypi.test"}, Mode::kAllowlist, 64, 1 << 16);
  Http("198.18.0.10", Get("pypi.test"));
  EXPECT_EQ(budgets[0]->rate(), 1 << 16);
}

TEST(TokenBucket, GrantsAtMostBurstPlusRateTimesTime) {
  using T = TokenBucket::Time;
  T t0{};
  TokenBucket b(1 << 20, t0);  // 1 MiB/s
  EXPECT_EQ(b.burst(), 256 << 10);
  EXPECT_EQ(b.Take(1 << 30, t0), 256 << 10);  // the burst, at once
  EXPECT_EQ(b.Take(1 << 16, t0), 0);
  EXPECT_GT(b.Wait(1 << 16, t0), 0ns);
  EXPECT_LE(b.Wait(1 << 16, t0), 5ms);  // 4 KiB at 1 MiB/s
  // Drain it over 10 simulated seconds in small steps: never more than burst + rate * T.
  uint64_t total = 256 << 10;
  for (int ms = 1; ms <= 10000; ++ms) {
    T now = t0 + std::chrono::milliseconds(ms);
    int64_t got = b.Take(100000, now);
    if (got > 0 && ms % 3 == 0) {
      b.Give(got / 2);
      got -= got / 2;
    }
    total += static_cast<uint64_t>(got);
    EXPECT_LE(total, (256u << 10) + (1u << 20) * static_cast<uint64_t>(ms) / 1000 + 1) << ms;
  }
  EXPECT_GE(total, (10u << 20) - (64u << 10));  // and it does give the rate
  EXPECT_EQ(b.granted(), total);
  b.SetRate(1 << 16);
  EXPECT_EQ(b.burst(), 16 << 10);
}

TEST_F(ProxyTest, BandwidthIsLimitedPerBox) {
  const int64_t rate = 1 << 20;  // 1 MiB/s: the bucket saves up at most 256 KiB
  Put({"pypi.test"}, Mode::kAllowlist, 64, rate);
  StartProxy();
  const size_t size = 3 << 19;  // 1.5 MiB
  auto start = std::chrono::steady_clock::now();
  std::string r = Http("198.18.0.10", Get("pypi.test", "/big/" + std::to_string(size)));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(Body(r) == Pattern(size)) << r.size();
  // The limiter granted every byte that went through (its accounting)...
  EXPECT_GE(proxy_->LimitedBytes("box1"), r.size());
  // ...and cannot have granted more than burst + rate * time: a lower bound on the time taken
  // that a slow machine only makes easier to meet.
  EXPECT_GE(seconds, static_cast<double>(r.size() - (256 << 10)) / rate - 0.05) << seconds;
}

TEST_F(ProxyTest, APolicyReplacedWhileRunningAppliesToTheNextConnection) {
  StartProxy();
  // A connection opened under the old policy...
  UniqueFd old = Connect("198.18.0.11", 7000);
  char buf[64];
  ASSERT_GT(::recv(old.get(), buf, sizeof buf, 0), 0);
  EXPECT_EQ(Body(Http("198.18.0.10", Get("pypi.test"))), "server 198.18.0.10 host pypi.test");
  Put({"evil.test"});
  std::string r = Http("198.18.0.10", Get("pypi.test"));
  EXPECT_TRUE(r.starts_with("HTTP/1.1 403")) << r;
  EXPECT_NE(Body(r).find("(mode allowlist; allowed: evil.test)"), std::string::npos) << r;
  EXPECT_EQ(Body(Http("198.18.0.11", Get("evil.test"))), "server 198.18.0.11 host evil.test");
  // ...keeps the entry it started with.
  Stream s{old.get(), nullptr};
  s.Write("still");
  ssize_t n = s.Read(buf, sizeof buf);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(std::max<ssize_t>(n, 0))), "still");
}

TEST_F(ProxyTest, StopClosesEverythingAndLeavesNoFds) {
  { net::ip::tcp::socket warm(ioc_); }  // the io_context's own epoll, eventfd and timerfd
  const size_t before = OpenFds();
  StartProxy();
  UniqueFd fd = Connect("198.18.0.11", 7000);
  char buf[64];
  ASSERT_GT(::recv(fd.get(), buf, sizeof buf, 0), 0);  // relayed and held open
  EXPECT_EQ(proxy_->OpenConnections("box1"), 1);
  StopProxy();  // returns once the io thread has run out of work: every socket closed
  EXPECT_EQ((Stream{fd.get(), nullptr}.ReadAll()), "");  // the box's end sees the close
  fd.reset();
  // The upstream's handler thread closes its end when it sees the proxy's close: wait for it.
  for (int i = 0; i < 3000 && OpenFds() != before; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(OpenFds(), before);
}

}  // namespace
}  // namespace sbx::network

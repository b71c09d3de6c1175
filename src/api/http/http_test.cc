// End-to-end tests of the HTTP server: a real Server on 127.0.0.1:0 driven by real sockets, both
// through the client helper and through raw POSIX sockets when the test needs to misbehave.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <fstream>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "api/http/client.h"
#include "api/http/exchange.h"
#include "api/http/router.h"
#include "api/http/server.h"
#include "api/http/websocket.h"

namespace sbx::http {
namespace {

namespace net = boost::asio;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Observations made by handlers, read by the tests.
struct Probe {
  std::atomic<uint64_t> upload_bytes{0};
  std::atomic<size_t> upload_max_read{0};
  std::atomic<int> upload_reads{0};
  std::promise<Clock::time_point> stream_failed;
  std::atomic<bool> stream_failed_set{false};
};

net::awaitable<void> Sleep(std::chrono::milliseconds d) {
  net::steady_timer timer(co_await net::this_coro::executor, d);
  co_await timer.async_wait(net::use_awaitable);
}

Router TestRouter(Probe& probe) {
  Router r;
  r.Get("/echo/{id}/files/{path...}", [](Exchange& ex) -> net::awaitable<void> {
    nlohmann::json out = {{"id", ex.Param("id")}, {"path", ex.Param("path")}};
    co_await ex.RespondJson(200, out);
  });
  r.Get("/items/{id}", [](Exchange& ex) -> net::awaitable<void> {
    // GCC 12 rejects braced temporaries holding string literals inside co_await ("array used
    // as initializer"): build them in a local first.
    nlohmann::json out = {{"id", ex.Param("id")}};
    co_await ex.RespondJson(200, out);
  });
  r.Delete("/items/{id}",
           [](Exchange& ex) -> net::awaitable<void> { co_await ex.Respond(204, ""); });
  r.Get("/query", [](Exchange& ex) -> net::awaitable<void> {
    nlohmann::json out = {{"a", ex.query().GetAll("a")}, {"b", ex.query().Get("b").value_or("?")}};
    co_await ex.RespondJson(200, out);
  });
  r.Post("/json",
         [](Exchange& ex) -> net::awaitable<void> {
           auto body = co_await ex.ReadJson();
           if (!body.ok()) co_return;  // ReadJson answered 400/413
           nlohmann::json out = {{"echo", *body}};
           co_await ex.RespondJson(200, out);
         },
         {.body_limit = 1024});
  // Reads "n" as a number the careless way: a string there throws json::type_error.
  r.Post("/typed", [](Exchange& ex) -> net::awaitable<void> {
    auto body = co_await ex.ReadJson();
    if (!body.ok()) co_return;
    nlohmann::json out = {{"n", body->value("n", 0) + 1}};
    co_await ex.RespondJson(200, out);
  });
  r.Put("/upload",
        [&probe](Exchange& ex) -> net::awaitable<void> {
          char buf[64 * 1024];  // the only body storage the handler has
          uint64_t total = 0;
          while (true) {
            auto n = co_await ex.ReadSome(buf, sizeof(buf));
            if (!n.ok()) co_return;
            if (*n == 0) break;
            total += *n;
            probe.upload_reads++;
            size_t prev = probe.upload_max_read.load();
            while (*n > prev && !probe.upload_max_read.compare_exchange_weak(prev, *n)) {
            }
          }
          probe.upload_bytes = total;
          nlohmann::json out = {{"bytes", total}};
          co_await ex.RespondJson(200, out);
        },
        {.body_limit = 0});
  r.Get("/stream", [](Exchange& ex) -> net::awaitable<void> {
    int n = std::stoi(ex.query().Get("n").value_or("10"));
    if (!(co_await ex.BeginStream(200, "application/x-ndjson")).ok()) co_return;
    for (int i = 0; i < n; ++i) {
      std::string line = nlohmann::json({{"seq", i}, {"data", "line " + std::to_string(i)}}).dump();
      line += '\n';
      if (!(co_await ex.WriteChunk(line)).ok()) co_return;
    }
    co_await ex.EndStream();
  });
  r.Get("/download", [](Exchange& ex) -> net::awaitable<void> {
    std::string part(1000, 'x');
    if (!(co_await ex.BeginStream(200, "application/octet-stream", {}, 10 * part.size())).ok()) {
      co_return;
    }
    for (int i = 0; i < 10; ++i) {
      if (!(co_await ex.WriteChunk(part)).ok()) co_return;
    }
    co_await ex.EndStream();
  });
  r.Get("/forever", [&probe](Exchange& ex) -> net::awaitable<void> {
    if (!(co_await ex.BeginStream(200, "application/x-ndjson")).ok()) co_return;
    while (true) {
      Status s = co_await ex.WriteChunk("{\"tick\":true}\n");
      if (!s.ok()) {
        if (!probe.stream_failed_set.exchange(true)) probe.stream_failed.set_value(Clock::now());
        co_return;
      }
      co_await Sleep(10ms);
    }
  });
  r.Get("/throw", [](Exchange&) -> net::awaitable<void> {
    throw std::runtime_error("boom");
    co_return;
  });
  r.Get("/throw-in-stream", [](Exchange& ex) -> net::awaitable<void> {
    co_await ex.BeginStream(200, "text/plain");
    co_await ex.WriteChunk("partial");
    throw std::runtime_error("boom mid-stream");
  });
  r.Get("/noreply", [](Exchange&) -> net::awaitable<void> { co_return; });
  r.Get("/slow", [](Exchange& ex) -> net::awaitable<void> {
    co_await Sleep(std::chrono::milliseconds(std::stoi(ex.query().Get("ms").value_or("100"))));
    co_await ex.Respond(200, "done");
  });
  r.Get("/ws", [](Exchange& ex) -> net::awaitable<void> {
    auto ws = co_await ex.AcceptWebSocket();
    if (!ws.ok()) co_return;
    while (true) {
      auto msg = co_await (*ws)->Read();
      if (!msg.ok()) co_return;
      if (!(co_await (*ws)->Write(msg->data, msg->binary)).ok()) co_return;
    }
  });
  // Relays the request to 127.0.0.1:{port}: what the E2B facade does for a sandbox's ports.
  r.Get("/relay/{port}", [](Exchange& ex) -> net::awaitable<void> {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(std::stoi(ex.Param("port"))));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string head = ex.ForwardHead({"x-secret"});
    Status s = co_await ex.Relay(std::move(fd), to, std::move(head));
    if (!s.ok() && !ex.responded()) co_await ex.RespondError(502, "bad_gateway", s.message());
  });
  return r;
}

class HttpTest : public ::testing::Test {
 protected:
  void StartServer(ServerOptions options = {}) {
    options.host = "127.0.0.1";
    options.port = 0;
    options.access_log = [this](const AccessLogEntry& e) {
      std::lock_guard lock(log_mu_);
      log_.push_back(std::string(e.method) + " " + std::string(e.path) + " " +
                     std::to_string(e.status));
    };
    server_ = std::make_unique<Server>(options, TestRouter(probe_));
    Status started = server_->Start();
    ASSERT_TRUE(started.ok()) << started.message();
    ASSERT_NE(server_->port(), 0);
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }

  Result<Response> Get(const std::string& target, const ClientHeaders& headers = {}) {
    return Request("127.0.0.1", server_->port(), "GET", target, headers, {}, 5s);
  }

  // A raw TCP connection to the server, for clients that misbehave on purpose.
  int Connect() {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(server_->port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }

  Probe probe_;
  std::unique_ptr<Server> server_;
  std::mutex log_mu_;
  std::vector<std::string> log_;
};

bool SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Reads until the peer closes or `timeout` passes; `closed` says whether EOF/reset was seen.
std::string ReadUntilClose(int fd, std::chrono::milliseconds timeout, bool* closed) {
  std::string out;
  auto until = Clock::now() + timeout;
  *closed = false;
  while (Clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count());
    if (::poll(&p, 1, std::max(left, 1)) <= 0) continue;
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      *closed = true;
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Reads one Content-Length-delimited response from a raw socket.
std::string ReadOneResponse(int fd, std::string& pending) {
  auto until = Clock::now() + 5s;
  auto fill = [&]() {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) return Clock::now() < until;
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    pending.append(buf, static_cast<size_t>(n));
    return true;
  };
  size_t end;
  while ((end = pending.find("\r\n\r\n")) == std::string::npos) {
    if (!fill()) return {};
  }
  std::string head = pending.substr(0, end + 4);
  size_t length = 0;
  size_t cl = head.find("Content-Length: ");
  if (cl != std::string::npos) length = std::stoul(head.substr(cl + 16));
  while (pending.size() < end + 4 + length) {
    if (!fill()) return {};
  }
  std::string whole = pending.substr(0, end + 4 + length);
  pending.erase(0, end + 4 + length);
  return whole;
}

size_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

TEST_F(HttpTest, RoutesWithParamsAndCatchAll) {
  StartServer();
  auto r = Get("/echo/a%20b/files/etc/x%2Fy/z.txt");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->status, 200);
  auto body = nlohmann::json::parse(r->body);
  EXPECT_EQ(body["id"], "a b");
  EXPECT_EQ(body["path"], "etc/x/y/z.txt");
  EXPECT_EQ(r->Header("content-type"), "application/json");
}

TEST_F(HttpTest, NotFoundAndMethodNotAllowedAreJson) {
  StartServer();
  auto r = Get("/nope");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 404);
  auto body = nlohmann::json::parse(r->body);
  EXPECT_EQ(body["error"]["code"], "not_found");
  EXPECT_FALSE(body["error"]["message"].get<std::string>().empty());

  r = Request("127.0.0.1", server_->port(), "POST", "/items/7", {}, "x", 5s);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->Header("Allow"), "DELETE, GET");
  EXPECT_EQ(nlohmann::json::parse(r->body)["error"]["code"], "method_not_allowed");

  r = Get("/items/%zz");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400);
  r = Get("/query?a=%zz");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400);
}

TEST_F(HttpTest, QueryDecoding) {
  StartServer();
  auto r = Get("/query?a=1&b=hello+w%C3%B6rld%21&a=x%26y");
  ASSERT_TRUE(r.ok());
  auto body = nlohmann::json::parse(r->body);
  EXPECT_EQ(body["a"], nlohmann::json({"1", "x&y"}));
  EXPECT_EQ(body["b"], "hello w\xC3\xB6rld!");
}

TEST_F(HttpTest, JsonEchoAndBadJson) {
  StartServer();
  auto r = Request("127.0.0.1", server_->port(), "POST", "/json",
                   {{"Content-Type", "application/json"}}, R"({"k":[1,2,"three"]})", 5s);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(nlohmann::json::parse(r->body)["echo"]["k"][2], "three");

  r = Request("127.0.0.1", server_->port(), "POST", "/json", {}, "{not json", 5s);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(nlohmann::json::parse(r->body)["error"]["code"], "bad_request");
}

TEST_F(HttpTest, BodyOverLimitIs413AndServerCarriesOn) {
  StartServer();
  // Declared too large: answered without reading the body.
  auto r =
      Request("127.0.0.1", server_->port(), "POST", "/json", {}, std::string(200'000, 'x'), 5s);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(nlohmann::json::parse(r->body)["error"]["code"], "payload_too_large");
  EXPECT_EQ(r->Header("Connection"), "close");

  // Chunked, so only discovered while reading.
  int fd = Connect();
  ASSERT_GE(fd, 0);
  std::string req = "POST /json HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 4; ++i) req += "200\r\n" + std::string(512, 'y') + "\r\n";
  req += "0\r\n\r\n";
  ASSERT_TRUE(SendAll(fd, req));
  bool closed = false;
  std::string reply = ReadUntilClose(fd, 3s, &closed);
  EXPECT_NE(reply.find("HTTP/1.1 413"), std::string::npos) << reply;
  EXPECT_TRUE(closed);
  ::close(fd);

  r = Get("/items/1");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpTest, OversizedHeaderIs431) {
  StartServer();
  auto r = Get("/items/1", {{"X-Big", std::string(20'000, 'h')}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->status, 431);
  EXPECT_EQ(nlohmann::json::parse(r->body)["error"]["code"], "header_too_large");
}

TEST_F(HttpTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  StartServer();
  int fd = Connect();
  ASSERT_GE(fd, 0);
  std::string pending;
  for (int i = 0; i < 3; ++i) {
    std::string id = std::to_string(i);
    ASSERT_TRUE(SendAll(fd, "GET /items/" + id + " HTTP/1.1\r\nHost: x\r\n\r\n"));
    std::string reply = ReadOneResponse(fd, pending);
    EXPECT_NE(reply.find("HTTP/1.1 200"), std::string::npos) << reply;
    EXPECT_NE(reply.find("{\"id\":\"" + id + "\"}"), std::string::npos) << reply;
  }
  // Pipelined: two requests in one write.
  ASSERT_TRUE(SendAll(fd,
                      "GET /items/a HTTP/1.1\r\nHost: x\r\n\r\n"
                      "GET /items/b HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_NE(ReadOneResponse(fd, pending).find("\"a\""), std::string::npos);
  EXPECT_NE(ReadOneResponse(fd, pending).find("\"b\""), std::string::npos);
  ::close(fd);
}

TEST_F(HttpTest, ChunkedUploadIsStreamedNotBuffered) {
  StartServer();
  constexpr uint64_t kTotal = 50ull << 20;
  size_t rss_before = RssBytes();
  int fd = Connect();
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd,
                      "PUT /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                      "Expect: 100-continue\r\n\r\n"));
  std::string pending;
  std::string cont = ReadOneResponse(fd, pending);
  EXPECT_NE(cont.find("100 Continue"), std::string::npos) << cont;
  std::string piece(100'000, 'u');
  char size_line[32];
  std::snprintf(size_line, sizeof(size_line), "%zx\r\n", piece.size());
  std::string chunk = std::string(size_line) + piece + "\r\n";
  uint64_t sent = 0;
  while (sent + piece.size() <= kTotal) {
    ASSERT_TRUE(SendAll(fd, chunk));
    sent += piece.size();
  }
  std::string tail(kTotal - sent, 't');
  std::snprintf(size_line, sizeof(size_line), "%zx\r\n", tail.size());
  ASSERT_TRUE(SendAll(fd, std::string(size_line) + tail + "\r\n0\r\n\r\n"));
  std::string reply = ReadOneResponse(fd, pending);
  ::close(fd);
  EXPECT_NE(reply.find("HTTP/1.1 200"), std::string::npos) << reply;
  EXPECT_EQ(probe_.upload_bytes.load(), kTotal);
  EXPECT_LE(probe_.upload_max_read.load(), size_t{64 * 1024});
  EXPECT_GT(probe_.upload_reads.load(), 700);  // ~50 MiB / 64 KiB
  // The server process never held anything near the 50 MiB body.
  size_t rss_after = RssBytes();
  EXPECT_LT(rss_after, rss_before + (16u << 20)) << rss_before << " -> " << rss_after;
}

TEST_F(HttpTest, StreamsTenThousandNdjsonLines) {
  StartServer();
  std::string data;
  Endpoint ep{"127.0.0.1", server_->port(), ""};
  auto r = RequestStream(ep, "GET", "/stream?n=10000", {}, {}, 5s, [&](std::string_view piece) {
    data.append(piece);
    return true;
  });
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->Header("Transfer-Encoding"), "chunked");
  int lines = 0;
  size_t start = 0;
  for (size_t nl; (nl = data.find('\n', start)) != std::string::npos; start = nl + 1) {
    auto j = nlohmann::json::parse(data.substr(start, nl - start));
    EXPECT_EQ(j["seq"], lines);
    ++lines;
  }
  EXPECT_EQ(lines, 10000);
  EXPECT_EQ(start, data.size());
}

TEST_F(HttpTest, FixedLengthStream) {
  StartServer();
  auto r = Get("/download");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->Header("Content-Length"), "10000");
  EXPECT_EQ(r->body, std::string(10000, 'x'));
}

TEST_F(HttpTest, ClientDisconnectMidStreamFailsWriteChunk) {
  StartServer();
  auto failed = probe_.stream_failed.get_future();
  int fd = Connect();
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "GET /forever HTTP/1.1\r\nHost: x\r\n\r\n"));
  char buf[256];
  ASSERT_GT(::recv(fd, buf, sizeof(buf), 0), 0);
  auto closed_at = Clock::now();
  ::close(fd);
  ASSERT_EQ(failed.wait_for(2s), std::future_status::ready);
  EXPECT_LT(failed.get() - closed_at, 1s);
  auto r = Get("/items/1");  // the server is fine
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpTest, SlowHeaderGets408AndClose) {
  ServerOptions options;
  options.header_timeout = 300ms;
  StartServer(options);
  int fd = Connect();
  ASSERT_GE(fd, 0);
  auto start = Clock::now();
  ASSERT_TRUE(SendAll(fd, "GET /items/1 HTTP/1.1\r\nHost: x\r\n"));
  bool closed = false;
  std::string reply = ReadUntilClose(fd, 3s, &closed);
  auto elapsed = Clock::now() - start;
  ::close(fd);
  EXPECT_NE(reply.find("HTTP/1.1 408"), std::string::npos) << reply;
  EXPECT_NE(reply.find("request_timeout"), std::string::npos);
  EXPECT_TRUE(closed);
  EXPECT_GE(elapsed, 250ms);
  EXPECT_LT(elapsed, 2s);
}

TEST_F(HttpTest, IdleKeepAliveIsClosed) {
  ServerOptions options;
  options.idle_timeout = 300ms;
  StartServer(options);
  int fd = Connect();
  ASSERT_GE(fd, 0);
  std::string pending;
  ASSERT_TRUE(SendAll(fd, "GET /items/1 HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_NE(ReadOneResponse(fd, pending).find("200"), std::string::npos);
  auto start = Clock::now();
  bool closed = false;
  std::string rest = ReadUntilClose(fd, 3s, &closed);
  ::close(fd);
  EXPECT_TRUE(closed);
  EXPECT_TRUE(rest.empty()) << rest;
  EXPECT_GE(Clock::now() - start, 250ms);
  EXPECT_LT(Clock::now() - start, 2s);
}

TEST_F(HttpTest, WebSocketEchoTextBinaryAndClose) {
  StartServer();
  net::io_context ioc;
  boost::beast::websocket::stream<net::ip::tcp::socket> ws(ioc);
  ws.next_layer().connect({net::ip::make_address("127.0.0.1"), server_->port()});
  ws.handshake("127.0.0.1", "/ws");
  boost::beast::flat_buffer buffer;

  ws.text(true);
  ws.write(net::buffer(std::string("hello")));
  ws.read(buffer);
  EXPECT_TRUE(ws.got_text());
  EXPECT_EQ(boost::beast::buffers_to_string(buffer.data()), "hello");
  buffer.clear();

  std::string binary("\x00\x01\xff\x7f", 4);
  ws.binary(true);
  ws.write(net::buffer(binary));
  ws.read(buffer);
  EXPECT_TRUE(ws.got_binary());
  EXPECT_EQ(boost::beast::buffers_to_string(buffer.data()), binary);

  ws.close(boost::beast::websocket::close_code::normal);
  // After close the server side ends; the server keeps serving HTTP.
  auto r = Get("/items/1");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);

  // A plain GET on the WebSocket route is a clean 400.
  r = Get("/ws");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400);
}

TEST_F(HttpTest, HandlerThatThrowsOrForgetsGets500) {
  StartServer();
  for (const char* target : {"/throw", "/noreply"}) {
    auto r = Get(target);
    ASSERT_TRUE(r.ok()) << target;
    EXPECT_EQ(r->status, 500) << target;
    EXPECT_EQ(nlohmann::json::parse(r->body)["error"]["code"], "internal");
  }
  // Mid-stream: the client sees a truncated body (a transport error), nothing else breaks.
  auto r = Get("/throw-in-stream");
  EXPECT_FALSE(r.ok());
  r = Get("/items/1");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpTest, TwoHundredConcurrentRequests) {
  StartServer();
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 20; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        std::string id = std::to_string(t * 100 + i);
        auto r = Get(i % 2 ? "/items/" + id : "/slow?ms=20");
        if (r.ok() && r->status == 200) ok++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 200);
}

TEST_F(HttpTest, UnixSocket) {
  ServerOptions options;
  options.unix_socket = ::testing::TempDir() + "sbx-http-test.sock";
  StartServer(options);
  Endpoint ep;
  ep.unix_socket = options.unix_socket;
  auto r = Request(ep, "GET", "/items/u");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(nlohmann::json::parse(r->body)["id"], "u");
}

TEST_F(HttpTest, ConnectionLimit) {
  ServerOptions options;
  options.max_connections = 2;
  StartServer(options);
  int a = Connect();
  int b = Connect();
  std::this_thread::sleep_for(100ms);
  int c = Connect();
  ASSERT_GE(c, 0);
  bool closed = false;
  ReadUntilClose(c, 2s, &closed);
  EXPECT_TRUE(closed);
  ::close(a);
  ::close(b);
  ::close(c);
  std::this_thread::sleep_for(100ms);
  auto r = Get("/items/1");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpTest, GracefulStopFinishesInFlightAndRefusesNew) {
  StartServer();
  uint16_t port = server_->port();
  int idle = Connect();  // an idle connection must not hold Stop() up
  ASSERT_GE(idle, 0);
  auto in_flight = std::async(std::launch::async, [&] { return Get("/slow?ms=500"); });
  std::this_thread::sleep_for(150ms);
  auto stop_start = Clock::now();
  std::thread stopper([&] { server_->Stop(); });
  std::this_thread::sleep_for(100ms);
  EXPECT_LT(Connect(), 0);  // no longer accepting
  auto r = in_flight.get();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "done");
  EXPECT_EQ(r->Header("Connection"), "close");
  stopper.join();
  EXPECT_LT(Clock::now() - stop_start, 3s);
  bool closed = false;
  ReadUntilClose(idle, 1s, &closed);
  EXPECT_TRUE(closed);
  ::close(idle);
  auto after = Request("127.0.0.1", port, "GET", "/items/1", {}, {}, 1s);
  EXPECT_FALSE(after.ok());
}

TEST_F(HttpTest, AccessLogHasNoHeaderValues) {
  StartServer();
  auto r = Get("/items/9?token=zzz", {{"Authorization", "Bearer secret-key"}});
  ASSERT_TRUE(r.ok());
  server_->Stop();
  std::lock_guard lock(log_mu_);
  ASSERT_FALSE(log_.empty());
  EXPECT_EQ(log_.back(), "GET /items/9 200");
}

// A one-connection upstream on 127.0.0.1: hands what it reads (up to the end of the request
// header) to the test, then answers with `reply` unless it is empty, then waits for the peer to
// close.
class Upstream {
 public:
  explicit Upstream(std::string reply) : reply_(std::move(reply)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd_, 4), 0);
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string got;
      char buf[4096];
      while (got.find("\r\n\r\n") == std::string::npos) {
        ssize_t n = ::read(c, buf, sizeof buf);
        if (n <= 0) break;
        got.append(buf, static_cast<size_t>(n));
      }
      request_.set_value(got);
      if (!reply_.empty()) SendAll(c, reply_);
      while (::read(c, buf, sizeof buf) > 0) {
      }
      ::close(c);
    });
  }
  ~Upstream() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  uint16_t port() const { return port_; }
  std::future<std::string> request() { return request_.get_future(); }

 private:
  std::string reply_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::promise<std::string> request_;
  std::thread thread_;
};

TEST_F(HttpTest, RelayForwardsTheRequestAndAnswersWithConnectionClose) {
  StartServer();
  // The upstream answers keep-alive: the client must still learn that this connection ends.
  Upstream up(
      "HTTP/1.1 201 Created\r\nContent-Length: 5\r\nConnection: keep-alive\r\n"
      "Keep-Alive: timeout=5\r\n\r\nhello");
  auto request = up.request();
  int fd = Connect();
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "GET /relay/" + std::to_string(up.port()) +
                              "?q=1 HTTP/1.1\r\nHost: box\r\nConnection: keep-alive\r\n"
                              "X-Test: yes\r\nX-Secret: s3cret\r\n\r\n"));
  // A client reads the response, sees Connection: close, and closes; that ends the relay (and the
  // upstream, which waits for it).
  std::string pending;
  std::string reply = ReadOneResponse(fd, pending);
  ::close(fd);
  EXPECT_EQ(reply.rfind("HTTP/1.1 201 Created\r\n", 0), 0u) << reply;
  EXPECT_NE(reply.find("Connection: close\r\n"), std::string::npos) << reply;
  EXPECT_EQ(reply.find("keep-alive"), std::string::npos) << reply;
  EXPECT_EQ(reply.substr(reply.size() - 5), "hello");
  std::string got = request.get();
  EXPECT_EQ(got.rfind("GET /relay/" + std::to_string(up.port()) + "?q=1 HTTP/1.1\r\n", 0), 0u);
  EXPECT_NE(got.find("X-Test: yes\r\n"), std::string::npos) << got;
  EXPECT_EQ(got.find("s3cret"), std::string::npos) << got;  // a dropped field
  EXPECT_NE(got.find("Connection: close\r\n"), std::string::npos) << got;
  EXPECT_EQ(got.find("keep-alive"), std::string::npos) << got;
}

TEST_F(HttpTest, RelayToAClosedPortLetsTheHandlerAnswer) {
  StartServer();
  uint16_t port;
  {
    Upstream gone("x");
    port = gone.port();
  }  // listened, now closed
  auto r =
      Request(Endpoint{"127.0.0.1", server_->port(), ""}, "GET", "/relay/" + std::to_string(port));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->status, 502);
}

TEST_F(HttpTest, IdleRelayIsClosed) {
  ServerOptions options;
  options.relay_idle_timeout = 300ms;
  StartServer(options);
  Upstream silent("");  // takes the request, never answers
  int fd = Connect();
  ASSERT_GE(fd, 0);
  auto start = Clock::now();
  ASSERT_TRUE(
      SendAll(fd, "GET /relay/" + std::to_string(silent.port()) + " HTTP/1.1\r\nHost: x\r\n\r\n"));
  bool closed = false;
  std::string reply = ReadUntilClose(fd, 5s, &closed);
  ::close(fd);
  EXPECT_TRUE(closed);
  EXPECT_TRUE(reply.empty()) << reply;
  EXPECT_GE(Clock::now() - start, 300ms);
}

TEST_F(HttpTest, AFieldOfTheWrongTypeIsABadRequest) {
  StartServer();
  Endpoint ep{"127.0.0.1", server_->port(), ""};
  auto good = Request(ep, "POST", "/typed", {{"Content-Type", "application/json"}}, R"({"n": 1})");
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good->status, 200);
  auto bad = Request(ep, "POST", "/typed", {{"Content-Type", "application/json"}}, R"({"n": "1"})");
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->status, 400) << bad->body;
  EXPECT_NE(bad->body.find("invalid_argument"), std::string::npos) << bad->body;
}

}  // namespace
}  // namespace sbx::http

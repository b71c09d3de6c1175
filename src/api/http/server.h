// Server: the HTTP/1.1 + WebSocket front of `sbx serve`. It accepts on a TCP address and/or a
// unix socket, runs one coroutine per connection on a pool of threads sharing one io_context,
// parses requests with Beast and hands each to the Router as an Exchange.
//
// Protection against slow or abusive clients (all configurable, defaults in ServerOptions; the
// numbers are in docs/api.md, "Limits"): request-line length (414), header size (431), header
// arrival time (408 + close; for a new connection counted from accept, so a client that connects
// and says nothing, or dribbles its header, holds its slot no longer than that), idle keep-alive
// time (close), a minimum body rate and body read stalls (408 + close), write stalls (close),
// strict message framing (400 or 501 + close: see CheckFraming in server.cc), and caps on open
// connections, in total and per remote address. At a cap the oldest idle connection (one that has
// not sent a whole request header yet, then an idle keep-alive one) is closed to make room; only
// when every connection is busy with a request is the new one refused.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "api/http/router.h"
#include "common/status.h"

namespace sbx::http {

// One finished request, for the access log. Carries no header values (no Authorization leaks)
// and the path without its query string.
struct AccessLogEntry {
  std::string_view remote;
  std::string_view method;
  std::string_view path;
  int status = 0;  // 0 when the connection dropped before any response
  std::chrono::microseconds duration{0};
  uint64_t bytes_in = 0;   // request body bytes read
  uint64_t bytes_out = 0;  // response bytes written (header included)
};
using AccessLog = std::function<void(const AccessLogEntry&)>;

// An AccessLog that writes one spdlog::info line per request.
AccessLog SpdlogAccessLog();

struct ServerOptions {
  std::string host = "127.0.0.1";  // empty: no TCP listener
  uint16_t port = 0;               // 0: an ephemeral port, see Server::port()
  std::string unix_socket;         // empty: none; an existing socket file is replaced
  uint32_t unix_socket_mode = 0600;
  int threads = 2;
  size_t max_connections = 1024;  // open at once, every listener together
  // From one remote address (0 = no cap). Loopback clients are exempt unless limit_loopback: every
  // local client shares 127.0.0.1, and the total cap with eviction still protects them.
  size_t max_connections_per_address = 64;
  bool limit_loopback = false;
  size_t max_target_bytes = 12 * 1024;  // the request-target (path and query): 414 beyond
  size_t max_header_bytes = 16 * 1024;  // request line and fields: 431 beyond
  // New connection: accept to the end of the first header. Later requests: first byte to end.
  std::chrono::milliseconds header_timeout{10'000};
  std::chrono::milliseconds idle_timeout{60'000};       // between keep-alive requests
  std::chrono::milliseconds body_read_timeout{30'000};  // one stalled body read
  // A request body must average at least this many bytes/s over the time the server spends
  // waiting for it, once body_rate_grace of waiting has passed (0 = no minimum).
  uint64_t min_body_rate = 1024;
  std::chrono::milliseconds body_rate_grace{10'000};
  std::chrono::milliseconds write_timeout{30'000};        // one stalled write
  std::chrono::milliseconds relay_idle_timeout{600'000};  // Exchange::Relay with no bytes moving
  std::chrono::milliseconds shutdown_grace{10'000};  // Stop(): in-flight requests get this long
  AccessLog access_log;                              // may be empty; called on connection threads
};

class Server {
 public:
  Server(ServerOptions options, Router router);
  ~Server();  // Stop()s if still running
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listeners and starts the worker threads. Fails (with errno) when a listener cannot
  // be bound; nothing is left running then. Call once.
  Status Start();
  // The bound TCP port (useful with port 0); 0 before Start() or without a TCP listener.
  uint16_t port() const;

  // Graceful shutdown: stops accepting, closes idle connections, cancels streams and WebSockets,
  // lets in-flight fixed responses finish for up to shutdown_grace, then closes everything and
  // joins the threads. Blocks; idempotent; must not be called from a handler.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sbx::http

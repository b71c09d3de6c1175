// Server: the HTTP/1.1 + WebSocket front of `sbx serve`. It accepts on a TCP address and/or a
// unix socket, runs one coroutine per connection on a pool of threads sharing one io_context,
// parses requests with Beast and hands each to the Router as an Exchange.
//
// Protection against slow or abusive clients (all configurable, defaults in ServerOptions):
// header size (431), header arrival time (408 + close), idle keep-alive time (close), body read
// stalls and write stalls (close), and a cap on open connections (extra ones are closed at once).
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
  size_t max_connections = 1024;
  size_t max_header_bytes = 16 * 1024;
  std::chrono::milliseconds header_timeout{10'000};       // first byte to end of header
  std::chrono::milliseconds idle_timeout{60'000};         // between keep-alive requests
  std::chrono::milliseconds body_read_timeout{30'000};    // one stalled body read
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

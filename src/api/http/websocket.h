// WebSocket: a message-oriented connection obtained from Exchange::AcceptWebSocket (the PTY
// endpoint). Ping/pong, fragmentation and the closing handshake are handled by Beast; the server
// pings an idle peer and drops it when the pong does not come back.
//
// Threading: all calls must run on executor() (the connection's strand). One Read and one Write
// may be in flight at the same time (e.g. an input pump and an output pump co_spawned on
// executor()), but never two Reads or two Writes.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"

namespace sbx::http {

class Connection;

struct WebSocketOptions {
  size_t max_message = size_t{1} << 20;  // larger incoming messages close the socket (1009)
  // With no traffic for this long the server pings; no answer for as long again closes it.
  std::chrono::seconds idle_timeout{60};
};

class WebSocket {
 public:
  struct Message {
    bool binary = false;
    std::string data;
  };

  ~WebSocket();  // closes the connection abruptly if Close() was not called
  WebSocket(const WebSocket&) = delete;
  WebSocket& operator=(const WebSocket&) = delete;

  // The next complete message. An error when the peer closed (closed_by_peer() is then true),
  // the message was too large, or the connection broke.
  boost::asio::awaitable<Result<Message>> Read();
  boost::asio::awaitable<Status> Write(std::string_view data, bool binary);
  boost::asio::awaitable<Status> WriteText(std::string_view data) { return Write(data, false); }
  boost::asio::awaitable<Status> WriteBinary(std::string_view data) { return Write(data, true); }
  // Sends a close frame (1000 normal by default) and waits for the peer's close.
  boost::asio::awaitable<Status> Close(uint16_t code = 1000, std::string_view reason = {});

  bool is_open() const;
  bool closed_by_peer() const { return closed_by_peer_; }
  boost::asio::any_io_executor executor() const;

 private:
  friend class Exchange;
  struct Impl;
  explicit WebSocket(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  bool closed_by_peer_ = false;
};

}  // namespace sbx::http

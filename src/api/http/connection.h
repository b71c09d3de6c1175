// Internal to src/api/http: one accepted connection and the server state it shares. Holds the
// Beast/Asio types so the public headers stay light; included only by server.cc, exchange.cc
// and websocket.cc.
//
// Timeouts: Beast's basic_stream closes the socket when a timer fires, which would make a 408
// answer impossible. Instead each connection runs a watchdog coroutine on its strand that
// cancels (not closes) the socket when `deadline_` passes; the pending operation then fails with
// operation_aborted, `timed_out_` says why, and the connection decides whether to answer.
#pragma once

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "api/http/router.h"
#include "api/http/server.h"
#include "common/status.h"

namespace sbx::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

// tcp and unix sockets are both converted to this, so one Connection type serves both.
using Socket = net::generic::stream_protocol::socket;
using RequestParser = bhttp::request_parser<bhttp::buffer_body>;

class Connection;

// errno-carrying Status for system errors; other categories (Beast, Asio misc) as text.
inline Status StatusFrom(std::string what, const boost::system::error_code& ec) {
  if (ec.category() == boost::system::system_category() ||
      ec.category() == boost::system::generic_category()) {
    return Status::Error(std::move(what), ec.value());
  }
  return Status::Error(std::move(what) + ": " + ec.message());
}

// What the Server and its Connections share. Destroyed after the io_context, so connections torn
// down while the io_context shuts down can still unregister themselves.
struct ServerState {
  ServerState(ServerOptions o, Router r) : options(std::move(o)), router(std::move(r)) {}

  const ServerOptions options;
  const Router router;
  std::atomic<bool> stopping{false};

  std::mutex mu;
  std::condition_variable all_closed;
  std::map<uint64_t, std::weak_ptr<Connection>> connections;  // GUARDED_BY(mu)
  uint64_t next_id = 0;                                       // GUARDED_BY(mu)
  std::atomic<size_t> open{0};
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  enum class Phase { kIdle, kHeader, kHandler, kStreaming, kUpgraded, kClosed };

  Connection(ServerState& state, Socket socket, std::string remote);
  ~Connection();

  // The connection's life: requests until close. Takes ownership through `self`.
  static net::awaitable<void> Run(std::shared_ptr<Connection> self);
  // Called on the strand by Server::Stop(): `force` closes whatever is going on.
  void OnStop(bool force);

  net::any_io_executor executor() { return socket_.get_executor(); }

  void SetDeadline(std::chrono::milliseconds d) { deadline_.expires_after(d); }
  void ClearDeadline() { deadline_.expires_at(std::chrono::steady_clock::time_point::max()); }

  // Writes `buffers` fully under write_timeout; on failure marks the connection broken.
  template <typename Buffers>
  net::awaitable<Status> WriteAll(const Buffers& buffers, const char* what) {
    if (broken_) co_return Status::Error(std::string(what) + ": connection closed");
    boost::system::error_code ec;
    SetDeadline(state_.options.write_timeout);
    size_t n =
        co_await net::async_write(socket_, buffers, net::redirect_error(net::use_awaitable, ec));
    ClearDeadline();
    bytes_out_ += n;
    if (ec) co_return Broken(what, ec);
    co_return Status();
  }
  // Serializes a whole message (header and body) under write_timeout.
  template <typename Message>
  net::awaitable<Status> WriteMessage(Message& msg, const char* what) {
    if (broken_) co_return Status::Error(std::string(what) + ": connection closed");
    boost::system::error_code ec;
    SetDeadline(state_.options.write_timeout);
    size_t n =
        co_await bhttp::async_write(socket_, msg, net::redirect_error(net::use_awaitable, ec));
    ClearDeadline();
    bytes_out_ += n;
    if (ec) co_return Broken(what, ec);
    co_return Status();
  }
  // Marks the socket unusable and returns the error, naming a timeout as such.
  Status Broken(const char* what, boost::system::error_code ec);

  // Whether the response being written may keep the connection open.
  bool KeepAliveAllowed() const;

  ServerState& state_;
  Socket socket_;
  std::string remote_;
  beast::flat_buffer buffer_;
  std::optional<RequestParser> parser_;
  net::steady_timer deadline_;
  bool timed_out_ = false;
  bool broken_ = false;          // socket unusable: skip writes, close
  bool close_after_ = false;     // answer with Connection: close, then close
  bool stop_requested_ = false;  // Server::Stop() began
  Phase phase_ = Phase::kIdle;
  uint64_t bytes_in_ = 0;
  uint64_t bytes_out_ = 0;
  uint64_t id_ = 0;

 private:
  static net::awaitable<void> Watchdog(std::shared_ptr<Connection> self);
  net::awaitable<void> ServeRequest();
  // Answers a request that never reached a handler (400/408/431) and closes.
  net::awaitable<void> RespondEarly(int status, const char* code, const char* message);
  // Closes politely: half-close, then read and discard for a moment so the peer sees our
  // response instead of a reset caused by its unread request bytes.
  net::awaitable<void> LingeringClose();
};

}  // namespace sbx::http

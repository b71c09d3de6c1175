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
#include <unordered_map>

#include "api/http/router.h"
#include "api/http/server.h"
#include "common/status.h"
#include "common/thread_annotations.h"

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

  // A registered connection. `conn` stays valid while registered: ~Connection unregisters under
  // `mu` before the object goes away, so the acceptor may read it under `mu`. Never drop a
  // shared_ptr from `weak` while holding `mu` (~Connection takes it).
  struct Entry {
    std::weak_ptr<Connection> weak;
    Connection* conn = nullptr;
  };
  // Open connections, and how many of them are marked to be evicted (they do not count against
  // a cap any more: their slots are being freed).
  struct Count {
    size_t open = 0;
    size_t marked = 0;
  };

  const ServerOptions options;
  const Router router;
  std::atomic<bool> stopping{false};

  Mutex mu;
  std::condition_variable_any all_closed;
  std::map<uint64_t, Entry> connections GUARDED_BY(mu);
  std::unordered_map<std::string, Count> per_address GUARDED_BY(mu);
  Count total GUARDED_BY(mu);
  uint64_t next_id GUARDED_BY(mu) = 0;
  std::atomic<size_t> open{0};
};

// How willing a connection is to give up its slot, from most to least (see ServerOptions).
enum class IdleKind : int {
  kFresh,      // accepted, nothing read yet
  kPartial,    // some of a request header read
  kKeepAlive,  // served a request, waiting for the next
  kBusy,       // a request is being served (or the connection was upgraded): never evicted
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  enum class Phase { kIdle, kHeader, kHandler, kStreaming, kUpgraded, kClosed };

  Connection(ServerState& state, Socket socket, std::string remote, std::string address);
  ~Connection();

  // The connection's life: requests until close. Takes ownership through `self`.
  static net::awaitable<void> Run(std::shared_ptr<Connection> self);
  // Called on the strand by Server::Stop(): `force` closes whatever is going on.
  void OnStop(bool force);
  // Called on the strand after the acceptor marked this connection to make room for a new one:
  // closes it if it is still idle, otherwise unmarks it (it keeps its slot).
  void OnEvict();

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
  const std::string address_;  // remote_ without the port: what per-address caps count
  const std::chrono::steady_clock::time_point accepted_at_ = std::chrono::steady_clock::now();
  // Written on the strand, read by the acceptor under state_.mu to pick whom to evict.
  std::atomic<IdleKind> idle_kind_{IdleKind::kFresh};
  std::atomic<int64_t> idle_since_{0};  // steady_clock ticks
  // Guarded by state_.mu; not annotated: the acceptor reaches it as `victim->evict_marked_` under
  // `state.mu`, the same mutex by another name, which the analysis cannot tell.
  bool evict_marked_ = false;
  bool evicted_ = false;  // on the strand: closing to make room
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

  void SetIdle(IdleKind kind) {
    idle_since_ = std::chrono::steady_clock::now().time_since_epoch().count();
    idle_kind_ = kind;
  }

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

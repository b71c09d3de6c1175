#include "api/http/server.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "api/http/connection.h"
#include "api/http/exchange.h"
#include "api/http/framing.h"

namespace sbx::http {
namespace {

using namespace std::chrono_literals;
using tcp = net::ip::tcp;
using local = net::local::stream_protocol;

// A keep-alive request whose body the handler left unread is drained up to this much; beyond,
// the connection is closed instead.
constexpr uint64_t kMaxDrain = 256 * 1024;
constexpr auto kLingerTime = 1s;
constexpr size_t kMaxLingerBytes = 1 << 20;

// Room in a connection's read buffer beyond the header limit: what a chunk-size line (with its
// extensions) or a trailer may take. A longer one fails the parse as buffer_overflow (400), so no
// request can make the buffer grow without bound.
constexpr size_t kBufferSlack = 16 * 1024;

bool IsLoopback(std::string_view address) {
  return address.starts_with("127.") || address == "::1" || address.starts_with("::ffff:127.");
}

bool IsQuietClose(boost::system::error_code ec) {
  return ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message ||
         ec == net::error::eof || ec == net::error::connection_reset ||
         ec == net::error::operation_aborted || ec == net::error::broken_pipe ||
         ec == net::error::bad_descriptor;
}

}  // namespace

AccessLog SpdlogAccessLog() {
  return [](const AccessLogEntry& e) {
    spdlog::info("http {} \"{} {}\" {} {}us in={} out={}", e.remote, e.method, e.path, e.status,
                 e.duration.count(), e.bytes_in, e.bytes_out);
  };
}

// ---------------------------------------------------------------------------------------------
// Connection

Connection::Connection(ServerState& state, Socket socket, std::string remote, std::string address)
    : state_(state),
      socket_(std::move(socket)),
      remote_(std::move(remote)),
      address_(std::move(address)),
      buffer_(state.options.max_header_bytes + kBufferSlack),
      deadline_(socket_.get_executor()) {
  ClearDeadline();
  SetIdle(IdleKind::kFresh);
}

Connection::~Connection() {
  boost::system::error_code ec;
  socket_.close(ec);
  MutexLock lock(state_.mu);
  state_.connections.erase(id_);
  auto it = state_.per_address.find(address_);
  if (it != state_.per_address.end()) {
    it->second.open--;
    if (evict_marked_) it->second.marked--;
    if (it->second.open == 0) state_.per_address.erase(it);
  }
  state_.total.open--;
  if (evict_marked_) state_.total.marked--;
  state_.open.fetch_sub(1);
  state_.all_closed.notify_all();
}

void Connection::OnEvict() {
  if (idle_kind_.load() != IdleKind::kBusy &&
      (phase_ == Phase::kIdle || phase_ == Phase::kHeader)) {
    evicted_ = true;
    boost::system::error_code ec;
    socket_.cancel(ec);
    return;
  }
  // A request arrived in the meantime: it keeps its slot (the cap is exceeded until one closes).
  MutexLock lock(state_.mu);
  if (!evict_marked_) return;
  evict_marked_ = false;
  state_.total.marked--;
  if (auto it = state_.per_address.find(address_); it != state_.per_address.end())
    it->second.marked--;
}

Status Connection::Broken(const char* what, boost::system::error_code ec) {
  broken_ = true;
  close_after_ = true;
  if (timed_out_) return Status::Error(std::string(what) + ": timed out", ETIMEDOUT);
  return StatusFrom(what, ec);
}

bool Connection::KeepAliveAllowed() const {
  if (broken_ || close_after_ || stop_requested_ || state_.stopping.load()) return false;
  if (!parser_ || !parser_->get().keep_alive()) return false;
  if (parser_->is_done()) return true;
  // Unread body: worth draining only when it is known to be small.
  auto remaining = parser_->content_length_remaining();
  return remaining && *remaining <= kMaxDrain;
}

void Connection::OnStop(bool force) {
  stop_requested_ = true;
  boost::system::error_code ec;
  switch (phase_) {
    case Phase::kIdle:
    case Phase::kHeader:
      socket_.cancel(ec);
      break;
    case Phase::kHandler:
      if (!force) break;
      [[fallthrough]];
    case Phase::kStreaming:
    case Phase::kUpgraded:
      // shutdown() rather than close(): the descriptor stays valid for code still holding it,
      // and every pending or later read/write fails promptly.
      socket_.shutdown(net::socket_base::shutdown_both, ec);
      socket_.cancel(ec);
      break;
    case Phase::kClosed:
      break;
  }
}

net::awaitable<void> Connection::Watchdog(std::shared_ptr<Connection> self) {
  while (self->phase_ != Phase::kClosed && self->phase_ != Phase::kUpgraded) {
    if (self->deadline_.expiry() <= std::chrono::steady_clock::now()) {
      self->timed_out_ = true;
      boost::system::error_code ec;
      self->socket_.cancel(ec);
      self->ClearDeadline();
    }
    boost::system::error_code ec;
    co_await self->deadline_.async_wait(net::redirect_error(net::use_awaitable, ec));
  }
}

net::awaitable<void> Connection::Run(std::shared_ptr<Connection> self) {
  const ServerOptions& opt = self->state_.options;
  net::co_spawn(self->executor(), Watchdog(self), net::detached);
  bool first = true;
  bool linger = false;
  // A new connection gets header_timeout from accept to the end of its first header, in all: one
  // that says nothing, or dribbles its header, holds its slot no longer than that.
  const auto first_deadline = self->accepted_at_ + opt.header_timeout;
  while (!self->stop_requested_ && !self->close_after_ && !self->broken_ && !self->evicted_) {
    boost::system::error_code ec;
    if (self->buffer_.size() == 0) {
      // Nothing buffered: wait for the first byte of the next request. Silence here is an idle
      // keep-alive (or a client that connected and said nothing): close without an answer.
      self->phase_ = Phase::kIdle;
      if (!first) self->SetIdle(IdleKind::kKeepAlive);
      self->timed_out_ = false;
      if (first) {
        self->deadline_.expires_at(first_deadline);
      } else {
        self->SetDeadline(opt.idle_timeout);
      }
      size_t n = co_await self->socket_.async_read_some(
          self->buffer_.prepare(4096), net::redirect_error(net::use_awaitable, ec));
      self->ClearDeadline();
      if (ec || self->evicted_) break;
      self->buffer_.commit(n);
    }
    self->phase_ = Phase::kHeader;
    self->SetIdle(IdleKind::kPartial);
    self->parser_.emplace();
    self->parser_->header_limit(static_cast<uint32_t>(opt.max_header_bytes));
    // Per route: ReadBody() enforces it. Not boost::none: Boost 1.74 compares
    // `content_length > none` as true and rejects every Content-Length body.
    self->parser_->body_limit(std::numeric_limits<uint64_t>::max());
    self->timed_out_ = false;
    if (first) {
      self->deadline_.expires_at(first_deadline);
    } else {
      self->SetDeadline(opt.header_timeout);
    }
    co_await bhttp::async_read_header(self->socket_, self->buffer_, *self->parser_,
                                      net::redirect_error(net::use_awaitable, ec));
    self->ClearDeadline();
    if (self->evicted_) break;
    if (ec) {
      linger = true;
      if (self->timed_out_) {
        co_await self->RespondEarly(408, "request_timeout", "request header not received in time");
      } else if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow) {
        // Beast sets the target as soon as the request line is whole: without one, the line
        // alone went past the header limit.
        auto target = self->parser_->get().target();
        if (target.empty() || target.size() > opt.max_target_bytes) {
          co_await self->RespondEarly(414, "uri_too_long", "request target too long");
        } else {
          co_await self->RespondEarly(431, "header_too_large", "request header too large");
        }
      } else if (!IsQuietClose(ec)) {
        co_await self->RespondEarly(400, "bad_request", "malformed request");
      }
      break;
    }
    if (auto refused = CheckFraming(*self->parser_)) {
      linger = true;
      co_await self->RespondEarly(refused->status, refused->code, refused->message.c_str());
      break;
    }
    if (self->parser_->get().target().size() > opt.max_target_bytes) {
      linger = true;
      co_await self->RespondEarly(414, "uri_too_long", "request target too long");
      break;
    }
    self->SetIdle(IdleKind::kBusy);
    co_await self->ServeRequest();
    if (self->phase_ == Phase::kUpgraded) co_return;  // the WebSocket owns the socket now
    first = false;
  }
  if (self->parser_ && !self->parser_->is_done()) linger = true;
  // An evicted connection gives its slot back at once.
  if (linger && !self->broken_ && !self->evicted_) co_await self->LingeringClose();
  boost::system::error_code ec;
  self->socket_.shutdown(net::socket_base::shutdown_both, ec);
  self->socket_.close(ec);
  self->phase_ = Phase::kClosed;
  self->deadline_.cancel();  // lets the watchdog see kClosed and exit
}

net::awaitable<void> Connection::ServeRequest() {
  auto start = std::chrono::steady_clock::now();
  bytes_in_ = 0;
  bytes_out_ = 0;
  phase_ = Phase::kHandler;
  Exchange ex(*this);
  std::string_view target = ex.target();
  size_t q = target.find('?');
  bool bad_query = false;
  if (q != std::string_view::npos) {
    auto query = ParseQuery(target.substr(q + 1));
    if (query.ok()) {
      ex.query_ = std::move(*query);
    } else {
      bad_query = true;
    }
  }

  std::string error;
  std::string bad_json;  // a JSON field of the wrong type in the request: the client's mistake
  if (bad_query) {
    state_.router.ApplyErrorShape(ex);
    co_await ex.RespondError(400, "bad_request", "malformed query string");
  } else {
    try {
      co_await state_.router.Dispatch(ex);
    } catch (const nlohmann::json::type_error& e) {
      bad_json = e.what();
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "exception";
    } catch (...) {
      error = "unknown exception";
    }
  }
  if (!error.empty()) {
    spdlog::error("http handler for {} {} threw: {}", ex.method(), ex.path(), error);
  }

  if (!bad_json.empty() && ex.state_ == Exchange::State::kNone) {
    spdlog::info("http {} {}: bad request body: {}", ex.method(), ex.path(), bad_json);
    co_await ex.RespondError(400, "invalid_argument", "a field of the request has the wrong type");
  }
  switch (ex.state_) {
    case Exchange::State::kNone:
      if (error.empty()) {
        spdlog::error("http handler for {} {} returned without responding", ex.method(), ex.path());
      }
      co_await ex.RespondError(500, "internal", "internal error");
      break;
    case Exchange::State::kStreaming:
      // Aborted stream: closing is the only way to tell the client the body is incomplete.
      broken_ = true;
      close_after_ = true;
      break;
    default:
      break;
  }

  if (ex.state_ != Exchange::State::kUpgraded && !broken_ && !close_after_ && parser_ &&
      !parser_->is_done()) {
    char scratch[8192];
    while (!parser_->is_done()) {
      auto n = co_await ex.ReadSome(scratch, sizeof(scratch));
      if (!n.ok() || *n == 0) break;
    }
    if (!parser_->is_done()) close_after_ = true;
  }

  if (state_.options.access_log) {
    AccessLogEntry entry;
    entry.remote = remote_;
    entry.method = ex.method();
    entry.path = ex.path();
    entry.status = ex.status_;
    entry.duration = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - start);
    entry.bytes_in = bytes_in_;
    entry.bytes_out = bytes_out_;
    state_.options.access_log(entry);
  }
  if (ex.state_ == Exchange::State::kUpgraded) phase_ = Phase::kUpgraded;
}

net::awaitable<void> Connection::RespondEarly(int status, const char* code, const char* message) {
  close_after_ = true;
  timed_out_ = false;
  bhttp::response<bhttp::string_body> res;
  res.version(11);
  res.result(static_cast<unsigned>(status));
  res.set(bhttp::field::server, "sbx");
  res.set(bhttp::field::content_type, "application/json");
  res.keep_alive(false);
  res.body() = ErrorJson(code, message).dump();
  res.prepare_payload();
  bytes_out_ = 0;
  // The connection closes after this either way (close_after_), and a failure marked it broken.
  (void)co_await WriteMessage(res, "write error response");
  if (state_.options.access_log) {
    AccessLogEntry entry;
    entry.remote = remote_;
    entry.method = "-";
    entry.path = "-";
    entry.status = status;
    entry.bytes_out = bytes_out_;
    state_.options.access_log(entry);
  }
}

net::awaitable<void> Connection::LingeringClose() {
  boost::system::error_code ec;
  socket_.shutdown(net::socket_base::shutdown_send, ec);
  if (ec) co_return;
  auto until = std::chrono::steady_clock::now() + kLingerTime;
  deadline_.expires_at(until);
  char scratch[4096];
  size_t total = 0;
  while (total < kMaxLingerBytes) {
    size_t n = co_await socket_.async_read_some(net::buffer(scratch),
                                                net::redirect_error(net::use_awaitable, ec));
    if (ec) break;
    total += n;
  }
  ClearDeadline();
}

// ---------------------------------------------------------------------------------------------
// Server

struct Server::Impl {
  Impl(ServerOptions options, Router router)
      : state(std::move(options), std::move(router)),
        ioc(std::max(1, state.options.threads)),
        acceptor_strand(net::make_strand(ioc)),
        tcp_acceptor(acceptor_strand),
        unix_acceptor(acceptor_strand) {}

  // Declared first so it outlives the io_context (see ServerState).
  ServerState state;
  net::io_context ioc;
  net::strand<net::io_context::executor_type> acceptor_strand;
  tcp::acceptor tcp_acceptor;
  local::acceptor unix_acceptor;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  uint16_t port = 0;
  bool started = false;
  bool stopped = false;

  template <typename Acceptor>
  net::awaitable<void> AcceptLoop(Acceptor& acceptor);
  void Adopt(Socket socket, std::string remote, std::string address);
  Connection* PickVictim(const std::string* address) REQUIRES(state.mu);
  void Broadcast(bool force);
  bool WaitAllClosed(std::chrono::milliseconds timeout);
};

template <typename Acceptor>
net::awaitable<void> Server::Impl::AcceptLoop(Acceptor& acceptor) {
  while (acceptor.is_open()) {
    boost::system::error_code ec;
    auto socket = co_await acceptor.async_accept(net::make_strand(ioc),
                                                 net::redirect_error(net::use_awaitable, ec));
    if (ec) {
      if (ec == net::error::operation_aborted || state.stopping.load()) co_return;
      // EMFILE and friends: back off instead of spinning.
      spdlog::warn("http accept: {}", ec.message());
      net::steady_timer pause(acceptor_strand, 100ms);
      co_await pause.async_wait(net::redirect_error(net::use_awaitable, ec));
      continue;
    }
    std::string remote = "unix";
    std::string address = "unix";
    if constexpr (std::is_same_v<Acceptor, tcp::acceptor>) {
      auto ep = socket.remote_endpoint(ec);
      if (!ec) {
        address = ep.address().to_string();
        remote = address + ":" + std::to_string(ep.port());
      }
      // Streams are written as many small writes (a header, then one NDJSON line per event):
      // with Nagle on, each waits for the client's delayed ACK (~40 ms).
      socket.set_option(tcp::no_delay(true), ec);
    }
    Adopt(Socket(std::move(socket)), std::move(remote), std::move(address));
  }
}

// The connection to close for a new one (of `address` only, when given): never a busy one; the
// oldest of those that have not sent a whole request header yet, else the longest idle keep-alive
// one. nullptr when every connection is busy. Linear in the open connections, paid only at a cap.
Connection* Server::Impl::PickVictim(const std::string* address) {
  Connection* best = nullptr;
  int best_rank = 0;
  int64_t best_since = 0;
  for (auto& [id, entry] : state.connections) {
    Connection* c = entry.conn;
    if (c->evict_marked_ || (address && c->address_ != *address)) continue;
    IdleKind kind = c->idle_kind_.load();
    if (kind == IdleKind::kBusy) continue;
    int rank = kind == IdleKind::kKeepAlive ? 1 : 0;
    int64_t since = c->idle_since_.load();
    if (!best || rank < best_rank || (rank == best_rank && since < best_since)) {
      best = c;
      best_rank = rank;
      best_since = since;
    }
  }
  return best;
}

void Server::Impl::Adopt(Socket socket, std::string remote, std::string address) {
  const ServerOptions& opt = state.options;
  std::shared_ptr<Connection> conn;
  std::shared_ptr<Connection> victim;  // released outside the lock: ~Connection takes it
  {
    MutexLock lock(state.mu);
    // Checked under the lock that Stop() takes to broadcast, so no connection slips past it.
    bool refuse = state.stopping.load();
    Connection* evict = nullptr;
    bool per_address = opt.max_connections_per_address > 0 && address != "unix" &&
                       (opt.limit_loopback || !IsLoopback(address));
    auto at = state.per_address.find(address);
    if (!refuse && per_address && at != state.per_address.end() &&
        at->second.open - at->second.marked >= opt.max_connections_per_address) {
      evict = PickVictim(&address);
      refuse = evict == nullptr;
    } else if (!refuse && state.total.open - state.total.marked >= opt.max_connections) {
      evict = PickVictim(nullptr);
      refuse = evict == nullptr;
    }
    if (refuse) {
      boost::system::error_code ec;
      socket.close(ec);
      return;
    }
    if (evict) {
      evict->evict_marked_ = true;
      state.total.marked++;
      state.per_address[evict->address_].marked++;
      victim = state.connections[evict->id_].weak.lock();  // null: it is going away anyway
    }
    state.open.fetch_add(1);
    state.total.open++;
    state.per_address[address].open++;
    conn = std::make_shared<Connection>(state, std::move(socket), std::move(remote),
                                        std::move(address));
    conn->id_ = state.next_id++;
    state.connections.emplace(conn->id_, ServerState::Entry{conn, conn.get()});
  }
  if (victim) net::post(victim->executor(), [victim] { victim->OnEvict(); });
  net::co_spawn(conn->executor(), Connection::Run(conn), net::detached);
}

void Server::Impl::Broadcast(bool force) {
  // Collected under the lock but released outside it: dropping the last reference runs
  // ~Connection, which takes the lock itself.
  std::vector<std::shared_ptr<Connection>> live;
  {
    MutexLock lock(state.mu);
    for (auto& [id, entry] : state.connections) {
      if (auto conn = entry.weak.lock()) live.push_back(std::move(conn));
    }
  }
  for (auto& conn : live) {
    net::post(conn->executor(), [conn, force] { conn->OnStop(force); });
  }
}

bool Server::Impl::WaitAllClosed(std::chrono::milliseconds timeout) {
  std::unique_lock lock(state.mu);
  return state.all_closed.wait_for(lock, timeout, [&] { return state.open.load() == 0; });
}

Server::Server(ServerOptions options, Router router)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(router))) {}

Server::~Server() { Stop(); }

uint16_t Server::port() const { return impl_->port; }

Status Server::Start() {
  Impl& s = *impl_;
  if (s.started) return Status::Error("http server: already started");
  const ServerOptions& opt = s.state.options;
  boost::system::error_code ec;
  if (!opt.host.empty()) {
    std::string where = opt.host + ":" + std::to_string(opt.port);
    auto address = net::ip::make_address(opt.host, ec);
    if (ec) {
      tcp::resolver resolver(s.ioc);
      auto results = resolver.resolve(opt.host, std::to_string(opt.port), ec);
      if (ec || results.empty()) {
        return StatusFrom("http: resolve " + where, ec);
      }
      address = results.begin()->endpoint().address();
    }
    tcp::endpoint endpoint(address, opt.port);
    s.tcp_acceptor.open(endpoint.protocol(), ec);
    if (!ec) s.tcp_acceptor.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) s.tcp_acceptor.bind(endpoint, ec);
    if (!ec) s.tcp_acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (ec) return StatusFrom("http: listen on " + where, ec);
    s.port = s.tcp_acceptor.local_endpoint().port();
  }
  if (!opt.unix_socket.empty()) {
    ::unlink(opt.unix_socket.c_str());
    local::endpoint endpoint(opt.unix_socket);
    s.unix_acceptor.open(endpoint.protocol(), ec);
    if (!ec) s.unix_acceptor.bind(endpoint, ec);
    if (!ec && ::chmod(opt.unix_socket.c_str(), opt.unix_socket_mode) != 0) {
      ec.assign(errno, boost::system::system_category());
    }
    if (!ec) s.unix_acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      s.tcp_acceptor.close();
      return StatusFrom("http: listen on unix socket " + opt.unix_socket, ec);
    }
  }
  if (!s.tcp_acceptor.is_open() && !s.unix_acceptor.is_open()) {
    return Status::Error("http: neither a TCP address nor a unix socket configured");
  }
  s.started = true;
  if (s.tcp_acceptor.is_open()) {
    net::co_spawn(s.acceptor_strand, s.AcceptLoop(s.tcp_acceptor), net::detached);
  }
  if (s.unix_acceptor.is_open()) {
    net::co_spawn(s.acceptor_strand, s.AcceptLoop(s.unix_acceptor), net::detached);
  }
  s.work.emplace(s.ioc.get_executor());
  for (int i = 0; i < std::max(1, opt.threads); ++i) {
    s.threads.emplace_back([&s] {
      // A stray exception must not take the daemon down; handlers' own are caught per request.
      while (true) {
        try {
          s.ioc.run();
          break;
        } catch (const std::exception& e) {
          spdlog::error("http worker: {}", e.what());
        } catch (...) {
          spdlog::error("http worker: unknown exception");
        }
      }
    });
  }
  return Status();
}

void Server::Stop() {
  Impl& s = *impl_;
  if (!s.started || s.stopped) return;
  s.stopped = true;
  {
    MutexLock lock(s.state.mu);
    s.state.stopping = true;
  }
  net::post(s.acceptor_strand, [&s] {
    boost::system::error_code ec;
    s.tcp_acceptor.close(ec);
    s.unix_acceptor.close(ec);
  });
  s.Broadcast(false);
  if (!s.WaitAllClosed(s.state.options.shutdown_grace)) {
    s.Broadcast(true);
    s.WaitAllClosed(1000ms);
  }
  s.work.reset();
  s.ioc.stop();
  for (std::thread& t : s.threads) t.join();
  s.threads.clear();
  if (!s.state.options.unix_socket.empty()) ::unlink(s.state.options.unix_socket.c_str());
}

}  // namespace sbx::http

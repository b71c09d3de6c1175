// Exchange::ForwardHead and Exchange::Relay: handing a request to another HTTP server as bytes
// (the E2B facade's proxy to ports inside a sandbox).
// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <netinet/in.h>
#include <sys/socket.h>

#include "api/http/connection.h"
#include "api/http/exchange.h"

namespace sbx::http {
namespace {

using Stream = net::generic::stream_protocol::socket;

// Hop-by-hop fields (RFC 9110 7.6.1) that describe this connection, not the request.
bool HopByHop(bhttp::field f) {
  switch (f) {
    case bhttp::field::connection:
    case bhttp::field::keep_alive:
    case bhttp::field::proxy_connection:
    case bhttp::field::proxy_authenticate:
    case bhttp::field::proxy_authorization:
    case bhttp::field::te:
    case bhttp::field::trailer:
    case bhttp::field::upgrade:
      return true;
    default:
      return false;
  }
}

// The client's side of a relay, run beside the other direction: copies the client's bytes to the
// upstream. A client that half-closes (EOF) has its end passed on; one that fails or is shut
// down by Server::Stop() ends the upstream's side too. Clears *running and wakes `done` at the
// end.
net::awaitable<void> ClientToUpstream(Connection& conn, Stream& upstream, uint64_t* bytes,
                                      bool* running, net::steady_timer* done) {
  Stream& client = conn.socket_;
  std::vector<char> buf(64 << 10);
  boost::system::error_code ec, ignored;
  for (;;) {
    size_t n = co_await client.async_read_some(net::buffer(buf),
                                               net::redirect_error(net::use_awaitable, ec));
    if (ec || n == 0) break;
    co_await net::async_write(upstream, net::buffer(buf.data(), n),
                              net::redirect_error(net::use_awaitable, ec));
    if (ec) break;
    *bytes += n;
    conn.SetDeadline(conn.state_.options.relay_idle_timeout);
  }
  if (ec == net::error::eof)
    upstream.shutdown(net::socket_base::shutdown_send, ignored);
  else
    upstream.cancel(ignored);
  *running = false;
  done->cancel();
}

constexpr size_t kMaxResponseHeader = 64 << 10;

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() &&
         beast::iequals(beast::string_view(s.data(), prefix.size()),
                        beast::string_view(prefix.data(), prefix.size()));
}

// A response header (status line and fields, each ending in CRLF, without the blank line) with
// its Connection and Keep-Alive fields replaced by "Connection: close", except for a 101 (the
// upgraded connection is the point). Sets *status from the status line.
std::string CloseAfter(const std::string& header, int* status) {
  if (header.size() >= 12 && header.compare(0, 5, "HTTP/") == 0) {
    int s = std::atoi(header.substr(9, 3).c_str());
    if (s >= 100 && s <= 599) *status = s;
  }
  if (*status == 101) return header;
  std::string out;
  size_t pos = 0;
  bool first = true;
  while (pos < header.size()) {
    size_t eol = header.find("\r\n", pos);
    if (eol == std::string::npos) eol = header.size();
    std::string_view line(header.data() + pos, eol - pos);
    pos = eol + 2;
    if (!first && (StartsWithNoCase(line, "connection:") || StartsWithNoCase(line, "keep-alive:")))
      continue;
    first = false;
    out.append(line);
    out += "\r\n";
  }
  return out + "Connection: close\r\n";
}

}  // namespace

std::string Exchange::ForwardHead(std::initializer_list<std::string_view> drop) const {
  const auto& req = conn_.parser_->get();
  const bool upgrade = req.find(bhttp::field::upgrade) != req.end();
  std::string head;
  head.append(req.method_string().data(), req.method_string().size());
  head += ' ';
  head.append(req.target().data(), req.target().size());
  head += " HTTP/1.1\r\n";
  for (const auto& f : req) {
    if (HopByHop(f.name())) continue;
    auto name = f.name_string();
    bool dropped = false;
    for (std::string_view d : drop)
      dropped |= beast::iequals(name, beast::string_view(d.data(), d.size()));
    if (dropped) continue;
    head.append(f.name_string().data(), f.name_string().size());
    head += ": ";
    head.append(f.value().data(), f.value().size());
    head += "\r\n";
  }
  if (upgrade) {
    // A WebSocket (or other) upgrade goes through as is; the relay carries the new protocol.
    auto up = req[bhttp::field::upgrade];
    head += "Connection: Upgrade\r\nUpgrade: " + std::string(up.data(), up.size()) + "\r\n";
  } else {
    // One request per upstream connection: its response ends where the upstream closes.
    head += "Connection: close\r\n";
  }
  head += "\r\n";
  return head;
}

net::awaitable<Status> Exchange::Relay(UniqueFd socket, const sockaddr_in* address,
                                       std::string head) {
  if (state_ != State::kNone) co_return Status::Error("relay: response already started");
  Stream upstream(conn_.executor());
  boost::system::error_code ec;
  sockaddr_storage own{};
  socklen_t own_len = sizeof own;
  if (::getsockname(socket.get(), reinterpret_cast<sockaddr*>(&own), &own_len) != 0)
    co_return Status::Errno("relay: socket");
  upstream.assign(
      net::generic::stream_protocol(own.ss_family, own.ss_family == AF_UNIX ? 0 : IPPROTO_TCP),
      socket.release(), ec);
  if (ec) co_return StatusFrom("relay: socket", ec);
  if (address != nullptr) {
    net::generic::stream_protocol::endpoint to(address, sizeof *address);
    conn_.SetDeadline(conn_.state_.options.write_timeout);
    co_await upstream.async_connect(to, net::redirect_error(net::use_awaitable, ec));
    conn_.ClearDeadline();
    // Nothing was sent to the client yet: the caller can still answer (502 for a closed port).
    if (ec) co_return StatusFrom("relay: connect", ec);
  }

  state_ = State::kStreaming;
  status_ = 502;                                 // until the upstream's status line says otherwise
  conn_.phase_ = Connection::Phase::kStreaming;  // Server::Stop() shuts it down
  conn_.close_after_ = true;
  // What the client sent past the request header (the start of a body) goes first.
  auto pending = conn_.buffer_.data();
  head.append(static_cast<const char*>(pending.data()), pending.size());
  conn_.buffer_.consume(conn_.buffer_.size());
  co_await net::async_write(upstream, net::buffer(head),
                            net::redirect_error(net::use_awaitable, ec));
  if (ec) {
    conn_.broken_ = true;
    co_return StatusFrom("relay: write upstream", ec);
  }

  // Idle (no bytes either way) for relay_idle_timeout: the watchdog cancels the client's socket,
  // which ends both directions.
  conn_.SetDeadline(conn_.state_.options.relay_idle_timeout);
  uint64_t to_upstream = 0, to_client = 0;
  bool running = true;
  net::steady_timer done(conn_.executor(), std::chrono::steady_clock::time_point::max());
  net::co_spawn(conn_.executor(), ClientToUpstream(conn_, upstream, &to_upstream, &running, &done),
                net::detached);
  // The upstream's answer until it closes: its header with "Connection: close" (the client must
  // not send another request on this connection), then every byte unchanged.
  std::vector<char> buf(64 << 10);
  std::string header;
  bool in_header = true;
  for (;;) {
    size_t n = co_await upstream.async_read_some(net::buffer(buf),
                                                 net::redirect_error(net::use_awaitable, ec));
    if (ec || n == 0) break;
    std::string_view out(buf.data(), n);
    if (in_header) {
      header.append(out);
      size_t end = header.find("\r\n\r\n");
      if (end == std::string::npos && header.size() < kMaxResponseHeader) continue;
      in_header = false;
      if (end != std::string::npos) {
        std::string rest = header.substr(end + 4);
        header = CloseAfter(header.substr(0, end + 2), &status_) + "\r\n" + rest;
      }
      out = header;
    }
    co_await net::async_write(conn_.socket_, net::buffer(out.data(), out.size()),
                              net::redirect_error(net::use_awaitable, ec));
    if (ec) break;
    to_client += out.size();
    conn_.SetDeadline(conn_.state_.options.relay_idle_timeout);
  }
  if (in_header && !header.empty()) {  // the upstream closed inside its header
    co_await net::async_write(conn_.socket_, net::buffer(header),
                              net::redirect_error(net::use_awaitable, ec));
  }
  // The upstream is done (or the client is gone): stop the other direction and wait for it, since
  // it uses this frame's sockets.
  conn_.socket_.shutdown(net::socket_base::shutdown_send, ec);
  upstream.close(ec);
  conn_.socket_.cancel(ec);
  if (running) co_await done.async_wait(net::redirect_error(net::use_awaitable, ec));
  conn_.ClearDeadline();
  conn_.bytes_in_ += to_upstream;
  conn_.bytes_out_ += to_client;
  conn_.broken_ = true;
  state_ = State::kStreamEnded;
  co_return Status();
}

}  // namespace sbx::http

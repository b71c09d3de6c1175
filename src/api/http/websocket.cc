#include "api/http/websocket.h"

#include <boost/beast/websocket.hpp>

#include "api/http/connection.h"
#include "api/http/exchange.h"

namespace sbx::http {

namespace ws = boost::beast::websocket;

struct WebSocket::Impl {
  explicit Impl(std::shared_ptr<Connection> c) : conn(std::move(c)), stream(conn->socket_) {}

  std::shared_ptr<Connection> conn;  // keeps the socket (and the server's count) alive
  ws::stream<Socket&> stream;
  beast::flat_buffer read_buffer;
};

WebSocket::WebSocket(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WebSocket::~WebSocket() {
  boost::system::error_code ec;
  impl_->conn->socket_.shutdown(net::socket_base::shutdown_both, ec);
  impl_->conn->socket_.close(ec);
}

bool WebSocket::is_open() const { return impl_->stream.is_open(); }

net::any_io_executor WebSocket::executor() const { return impl_->conn->executor(); }

net::awaitable<Result<WebSocket::Message>> WebSocket::Read() {
  boost::system::error_code ec;
  impl_->read_buffer.clear();
  co_await impl_->stream.async_read(impl_->read_buffer,
                                    net::redirect_error(net::use_awaitable, ec));
  if (ec == ws::error::closed) {
    closed_by_peer_ = true;
    co_return Status::Error("websocket closed by peer (code " +
                            std::to_string(impl_->stream.reason().code) + ")");
  }
  if (ec) co_return StatusFrom("websocket read", ec);
  Message message;
  message.binary = !impl_->stream.got_text();
  message.data = beast::buffers_to_string(impl_->read_buffer.data());
  impl_->read_buffer.consume(impl_->read_buffer.size());
  co_return message;
}

net::awaitable<Status> WebSocket::Write(std::string_view data, bool binary) {
  boost::system::error_code ec;
  impl_->stream.binary(binary);
  co_await impl_->stream.async_write(net::buffer(data.data(), data.size()),
                                     net::redirect_error(net::use_awaitable, ec));
  if (ec) co_return StatusFrom("websocket write", ec);
  co_return Status();
}

net::awaitable<Status> WebSocket::Close(uint16_t code, std::string_view reason) {
  if (!impl_->stream.is_open()) co_return Status();
  boost::system::error_code ec;
  ws::close_reason why;
  why.code = code;
  why.reason.assign(reason.data(), std::min(reason.size(), why.reason.max_size()));
  co_await impl_->stream.async_close(why, net::redirect_error(net::use_awaitable, ec));
  if (ec) co_return StatusFrom("websocket close", ec);
  co_return Status();
}

// Exchange's upgrade lives here so the websocket templates are compiled in one file.
net::awaitable<Result<std::unique_ptr<WebSocket>>> Exchange::AcceptWebSocket() {
  co_return co_await AcceptWebSocket(WebSocketOptions());
}

net::awaitable<Result<std::unique_ptr<WebSocket>>> Exchange::AcceptWebSocket(
    const WebSocketOptions& options) {
  if (state_ != State::kNone) co_return Status::Error("websocket accept: response already started");
  if (!WantsWebSocket()) {
    co_await RespondError(400, "bad_request", "expected a WebSocket upgrade request");
    co_return Status::Error("websocket accept: not an upgrade request");
  }
  if (stopping()) {
    co_await RespondError(503, "unavailable", "server is shutting down");
    co_return Status::Error("websocket accept: server is shutting down");
  }
  state_ = State::kUpgraded;
  status_ = 101;
  // From here Beast's own timers guard the socket; retire the connection watchdog.
  conn_.phase_ = Connection::Phase::kUpgraded;
  conn_.ClearDeadline();
  conn_.deadline_.cancel();

  auto impl = std::make_unique<WebSocket::Impl>(conn_.shared_from_this());
  ws::stream_base::timeout timeouts;
  timeouts.handshake_timeout = std::chrono::duration_cast<std::chrono::seconds>(
      std::max(conn_.state_.options.header_timeout, std::chrono::milliseconds(1000)));
  timeouts.idle_timeout = options.idle_timeout;
  timeouts.keep_alive_pings = true;
  impl->stream.set_option(timeouts);
  impl->stream.set_option(ws::stream_base::decorator(
      [](ws::response_type& res) { res.set(bhttp::field::server, "sbx"); }));
  impl->stream.read_message_max(options.max_message);

  bhttp::request<bhttp::empty_body> request(conn_.parser_->get().base());
  boost::system::error_code ec;
  co_await impl->stream.async_accept(request, net::redirect_error(net::use_awaitable, ec));
  if (ec) {
    conn_.broken_ = true;
    co_return StatusFrom("websocket accept", ec);
  }
  co_return std::unique_ptr<WebSocket>(new WebSocket(std::move(impl)));
}

}  // namespace sbx::http

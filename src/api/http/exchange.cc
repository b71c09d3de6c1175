#include "api/http/exchange.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <boost/beast/websocket/rfc6455.hpp>
#include <sstream>

#include "api/http/connection.h"

namespace sbx::http {
namespace {

constexpr std::string_view kJson = "application/json";

template <typename Fields>
void SetHeaders(Fields& fields, const Headers& headers) {
  for (const auto& [name, value] : headers) fields.insert(name, value);
}

}  // namespace

nlohmann::json ErrorJson(std::string_view code, std::string_view message) {
  return {{"error", {{"code", code}, {"message", message}}}};
}

Exchange::Exchange(Connection& conn) : conn_(conn), body_limit_(RouteOptions().body_limit) {}
Exchange::~Exchange() = default;

std::string_view Exchange::method() const {
  auto m = conn_.parser_->get().method_string();
  return {m.data(), m.size()};
}

std::string_view Exchange::target() const {
  auto t = conn_.parser_->get().target();
  return {t.data(), t.size()};
}

std::string_view Exchange::path() const {
  std::string_view t = target();
  return t.substr(0, t.find('?'));
}

std::string_view Exchange::Header(std::string_view name) const {
  const auto& fields = conn_.parser_->get();
  auto it = fields.find(beast::string_view(name.data(), name.size()));
  if (it == fields.end()) return {};
  auto v = it->value();
  return {v.data(), v.size()};
}

bool Exchange::HasHeader(std::string_view name) const {
  const auto& fields = conn_.parser_->get();
  return fields.find(beast::string_view(name.data(), name.size())) != fields.end();
}

std::vector<std::pair<std::string, std::string>> Exchange::HeadersWithPrefix(
    std::string_view prefix) const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& field : conn_.parser_->get()) {
    auto name = field.name_string();
    if (name.size() < prefix.size() ||
        !beast::iequals(name.substr(0, prefix.size()),
                        beast::string_view(prefix.data(), prefix.size())))
      continue;
    auto value = field.value();
    out.emplace_back(std::string(name.data(), name.size()),
                     std::string(value.data(), value.size()));
  }
  return out;
}

std::optional<uint64_t> Exchange::content_length() const {
  auto len = conn_.parser_->content_length();
  if (!len) return std::nullopt;
  return *len;
}

std::string_view Exchange::remote() const { return conn_.remote_; }

std::string_view Exchange::remote_address() const { return conn_.address_; }

boost::asio::any_io_executor Exchange::executor() const { return conn_.executor(); }

bool Exchange::stopping() const { return conn_.stop_requested_ || conn_.state_.stopping.load(); }

// ---- Request body ----

net::awaitable<Status> Exchange::SendContinueIfExpected() {
  if (continue_sent_ || state_ != State::kNone) co_return Status();
  continue_sent_ = true;
  std::string_view expect = Header("Expect");
  if (!beast::iequals(beast::string_view(expect.data(), expect.size()), "100-continue")) {
    co_return Status();
  }
  static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
  co_return co_await conn_.WriteAll(net::buffer(kContinue.data(), kContinue.size()),
                                    "write 100 Continue");
}

net::awaitable<Result<size_t>> Exchange::ReadSome(char* buf, size_t n) {
  RequestParser& parser = *conn_.parser_;
  if (parser.is_done()) co_return size_t{0};
  if (n == 0) co_return Status::Error("read request body: empty buffer");
  if (conn_.broken_) co_return Status::Error("read request body: connection closed");
  Status continued = co_await SendContinueIfExpected();
  if (!continued.ok()) co_return continued;
  const ServerOptions& opt = conn_.state_.options;
  while (true) {
    parser.get().body().data = buf;
    parser.get().body().size = n;
    boost::system::error_code ec;
    conn_.timed_out_ = false;
    auto limit = opt.body_read_timeout;
    if (opt.min_body_rate > 0 && !slow_body_ok_) {
      // What the bytes so far pay for: the grace plus 1 s per min_body_rate bytes, of waiting.
      auto earned = opt.body_rate_grace +
                    std::chrono::milliseconds(conn_.bytes_in_ * 1000 / opt.min_body_rate);
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(earned - body_wait_);
      limit = std::clamp(left, std::chrono::milliseconds(0), limit);
    }
    conn_.SetDeadline(limit);
    auto waited_from = std::chrono::steady_clock::now();
    co_await bhttp::async_read_some(conn_.socket_, conn_.buffer_, parser,
                                    net::redirect_error(net::use_awaitable, ec));
    body_wait_ += std::chrono::steady_clock::now() - waited_from;
    conn_.ClearDeadline();
    size_t got = n - parser.get().body().size;
    parser.get().body().data = nullptr;
    if (ec == bhttp::error::need_buffer) ec = {};
    if (ec) co_return co_await BodyReadFailed(ec);
    conn_.bytes_in_ += got;
    if (got > 0 || parser.is_done()) co_return got;
  }
}

net::awaitable<Status> Exchange::BodyReadFailed(boost::system::error_code ec) {
  // Beast's own parse errors (bad chunk size or extension, a chunk line or trailer that does not
  // fit the connection's buffer) are the client's malformed framing; the end of stream and a
  // cut-off message are a client that went away.
  bool framing = ec.category() == bhttp::make_error_code(bhttp::error::bad_chunk).category() &&
                 ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message;
  bool slow = conn_.timed_out_;
  if (!(framing || slow) || state_ != State::kNone || conn_.broken_) {
    co_return conn_.Broken("read request body", ec);
  }
  conn_.close_after_ = true;  // the rest of the body cannot be told from a next request
  conn_.timed_out_ = false;
  if (slow) {
    co_await RespondError(408, "request_timeout", "request body arrived too slowly");
    co_return Status::Error("read request body: too slow", ETIMEDOUT);
  }
  std::string message = "malformed request body: " + ec.message();
  co_await RespondError(400, "bad_request", message);
  co_return Status::Error(message, EBADMSG);
}

net::awaitable<Result<std::string>> Exchange::ReadBody() {
  co_return co_await ReadBody(body_limit_);
}

net::awaitable<Result<std::string>> Exchange::ReadBody(size_t limit) {
  auto declared = content_length();
  bool too_large = declared && *declared > limit;
  std::string body;
  if (!too_large) {
    if (declared) body.reserve(*declared);
    char scratch[16 * 1024];
    while (true) {
      auto n = co_await ReadSome(scratch, sizeof(scratch));
      if (!n.ok()) co_return n.status();
      if (*n == 0) break;
      if (body.size() + *n > limit) {
        too_large = true;
        break;
      }
      body.append(scratch, *n);
    }
  }
  if (too_large) {
    std::string message = "request body exceeds " + std::to_string(limit) + " bytes";
    conn_.close_after_ = true;  // the rest of the body stays unread
    co_await RespondError(413, "payload_too_large", message);
    co_return Status::Error(message, EFBIG);
  }
  co_return body;
}

net::awaitable<Result<nlohmann::json>> Exchange::ReadJson() {
  auto body = co_await ReadBody();
  if (!body.ok()) co_return body.status();
  nlohmann::json parsed = ParseJsonBody(*body);
  if (parsed.is_discarded()) {
    co_await RespondError(400, "bad_request", "request body is not valid JSON");
    co_return Status::Error("request body is not valid JSON", EINVAL);
  }
  co_return parsed;
}

// ---- Fixed response ----

net::awaitable<void> Exchange::Respond(int status, std::string body, std::string_view content_type,
                                       const Headers& headers) {
  if (state_ != State::kNone) {
    spdlog::warn("http {} {}: second response ignored", method(), path());
    co_return;
  }
  state_ = State::kResponded;
  status_ = status;
  bhttp::response<bhttp::string_body> res;
  res.version(11);
  res.result(static_cast<unsigned>(status));
  res.set(bhttp::field::server, "sbx");
  if (!content_type.empty()) {
    res.set(bhttp::field::content_type,
            beast::string_view(content_type.data(), content_type.size()));
  }
  SetHeaders(res, headers);
  bool keep_alive = conn_.KeepAliveAllowed();
  if (!keep_alive) conn_.close_after_ = true;
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  Status written = co_await conn_.WriteMessage(res, "write response");
  if (!written.ok()) spdlog::debug("http {} {}: {}", method(), path(), written.message());
}

net::awaitable<void> Exchange::RespondJson(int status, const nlohmann::json& body,
                                           const Headers& headers) {
  co_await Respond(status, JsonText(body), kJson, headers);
}

net::awaitable<void> Exchange::RespondError(int status, std::string_view code,
                                            std::string_view message, const Headers& headers) {
  nlohmann::json body = error_shape_ == ErrorShape::kE2b
                            ? nlohmann::json{{"code", status}, {"message", message}}
                            : ErrorJson(code, message);
  co_await Respond(status, JsonText(body), kJson, headers);
}

// ---- Streamed response ----

net::awaitable<Status> Exchange::BeginStream(int status, std::string_view content_type,
                                             const Headers& headers,
                                             std::optional<uint64_t> content_length,
                                             bool hold_header) {
  if (state_ != State::kNone) co_return Status::Error("begin stream: response already started");
  if (stopping()) {
    co_await RespondError(503, "unavailable", "server is shutting down");
    co_return Status::Error("begin stream: server is shutting down");
  }
  state_ = State::kStreaming;
  status_ = status;
  conn_.phase_ = Connection::Phase::kStreaming;
  bhttp::response<bhttp::empty_body> res;
  res.version(11);
  res.result(static_cast<unsigned>(status));
  res.set(bhttp::field::server, "sbx");
  res.set(bhttp::field::content_type, beast::string_view(content_type.data(), content_type.size()));
  SetHeaders(res, headers);
  if (content_length) {
    res.content_length(*content_length);
    stream_length_ = *content_length;
  } else {
    res.chunked(true);
  }
  bool keep_alive = conn_.KeepAliveAllowed();
  if (!keep_alive) conn_.close_after_ = true;
  res.keep_alive(keep_alive);
  if (conn_.broken_) co_return Status::Error("begin stream: connection closed");
  if (hold_header) {
    std::ostringstream head;
    head << res.base();
    held_header_ = std::move(head).str();
    co_return Status();
  }
  bhttp::response_serializer<bhttp::empty_body> serializer(res);
  boost::system::error_code ec;
  conn_.timed_out_ = false;
  conn_.SetDeadline(conn_.state_.options.write_timeout);
  size_t n = co_await bhttp::async_write_header(conn_.socket_, serializer,
                                                net::redirect_error(net::use_awaitable, ec));
  conn_.ClearDeadline();
  conn_.bytes_out_ += n;
  if (ec) co_return conn_.Broken("write stream header", ec);
  co_return Status();
}

template <typename Buffers>
net::awaitable<Status> Exchange::SendBody(const Buffers& body, const char* what) {
  if (held_header_.empty()) co_return co_await conn_.WriteAll(body, what);
  std::string header = std::move(held_header_);  // lives here until the write is done
  held_header_.clear();
  co_return co_await conn_.WriteAll(beast::buffers_cat(net::buffer(header), body), what);
}

net::awaitable<Status> Exchange::WriteChunk(std::string_view data) {
  co_return co_await WriteChunk({}, data);
}

net::awaitable<Status> Exchange::WriteChunk(std::string_view head, std::string_view data) {
  if (state_ != State::kStreaming) co_return Status::Error("write chunk: no stream in progress");
  size_t size = head.size() + data.size();
  if (size == 0) co_return Status();
  conn_.timed_out_ = false;
  std::array<net::const_buffer, 2> parts = {net::const_buffer(head.data(), head.size()),
                                            net::const_buffer(data.data(), data.size())};
  if (stream_length_) {
    if (size > *stream_length_) {
      conn_.broken_ = true;
      co_return Status::Error("write chunk: more data than the declared Content-Length");
    }
    *stream_length_ -= size;
    co_return co_await SendBody(parts, "write body");
  }
  co_return co_await SendBody(bhttp::make_chunk(parts), "write chunk");
}

net::awaitable<Status> Exchange::EndStream() {
  if (state_ != State::kStreaming) co_return Status::Error("end stream: no stream in progress");
  if (stream_length_ && *stream_length_ != 0) {
    co_return Status::Error("end stream: " + std::to_string(*stream_length_) +
                            " bytes short of the declared Content-Length");
  }
  Status status;
  if (!stream_length_)
    status = co_await SendBody(bhttp::make_chunk_last(), "write last chunk");
  else if (!held_header_.empty())  // an empty fixed-length body: the header alone
    status = co_await SendBody(net::const_buffer(), "write header");
  if (status.ok()) StreamEnded();
  co_return status;
}

net::awaitable<Status> Exchange::EndStream(std::string_view head, std::string_view data) {
  if (state_ != State::kStreaming) co_return Status::Error("end stream: no stream in progress");
  if (stream_length_ || head.size() + data.size() == 0) {
    Status wrote = co_await WriteChunk(head, data);
    if (!wrote.ok()) co_return wrote;
    co_return co_await EndStream();
  }
  std::array<net::const_buffer, 2> parts = {net::const_buffer(head.data(), head.size()),
                                            net::const_buffer(data.data(), data.size())};
  Status status = co_await SendBody(
      beast::buffers_cat(bhttp::make_chunk(parts), bhttp::make_chunk_last()), "write last chunk");
  if (status.ok()) StreamEnded();
  co_return status;
}

void Exchange::StreamEnded() {
  state_ = State::kStreamEnded;
  conn_.phase_ = Connection::Phase::kHandler;
}

bool Exchange::WantsWebSocket() const {
  return boost::beast::websocket::is_upgrade(conn_.parser_->get().base());
}

}  // namespace sbx::http

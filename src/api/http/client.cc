#include "api/http/client.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <exception>
#include <limits>
#include <optional>

namespace sbx::http {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using Stream = beast::basic_stream<net::generic::stream_protocol>;

// errno-carrying Status for system errors; other categories (Beast, Asio misc) as text.
inline Status StatusFrom(std::string what, const boost::system::error_code& ec) {
  if (ec.category() == boost::system::system_category() ||
      ec.category() == boost::system::generic_category()) {
    return Status::Error(std::move(what), ec.value());
  }
  return Status::Error(std::move(what) + ": " + ec.message());
}

std::string Describe(const Endpoint& e) {
  return e.unix_socket.empty() ? e.host + ":" + std::to_string(e.port) : "unix:" + e.unix_socket;
}

net::awaitable<Status> Connect(Stream& stream, const Endpoint& endpoint,
                               std::chrono::milliseconds timeout) {
  boost::system::error_code ec;
  stream.expires_after(timeout);
  if (!endpoint.unix_socket.empty()) {
    net::local::stream_protocol::endpoint ep(endpoint.unix_socket);
    co_await stream.async_connect(ep, net::redirect_error(net::use_awaitable, ec));
  } else {
    net::ip::tcp::resolver resolver(stream.get_executor());
    auto results = co_await resolver.async_resolve(endpoint.host, std::to_string(endpoint.port),
                                                   net::redirect_error(net::use_awaitable, ec));
    if (ec) co_return StatusFrom("resolve " + Describe(endpoint), ec);
    ec = net::error::host_not_found;
    for (const auto& entry : results) {
      ec = {};
      co_await stream.async_connect(entry.endpoint(), net::redirect_error(net::use_awaitable, ec));
      if (!ec) break;
      stream.close();
    }
  }
  if (ec) co_return StatusFrom("connect " + Describe(endpoint), ec);
  co_return Status();
}

net::awaitable<Result<Response>> DoRequest(const Endpoint& endpoint, std::string_view method,
                                           std::string_view target, const ClientHeaders& headers,
                                           std::string_view body, std::chrono::milliseconds timeout,
                                           const DataCallback* on_data) {
  Stream stream(co_await net::this_coro::executor);
  Status connected = co_await Connect(stream, endpoint, timeout);
  if (!connected.ok()) co_return connected;
  const std::string where = std::string(method) + " " + Describe(endpoint) + std::string(target);

  bhttp::request<bhttp::string_body> req;
  req.method_string(beast::string_view(method.data(), method.size()));
  req.target(beast::string_view(target.data(), target.size()));
  req.version(11);
  // With the port (RFC 9110 7.2): servers build URLs for the client from it (MCP's expose_port).
  std::string host =
      endpoint.host.find(':') != std::string::npos ? "[" + endpoint.host + "]" : endpoint.host;
  if (endpoint.port != 80) host += ":" + std::to_string(endpoint.port);
  req.set(bhttp::field::host, endpoint.unix_socket.empty() ? host : "localhost");
  for (const auto& [name, value] : headers) req.insert(name, value);
  req.body() = std::string(body);
  req.keep_alive(false);
  req.prepare_payload();
  boost::system::error_code ec;
  stream.expires_after(timeout);
  co_await bhttp::async_write(stream, req, net::redirect_error(net::use_awaitable, ec));
  // A server may answer early (413, 401) and stop reading: still try to read its response.
  bool write_failed = static_cast<bool>(ec);

  beast::flat_buffer buffer;
  bhttp::response_parser<bhttp::buffer_body> parser;
  parser.body_limit(std::numeric_limits<uint64_t>::max());  // not none: Boost 1.74 bug
  stream.expires_after(timeout);
  co_await bhttp::async_read_header(stream, buffer, parser,
                                    net::redirect_error(net::use_awaitable, ec));
  if (ec) {
    co_return StatusFrom(where + (write_failed ? ": write request" : ": read response"), ec);
  }
  Response response;
  response.status = static_cast<int>(parser.get().result_int());
  for (const auto& field : parser.get()) {
    response.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  char scratch[64 * 1024];
  while (!parser.is_done()) {
    parser.get().body().data = scratch;
    parser.get().body().size = sizeof(scratch);
    stream.expires_after(timeout);
    co_await bhttp::async_read_some(stream, buffer, parser,
                                    net::redirect_error(net::use_awaitable, ec));
    if (ec == bhttp::error::need_buffer) ec = {};
    if (ec) co_return StatusFrom(where + ": read response body", ec);
    size_t got = sizeof(scratch) - parser.get().body().size;
    if (got == 0) continue;
    if (on_data != nullptr) {
      if (!(*on_data)(std::string_view(scratch, got))) break;
    } else {
      response.body.append(scratch, got);
    }
  }
  stream.socket().shutdown(net::socket_base::shutdown_both, ec);
  co_return response;
}

Result<Response> Run(const Endpoint& endpoint, std::string_view method, std::string_view target,
                     const ClientHeaders& headers, std::string_view body,
                     std::chrono::milliseconds timeout, const DataCallback* on_data) {
  net::io_context ioc(1);
  std::optional<Result<Response>> result;
  std::exception_ptr error;
  net::co_spawn(
      ioc,
      [&]() -> net::awaitable<void> {
        result.emplace(
            co_await DoRequest(endpoint, method, target, headers, body, timeout, on_data));
      },
      [&](std::exception_ptr e) { error = e; });
  ioc.run();
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      return Status::Error(std::string("http request: ") + e.what());
    } catch (...) {
      return Status::Error("http request: unknown exception");
    }
  }
  if (!result) return Status::Error("http request: did not complete");
  return std::move(*result);
}

}  // namespace

std::string_view Response::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (beast::iequals(beast::string_view(k.data(), k.size()),
                       beast::string_view(name.data(), name.size()))) {
      return v;
    }
  }
  return {};
}

Result<Response> Request(const Endpoint& endpoint, std::string_view method, std::string_view target,
                         const ClientHeaders& headers, std::string_view body,
                         std::chrono::milliseconds timeout) {
  return Run(endpoint, method, target, headers, body, timeout, nullptr);
}

Result<Response> Request(const std::string& host, uint16_t port, std::string_view method,
                         std::string_view target, const ClientHeaders& headers,
                         std::string_view body, std::chrono::milliseconds timeout) {
  Endpoint endpoint;
  endpoint.host = host;
  endpoint.port = port;
  return Run(endpoint, method, target, headers, body, timeout, nullptr);
}

Result<Response> RequestStream(const Endpoint& endpoint, std::string_view method,
                               std::string_view target, const ClientHeaders& headers,
                               std::string_view body, std::chrono::milliseconds timeout,
                               const DataCallback& on_data) {
  return Run(endpoint, method, target, headers, body, timeout, &on_data);
}

}  // namespace sbx::http

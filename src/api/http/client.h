// A small blocking HTTP/1.1 client for tests and the CLI: one request per connection, over TCP or
// a unix socket, with a stall timeout. Each call runs its own private io_context, so it is safe
// to call from any thread (including many at once) and never touches the server's threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace sbx::http {

struct Endpoint {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string unix_socket;  // when set, used instead of host:port
};

struct Response {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;  // empty for RequestStream
  // First value of header `name` (case-insensitive), "" when absent.
  std::string_view Header(std::string_view name) const;
};

using ClientHeaders = std::vector<std::pair<std::string, std::string>>;

// Sends one request and reads the whole response. `timeout` bounds each network step (connect,
// write, every read), not the total, so a long but steady response is fine. A non-2xx status is
// still a successful Result: only transport failures are errors.
Result<Response> Request(const Endpoint& endpoint, std::string_view method, std::string_view target,
                         const ClientHeaders& headers = {}, std::string_view body = {},
                         std::chrono::milliseconds timeout = std::chrono::seconds(30));
Result<Response> Request(const std::string& host, uint16_t port, std::string_view method,
                         std::string_view target, const ClientHeaders& headers = {},
                         std::string_view body = {},
                         std::chrono::milliseconds timeout = std::chrono::seconds(30));

// Like Request, but hands the response body to `on_data` as it arrives (chunk boundaries are not
// preserved) instead of collecting it. `on_data` returns false to stop early: the connection is
// closed and the call returns the response so far.
using DataCallback = std::function<bool(std::string_view)>;
Result<Response> RequestStream(const Endpoint& endpoint, std::string_view method,
                               std::string_view target, const ClientHeaders& headers,
                               std::string_view body, std::chrono::milliseconds timeout,
                               const DataCallback& on_data);

}  // namespace sbx::http

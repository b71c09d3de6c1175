// The CLI's side of the REST API (docs/api.md): where the daemon is and which key to send
// (--url/$SBX_URL, --api-key/$SBX_API_KEY, else what `sbx serve` left in the data directory), and
// blocking request helpers that turn the API's `{"error":{"code","message"}}` answers and transport
// failures into a Status with a message fit to print after "sbx: ".
#pragma once

#include <CLI/CLI.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "api/http/client.h"
#include "common/status.h"

namespace sbx::cli {

// Flags every client verb takes.
struct ConnectionFlags {
  std::string url;      // http://HOST:PORT or unix:/path
  std::string api_key;  // the secret
  bool json = false;    // print the API's JSON instead of a table
};

// Adds --url, --api-key and --json to `verb`.
void AddConnectionFlags(CLI::App* verb, ConnectionFlags* flags, bool with_json = true);

struct Connection {
  std::string url;  // as shown in messages
  http::Endpoint endpoint;
  std::string api_key;
};

// Resolves the daemon's address and the key: flags, then $SBX_URL / $SBX_API_KEY, then
// <data_dir>/serve.port (else port 7777 on 127.0.0.1) and <data_dir>/api-key.
Result<Connection> ResolveConnection(const std::string& data_dir, const ConnectionFlags& flags);

// An API answer that arrived (any HTTP status) with its body parsed when it is JSON.
struct ApiResponse {
  int status = 0;
  nlohmann::json body;  // null when the body was empty or not JSON
  std::string raw;
};

// "the API's error message" for a non-2xx answer; includes the HTTP status when the body has none.
Status ApiError(int status, const std::string& body);

// Blocking calls on one daemon. Each call opens its own connection, so calls from several threads
// at once are fine.
class Client {
 public:
  explicit Client(Connection connection) : c_(std::move(connection)) {}

  const Connection& connection() const { return c_; }

  // Sends `body` (JSON unless null) and returns the answer, whatever its status. Fails only when
  // the daemon could not be reached.
  Result<ApiResponse> Send(std::string_view method, const std::string& target,
                           const nlohmann::json& body = nullptr,
                           const http::ClientHeaders& extra = {});
  // Send with a raw (not JSON) body.
  Result<ApiResponse> SendBytes(std::string_view method, const std::string& target,
                                std::string_view body);
  // Like Send, but a non-2xx answer is a failure carrying the API's message.
  Result<nlohmann::json> Call(std::string_view method, const std::string& target,
                              const nlohmann::json& body = nullptr,
                              const http::ClientHeaders& extra = {});

  // Sends a request whose answer is an NDJSON stream and hands each event to `on_event` (return
  // false to stop). A non-2xx answer is a failure carrying the API's message.
  Status StreamEvents(std::string_view method, const std::string& target,
                      const nlohmann::json& body,
                      const std::function<bool(const nlohmann::json&)>& on_event);

  // Streams a raw response body to `on_data` (return false to stop). Returns the HTTP status; the
  // body of a non-2xx answer also goes to `on_data` (callers that write it somewhere check the
  // status before keeping it).
  Result<int> Download(const std::string& target, const http::DataCallback& on_data);

  // Sends a body produced piece by piece (chunked transfer encoding): `produce` fills the buffer
  // and returns the bytes written, 0 at the end. The upload is never held in memory whole.
  using Producer = std::function<Result<size_t>(char* buf, size_t size)>;
  Result<ApiResponse> Upload(std::string_view method, const std::string& target,
                             const std::string& content_type, const Producer& produce);

  // Connects `socket` (not yet open) to the daemon, for protocols the helpers above do not speak
  // (the PTY WebSocket).
  Status ConnectSocket(boost::asio::generic::stream_protocol::socket& socket) const;
  // "cannot reach the sbx daemon at URL ...: <transport>".
  Status Unreachable(const Status& transport) const;

 private:
  http::ClientHeaders Headers(bool json_body) const;

  Connection c_;
};

// Decodes standard base64 (the API's `data` fields). Fails on anything that is not base64.
Result<std::string> DecodeBase64(std::string_view in);

// Percent-encodes a query parameter value.
std::string Q(std::string_view value);

}  // namespace sbx::cli

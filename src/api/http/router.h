// Router: maps method + path pattern to a coroutine handler, with an optional "before" hook (auth)
// that runs ahead of routing. Patterns are literal segments, `{name}` segments that match exactly
// one segment, and a final `{name...}` that matches the rest of the path (zero or more segments):
//
//   router.Handle("GET", "/v1/sandboxes/{id}", GetSandbox);
//   router.Handle("PUT", "/v1/sandboxes/{id}/files/{path...}", PutFile, {.body_limit = 0});
//
// When several patterns match, the most specific wins: segment by segment a literal beats a
// `{name}`, which beats a `{name...}`. Parameters are percent-decoded ("%2F" becomes '/').
// Unknown paths get 404 `not_found`, a known path with the wrong method gets 405
// `method_not_allowed` with an `Allow` header, and an undecodable path gets 400 `bad_request`.
// Those errors, and every RespondError of the request, take the ErrorShape SetErrorShape picks
// for the path (sbx's own by default), so an E2B client gets E2B's error body even for a path
// nothing serves.
//
// Thread-safety: configure (Handle, SetBefore) before the Server starts; afterwards the router is
// only read, from any number of threads.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on
#include <boost/asio/awaitable.hpp>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sbx::http {

class Exchange;
enum class ErrorShape;

// A handler answers one request. It must respond (Respond*, a stream, or a WebSocket upgrade);
// returning without a response, or throwing, makes the server answer 500 `internal`.
using Handler = std::function<boost::asio::awaitable<void>(Exchange&)>;

// Runs before routing. Returns true to continue, or false after responding itself (e.g. 401).
using Middleware = std::function<boost::asio::awaitable<bool>(Exchange&)>;

struct RouteOptions {
  // Largest body Exchange::ReadBody()/ReadJson() accept on this route (413 beyond). Streaming
  // reads with ReadSome are not limited by it.
  size_t body_limit = size_t{1} << 20;
};

// Decoded path parameters of the matched route, in pattern order.
class PathParams {
 public:
  using Items = std::vector<std::pair<std::string, std::string>>;
  // The value of `name`, or "" when the pattern has no such parameter.
  const std::string& Get(std::string_view name) const;
  const Items& items() const { return items_; }
  void Add(std::string name, std::string value) {
    items_.emplace_back(std::move(name), std::move(value));
  }

 private:
  Items items_;
};

class Router {
 public:
  // Registers `handler` for `method` (upper case, e.g. "GET") and `pattern`. Throws
  // std::invalid_argument for a malformed pattern (a programming error, caught at startup).
  void Handle(std::string method, std::string_view pattern, Handler handler,
              RouteOptions options = {});
  void Get(std::string_view p, Handler h, RouteOptions o = {}) {
    Handle("GET", p, std::move(h), o);
  }
  void Post(std::string_view p, Handler h, RouteOptions o = {}) {
    Handle("POST", p, std::move(h), o);
  }
  void Put(std::string_view p, Handler h, RouteOptions o = {}) {
    Handle("PUT", p, std::move(h), o);
  }
  void Delete(std::string_view p, Handler h, RouteOptions o = {}) {
    Handle("DELETE", p, std::move(h), o);
  }

  void SetBefore(Middleware before) { before_ = std::move(before); }
  // Picks the error body of each request by its raw path, before the before hook runs. Unset:
  // the exchange keeps the shape it has (ErrorShape::kNative unless an outer router set it).
  void SetErrorShape(std::function<ErrorShape(std::string_view path)> shape_for) {
    shape_for_ = std::move(shape_for);
  }
  // Applies SetErrorShape's choice to `ex` (the server calls it for errors it answers before
  // dispatching, such as a malformed query string).
  void ApplyErrorShape(Exchange& ex) const;

  // The outcome of matching a request line, exposed for tests.
  struct Match {
    enum class Kind { kFound, kNotFound, kMethodNotAllowed, kBadPath } kind = Kind::kNotFound;
    const Handler* handler = nullptr;
    RouteOptions options;
    PathParams params;
    std::string allow;  // for kMethodNotAllowed: "GET, POST"
  };
  // `path` is the raw (still percent-encoded) path without the query string.
  Match Find(std::string_view method, std::string_view path) const;

  // Runs the before hook, routes, and calls the handler (or answers 400/404/405). Called by the
  // server once per request; exceptions from handlers propagate to the server.
  boost::asio::awaitable<void> Dispatch(Exchange& ex) const;

 private:
  struct Segment {
    enum class Kind { kLiteral, kParam, kRest } kind;
    std::string text;  // literal text or parameter name
  };
  struct Route {
    std::string method;
    std::vector<Segment> segments;
    Handler handler;
    RouteOptions options;
  };

  std::vector<Route> routes_;
  Middleware before_;
  std::function<ErrorShape(std::string_view)> shape_for_;
};

}  // namespace sbx::http

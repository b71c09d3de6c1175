// What the route files of the native API share (api.cc, commands.cc, files.cc, archives.cc):
// authentication, the error answer, the blocking pool, query and JSON field parsing, and the
// session of the sandbox a request names. Internal to api/v1.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "api/http/exchange.h"
#include "api/v1/api.h"
#include "common/status.h"
#include "sandbox/session.h"

namespace sbx::api::v1 {

using boost::asio::awaitable;
using nlohmann::json;

std::string IsoTime(int64_t ms);

// Answers `s` as the one errno table of api/errors.h says (499 for a client that went away).
awaitable<void> Fail(http::Exchange& ex, const Status& s, const http::Headers& headers = {});

using AuthedHandler = std::function<awaitable<void>(http::Exchange&, const store::ApiKeyRecord&)>;
// Wraps a handler with API key authentication: `Authorization: Bearer <key>` or `X-API-Key`.
http::Handler Authed(ApiContext& ctx, AuthedHandler h);

// The session of the sandbox {id} of the request for `key`, or nullptr once the error is answered.
awaitable<std::shared_ptr<sandbox::Session>> SessionOrFail(ApiContext& ctx, http::Exchange& ex,
                                                           const store::ApiKeyRecord& key);

// Runs blocking `f` on the blocking pool and resumes the caller with its result.
template <typename F>
awaitable<decltype(std::declval<F>()())> OnPool(boost::asio::thread_pool& pool, F f) {
  using R = decltype(f());
  std::optional<R> out;
  co_await boost::asio::co_spawn(
      pool,
      [&]() -> awaitable<void> {
        out.emplace(f());
        co_return;
      },
      boost::asio::use_awaitable);
  co_return std::move(*out);
}

// ---- request fields ----
Result<std::map<std::string, std::string>> StringMap(const json& j, const char* field);
// A number of seconds from `min_s` to `max_s`, as milliseconds; 0 when absent.
Result<int64_t> SecondsField(const json& j, const char* field, double min_s, double max_s);
Result<bool> BoolField(const json& j, const char* field, bool def);
Result<int64_t> IntField(const json& j, const char* field, int64_t def);
Result<std::string> PathQuery(const http::Exchange& ex, const char* name = "path");
Result<int64_t> IntQuery(const http::Exchange& ex, const char* name, int64_t def);
// A flag in the query: "true" or "1" set it.
bool FlagQuery(const http::Exchange& ex, const char* name);
// A signal by number or name ("TERM", "SIGTERM"); 0 for anything else.
int SignalNumber(const json& j);

// A command's timeout: a millisecond at least (less would round to 0, "no timeout").
inline constexpr double kMinCommandTimeoutS = 0.001;
inline constexpr double kMaxCommandTimeoutS = 1e7;

// ---- route groups ----
void Commands(http::Router& r, ApiContext& ctx);  // commands.cc, with the PTY
void Files(http::Router& r, ApiContext& ctx);     // files.cc
void Archives(http::Router& r, ApiContext& ctx);  // archives.cc

}  // namespace sbx::api::v1

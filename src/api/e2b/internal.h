// Shared between the E2B control plane (control_plane.cc) and envd (envd.cc).
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <optional>
#include <string>

#include "api/context.h"
#include "api/http/router.h"

namespace sbx::api::e2b {

// Runs blocking `f` on the blocking pool and resumes the caller with its result.
template <typename F>
boost::asio::awaitable<decltype(std::declval<F>()())> OnPool(boost::asio::thread_pool& pool, F f) {
  using R = decltype(f());
  std::optional<R> out;
  co_await boost::asio::co_spawn(
      pool,
      [&]() -> boost::asio::awaitable<void> {
        out.emplace(f());
        co_return;
      },
      boost::asio::use_awaitable);
  co_return std::move(*out);
}

// The envdAccessToken of a sandbox: HMAC-SHA256 under the install secret of the owner key's id
// and the sandbox id, like network::TrafficToken (see there). It also keys the sandbox's pre-signed
// /files URLs (FileSignature), which the E2B SDK computes from it on the client side.
inline std::string EnvdToken(const InstallSecret& secret, const std::string& owner_key_id,
                             const std::string& sandbox_id) {
  return secret.HmacHex("sbx-envd-token\n" + owner_key_id + "\n" + sandbox_id);
}
// The trafficAccessToken is network::TrafficToken (shared with the native API): sbx never serves
// ports publicly (threats.md row 37).
using network::TrafficToken;

void RegisterControlPlane(http::Router& router, ApiContext& ctx);
void RegisterEnvd(http::Router& router, ApiContext& ctx);

}  // namespace sbx::api::e2b

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

#include "api/v1/api.h"
#include "store/store.h"

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

// The envdAccessToken of a sandbox: derived from its owner key's stored hash, so it needs no
// storage of its own, survives restarts and dies with the key.
inline std::string EnvdToken(const store::ApiKeyRecord& key, const std::string& sandbox_id) {
  return store::Sha256Hex("sbx-e2b-envd-token\n" + key.hash + "\n" + sandbox_id);
}
// The trafficAccessToken is api::TrafficToken (shared with the native API): sbx never serves
// ports publicly (threats.md row 37).
using api::TrafficToken;

void RegisterControlPlane(http::Router& router, ApiContext& ctx);
void RegisterEnvd(http::Router& router, ApiContext& ctx);

}  // namespace sbx::api::e2b

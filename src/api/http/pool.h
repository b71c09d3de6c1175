// Running blocking work (a lifecycle call that waits on the kernel, a store read) off the I/O
// threads, for every facade: one OnPool, so that none writes its own.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's awaitable.hpp uses std::exchange without it
// clang-format on

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <optional>

namespace sbx::http {

// Runs blocking `f` on `pool` and resumes the caller (on its own executor) with its result.
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

}  // namespace sbx::http

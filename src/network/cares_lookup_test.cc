#include "network/cares_lookup.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>

#include "network/dns_test_server.h"

namespace sbx::network {
namespace {

using testing::FakeUpstream;

// Waits (bounded) for one Resolve's answer and counts how often done ran.
struct Waiter {
  std::promise<Result<std::vector<address>>> promise;
  std::atomic<int> calls{0};
  std::function<void(Result<std::vector<address>>)> Done() {
    return [this](Result<std::vector<address>> r) {
      if (calls++ == 0) promise.set_value(std::move(r));
    };
  }
  Result<std::vector<address>> Get() {
    auto future = promise.get_future();
    if (future.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      return Status::Error("test: no answer in 30s");
    }
    return future.get();
  }
};

CaresLookupConfig Config(const FakeUpstream& upstream, bool ipv6 = false) {
  CaresLookupConfig config;
  config.cares.servers = {upstream.address()};
  config.cares.timeout_ms = 300;
  config.cares.tries = 1;
  config.ipv6 = ipv6;
  return config;
}

TEST(CaresLookup, ResolvesFromTheUpstream) {
  FakeUpstream upstream("127.0.0.2");
  upstream.Set("pypi.test", {.a = {"198.18.0.10", "198.18.0.11"}, .aaaa = {"2001:db8::10"}});
  auto lookup = CaresLookup::Start(Config(upstream));
  ASSERT_TRUE(lookup.ok()) << lookup.status().message();
  Waiter w;
  (*lookup)->Resolve("PyPI.test", w.Done());
  auto r = w.Get();
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].to_string(), "198.18.0.10");
  EXPECT_EQ((*r)[1].to_string(), "198.18.0.11");
  EXPECT_EQ(w.calls.load(), 1);
  // IPv4 only: no AAAA was asked.
  for (const std::string& name : upstream.asked()) EXPECT_EQ(name, "pypi.test");
  EXPECT_EQ(upstream.queries(), 1);
}

TEST(CaresLookup, AsksAaaaWithIpv6) {
  FakeUpstream upstream("127.0.0.2");
  upstream.Set("pypi.test", {.a = {"198.18.0.10"}, .aaaa = {"2001:db8::10"}});
  auto lookup = CaresLookup::Start(Config(upstream, true));
  ASSERT_TRUE(lookup.ok()) << lookup.status().message();
  Waiter w;
  (*lookup)->Resolve("pypi.test", w.Done());
  auto r = w.Get();
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::set<std::string> got;
  for (auto& a : *r) got.insert(a.to_string());
  EXPECT_EQ(got, (std::set<std::string>{"198.18.0.10", "2001:db8::10"}));
}

TEST(CaresLookup, UnknownNameIsEnoent) {
  FakeUpstream upstream("127.0.0.2");
  auto lookup = CaresLookup::Start(Config(upstream));
  ASSERT_TRUE(lookup.ok());
  Waiter w;
  (*lookup)->Resolve("nope.test", w.Done());
  auto r = w.Get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().err(), ENOENT) << r.status().message();
  Waiter bad;
  (*lookup)->Resolve("a b\n", bad.Done());
  EXPECT_EQ(bad.Get().status().err(), EINVAL);
}

TEST(CaresLookup, SilentUpstreamTimesOut) {
  FakeUpstream upstream("127.0.0.2");
  upstream.SetSilent(true);
  auto lookup = CaresLookup::Start(Config(upstream));
  ASSERT_TRUE(lookup.ok());
  Waiter w;
  auto start = std::chrono::steady_clock::now();
  (*lookup)->Resolve("slow.test", w.Done());
  auto r = w.Get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().err(), ETIMEDOUT) << r.status().message();
  // Bounded by the configured timeout (300 ms, one try), with slack for a slow machine.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(CaresLookup, StopEndsLookupsInFlightOnce) {
  FakeUpstream upstream("127.0.0.2");
  upstream.SetSilent(true);
  CaresLookupConfig config = Config(upstream);
  config.cares.timeout_ms = 60'000;
  auto lookup = CaresLookup::Start(config);
  ASSERT_TRUE(lookup.ok());
  Waiter w;
  (*lookup)->Resolve("slow.test", w.Done());
  (*lookup)->Stop();
  auto r = w.Get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().err(), ECANCELED) << r.status().message();
  Waiter after;
  (*lookup)->Resolve("slow.test", after.Done());
  EXPECT_EQ(after.Get().status().err(), ECANCELED);
  lookup->reset();
  EXPECT_EQ(w.calls.load(), 1);
  EXPECT_EQ(after.calls.load(), 1);
}

TEST(CaresLookup, BadUpstreamIsEinval) {
  for (const char* bad : {"1.2.3.4", "1.2.3.4:0", "x:53", "[::1]53", "1.2.3.4:99999", ""}) {
    CaresLookupConfig config;
    config.cares.servers = {bad};
    auto lookup = CaresLookup::Start(config);
    ASSERT_FALSE(lookup.ok()) << bad;
    EXPECT_EQ(lookup.status().err(), EINVAL) << bad;
  }
  EXPECT_TRUE(ParseUpstream("[::1]:5353").ok());
  EXPECT_TRUE(ParseUpstream("127.0.0.1:53").ok());
}

}  // namespace
}  // namespace sbx::network

// c-ares on a thread of its own: the upstream side of sbx's DNS (the resolver's forwarded
// queries, resolver.h) and the host-side lookup the egress proxy re-resolves names with
// (CaresLookup, box_net.h's HostLookup).
//
// Why a thread: c-ares 1.18 has no event-loop integration beyond "here are my sockets" and a
// channel is not thread-safe, so one thread owns each channel and runs its poll loop; work is
// handed to it through a queue (Post) and c-ares's callbacks run on it.
//
// Servers: `servers` as "ADDR:PORT" ("[v6]:port" for IPv6), the daemon's --upstream-dns; empty:
// the host's /etc/resolv.conf nameservers. Only DNS is asked: neither the host's /etc/hosts nor
// resolv.conf's search domains apply (a box's name means what upstream DNS says, for the resolver
// and the proxy alike).
#pragma once

#include <ares.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/fd.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "network/box_net.h"

namespace sbx::network {

struct CaresOptions {
  std::vector<std::string> servers;  // "ADDR:PORT"; empty: /etc/resolv.conf
  int timeout_ms = 2000;             // first try, per server (c-ares doubles it on later rounds)
  int tries = 2;                     // rounds over the servers before ARES_ETIMEOUT
};

// Checks one "ADDR:PORT" / "[v6]:PORT" (the --upstream-dns syntax); EINVAL naming it otherwise.
Status ParseUpstream(const std::string& server);

class CaresChannel {
 public:
  // Makes the channel and starts its thread. EINVAL for a bad server, the c-ares error otherwise.
  static Result<std::unique_ptr<CaresChannel>> Start(const CaresOptions& options);
  ~CaresChannel();  // Stop()
  CaresChannel(const CaresChannel&) = delete;
  CaresChannel& operator=(const CaresChannel&) = delete;

  // Runs `work` on the channel's thread with the channel (to ares_send, ares_getaddrinfo).
  // Returns false, without running it, once Stop() has begun: the caller answers its own
  // callback then. Work posted before Stop() always runs, and the queries it starts are ended
  // (ARES_ECANCELLED or ARES_EDESTRUCTION) by Stop(), so every c-ares callback runs exactly once.
  bool Post(std::function<void(ares_channel)> work);

  // Ends every query (their callbacks run, on the channel's thread) and joins it. Idempotent;
  // must not be called from the channel's thread (a c-ares callback).
  void Stop();

 private:
  CaresChannel() = default;
  void Loop();

  ares_channel channel_ = nullptr;  // only the thread touches it after Start
  UniqueFd wake_;                   // eventfd: work queued or Stop
  Mutex mu_;
  std::vector<std::function<void(ares_channel)>> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

struct CaresLookupConfig {
  CaresOptions cares;
  bool ipv6 = false;  // AAAA as well as A
};

// HostLookup through c-ares's ares_getaddrinfo: A, plus AAAA when ipv6; the addresses in the
// order upstream gave them, without duplicates. done gets ENOENT ("no such name") for NXDOMAIN or
// no address, ETIMEDOUT when no server answered within the options' tries, ECANCELED after Stop,
// EINVAL for a name that is not a DNS name, EIO for other failures. Thread-safe.
class CaresLookup : public HostLookup {
 public:
  static Result<std::unique_ptr<CaresLookup>> Start(CaresLookupConfig config);
  ~CaresLookup() override;  // Stop()

  // Calls done exactly once, on the lookup's thread (or on the caller's when already stopped).
  void Resolve(const std::string& name,
               std::function<void(Result<std::vector<address>>)> done) override;
  // Ends every lookup in flight (done gets ECANCELED) and joins the thread. Idempotent.
  void Stop();

 private:
  explicit CaresLookup(bool ipv6) : ipv6_(ipv6) {}
  bool ipv6_;
  std::unique_ptr<CaresChannel> channel_;
};

}  // namespace sbx::network

#include "network/cares_lookup.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <cerrno>
#include <cstring>

namespace sbx::network {
namespace {

Status AresError(const std::string& what, int status) {
  return Status::Error(what + ": " + ares_strerror(status), EIO);
}

void InitLibrary() {
  static std::once_flag once;
  // ares_library_init does real work only on Windows; its status is checked by ares_init_options.
  std::call_once(once, [] { (void)ares_library_init(ARES_LIB_INIT_ALL); });
}

}  // namespace

Status ParseUpstream(const std::string& server) {
  auto bad = [&](const char* why) {
    return Status::Error("upstream DNS server \"" + server + "\": " + why + " (want ADDR:PORT)",
                         EINVAL);
  };
  std::string host, port;
  if (!server.empty() && server[0] == '[') {
    size_t close = server.find(']');
    if (close == std::string::npos || close + 1 >= server.size() || server[close + 1] != ':') {
      return bad("no port after the bracketed address");
    }
    host = server.substr(1, close - 1);
    port = server.substr(close + 2);
    boost::system::error_code ec;
    (void)boost::asio::ip::make_address_v6(host, ec);
    if (ec) return bad("not an IPv6 address");
  } else {
    size_t colon = server.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    host = server.substr(0, colon);
    port = server.substr(colon + 1);
    boost::system::error_code ec;
    (void)boost::asio::ip::make_address_v4(host, ec);
    if (ec) return bad("not an IPv4 address");
  }
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return bad("not a port number");
  }
  int n = std::stoi(port);
  if (n < 1 || n > 65535) return bad("port out of range");
  return Status();
}

Result<std::unique_ptr<CaresChannel>> CaresChannel::Start(const CaresOptions& options) {
  InitLibrary();
  std::string csv;
  for (const std::string& server : options.servers) {
    SBX_RETURN_IF_ERROR(ParseUpstream(server));
    if (!csv.empty()) csv += ",";
    csv += server;
  }
  std::unique_ptr<CaresChannel> c(new CaresChannel());
  c->wake_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!c->wake_) return Status::Errno("c-ares: eventfd");

  ares_options opts{};
  // Only DNS, only the name as given: the host's /etc/hosts, resolv.conf's search domains and
  // HOSTALIASES are the host's business, not a box's.
  opts.flags = ARES_FLAG_NOSEARCH | ARES_FLAG_NOALIASES;
  opts.timeout = std::max(1, options.timeout_ms);
  opts.tries = std::max(1, options.tries);
  char lookups[] = "b";
  opts.lookups = lookups;
  opts.domains = nullptr;
  opts.ndomains = 0;
  int mask =
      ARES_OPT_FLAGS | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES | ARES_OPT_LOOKUPS | ARES_OPT_DOMAINS;
  int status = ares_init_options(&c->channel_, &opts, mask);
  if (status != ARES_SUCCESS) return AresError("c-ares: init", status);
  if (!csv.empty()) {
    status = ares_set_servers_ports_csv(c->channel_, csv.c_str());
    if (status != ARES_SUCCESS) {
      ares_destroy(c->channel_);
      c->channel_ = nullptr;
      return AresError("c-ares: set servers " + csv, status);
    }
  }
  c->thread_ = std::thread([raw = c.get()] { raw->Loop(); });
  return c;
}

CaresChannel::~CaresChannel() { Stop(); }

bool CaresChannel::Post(std::function<void(ares_channel)> work) {
  {
    MutexLock lock(mu_);
    if (stopping_) return false;
    queue_.push_back(std::move(work));
  }
  uint64_t one = 1;
  // A full counter (never, at 2^64) or EAGAIN still leaves the loop woken.
  (void)!write(wake_.get(), &one, sizeof one);
  return true;
}

void CaresChannel::Stop() {
  {
    MutexLock lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof one);
  if (thread_.joinable()) thread_.join();
}

void CaresChannel::Loop() {
  for (;;) {
    std::vector<std::function<void(ares_channel)>> work;
    bool stop;
    {
      MutexLock lock(mu_);
      work.swap(queue_);
      stop = stopping_;
    }
    for (auto& w : work) w(channel_);
    if (stop) break;

    ares_socket_t socks[ARES_GETSOCK_MAXNUM];
    int bits = ares_getsock(channel_, socks, ARES_GETSOCK_MAXNUM);
    pollfd fds[ARES_GETSOCK_MAXNUM + 1];
    int n = 0;
    fds[n++] = {wake_.get(), POLLIN, 0};
    for (int i = 0; i < ARES_GETSOCK_MAXNUM; i++) {
      short events = 0;
      if (ARES_GETSOCK_READABLE(bits, i)) events |= POLLIN;
      if (ARES_GETSOCK_WRITABLE(bits, i)) events |= POLLOUT;
      if (events) fds[n++] = {socks[i], events, 0};
    }
    timeval tv{};
    timeval* next = ares_timeout(channel_, nullptr, &tv);
    int ms = next ? static_cast<int>(tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000) : -1;
    int ready = poll(fds, static_cast<nfds_t>(n), ms);
    if (ready < 0 && errno != EINTR) ready = 0;  // cannot happen with valid fds; time out below
    if (fds[0].revents) {
      uint64_t count;
      (void)!read(wake_.get(), &count, sizeof count);
    }
    for (int i = 1; i < n && ready > 0; i++) {
      if (!fds[i].revents) continue;
      ares_socket_t r =
          (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) ? fds[i].fd : ARES_SOCKET_BAD;
      ares_socket_t w = (fds[i].revents & POLLOUT) ? fds[i].fd : ARES_SOCKET_BAD;
      ares_process_fd(channel_, r, w);
    }
    ares_process_fd(channel_, ARES_SOCKET_BAD, ARES_SOCKET_BAD);  // timeouts
  }
  // Every query still open ends here, its callback told so (ARES_ECANCELLED, then
  // ARES_EDESTRUCTION for any a callback started).
  ares_cancel(channel_);
  ares_destroy(channel_);
  channel_ = nullptr;
}

// ---- CaresLookup ----

namespace {

struct LookupCall {
  std::string name;
  std::function<void(Result<std::vector<address>>)> done;
};

Status LookupError(const std::string& name, int status) {
  std::string what = "resolve " + name;
  switch (status) {
    case ARES_ENOTFOUND:
    case ARES_ENODATA:
      return Status::Error(what + ": no such name", ENOENT);
    case ARES_ETIMEOUT:
      return Status::Error(what + ": no DNS server answered", ETIMEDOUT);
    case ARES_ECANCELLED:
    case ARES_EDESTRUCTION:
      return Status::Error(what + ": lookup stopped", ECANCELED);
    case ARES_EBADNAME:
      return Status::Error(what + ": not a DNS name", EINVAL);
    default:
      return Status::Error(what + ": " + ares_strerror(status), EIO);
  }
}

void OnAddrinfo(void* arg, int status, int /*timeouts*/, ares_addrinfo* result) {
  std::unique_ptr<LookupCall> call(static_cast<LookupCall*>(arg));
  if (status != ARES_SUCCESS) {
    if (result) ares_freeaddrinfo(result);
    call->done(LookupError(call->name, status));
    return;
  }
  std::vector<address> out;
  for (ares_addrinfo_node* node = result ? result->nodes : nullptr; node; node = node->ai_next) {
    address a;
    if (node->ai_family == AF_INET && node->ai_addrlen >= sizeof(sockaddr_in)) {
      const auto* sin = reinterpret_cast<const sockaddr_in*>(node->ai_addr);
      a = boost::asio::ip::address_v4(ntohl(sin->sin_addr.s_addr));
    } else if (node->ai_family == AF_INET6 && node->ai_addrlen >= sizeof(sockaddr_in6)) {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(node->ai_addr);
      boost::asio::ip::address_v6::bytes_type bytes;
      std::memcpy(bytes.data(), sin6->sin6_addr.s6_addr, bytes.size());
      a = boost::asio::ip::address_v6(bytes);
    } else {
      continue;
    }
    if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  }
  if (result) ares_freeaddrinfo(result);
  if (out.empty()) {
    call->done(LookupError(call->name, ARES_ENODATA));
    return;
  }
  call->done(std::move(out));
}

bool LooksLikeName(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.' || c == ':';  // ':' for an IPv6 literal
  });
}

}  // namespace

Result<std::unique_ptr<CaresLookup>> CaresLookup::Start(CaresLookupConfig config) {
  auto channel = CaresChannel::Start(config.cares);
  if (!channel.ok()) return channel.status();
  std::unique_ptr<CaresLookup> lookup(new CaresLookup(config.ipv6));
  lookup->channel_ = std::move(*channel);
  return lookup;
}

CaresLookup::~CaresLookup() { Stop(); }

void CaresLookup::Stop() {
  if (channel_) channel_->Stop();
}

void CaresLookup::Resolve(const std::string& name,
                          std::function<void(Result<std::vector<address>>)> done) {
  if (!LooksLikeName(name)) {
    done(LookupError("(bad name)", ARES_EBADNAME));  // the name itself may be anything: not echoed
    return;
  }
  auto call = std::make_unique<LookupCall>(LookupCall{name, std::move(done)});
  LookupCall* raw = call.get();
  bool ipv6 = ipv6_;
  bool posted = channel_->Post([raw, ipv6](ares_channel channel) {
    ares_addrinfo_hints hints{};
    hints.ai_family = ipv6 ? AF_UNSPEC : AF_INET;
    hints.ai_socktype = SOCK_STREAM;  // one node per address, not one per socket type
    ares_getaddrinfo(channel, raw->name.c_str(), nullptr, &hints, OnAddrinfo, raw);
  });
  if (posted) {
    (void)call.release();  // OnAddrinfo owns it now
  } else {
    call->done(LookupError(name, ARES_ECANCELLED));
  }
}

}  // namespace sbx::network

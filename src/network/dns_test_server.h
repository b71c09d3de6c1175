// For tests only: a small real upstream DNS server on a loopback address (UDP and TCP on one
// port), answering the names it is given and counting every query it receives, so a test can
// prove that a query never reached upstream. Answers over UDP longer than the client's size are
// sent truncated (TC), as a real server does, so clients retry over TCP. Not for the daemon.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/fd.h"
#include "network/dns_message.h"

namespace sbx::network::testing {

class FakeUpstream {
 public:
  struct Records {
    std::vector<std::string> a;     // "198.18.0.1"
    std::vector<std::string> aaaa;  // "2001:db8::1"
    std::vector<std::string> txt;   // each one string (< 256 bytes)
  };

  // Binds UDP and TCP on `ip` (a 127.0.0.0/8 address) and an ephemeral port; starts answering.
  explicit FakeUpstream(const std::string& ip) {
    for (int attempt = 0; attempt < 20 && port_ == 0; attempt++) {
      udp_.reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      tcp_.reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      inet_pton(AF_INET, ip.c_str(), &sa.sin_addr);
      if (bind(udp_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) continue;
      socklen_t len = sizeof sa;
      getsockname(udp_.get(), reinterpret_cast<sockaddr*>(&sa), &len);
      int one = 1;
      setsockopt(tcp_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(tcp_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) continue;
      if (listen(tcp_.get(), 16) != 0) continue;
      port_ = ntohs(sa.sin_port);
    }
    address_ = ip + ":" + std::to_string(port_);
    wake_.reset(eventfd(0, EFD_CLOEXEC));
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeUpstream() {
    stop_ = true;
    uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof one);
    thread_.join();
  }

  uint16_t port() const { return port_; }
  const std::string& address() const { return address_; }  // "127.0.0.x:port", for config
  void Set(const std::string& lowercase_name, Records records) {
    std::lock_guard lock(mu_);
    names_[lowercase_name] = std::move(records);
  }
  // Receives queries and never answers (an upstream that is down but not refusing).
  void SetSilent(bool silent) { silent_ = silent; }
  int queries() const { return queries_.load(); }
  int tcp_queries() const { return tcp_queries_.load(); }
  // Names asked (lowercase), for tests that check what reached upstream.
  std::multiset<std::string> asked() const {
    std::lock_guard lock(mu_);
    return asked_;
  }

 private:
  static void Put16(std::vector<uint8_t>& b, uint16_t v) {
    b.push_back(static_cast<uint8_t>(v >> 8));
    b.push_back(static_cast<uint8_t>(v));
  }

  // The answer to one query, or empty for no answer.
  std::vector<uint8_t> Answer(std::span<const uint8_t> msg, bool udp) {
    queries_++;
    if (!udp) tcp_queries_++;
    dns::Parsed p = dns::ParseQuery(msg);
    if (p.outcome != dns::Parsed::Outcome::kOk || silent_) return {};
    std::string name = p.query.question->name;
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    Records records;
    bool known;
    {
      std::lock_guard lock(mu_);
      asked_.insert(name);
      auto it = names_.find(name);
      known = it != names_.end();
      if (known) records = it->second;
    }
    std::vector<std::vector<uint8_t>> rdata;
    uint16_t type = p.query.question->type;
    if (type == dns::kTypeA) {
      for (auto& a : records.a) {
        std::vector<uint8_t> r(4);
        inet_pton(AF_INET, a.c_str(), r.data());
        rdata.push_back(r);
      }
    } else if (type == dns::kTypeAaaa) {
      for (auto& a : records.aaaa) {
        std::vector<uint8_t> r(16);
        inet_pton(AF_INET6, a.c_str(), r.data());
        rdata.push_back(r);
      }
    } else if (type == dns::kTypeTxt) {
      for (auto& t : records.txt) {
        std::vector<uint8_t> r{static_cast<uint8_t>(t.size())};
        r.insert(r.end(), t.begin(), t.end());
        rdata.push_back(r);
      }
    }
    std::vector<uint8_t> out;
    Put16(out, p.query.id);
    Put16(out, static_cast<uint16_t>(0x8180 | (known ? 0 : 3)));
    Put16(out, 1);
    Put16(out, static_cast<uint16_t>(rdata.size()));
    Put16(out, 0);
    Put16(out, 0);
    const dns::Question& q = *p.query.question;
    out.insert(out.end(), q.wire.begin(), q.wire.end());
    Put16(out, q.type);
    Put16(out, q.qclass);
    for (auto& r : rdata) {
      out.push_back(0xc0);
      out.push_back(12);
      Put16(out, type);
      Put16(out, dns::kClassIn);
      Put16(out, 0);
      Put16(out, 60);
      Put16(out, static_cast<uint16_t>(r.size()));
      out.insert(out.end(), r.begin(), r.end());
    }
    size_t max = p.query.edns ? p.query.udp_size : 512;
    if (udp && out.size() > max) {
      out.resize(12 + q.wire.size() + 4);
      out[2] |= 0x02;  // TC
      out[6] = out[7] = 0;
    }
    return out;
  }

  void ServeTcp(int fd) {
    // One message per connection, then close: clients reconnect for more.
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint8_t len[2];
    if (recv(fd, len, 2, MSG_WAITALL) != 2) return;
    std::vector<uint8_t> msg(static_cast<size_t>(len[0] << 8 | len[1]));
    if (!msg.empty() && recv(fd, msg.data(), msg.size(), MSG_WAITALL) != ssize_t(msg.size())) {
      return;
    }
    std::vector<uint8_t> out = Answer(msg, false);
    if (out.empty()) return;
    std::vector<uint8_t> framed{static_cast<uint8_t>(out.size() >> 8),
                                static_cast<uint8_t>(out.size())};
    framed.insert(framed.end(), out.begin(), out.end());
    (void)!send(fd, framed.data(), framed.size(), MSG_NOSIGNAL);
  }

  void Loop() {
    std::vector<uint8_t> buf(65536);
    while (!stop_) {
      pollfd fds[3] = {{wake_.get(), POLLIN, 0}, {udp_.get(), POLLIN, 0}, {tcp_.get(), POLLIN, 0}};
      if (poll(fds, 3, -1) <= 0) continue;
      if (fds[1].revents & POLLIN) {
        sockaddr_in from{};
        socklen_t len = sizeof from;
        ssize_t n = recvfrom(udp_.get(), buf.data(), buf.size(), 0,
                             reinterpret_cast<sockaddr*>(&from), &len);
        if (n >= 0) {
          std::vector<uint8_t> out = Answer({buf.data(), static_cast<size_t>(n)}, true);
          if (!out.empty()) {
            sendto(udp_.get(), out.data(), out.size(), 0, reinterpret_cast<sockaddr*>(&from), len);
          }
        }
      }
      if (fds[2].revents & POLLIN) {
        UniqueFd conn(accept4(tcp_.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (conn) ServeTcp(conn.get());
      }
    }
  }

  UniqueFd udp_, tcp_, wake_;
  uint16_t port_ = 0;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> silent_{false};
  std::atomic<int> queries_{0};
  std::atomic<int> tcp_queries_{0};
  mutable std::mutex mu_;
  std::map<std::string, Records> names_;
  std::multiset<std::string> asked_;
  std::thread thread_;
};

}  // namespace sbx::network::testing

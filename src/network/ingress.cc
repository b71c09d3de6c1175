#include "network/ingress.h"

#include <arpa/inet.h>

namespace sbx::network {

std::string TrafficToken(const InstallSecret& secret, const std::string& owner_key_id,
                         const std::string& sandbox_id) {
  return secret.HmacHex("sbx-traffic-token\n" + owner_key_id + "\n" + sandbox_id);
}

bool IsTrafficToken(const InstallSecret& secret, const std::string& owner_key_id,
                    const std::string& sandbox_id, std::string_view presented) {
  return ConstantTimeEquals(presented, TrafficToken(secret, owner_key_id, sandbox_id));
}

namespace {

std::string PortUrlMac(const InstallSecret& secret, const std::string& owner_key_id,
                       const std::string& sandbox_id, int port, std::string_view expires) {
  return secret.HmacHex("sbx-port-url\n" + owner_key_id + "\n" + sandbox_id + "\n" +
                        std::to_string(port) + "\n" + std::string(expires));
}

}  // namespace

std::string SignPortUrl(const InstallSecret& secret, const std::string& owner_key_id,
                        const std::string& sandbox_id, int port, int64_t expires_s) {
  std::string expires = std::to_string(expires_s);
  return std::string(kPortUrlExpires) + "=" + expires + "&" + kPortUrlSignature + "=" +
         PortUrlMac(secret, owner_key_id, sandbox_id, port, expires);
}

PortUrlCheck VerifyPortUrl(const InstallSecret& secret, const std::string& owner_key_id,
                           const std::string& sandbox_id, int port, std::string_view expires,
                           std::string_view signature, int64_t now_s) {
  // The expiry is signed as written: only the decimal form SignPortUrl writes can match.
  if (expires.empty() || expires.size() > 18) return PortUrlCheck::kBadSignature;
  int64_t at = 0;
  for (char c : expires) {
    if (c < '0' || c > '9') return PortUrlCheck::kBadSignature;
    at = at * 10 + (c - '0');
  }
  if (!ConstantTimeEquals(signature, PortUrlMac(secret, owner_key_id, sandbox_id, port, expires)))
    return PortUrlCheck::kBadSignature;
  return now_s < at ? PortUrlCheck::kValid : PortUrlCheck::kExpired;
}

int ParsePort(std::string_view text) {
  if (text.empty() || text.size() > 5) return 0;
  int port = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return 0;
    port = port * 10 + (c - '0');
  }
  return ValidPort(port) ? port : 0;
}

sockaddr_in BoxLoopback(int port) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return to;
}

}  // namespace sbx::network

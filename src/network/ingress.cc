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

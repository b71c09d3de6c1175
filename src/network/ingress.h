// Ingress: how a request from outside reaches a port inside a sandbox (DESIGN.md, "Network"). This
// is the sandbox-facing half, with no HTTP in it: the traffic token a request must carry unless
// the sandbox's ports are public, and where in the box a port is. The HTTP-facing half (who asks,
// the byte relay, each facade's answers) is api/ingress.h, on top of http::Exchange::Relay; the
// socket in the box's network namespace comes from sandbox::Manager::TcpSocket. network/ sits
// below sandbox/ (api -> sandbox -> network -> common), so nothing here knows a manager or a
// record.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "common/secret.h"

namespace sbx::network {

// A sandbox's traffic token: what a request relayed to one of its ports must carry
// (E2B-Traffic-Access-Token). HMAC-SHA256 under the install secret of the owner key's id and the
// sandbox id: it needs no storage, survives restarts, is useless once the owner key is revoked
// (the owner check fails first), and cannot be computed from the database alone.
std::string TrafficToken(const InstallSecret& secret, const std::string& owner_key_id,
                         const std::string& sandbox_id);

// Whether `presented` is the traffic token of sandbox `sandbox_id` owned by `owner_key_id`, in
// constant time.
bool IsTrafficToken(const InstallSecret& secret, const std::string& owner_key_id,
                    const std::string& sandbox_id, std::string_view presented);

// A signed, expiring URL of a sandbox port (issue 12, item 7): the port route with
// `?sbx_expires=<unix seconds>&sbx_signature=<hex>` opens that port of that sandbox to whoever
// holds it, instead of the key or the traffic token, until it expires. The signature is an
// HMAC-SHA256 under the install secret of the owner key's id, the sandbox id, the port and the
// expiry: no storage, nothing to forge from the database, and useless once the owner key is
// revoked (the owner check fails first) or the sandbox ends.
inline constexpr char kPortUrlExpires[] = "sbx_expires";
inline constexpr char kPortUrlSignature[] = "sbx_signature";
inline constexpr int64_t kMaxPortUrlTtlS = int64_t{7} * 24 * 3600;  // a week

// The query (no '?') that signs `port` of `sandbox_id` until `expires_s` (unix seconds).
std::string SignPortUrl(const InstallSecret& secret, const std::string& owner_key_id,
                        const std::string& sandbox_id, int port, int64_t expires_s);

enum class PortUrlCheck { kValid, kBadSignature, kExpired };
// Whether `expires` and `signature` (as the query gave them) sign `port` of `sandbox_id`, in
// constant time; a good signature past its expiry at `now_s` is kExpired (a distinct answer: the
// holder should ask for a new URL), a malformed expiry a kBadSignature.
PortUrlCheck VerifyPortUrl(const InstallSecret& secret, const std::string& owner_key_id,
                           const std::string& sandbox_id, int port, std::string_view expires,
                           std::string_view signature, int64_t now_s);

// A TCP port a request may name: 1..65535.
inline bool ValidPort(long port) { return port >= 1 && port <= 65535; }

// Parses a port as a client writes it in a path or header: decimal digits only, 1..65535; 0 for
// anything else (which ValidPort refuses).
int ParsePort(std::string_view text);

// Where `port` is inside a box: its own loopback (a server there listens on 127.0.0.1 of the
// box's network namespace, which only a socket made in that namespace reaches).
sockaddr_in BoxLoopback(int port);

}  // namespace sbx::network

// Ingress: how a request from outside reaches a port inside a sandbox (DESIGN.md, "Network"). This
// is the sandbox-facing half, with no HTTP in it: the traffic token a request must carry unless
// the sandbox's ports are public, and where in the box a port is. The HTTP-facing half (who asks,
// the byte relay, each facade's answers) is api/ingress.h, on top of http::Exchange::Relay; the
// socket in the box's network namespace comes from sandbox::Manager::TcpSocket. network/ sits
// below sandbox/ (api -> sandbox -> network -> common), so nothing here knows a manager or a
// record.
#pragma once

#include <netinet/in.h>

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

// A TCP port a request may name: 1..65535.
inline bool ValidPort(long port) { return port >= 1 && port <= 65535; }

// Parses a port as a client writes it in a path or header: decimal digits only, 1..65535; 0 for
// anything else (which ValidPort refuses).
int ParsePort(std::string_view text);

// Where `port` is inside a box: its own loopback (a server there listens on 127.0.0.1 of the
// box's network namespace, which only a socket made in that namespace reaches).
sockaddr_in BoxLoopback(int port);

}  // namespace sbx::network

// The link of a box with networking: a veth pair between the creator's network namespace (the
// "host" end, named sbx<slot>) and the box's (its "eth0"), made and removed through rtnetlink
// (libmnl; no `ip` subprocess). docs/network.md, "Links and addresses".
//
// Work inside the box's namespace happens on a short-lived thread that setns'd into it (setns
// changes only the calling thread), so nothing of the caller's thread changes. Every request asks
// for its ACK; errors name the operation and the link.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "network/policy.h"

namespace sbx::network {

struct LinkPlan {
  std::string host_ifname;  // the host end, e.g. "sbx3"; the box end is always "eth0"
  address host_ip;          // the host end's address: the box's gateway, resolver and proxy
  address box_ip;           // eth0's address
  int prefix = 30;
  bool ipv6 = false;  // false: IPv6 disabled in the box's namespace
  // With ipv6: each end's IPv6 address in one /prefix6 network; unspecified (::): none.
  address host_ip6 = boost::asio::ip::address_v6();
  address box_ip6 = boost::asio::ip::address_v6();
  int prefix6 = 126;
};

// Creates the veth pair: the host end in the calling thread's network namespace, up with
// host_ip/prefix; the peer created directly in the network namespace of `init_pid` as eth0, up
// with box_ip/prefix, lo up, and a default route via host_ip. With ipv6 and IPv6 addresses in
// the plan, the ends also get host_ip6 and box_ip6 (no duplicate address detection: they are
// usable at once) and the box a default IPv6 route via host_ip6; no other IPv6 address, not
// even link-local, is ever made, and the host end takes no router advertisement. EINVAL for a
// bad plan or a pid that shares our namespace, ENOENT/ESRCH for a gone pid, EEXIST for a name in
// use (which is then left alone). On any failure what this call made is removed (deleting the
// host end deletes both).
Status CreateBoxLink(const LinkPlan& plan, pid_t init_pid);

// Deletes a link of the calling thread's namespace (and so its veth peer, wherever it is). A link
// that does not exist is success.
Status DeleteLink(const std::string& ifname);

// The names of the calling thread's namespace's links that start with `prefix`.
Result<std::vector<std::string>> ListLinks(std::string_view prefix);

// Whether `name` is one of sbx's host ends: "sbx" followed by decimal digits only.
bool IsBoxLinkName(std::string_view name);

}  // namespace sbx::network

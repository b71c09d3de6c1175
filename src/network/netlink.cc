#include "network/netlink.h"

#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/if.h>
#include <linux/if_addr.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <functional>
#include <thread>

#include "common/fd.h"

namespace sbx::network {
namespace {

constexpr char kBoxIfname[] = "eth0";

// One rtnetlink socket of the namespace of the thread that opened it (a netlink socket stays in
// the namespace it was created in, whichever thread uses it later).
class NlSocket {
 public:
  static Result<NlSocket> Open(const std::string& what) {
    mnl_socket* nl = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
    if (nl == nullptr) return Status::Errno(what + ": open rtnetlink socket");
    NlSocket s(nl);
    if (mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0)
      return Status::Errno(what + ": bind rtnetlink socket");
    s.portid_ = mnl_socket_get_portid(nl);
    // The kernel's own words on a refused request ("veth: ..."), for the error message; a kernel
    // without extended ACKs just gives errno.
    int one = 1;
    (void)mnl_socket_setsockopt(nl, NETLINK_EXT_ACK, &one, sizeof one);
    (void)mnl_socket_setsockopt(nl, NETLINK_CAP_ACK, &one, sizeof one);
    return s;
  }
  NlSocket(NlSocket&& o) noexcept
      : nl_(std::exchange(o.nl_, nullptr)), portid_(o.portid_), seq_(o.seq_) {}
  NlSocket& operator=(NlSocket&&) = delete;
  ~NlSocket() {
    if (nl_ != nullptr) mnl_socket_close(nl_);
  }

  // A message in the socket's buffer, to fill and then send with Run.
  nlmsghdr* Start(uint16_t type, uint16_t flags) {
    buf_.fill(0);
    nlmsghdr* nlh = mnl_nlmsg_put_header(buf_.data());
    nlh->nlmsg_type = type;
    nlh->nlmsg_flags = NLM_F_REQUEST | flags;
    nlh->nlmsg_seq = ++seq_;
    return nlh;
  }

  // Sends the message and reads the kernel's answer to it until its ACK (or, for a dump, its
  // end), calling `cb` on each reply. `what` names the operation and the link.
  Status Run(nlmsghdr* nlh, const std::string& what, mnl_cb_t cb = nullptr, void* data = nullptr) {
    if ((nlh->nlmsg_flags & NLM_F_DUMP) != NLM_F_DUMP) nlh->nlmsg_flags |= NLM_F_ACK;
    if (mnl_socket_sendto(nl_, nlh, nlh->nlmsg_len) < 0) return Status::Errno(what);
    std::array<char, 32768> rx;
    for (;;) {
      ssize_t n = mnl_socket_recvfrom(nl_, rx.data(), rx.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::Errno(what);
      }
      errno = 0;
      RunCtx ctx{cb, data, {}};
      mnl_cb_t ctl[NLMSG_ERROR + 1] = {nullptr, nullptr, OnError};
      int ret = mnl_cb_run2(rx.data(), static_cast<size_t>(n), nlh->nlmsg_seq, portid_, OnData,
                            &ctx, ctl, NLMSG_ERROR + 1);
      if (ret < 0) {
        int err = errno != 0 ? errno : EPROTO;
        return Status::Error(ctx.kernel_says.empty() ? what : what + " (" + ctx.kernel_says + ")",
                             err);
      }
      if (ret == MNL_CB_STOP) return Status();
    }
  }

 private:
  struct RunCtx {
    mnl_cb_t cb;
    void* data;
    std::string kernel_says;
  };
  static int OnData(const nlmsghdr* nlh, void* data) {
    auto* ctx = static_cast<RunCtx*>(data);
    return ctx->cb != nullptr ? ctx->cb(nlh, ctx->data) : MNL_CB_OK;
  }
  // NLMSG_ERROR: an ACK (error 0) ends the answer; an error sets errno and keeps the extended
  // ACK's message, if any (bounded: an attribute of one netlink message).
  static int OnError(const nlmsghdr* nlh, void* data) {
    if (nlh->nlmsg_len < mnl_nlmsg_size(sizeof(nlmsgerr))) {
      errno = EBADMSG;
      return MNL_CB_ERROR;
    }
    const auto* err = static_cast<const nlmsgerr*>(mnl_nlmsg_get_payload(nlh));
    if (err->error == 0) return MNL_CB_STOP;
    if ((nlh->nlmsg_flags & NLM_F_ACK_TLVS) != 0) {
      size_t offset = sizeof(nlmsgerr);
      if ((nlh->nlmsg_flags & NLM_F_CAPPED) == 0 && err->msg.nlmsg_len >= sizeof(nlmsghdr))
        offset += err->msg.nlmsg_len - sizeof(nlmsghdr);
      if (offset > mnl_nlmsg_get_payload_len(nlh)) offset = mnl_nlmsg_get_payload_len(nlh);
      const char* tail = static_cast<const char*>(mnl_nlmsg_get_payload_tail(nlh));
      const auto* attr = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(nlh, offset));
      while (reinterpret_cast<const char*>(attr) < tail &&
             mnl_attr_ok(attr, static_cast<int>(tail - reinterpret_cast<const char*>(attr)))) {
        if (mnl_attr_get_type(attr) == NLMSGERR_ATTR_MSG &&
            mnl_attr_validate(attr, MNL_TYPE_NUL_STRING) >= 0)
          static_cast<RunCtx*>(data)->kernel_says = mnl_attr_get_str(attr);
        attr = mnl_attr_next(attr);
      }
    }
    errno = -err->error;
    return MNL_CB_ERROR;
  }

  explicit NlSocket(mnl_socket* nl) : nl_(nl) {}
  mnl_socket* nl_;
  unsigned portid_ = 0;
  unsigned seq_ = 0;
  std::array<char, 8192> buf_{};  // every request sbx sends is far smaller
};

bool ValidIfname(std::string_view name) {
  if (name.empty() || name.size() >= IFNAMSIZ) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

// IFLA_AF_SPEC { AF_INET6 { IFLA_INET6_ADDR_GEN_MODE = NONE } }: no link-local address when the
// link goes up, so neither end ever has an IPv6 address sbx did not give it.
void PutNoAddrGen(nlmsghdr* nlh) {
  nlattr* spec = mnl_attr_nest_start(nlh, IFLA_AF_SPEC);
  nlattr* inet6 = mnl_attr_nest_start(nlh, AF_INET6);
  mnl_attr_put_u8(nlh, IFLA_INET6_ADDR_GEN_MODE, IN6_ADDR_GEN_MODE_NONE);
  mnl_attr_nest_end(nlh, inet6);
  mnl_attr_nest_end(nlh, spec);
}

// IPv6 may be compiled out or disabled at boot (ipv6.disable=1): then there is nothing to turn off.
bool HostHasIpv6() { return ::access("/proc/sys/net/ipv6", F_OK) == 0; }

struct IndexQuery {
  int index = 0;
};

int OnLinkIndex(const nlmsghdr* nlh, void* data) {
  if (nlh->nlmsg_type != RTM_NEWLINK) return MNL_CB_OK;
  const auto* ifm = static_cast<const ifinfomsg*>(mnl_nlmsg_get_payload(nlh));
  static_cast<IndexQuery*>(data)->index = ifm->ifi_index;
  return MNL_CB_OK;
}

Result<int> LinkIndex(NlSocket& nl, const std::string& ifname) {
  nlmsghdr* nlh = nl.Start(RTM_GETLINK, 0);
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, ifname.c_str());
  IndexQuery q;
  SBX_RETURN_IF_ERROR(nl.Run(nlh, "find link " + ifname, OnLinkIndex, &q));
  if (q.index <= 0) return Status::Error("find link " + ifname, ENODEV);
  return q.index;
}

Status SetLink(NlSocket& nl, int index, bool up, bool no_addr_gen, const std::string& what) {
  nlmsghdr* nlh = nl.Start(RTM_NEWLINK, 0);
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  ifm->ifi_index = index;
  if (up) {
    ifm->ifi_change = IFF_UP;
    ifm->ifi_flags = IFF_UP;
  }
  if (no_addr_gen) PutNoAddrGen(nlh);
  return nl.Run(nlh, what);
}

// Attribute `type` holding `ip` in its family's size (4 or 16 bytes).
void PutAddress(nlmsghdr* nlh, uint16_t type, const address& ip) {
  if (ip.is_v4()) {
    auto bytes = ip.to_v4().to_bytes();
    mnl_attr_put(nlh, type, bytes.size(), bytes.data());
  } else {
    auto bytes = ip.to_v6().to_bytes();
    mnl_attr_put(nlh, type, bytes.size(), bytes.data());
  }
}

// `ip`/`prefix` on link `index`. An IPv6 address skips duplicate address detection (sbx owns
// both ends of the link), so it is usable at once instead of tentative for a second or more.
Status AddAddress(NlSocket& nl, int index, const address& ip, int prefix, const std::string& what) {
  nlmsghdr* nlh = nl.Start(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL);
  auto* ifa = static_cast<ifaddrmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifaddrmsg)));
  ifa->ifa_family = ip.is_v4() ? AF_INET : AF_INET6;
  ifa->ifa_prefixlen = static_cast<uint8_t>(prefix);
  ifa->ifa_scope = RT_SCOPE_UNIVERSE;
  ifa->ifa_index = static_cast<uint32_t>(index);
  PutAddress(nlh, IFA_LOCAL, ip);
  PutAddress(nlh, IFA_ADDRESS, ip);
  if (ip.is_v6()) {
    ifa->ifa_flags = IFA_F_NODAD;
    mnl_attr_put_u32(nlh, IFA_FLAGS, IFA_F_NODAD);
  }
  return nl.Run(nlh, what);
}

Status AddDefaultRoute(NlSocket& nl, int index, const address& gateway, const std::string& what) {
  nlmsghdr* nlh = nl.Start(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL);
  auto* rtm = static_cast<rtmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(rtmsg)));
  rtm->rtm_family = gateway.is_v4() ? AF_INET : AF_INET6;
  rtm->rtm_dst_len = 0;
  rtm->rtm_table = RT_TABLE_MAIN;
  rtm->rtm_protocol = RTPROT_STATIC;
  rtm->rtm_scope = RT_SCOPE_UNIVERSE;
  rtm->rtm_type = RTN_UNICAST;
  PutAddress(nlh, RTA_GATEWAY, gateway);
  mnl_attr_put_u32(nlh, RTA_OIF, static_cast<uint32_t>(index));
  return nl.Run(nlh, what);
}

// Whether the plan gives the link IPv6 addresses.
bool HasIpv6Addresses(const LinkPlan& plan) { return plan.ipv6 && !plan.box_ip6.is_unspecified(); }

std::string WithPrefix(const address& a, int prefix) {
  return a.to_string() + "/" + std::to_string(prefix);
}

// Writes a sysctl of the calling thread's network namespace (/proc/sys/net is per thread: it
// shows the namespace of the task that opens it).
Status WriteNetSysctl(const std::string& path, const char* value = "1") {
  return WriteFile("/proc/sys/net/" + path, std::string(value) + "\n")
      .Wrap("set net." + path + " = " + value);
}

// Runs `fn` on a new thread that joined the network namespace `netns_fd`; the caller's thread
// stays where it is, and the namespace membership ends with the thread.
Status InNetns(int netns_fd, const std::function<Status()>& fn) {
  Status out;
  std::thread t([&] {
    if (::setns(netns_fd, CLONE_NEWNET) != 0) {
      out = Status::Errno("join the box's network namespace");
      return;
    }
    out = fn();
  });
  t.join();
  return out;
}

// Inside the box's namespace: IPv6 off (unless asked for), eth0 addressed and up, lo up, the
// default route via the host end.
Status ConfigureBoxSide(const LinkPlan& plan) {
  const std::string what = "configure eth0 (peer of " + plan.host_ifname + ") in the box";
  if (!plan.ipv6 && HostHasIpv6()) {
    SBX_RETURN_IF_ERROR(WriteNetSysctl("ipv6/conf/all/disable_ipv6").Wrap(what));
    SBX_RETURN_IF_ERROR(WriteNetSysctl("ipv6/conf/default/disable_ipv6").Wrap(what));
  }
  Result<NlSocket> nl = NlSocket::Open(what);
  if (!nl.ok()) return nl.status();
  Result<int> eth0 = LinkIndex(*nl, kBoxIfname);
  if (!eth0.ok()) return eth0.status().Wrap(what);
  Result<int> lo = LinkIndex(*nl, "lo");
  if (!lo.ok()) return lo.status().Wrap(what);
  const bool v6 = HostHasIpv6();
  SBX_RETURN_IF_ERROR(SetLink(*nl, *eth0, false, v6, what + ": turn off IPv6 address generation"));
  SBX_RETURN_IF_ERROR(AddAddress(*nl, *eth0, plan.box_ip, plan.prefix,
                                 what + ": add address " + WithPrefix(plan.box_ip, plan.prefix)));
  if (HasIpv6Addresses(plan))
    SBX_RETURN_IF_ERROR(
        AddAddress(*nl, *eth0, plan.box_ip6, plan.prefix6,
                   what + ": add address " + WithPrefix(plan.box_ip6, plan.prefix6)));
  SBX_RETURN_IF_ERROR(SetLink(*nl, *eth0, true, false, what + ": set eth0 up"));
  SBX_RETURN_IF_ERROR(SetLink(*nl, *lo, true, false, what + ": set lo up"));
  SBX_RETURN_IF_ERROR(AddDefaultRoute(
      *nl, *eth0, plan.host_ip, what + ": add default route via " + plan.host_ip.to_string()));
  if (!HasIpv6Addresses(plan)) return Status();
  return AddDefaultRoute(*nl, *eth0, plan.host_ip6,
                         what + ": add default IPv6 route via " + plan.host_ip6.to_string());
}

Status ConfigureHostSide(NlSocket& nl, const LinkPlan& plan) {
  const std::string what = "configure host end " + plan.host_ifname;
  Result<int> index = LinkIndex(nl, plan.host_ifname);
  if (!index.ok()) return index.status().Wrap(what);
  if (HostHasIpv6()) {
    SBX_RETURN_IF_ERROR(
        SetLink(nl, *index, false, true, what + ": turn off IPv6 address generation"));
    // Router advertisements the box sends must not configure an address or a route on the host
    // end either (the firewall drops them too: their source is link-local).
    const std::string conf = "ipv6/conf/" + plan.host_ifname + "/";
    if (!plan.ipv6)
      SBX_RETURN_IF_ERROR(WriteNetSysctl(conf + "disable_ipv6").Wrap(what));
    else
      SBX_RETURN_IF_ERROR(WriteNetSysctl(conf + "accept_ra", "0").Wrap(what));
  }
  SBX_RETURN_IF_ERROR(AddAddress(nl, *index, plan.host_ip, plan.prefix,
                                 what + ": add address " + WithPrefix(plan.host_ip, plan.prefix)));
  if (HasIpv6Addresses(plan))
    SBX_RETURN_IF_ERROR(
        AddAddress(nl, *index, plan.host_ip6, plan.prefix6,
                   what + ": add address " + WithPrefix(plan.host_ip6, plan.prefix6)));
  return SetLink(nl, *index, true, false, what + ": set up");
}

Status CheckPlan(const LinkPlan& plan) {
  const std::string what = "link plan for " + plan.host_ifname;
  if (!ValidIfname(plan.host_ifname) || plan.host_ifname == kBoxIfname)
    return Status::Error("link plan: bad host interface name '" + plan.host_ifname + "'", EINVAL);
  if (!plan.host_ip.is_v4() || !plan.box_ip.is_v4())
    return Status::Error(what + ": addresses must be IPv4", EINVAL);
  if (plan.prefix < 1 || plan.prefix > 30)
    return Status::Error(what + ": prefix must be 1..30", EINVAL);
  if (plan.host_ip == plan.box_ip)
    return Status::Error(what + ": one address for both ends", EINVAL);
  uint32_t mask = ~uint32_t{0} << (32 - plan.prefix);
  if ((plan.host_ip.to_v4().to_uint() & mask) != (plan.box_ip.to_v4().to_uint() & mask))
    return Status::Error(what + ": the ends' addresses are in different networks", EINVAL);
  if (!plan.ipv6 || (plan.host_ip6.is_unspecified() && plan.box_ip6.is_unspecified()))
    return Status();
  if (!plan.host_ip6.is_v6() || !plan.box_ip6.is_v6() || plan.host_ip6.to_v6().is_v4_mapped() ||
      plan.box_ip6.to_v6().is_v4_mapped() || plan.host_ip6.is_unspecified() ||
      plan.box_ip6.is_unspecified())
    return Status::Error(what + ": IPv6 addresses must be IPv6, both or neither", EINVAL);
  if (plan.prefix6 < 1 || plan.prefix6 > 126)
    return Status::Error(what + ": IPv6 prefix must be 1..126", EINVAL);
  if (plan.host_ip6 == plan.box_ip6)
    return Status::Error(what + ": one IPv6 address for both ends", EINVAL);
  if (!Cidr{plan.host_ip6, plan.prefix6}.Contains(plan.box_ip6))
    return Status::Error(what + ": the ends' IPv6 addresses are in different networks", EINVAL);
  return Status();
}

struct ListQuery {
  std::string_view prefix;
  std::vector<std::string> names;
};

int OnLinkAttr(const nlattr* attr, void* data) {
  if (mnl_attr_get_type(attr) == IFLA_IFNAME && mnl_attr_validate(attr, MNL_TYPE_NUL_STRING) >= 0)
    *static_cast<const char**>(data) = mnl_attr_get_str(attr);
  return MNL_CB_OK;
}

int OnListedLink(const nlmsghdr* nlh, void* data) {
  if (nlh->nlmsg_type != RTM_NEWLINK) return MNL_CB_OK;
  const char* name = nullptr;
  if (mnl_attr_parse(nlh, sizeof(ifinfomsg), OnLinkAttr, &name) < 0) return MNL_CB_ERROR;
  auto* q = static_cast<ListQuery*>(data);
  if (name != nullptr && std::string_view(name).starts_with(q->prefix)) q->names.emplace_back(name);
  return MNL_CB_OK;
}

}  // namespace

Status CreateBoxLink(const LinkPlan& plan, pid_t init_pid) {
  SBX_RETURN_IF_ERROR(CheckPlan(plan));
  const std::string what = "create veth " + plan.host_ifname + " with peer eth0 in the network " +
                           "namespace of pid " + std::to_string(init_pid);
  if (init_pid <= 0) return Status::Error(what + ": bad pid", EINVAL);
  UniqueFd netns(
      ::open(("/proc/" + std::to_string(init_pid) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
  if (!netns) return Status::Errno(what + ": open its namespace");
  struct stat theirs {
  }, ours{};
  if (::fstat(netns.get(), &theirs) != 0 || ::stat("/proc/thread-self/ns/net", &ours) != 0)
    return Status::Errno(what + ": stat the namespaces");
  if (theirs.st_ino == ours.st_ino && theirs.st_dev == ours.st_dev)
    return Status::Error(what + ": the process shares our network namespace", EINVAL);

  Result<NlSocket> nl = NlSocket::Open(what);
  if (!nl.ok()) return nl.status();
  // The peer is created in the box's namespace under its final name: it never exists on the host
  // side, so no temporary name can clash and a crash between steps leaves no stray peer here.
  nlmsghdr* nlh = nl->Start(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, plan.host_ifname.c_str());
  nlattr* linkinfo = mnl_attr_nest_start(nlh, IFLA_LINKINFO);
  mnl_attr_put_strz(nlh, IFLA_INFO_KIND, "veth");
  nlattr* info = mnl_attr_nest_start(nlh, IFLA_INFO_DATA);
  nlattr* peer = mnl_attr_nest_start(nlh, VETH_INFO_PEER);
  auto* pifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  pifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, kBoxIfname);
  mnl_attr_put_u32(nlh, IFLA_NET_NS_FD, static_cast<uint32_t>(netns.get()));
  mnl_attr_nest_end(nlh, peer);
  mnl_attr_nest_end(nlh, info);
  mnl_attr_nest_end(nlh, linkinfo);
  SBX_RETURN_IF_ERROR(nl->Run(nlh, what));

  Status st = ConfigureHostSide(*nl, plan);
  if (st.ok()) st = InNetns(netns.get(), [&] { return ConfigureBoxSide(plan); });
  if (st.ok()) return st;
  // Deleting the host end deletes its peer in the box too.
  Status undo = DeleteLink(plan.host_ifname);
  if (!undo.ok()) return st.Wrap(what + " (and removing it failed: " + undo.message() + ")");
  return st.Wrap(what);
}

Status DeleteLink(const std::string& ifname) {
  const std::string what = "delete link " + ifname;
  if (!ValidIfname(ifname)) return Status::Error(what + ": bad interface name", EINVAL);
  Result<NlSocket> nl = NlSocket::Open(what);
  if (!nl.ok()) return nl.status();
  nlmsghdr* nlh = nl->Start(RTM_DELLINK, 0);
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  mnl_attr_put_strz(nlh, IFLA_IFNAME, ifname.c_str());
  Status st = nl->Run(nlh, what);
  if (!st.ok() && (st.err() == ENODEV || st.err() == ENOENT)) return Status();
  return st;
}

Result<std::vector<std::string>> ListLinks(std::string_view prefix) {
  const std::string what = "list links";
  Result<NlSocket> nl = NlSocket::Open(what);
  if (!nl.ok()) return nl.status();
  nlmsghdr* nlh = nl->Start(RTM_GETLINK, NLM_F_DUMP);
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  ListQuery q{prefix, {}};
  SBX_RETURN_IF_ERROR(nl->Run(nlh, what, OnListedLink, &q));
  return std::move(q.names);
}

bool IsBoxLinkName(std::string_view name) {
  if (!name.starts_with("sbx") || name.size() == 3 || name.size() >= IFNAMSIZ) return false;
  for (char c : name.substr(3))
    if (c < '0' || c > '9') return false;
  return true;
}

}  // namespace sbx::network

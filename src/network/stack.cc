// The network stack a manager owns (network.h): the pieces of issue 12 put together. The order
// of a box's life: Prepare (a slot, the box's files and env) -> Attach at the runtime's sync
// point (the veth into the box, its chain, the registry entry the resolver and the proxy decide
// with) -> Update (live policy) -> Release (everything, idempotent). Reconcile after a restart
// removes what no live box holds.
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <mutex>
#include <optional>
#include <thread>

#include "common/fs.h"
#include "common/thread_annotations.h"
#include "network/box_files.h"
#include "network/ca.h"
#include "network/cares_lookup.h"
#include "network/firewall.h"
#include "network/mitm.h"
#include "network/netlink.h"
#include "network/network.h"
#include "network/proxy.h"
#include "network/resolver.h"
#include "network/slots.h"

namespace sbx::network {
namespace {

namespace asio = boost::asio;

// Where a box finds the CA bundle (read-only, bound from the host).
constexpr char kBoxCaBundle[] = "/etc/sbx/ca-certificates.crt";

class StackImpl final : public Stack {
 public:
  StackImpl(StackConfig config, Cidr subnet, std::optional<Cidr> subnet6)
      : config_(std::move(config)), subnet_(std::move(subnet)), subnet6_(std::move(subnet6)) {}
  ~StackImpl() override { Shutdown(); }

  Status Init() {
    if (!config_.slots) return Status::Error("network: no slot pool", EINVAL);
    SBX_RETURN_IF_ERROR(MakeDirs(config_.state_dir + "/boxes", 0700));
    work_.emplace(io_.get_executor());
    thread_ = std::thread([this] { io_.run(); });
    CaresLookupConfig lc;
    lc.cares.servers = config_.upstream_dns;
    lc.ipv6 = config_.ipv6;
    auto lookup = CaresLookup::Start(lc);
    if (!lookup.ok()) return lookup.status().Wrap("network: host lookup");
    lookup_ = std::move(*lookup);
    ResolverConfig rc;
    rc.upstream = config_.upstream_dns;
    rc.ipv6 = config_.ipv6;
    rc.on_event = config_.on_event;
    rc.refusals = &refusals_;
    // With IPv6, one dual-stack socket each for the resolver and the proxy: the nat rules
    // redirect a box's IPv6 DNS and TCP to the host end's IPv6 address, on the same ports.
    const address any =
        config_.ipv6 ? address(asio::ip::address_v6::any()) : address(asio::ip::address_v4::any());
    auto resolver = Resolver::Start(any, 0, boxes_, rc);
    if (!resolver.ok()) return resolver.status().Wrap("network: DNS resolver");
    resolver_ = std::move(*resolver);
    // The CA boxes with secrets trust (their HTTPS ends at the interceptor), and the bundle every
    // box with a network gets: the roots sbx trusts upstream (--upstream-ca, or the host's) and
    // that CA.
    auto ca = Ca::LoadOrCreate(config_.state_dir);
    if (!ca.ok()) return ca.status().Wrap("network: the CA");
    ca_ = std::shared_ptr<Ca>(std::move(*ca));
    std::string bundle_name =
        config_.table == "sbx" ? "ca-bundle.crt" : "ca-bundle-" + config_.table + ".crt";
    auto bundle = ca_->WriteBundle(
        config_.upstream_ca.empty() ? std::string(kSystemCaBundle) : config_.upstream_ca,
        bundle_name);
    if (!bundle.ok()) return bundle.status().Wrap("network: the CA bundle");
    bundle_ = *bundle;
    MitmConfig mc;
    mc.upstream_ca = config_.upstream_ca;
    auto mitm = Mitm::Make(mc, ca_, config_.on_event);
    if (!mitm.ok()) return mitm.status().Wrap("network: the interceptor");
    mitm_ = std::move(*mitm);
    ProxyConfig pc;
    pc.opened_ranges = config_.opened_ranges;
    pc.on_event = config_.on_event;
    pc.lookup = lookup_.get();
    pc.interceptor = mitm_.get();
    pc.refusals = &refusals_;
    pc.ca = ca_;  // refused HTTPS gets its 403 inside a handshake with sbx's CA
    if (!config_.refusal_hint.empty()) pc.change_hint = config_.refusal_hint;
    auto proxy =
        EgressProxy::Start(io_.get_executor(), asio::ip::tcp::endpoint(any, 0), boxes_, pc);
    if (!proxy.ok()) return proxy.status().Wrap("network: egress proxy");
    proxy_ = std::move(*proxy);
    FirewallConfig fc;
    fc.dns_port = resolver_->port();
    fc.proxy_port = proxy_->port();
    fc.ipv6 = config_.ipv6;
    fc.opened_ranges = config_.opened_ranges;
    fc.table = config_.table;
    fc.box_ifname_prefix = config_.owns_link_prefix ? config_.link_prefix : "";
    auto fw = Firewall::Open(fc);
    if (!fw.ok()) return fw.status().Wrap("network: nftables");
    firewall_ = std::move(*fw);
    spdlog::info("network: boxes get {}{} ({} slots), DNS on port {}, egress proxy on port {}",
                 subnet_.ToString(), subnet6_ ? " and " + subnet6_->ToString() : "",
                 SlotCount(subnet_).ok() ? *SlotCount(subnet_) : 0, resolver_->port(),
                 proxy_->port());
    return {};
  }

  Result<BoxNetPlan> Prepare(const std::string& box_id, const BoxNetRequest& req) override {
    if (req.policy.mode == Mode::kNone)
      return Status::Error("network: mode none needs no network", EINVAL);
    auto slot = config_.slots->Acquire(box_id);
    if (!slot.ok()) return slot.status().Wrap("network: an address for " + box_id);
    auto link = LinkFor(*slot);
    if (!link.ok()) return Fail(box_id, link.status());
    auto net = std::make_shared<BoxNet>();
    net->id = box_id;
    net->box_ip = link->box_ip;
    net->host_ip = link->host_ip;
    net->box_ip6 = link->box_ip6;
    net->host_ip6 = link->host_ip6;
    net->policy = req.policy;
    net->secrets = req.secrets;
    net->egress_bytes_per_s = req.egress_bytes_per_s;
    net->refusal_hint = req.refusal_hint;
    std::string dir = BoxDir(box_id);
    auto files = WriteBoxNetFiles(dir, link->host_ip, link->box_ip, "sbx", config_.ipv6);
    if (!files.ok()) return Fail(box_id, files.status());
    BoxNetPlan plan;
    plan.files = std::move(*files);
    // Every TLS client in the box trusts the bundle: OpenSSL's tools (SSL_CERT_FILE, curl's
    // CURL_CA_BUNDLE), Python's requests and pip (REQUESTS_CA_BUNDLE), Node (NODE_EXTRA_CA_CERTS).
    plan.files.emplace_back(bundle_, kBoxCaBundle);
    for (const char* var :
         {"SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"})
      plan.env[var] = kBoxCaBundle;
    for (auto& secret : net->secrets)
      if (!secret.env.empty()) plan.env[secret.env] = secret.placeholder;
    plan.net = net;
    {
      MutexLock g(mu_);
      boxes_state_[box_id] = {*link, net};
    }
    return plan;
  }

  Status Attach(const std::string& box_id, pid_t init_pid) override {
    Entry e;
    {
      MutexLock g(mu_);
      auto it = boxes_state_.find(box_id);
      if (it == boxes_state_.end())
        return Status::Error("network: " + box_id + " was not prepared", ENOENT);
      e = it->second;
    }
    SBX_RETURN_IF_ERROR(CreateBoxLink(e.link, init_pid).Wrap("network: link of " + box_id));
    SBX_RETURN_IF_ERROR(
        firewall_->AddBox(box_id, e.link.host_ifname, BoxAddresses(e.link), e.net->policy));
    refusals_.Open(box_id);
    boxes_.Put(e.net);
    return {};
  }

  Status Update(const std::string& box_id, const BoxNetRequest& req) override {
    Entry e;
    bool known = false;
    {
      MutexLock g(mu_);
      auto it = boxes_state_.find(box_id);
      if (it != boxes_state_.end()) {
        e = it->second;
        known = true;
      }
    }
    if (!known && req.policy.mode == Mode::kNone)
      return Status::Error("network: " + box_id + " has no network", ENOENT);
    if (!known) {
      // A box adopted after a restart: its link lives on in its namespace; its slot is the one
      // the pool still holds for it.
      auto slot = config_.slots->Acquire(box_id);
      if (!slot.ok()) return slot.status();
      auto link = LinkFor(*slot);
      if (!link.ok()) return link.status();
      e.link = *link;
    }
    auto net = std::make_shared<BoxNet>(e.net ? *e.net : BoxNet{});
    net->id = box_id;
    net->box_ip = e.link.box_ip;
    net->host_ip = e.link.host_ip;
    net->box_ip6 = e.link.box_ip6;
    net->host_ip6 = e.link.host_ip6;
    net->policy = req.policy;
    // The request holds every binding the box has now: the owner (sandbox::Manager) opens the
    // recorded ones again with the placeholders the box's env holds, and E2B's rules change
    // with a policy change.
    net->secrets = req.secrets;
    net->egress_bytes_per_s = req.egress_bytes_per_s;
    if (!req.refusal_hint.empty()) net->refusal_hint = req.refusal_hint;  // else the one it had
    Status fw =
        known ? firewall_->UpdateBox(box_id, net->policy)
              : firewall_->AddBox(box_id, e.link.host_ifname, BoxAddresses(e.link), net->policy);
    SBX_RETURN_IF_ERROR(fw);
    refusals_.Open(box_id);  // kept across policy changes: a command may span one
    boxes_.Put(net);
    MutexLock g(mu_);
    boxes_state_[box_id] = {e.link, net};
    return {};
  }

  Status Release(const std::string& box_id) override {
    boxes_.Remove(box_id);
    refusals_.Forget(box_id);
    Status s = firewall_->RemoveBox(box_id);
    std::optional<std::string> ifname;
    {
      MutexLock g(mu_);
      if (auto it = boxes_state_.find(box_id); it != boxes_state_.end())
        ifname = it->second.link.host_ifname;
      boxes_state_.erase(box_id);
    }
    if (!ifname) {
      if (auto holders = config_.slots->Holders(); holders.ok())
        for (const auto& [id, slot] : *holders)
          if (id == box_id) ifname = IfName(slot);
    }
    // The veth goes with the box's namespace; this is for a box whose namespace outlived it.
    if (ifname)
      if (Status d = DeleteLink(*ifname); !d.ok() && s.ok()) s = d;
    if (Status r = RemoveTree(BoxDir(box_id)); !r.ok() && r.err() != ENOENT && s.ok()) s = r;
    if (Status r = config_.slots->Release(box_id); !r.ok() && s.ok()) s = r;
    return s;
  }

  Status Reconcile(const std::set<std::string>& live) override {
    Status first;
    auto keep = [&](const Status& s) {
      if (!s.ok()) {
        spdlog::warn("network reconcile: {}", s.message());
        if (first.ok()) first = s;
      }
    };
    std::set<std::string> held_ifnames;
    if (auto holders = config_.slots->Holders(); holders.ok()) {
      for (const auto& [id, slot] : *holders) {
        if (live.count(id)) {
          held_ifnames.insert(IfName(slot));
        } else {
          keep(Release(id));
        }
      }
    } else {
      keep(holders.status());
    }
    if (auto chains = firewall_->Boxes(); chains.ok()) {
      for (const auto& id : *chains)
        if (!live.count(id)) keep(firewall_->RemoveBox(id));
    } else {
      keep(chains.status());
    }
    if (!config_.owns_link_prefix) return first;  // other processes' links share the prefix
    if (auto links = ListLinks(config_.link_prefix); links.ok()) {
      for (const auto& name : *links)
        if (IsLinkOfPrefix(name) && !held_ifnames.count(name)) keep(DeleteLink(name));
    } else {
      keep(links.status());
    }
    return first;
  }

  BoxRefusals Refusals(const std::string& box_id, int64_t since_ms) override {
    std::shared_ptr<const BoxNet> net = boxes_.ById(box_id);
    if (!net) return {};
    BoxRefusals out = refusals_.Since(box_id, since_ms);
    out.policy = PolicySummary(net->policy);
    return out;
  }

  std::vector<std::string> HostObjects() override {
    std::vector<std::string> out;
    if (auto links = ListLinks(config_.link_prefix); links.ok())
      for (const auto& l : *links)
        if (IsLinkOfPrefix(l)) out.push_back("link " + l);
    if (auto chains = firewall_->Boxes(); chains.ok())
      for (const auto& c : *chains) out.push_back("chain box-" + c);
    return out;
  }

 private:
  struct Entry {
    LinkPlan link;
    std::shared_ptr<const BoxNet> net;
  };

  std::string BoxDir(const std::string& id) const { return config_.state_dir + "/boxes/" + id; }
  std::string IfName(int slot) const { return config_.link_prefix + std::to_string(slot); }
  // <link_prefix> and digits: a host end of this stack's kind.
  bool IsLinkOfPrefix(const std::string& name) const {
    const std::string& p = config_.link_prefix;
    return name.size() > p.size() && name.size() < 16 && name.rfind(p, 0) == 0 &&
           name.find_first_not_of("0123456789", p.size()) == std::string::npos;
  }
  static std::vector<address> BoxAddresses(const LinkPlan& link) {
    std::vector<address> out{link.box_ip};
    if (link.ipv6 && !link.box_ip6.is_unspecified()) out.push_back(link.box_ip6);
    return out;
  }
  Result<LinkPlan> LinkFor(int slot) const {
    auto link = SlotLinkPlan(subnet_, slot, subnet6_ ? &*subnet6_ : nullptr);
    if (link.ok()) link->host_ifname = IfName(slot);
    return link;
  }

  Status Fail(const std::string& box_id, const Status& why) {
    (void)Release(box_id);
    return why;
  }

  void Shutdown() {
    if (proxy_) proxy_->Stop();
    if (resolver_) resolver_->Stop();
    work_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
    // The table outlives the daemon for the boxes that do; with none left, a stop leaves no rule.
    if (firewall_) {
      auto boxes = firewall_->Boxes();
      if (boxes.ok() && boxes->empty()) {
        if (Status gone = DeleteTable(config_.table); !gone.ok())
          spdlog::warn("network: {}", gone.message());
      }
      firewall_.reset();
    }
  }

  const StackConfig config_;
  const Cidr subnet_;
  const std::optional<Cidr> subnet6_;  // with --ipv6
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::thread thread_;
  BoxRegistry boxes_;
  RefusalLog refusals_;  // before the resolver and the proxy, which write to it
  std::unique_ptr<CaresLookup> lookup_;
  std::unique_ptr<Resolver> resolver_;
  std::shared_ptr<Ca> ca_;
  std::string bundle_;  // host path of the CA bundle every networked box gets
  std::shared_ptr<Mitm> mitm_;
  std::unique_ptr<EgressProxy> proxy_;
  std::unique_ptr<Firewall> firewall_;
  Mutex mu_;
  std::map<std::string, Entry> boxes_state_ GUARDED_BY(mu_);
};

}  // namespace

Result<std::unique_ptr<Stack>> Stack::Start(StackConfig config, const InstallSecret& /*secret*/) {
  if (config.link_prefix.empty() || config.link_prefix.size() > 6 ||
      config.link_prefix.find_first_not_of("abcdefghijklmnopqrstuvwxyz") != std::string::npos)
    return Status::Error("network: bad link prefix '" + config.link_prefix + "'", EINVAL);
  auto subnet = ParseCidr(config.box_subnet);
  if (!subnet.ok()) return subnet.status().Wrap("--box-subnet");
  if (auto n = SlotCount(*subnet); !n.ok()) return n.status().Wrap("--box-subnet");
  std::optional<Cidr> subnet6;
  if (config.ipv6) {
    auto six = ParseCidr(config.box_subnet6);
    if (!six.ok()) return six.status().Wrap("--box-subnet6");
    SBX_RETURN_IF_ERROR(CheckSubnet6(*subnet, *six).Wrap("--box-subnet6"));
    subnet6 = *six;
  }
  auto stack = std::make_unique<StackImpl>(std::move(config), *subnet, subnet6);
  SBX_RETURN_IF_ERROR(stack->Init());
  return std::unique_ptr<Stack>(std::move(stack));
}

}  // namespace sbx::network

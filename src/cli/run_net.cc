#include "cli/run_net.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "cli/net.h"
#include "cli/serve.h"
#include "network/firewall.h"
#include "sandbox/net_slot_pool.h"
#include "sandbox/run_networks.h"

namespace sbx::cli {
namespace {

// The policy's network stack for one run: sbx serve's settings but for the names above.
Result<network::StackConfig> RunStackConfig(const std::string& data_dir, const std::string& id,
                                            const RunNetOptions& o) {
  ServeOptions so;  // one parser of the network flags for sbx serve and sbx run
  so.box_subnet = o.box_subnet;
  so.upstream_dns = o.upstream_dns;
  so.upstream_ca = o.upstream_ca;
  auto c = NetworkConfig(so);
  if (!c.ok()) return c.status();
  c->state_dir = sandbox::RunNetworkDir(data_dir);
  c->table = sandbox::RunTable(id);
  c->link_prefix = sandbox::kRunLinkPrefix;
  c->owns_link_prefix = false;
  c->refusal_hint =
      o.refusal_hint.empty()
          ? "This box was made by `sbx run`: run the command again with another --net."
          : o.refusal_hint;
  return c;
}

}  // namespace

void AddRunNetFlags(CLI::App* cmd, RunNetOptions& o, const std::string& what) {
  cmd->add_option("--net", o.net,
                  "Give " + what +
                      " a network: allow=NAME,... (an allowlist), open, deny=CIDR,... (with "
                      "open); as sbx create --net (repeatable)");
  cmd->add_option("--upstream-dns", o.upstream_dns,
                  "With --net: DNS servers names are resolved with, ADDR:PORT (repeatable; "
                  "default: the host's)");
  cmd->add_option("--upstream-ca", o.upstream_ca,
                  "With --net: the CA file upstream TLS is verified with (default: the host's)");
  cmd->add_option("--box-subnet", o.box_subnet,
                  "With --net: the pool box addresses come from (default 10.213.0.0/16)");
}

Result<network::Policy> RunPolicy(const RunNetOptions& o) {
  network::Policy p;
  if (!o.net.empty()) {
    auto j = ParseNetFlags(o.net);
    if (!j.ok()) return j.status();
    auto parsed = network::Policy::FromJson(j->dump());
    if (!parsed.ok()) return parsed.status().Wrap("--net");
    p = std::move(*parsed);
  }
  if (p.mode == network::Mode::kNone &&
      (!o.upstream_dns.empty() || !o.upstream_ca.empty() || !o.box_subnet.empty()))
    return Status::Error(
        "--upstream-dns, --upstream-ca and --box-subnet need --net (allow=NAME,... or open)",
        EINVAL);
  return p;
}

Result<std::unique_ptr<RunNetwork>> RunNetwork::Start(const std::string& data_dir,
                                                      store::Store& store,
                                                      const std::string& box_id,
                                                      const network::Policy& policy,
                                                      const RunNetOptions& o, bool verbose) {
  if (!sandbox::ValidRunId(box_id))
    return Status::Error("run network: bad box id '" + box_id + "'", EINVAL);
  auto config = RunStackConfig(data_dir, box_id, o);
  if (!config.ok()) return config.status();
  std::unique_ptr<RunNetwork> n(new RunNetwork(data_dir, box_id));
  auto lock = sandbox::TakeRunLock(data_dir, box_id);
  if (!lock.ok()) return lock.status().Wrap("run network: lock");
  n->lock_ = std::move(*lock);
  // From here on the destructor removes whatever exists.
  auto cidr = network::ParseCidr(config->box_subnet);
  if (!cidr.ok()) return cidr.status().Wrap("--box-subnet");
  auto pool = sandbox::StoreNetSlotPool::Make(store, *cidr, sandbox::kRunSlotScope);
  if (!pool.ok()) return pool.status();
  n->slots_ = std::move(*pool);
  config->slots = n->slots_.get();
  if (verbose) {
    config->on_event = [](network::NetEvent e) {
      std::fprintf(stderr, "sbx: %s %s\n", e.type.c_str(), e.detail.dump().c_str());
    };
  }
  auto secret = InstallSecret::LoadOrCreate(data_dir);
  if (!secret.ok()) return secret.status();
  auto stack = network::Stack::Start(*config, *secret);
  if (!stack.ok()) return stack.status().Wrap("--net needs networking on this host");
  n->stack_ = std::move(*stack);
  network::BoxNetRequest req;
  req.policy = policy;
  n->prepared_ = true;  // Release is idempotent: a failed Prepare leaves nothing either way
  auto plan = n->stack_->Prepare(box_id, req);
  if (!plan.ok()) return plan.status();
  n->plan_ = std::move(*plan);
  return n;
}

Status RunNetwork::Close() {
  Status s;
  if (stack_ && prepared_) s = stack_->Release(box_id_);
  stack_.reset();  // its threads, resolver and proxy
  if (Status t = network::DeleteTable(sandbox::RunTable(box_id_)); !t.ok() && s.ok()) s = t;
  if (::unlink(sandbox::RunBundle(data_dir_, box_id_).c_str()) != 0 && errno != ENOENT && s.ok())
    s = Status::Errno("unlink the run's CA bundle");
  // Last: with the lock gone the run is no more; everything above is gone already (or for a
  // reaper to find: a failure here leaves the lock file unlinked only if all went well).
  if (s.ok() && lock_) ::unlink(sandbox::RunLockPath(data_dir_, box_id_).c_str());
  lock_.reset();
  return s;
}

RunNetwork::~RunNetwork() {
  if (Status s = Close(); !s.ok())
    std::fprintf(stderr, "sbx: warning: the box's network: %s (the next sbx run removes it)\n",
                 s.message().c_str());
}

}  // namespace sbx::cli

#include "cli/serve.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <cctype>
#include <cstdio>
#include <cstring>

#include "api/audit_keeper.h"
#include "api/e2b/e2b.h"
#include "api/http/server.h"
#include "api/mcp/mcp.h"
#include "api/v1/api.h"
#include "cli/net.h"
#include "cli/runtimes.h"
#include "cli/template.h"
#include "cli/units.h"
#include "common/fs.h"
#include "common/secret.h"
#include "network/box_files.h"
#include "network/cares_lookup.h"
#include "network/ingress.h"
#include "network/policy.h"
#include "network/slots.h"
#include "runtime/native/native_runtime.h"
#include "sandbox/build.h"
#include "sandbox/id_pool.h"
#include "sandbox/manager.h"
#include "sandbox/net_slot_pool.h"
#include "sandbox/run_networks.h"
#include "store/store.h"

namespace sbx::cli {

std::string ApiKeyFile(const std::string& data_dir) { return data_dir + "/api-key"; }

namespace {

// `s` as one shell word: as it is when only safe characters make it, else single-quoted.
std::string ShellWord(const std::string& s) {
  bool plain = !s.empty();
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || std::strchr("/._-+:=@%,", c)))
      plain = false;
  if (plain) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// On first start (no key in the store) makes the key "default", prints it once and leaves it in
// a 0600 file for the CLI. The store keeps only its hash. It is an operator key: whoever can read
// the data directory (root on the host) manages every sandbox; tenants get keys of their own
// from `sbx key create`.
Status EnsureApiKey(store::Store& store, const std::string& data_dir) {
  auto keys = store.ListApiKeys();
  if (!keys.ok()) return keys.status();
  for (const auto& k : *keys)
    if (k.active()) return {};
  auto key = store.CreateApiKey("default", 0, 0, /*is_operator=*/true);
  if (!key.ok()) return key.status();
  SBX_RETURN_IF_ERROR(WriteFileAtomic(ApiKeyFile(data_dir), key->secret + "\n", 0600));
  std::fprintf(stderr,
               "sbx: first start: created operator API key '%s' (shown once, stored "
               "hashed):\n\n    %s\n\n"
               "     the sbx CLI reads it from %s\n",
               key->record.id.c_str(), key->secret.c_str(), ApiKeyFile(data_dir).c_str());
  return {};
}

}  // namespace

Result<network::StackConfig> NetworkConfig(const ServeOptions& o) {
  network::StackConfig c;
  if (!o.box_subnet.empty()) {
    auto cidr = network::ParseCidr(o.box_subnet);
    if (!cidr.ok() || !cidr->base.is_v4() || cidr->prefix < 8 || cidr->prefix > 30)
      return Status::Error(
          "--box-subnet: an IPv4 network from /8 to /30, e.g. 10.213.0.0/16 (got '" + o.box_subnet +
              "')",
          EINVAL);
    c.box_subnet = cidr->ToString();
  }
  for (const auto& addr : o.upstream_dns) {
    Status ok = network::ParseUpstream(addr);  // ADDR:PORT, [v6]:PORT
    if (!ok.ok())
      return Status::Error("--upstream-dns: " + ok.message() + ", e.g. 198.18.0.53:53 or [::1]:53",
                           EINVAL);
    c.upstream_dns.push_back(addr);
  }
  if (!o.upstream_ca.empty()) {
    if (::access(o.upstream_ca.c_str(), R_OK) != 0)
      return Status::Error(
          "--upstream-ca: cannot read '" + o.upstream_ca + "': " + std::strerror(errno), EINVAL);
    c.upstream_ca = o.upstream_ca;
  }
  for (const auto& r : o.allow_ranges) {
    auto cidr = network::ParseCidr(r);
    if (!cidr.ok())
      return Status::Error("--allow-range: a CIDR, e.g. 192.168.5.0/24 (got '" + r + "')", EINVAL);
    if (!network::AlwaysDeniedRange(cidr->base))
      return Status::Error(
          "--allow-range: " + r + " is not in an always-denied range; policies already reach it",
          EINVAL);
    c.opened_ranges.push_back(*cidr);
  }
  c.ipv6 = o.ipv6;
  if (!o.box_subnet6.empty()) {
    if (!o.ipv6) return Status::Error("--box-subnet6 needs --ipv6", EINVAL);
    auto six = network::ParseCidr(o.box_subnet6);
    auto subnet = network::ParseCidr(c.box_subnet);
    Status fits = !six.ok()     ? six.status()
                  : subnet.ok() ? network::CheckSubnet6(*subnet, *six)
                                : subnet.status();
    if (!fits.ok())
      return Status::Error("--box-subnet6: " + fits.message() + ", e.g. fd73:6278::/64 (got '" +
                               o.box_subnet6 + "')",
                           EINVAL);
    c.box_subnet6 = six->ToString();
  }
  return c;
}

Result<sandbox::RegistryPolicy> RegistryPolicyOf(const ServeOptions& o) {
  sandbox::RegistryPolicy p;
  p.allowed = o.registries;
  p.insecure = o.insecure_registries;
  p.ca_file = o.registry_ca_file;
  for (const auto& m : o.registry_mirrors) {
    size_t eq = m.find('=');
    if (eq == std::string::npos)
      return Status::Error(
          "--registry-mirror: expected REGISTRY=HOST[:PORT], e.g. docker.io=127.0.0.1:5000 (got '" +
              m + "')",
          EINVAL);
    p.mirrors.emplace_back(m.substr(0, eq), m.substr(eq + 1));
  }
  if (!p.ca_file.empty() && ::access(p.ca_file.c_str(), R_OK) != 0)
    return Status::Error(
        "--registry-ca-file: cannot read '" + p.ca_file + "': " + std::strerror(errno), EINVAL);
  SBX_RETURN_IF_ERROR(sandbox::ValidateRegistryPolicy(p));
  return p;
}

namespace {

// --build-network as a policy (sandbox::ManagerConfig::e2b_build_network); EINVAL naming it.
Result<network::Policy> BuildNetwork(const ServeOptions& o) {
  if (o.build_network.empty()) return network::Policy{};
  auto j = ParseNetFlags(o.build_network);
  auto p = j.ok() ? network::Policy::FromJson(j->dump()) : Result<network::Policy>(j.status());
  if (!p.ok())
    return Status::Error(
        "--build-network: " + p.status().message() + " (none, open, or allow=NAME,...)", EINVAL);
  if (p->mode != network::Mode::kNone && o.network == "off")
    return Status::Error("--build-network: builds get a network only with --network auto or on",
                         EINVAL);
  return p;
}

}  // namespace

int IoThreadsFor(int cpus) { return std::clamp(cpus / 4, 1, 8); }

int UsableCpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

int ServeCommand(const GlobalOptions& global, const ServeOptions& o) {
  if (::geteuid() != 0) {
    std::fprintf(stderr, "sbx: sbx serve needs root (it creates namespaces, cgroups and mounts)\n");
    return kExitSbxError;
  }
  // The network flags, checked before anything is opened.
  auto net_config = NetworkConfig(o);
  if (!net_config.ok()) {
    std::fprintf(stderr, "sbx: %s\n", net_config.status().message().c_str());
    return kExitSbxError;
  }
  net_config->state_dir = global.data_dir + "/network";
  auto registries = RegistryPolicyOf(o);
  if (!registries.ok()) {
    std::fprintf(stderr, "sbx: %s\n", registries.status().message().c_str());
    return kExitSbxError;
  }
  auto build_network = BuildNetwork(o);
  if (!build_network.ok()) {
    std::fprintf(stderr, "sbx: %s\n", build_network.status().message().c_str());
    return kExitSbxError;
  }
  std::vector<sandbox::PoolSpec> pools;
  for (const auto& text : o.pools) {
    auto spec = sandbox::ParsePoolSpec(text);
    if (!spec.ok()) {
      std::fprintf(stderr, "sbx: --pool: %s\n", spec.status().message().c_str());
      return kExitSbxError;
    }
    pools.push_back(*spec);
  }
  auto colon = o.listen.rfind(':');
  if (colon == std::string::npos) {
    std::fprintf(stderr, "sbx: --listen: expected HOST:PORT, got '%s'\n", o.listen.c_str());
    return kExitSbxError;
  }
  http::ServerOptions so;
  so.host = o.listen.substr(0, colon);
  so.port = static_cast<uint16_t>(std::atoi(o.listen.c_str() + colon + 1));
  so.unix_socket = o.unix_socket;
  so.threads = o.threads > 0 ? o.threads : IoThreadsFor(UsableCpus());
  so.max_connections = o.max_connections;
  so.max_connections_per_address = o.max_connections_per_address;
  so.access_log = http::SpdlogAccessLog();
  auto retention = ParseDuration(o.audit_retention);
  if (!retention.ok()) {
    std::fprintf(stderr, "sbx: --audit-retention: %s\n", retention.status().message().c_str());
    return kExitSbxError;
  }
  if (Status bounds = sandbox::Limits::CheckConfigured(o.ranges); !bounds.ok()) {
    std::fprintf(stderr, "sbx: %s\n", bounds.what().c_str());
    return kExitSbxError;
  }
  if (!(o.default_egress_mbps >= 0)) {
    std::fprintf(stderr, "sbx: --default-egress-mbps: a rate in Mbit/s, 0 for none\n");
    return kExitSbxError;
  }
  // Every connection is a descriptor, and so is much of what a sandbox holds (a create of a
  // 500-layer template opens each layer): the soft limit (often 1024, or less where the daemon
  // was started from) would make accept or a mount fail long before the hard limit.
  if (rlimit nofile{}; ::getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    rlim_t inherited = nofile.rlim_cur;
    if (nofile.rlim_cur < nofile.rlim_max) {
      nofile.rlim_cur = nofile.rlim_max;
      if (::setrlimit(RLIMIT_NOFILE, &nofile) != 0) nofile.rlim_cur = inherited;
    }
    spdlog::info("open files: soft limit {} (inherited {}, hard {})",
                 static_cast<uint64_t>(nofile.rlim_cur), static_cast<uint64_t>(inherited),
                 static_cast<uint64_t>(nofile.rlim_max));
  }

  // SIGTERM/SIGINT end the daemon through a signalfd; SIGPIPE never kills it.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  ::sigprocmask(SIG_BLOCK, &sigs, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  Status s = MakeDirs(global.data_dir, 0711);
  if (!s.ok()) {
    std::fprintf(stderr, "sbx: %s\n", s.message().c_str());
    return kExitSbxError;
  }
  // One daemon per data directory: the lock lives as long as this process.
  UniqueFd lock(
      ::open((global.data_dir + "/serve.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock || ::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    std::fprintf(stderr, "sbx: another sbx serve is using %s (%s)\n", global.data_dir.c_str(),
                 std::strerror(errno));
    return kExitSbxError;
  }
  // Every token and URL signature is an HMAC under this secret (common/secret.h).
  auto secret = InstallSecret::LoadOrCreate(global.data_dir);
  if (!secret.ok()) {
    std::fprintf(stderr, "sbx: %s\n", secret.status().message().c_str());
    return kExitSbxError;
  }
  sandbox::ManagerConfig mc;
  mc.default_timeout_ms = o.default_timeout_s * 1000;
  mc.ranges = o.ranges;
  mc.default_limits.egress_mbps = o.default_egress_mbps;
  mc.data_dir = global.data_dir;
  mc.pools = pools;
  mc.install_secret = &*secret;  // seals secret values (sandbox/secrets.h)
  if (!o.disk_reserve.empty() && o.disk_reserve.back() == '%') {
    char* end = nullptr;
    std::string num = o.disk_reserve.substr(0, o.disk_reserve.size() - 1);
    mc.disk_reserve_percent = std::strtod(num.c_str(), &end);
    mc.disk_reserve_bytes = 0;
    if (num.empty() || *end != '\0' || !(mc.disk_reserve_percent >= 0) ||
        mc.disk_reserve_percent > 100) {
      std::fprintf(stderr, "sbx: --disk-reserve: a size or a percentage 0%%..100%%, got '%s'\n",
                   o.disk_reserve.c_str());
      return kExitSbxError;
    }
  } else {
    auto bytes = ParseSize(o.disk_reserve);
    if (!bytes.ok() || *bytes < 0) {
      std::fprintf(stderr, "sbx: --disk-reserve: a size (1G) or a percentage (5%%), got '%s'\n",
                   o.disk_reserve.c_str());
      return kExitSbxError;
    }
    mc.disk_reserve_bytes = *bytes;
  }
  auto st = store::Store::Open(global.data_dir + "/" + store::kDbFileName);
  if (!st.ok()) {
    std::fprintf(stderr, "sbx: store: %s\n", st.status().message().c_str());
    return kExitSbxError;
  }
  runtime::NativeConfig cfg;
  cfg.run_dir = global.data_dir + "/run";
  cfg.agent_path = FindAgent(global.agent_path);
  if (const char* p = std::getenv("SBX_CGROUP_PARENT")) cfg.cgroup_parent = p;
  cfg.idmap = !o.no_idmap;
  sandbox::IdPoolConfig pool_config{o.id_pool_base, o.id_pool_size};
  auto pool = sandbox::StoreIdPool::Make(**st, pool_config, cfg.id_base);
  if (!pool.ok()) {
    std::fprintf(stderr, "sbx: %s\n", pool.status().message().c_str());
    return kExitSbxError;
  }
  // sbx run reads it, so a slot means the same host ids to both.
  if (Status saved = sandbox::SaveIdPoolConfig(global.data_dir, pool_config); !saved.ok()) {
    std::fprintf(stderr, "sbx: %s\n", saved.message().c_str());
    return kExitSbxError;
  }
  cfg.id_pool = pool->get();
  cfg.peer_run_dirs = HostRuntimeRunDirs(global);
  auto rt = runtime::NativeRuntime::Open(cfg);
  if (!rt.ok()) {
    std::fprintf(stderr, "sbx: %s\n", rt.status().message().c_str());
    return kExitSbxError;
  }
  for (const auto& w : (*rt)->warnings()) spdlog::warn("{}", w);
  s = EnsureApiKey(**st, global.data_dir);
  if (!s.ok()) {
    std::fprintf(stderr, "sbx: api key: %s\n", s.message().c_str());
    return kExitSbxError;
  }
  storage::TemplateStore templates = CliTemplateStore(global.data_dir, o.template_cache_bytes);
  templates.sudo_binary = cfg.agent_path;  // the host template's sudo (template.h)
  if (s = RecordTemplateCacheBytes(templates); !s.ok()) {
    std::fprintf(stderr, "sbx: template cache: %s\n", s.message().c_str());
    return kExitSbxError;
  }
  // What killed pulls, builds and uploads left (a pull running beside the daemon keeps its
  // directory). No upload is running yet: every temp file is a dead one's.
  auto swept = storage::SweepAbandoned(templates, **st);
  if (!swept.ok()) spdlog::warn("template cache sweep: {}", swept.status().message());
  int swept_pulls = swept.ok() ? *swept : 0;
  int swept_uploads = sandbox::TemplateBuilds::SweepUploads(global.data_dir, true);
  if (swept_pulls > 0 || swept_uploads > 0)
    spdlog::info("swept {} abandoned pull directories and {} upload temp files", swept_pulls,
                 swept_uploads);
  // The network stack: it must outlive the manager, which calls it on every create and destroy.
  // Its audit events go to the manager once there is one (AuditNetwork), never after it.
  std::unique_ptr<network::Stack> stack;
  std::unique_ptr<sandbox::StoreNetSlotPool> slots;
  std::atomic<sandbox::Manager*> audit_to{nullptr};
  if (o.network != "off") {
    Status started_ok;
    auto cidr = network::ParseCidr(net_config->box_subnet);
    auto net_pool = cidr.ok() ? sandbox::StoreNetSlotPool::Make(**st, *cidr)
                              : Result<std::unique_ptr<sandbox::StoreNetSlotPool>>(cidr.status());
    if (net_pool.ok()) {
      slots = std::move(*net_pool);
      net_config->slots = slots.get();
      net_config->on_event = [&audit_to](network::NetEvent e) {
        if (sandbox::Manager* m = audit_to.load()) m->AuditNetwork(e);
      };
      auto started = network::Stack::Start(*net_config, *secret);
      if (started.ok())
        stack = std::move(*started);
      else
        started_ok = started.status();
    } else {
      started_ok = net_pool.status();
    }
    if (!started_ok.ok() && o.network == "on") {
      std::fprintf(stderr, "sbx: --network on: %s\n", started_ok.message().c_str());
      return kExitSbxError;
    }
    if (!started_ok.ok())
      spdlog::warn(
          "networking is off: {} (sandboxes get loopback only; --network on makes this "
          "fatal)",
          started_ok.message());
  }
  mc.network = stack.get();
  // What a box without a network sees of it: a resolv.conf saying so.
  if (auto none = network::WriteNoNetworkFiles(global.data_dir + "/network/none"); none.ok())
    mc.no_network_files = std::move(*none);
  else
    spdlog::warn("network: {}", none.status().message());
  // Template builds (sandbox/build.h) for /v1/templates and E2B's template API: RUN steps in
  // boxes of this runtime, with this daemon's network stack and cache.
  sandbox::BuilderConfig bc;
  bc.runtime = rt->get();
  bc.templates = templates;
  bc.store = st->get();
  bc.network = stack.get();
  bc.refusal_hint =
      "This box is a RUN step of a template build: build again with another network policy (the "
      "build's \"network\" on /v1/templates, sbx serve --build-network for E2B builds).";
  bc.no_network_files = mc.no_network_files;
  bc.registries = *registries;
  std::unique_ptr<sandbox::Builder> builder = sandbox::MakeBuilder(bc);
  mc.builder = builder.get();
  mc.e2b_build_network = *build_network;
  if (!stack && build_network->mode != network::Mode::kNone)
    spdlog::warn("--build-network {}: networking is off, so E2B builds fail until it is on",
                 build_network->Describe());
  // Sandboxes run under their template's runtime, or the one a create asks for (runtimes.h).
  runtime::Router runtimes(**rt);
  AddHostRuntimes(runtimes, global, cfg.agent_path, cfg.id_pool);
  sandbox::Manager manager(mc, runtimes, templates, **st);
  audit_to = &manager;
  struct AuditOff {
    std::atomic<sandbox::Manager*>& to;
    ~AuditOff() { to = nullptr; }
  } audit_off{audit_to};
  // And the networks killed `sbx run --net`s left here (tables, links, slots, files): the clean-up
  // every sbx run does first, so a host that runs no sbx run again is cleaned up too. Live runs
  // (their lock held) are left alone.
  if (stack) {
    if (auto reaped = sandbox::ReapKilledRunNetworks(global.data_dir, **st); !reaped.ok())
      spdlog::warn("{}", reaped.status().message());
    else if (*reaped > 0)
      spdlog::info("removed the networks of {} killed sbx run(s)", *reaped);
  }
  s = manager.Reconcile();
  if (!s.ok()) {
    std::fprintf(stderr, "sbx: %s\n", s.message().c_str());
    return kExitSbxError;
  }
  manager.StartTtlLoop();
  if (s = manager.StartPools(); !s.ok()) {
    std::fprintf(stderr, "sbx: %s\n", s.message().c_str());
    return kExitSbxError;
  }

  boost::asio::thread_pool blocking(4);
  api::Metrics metrics;
  api::ApiContext ctx{manager, metrics, blocking, *secret};
  api::AuditKeeperOptions ko;
  ko.retention_ms = *retention;
  api::AuditKeeper audit_keeper(**st, *ctx.denials, ko);
  audit_keeper.Start();
  http::Router router;
  api::RegisterV1(router, ctx);
  api::RegisterE2b(router, ctx);
  api::McpContext mcp_ctx{manager, blocking, *secret, ctx.denials};
  api::RegisterMcp(router, mcp_ctx);
  http::Server server(so, std::move(router));
  s = server.Start();
  if (!s.ok()) {
    std::fprintf(stderr, "sbx: listen on %s: %s\n", o.listen.c_str(), s.message().c_str());
    return kExitSbxError;
  }
  // The CLI finds the daemon and its key through the data directory: a command to copy must name
  // one that is not the default.
  std::string sbx = global.data_dir == GlobalOptions{}.data_dir
                        ? "sbx"
                        : "sbx --data-dir " + ShellWord(global.data_dir);
  std::fprintf(stderr,
               "sbx: serving on http://%s:%u (data in %s); stop with Ctrl-C or SIGTERM\n"
               "     try:  %s create   (the CLI finds the daemon and its key by itself)\n"
               "           curl -H \"Authorization: Bearer $(cat %s)\" http://%s:%u/v1/sandboxes\n",
               so.host.c_str(), server.port(), global.data_dir.c_str(), sbx.c_str(),
               ShellWord(ApiKeyFile(global.data_dir)).c_str(), so.host.c_str(), server.port());
  spdlog::info("http: {} I/O thread(s){}", so.threads,
               o.threads > 0 ? "" : " (one per 4 CPUs this process may use; --threads N)");
  // The port, for scripts and tests that asked for port 0.
  (void)WriteFileAtomic(global.data_dir + "/serve.port", std::to_string(server.port()) + "\n",
                        0644);

  int sfd = ::signalfd(-1, &sigs, SFD_CLOEXEC);
  signalfd_siginfo si{};
  while (::read(sfd, &si, sizeof si) < 0 && errno == EINTR) {
  }
  spdlog::info("signal {}: stopping; sandboxes keep running", si.ssi_signo);
  server.Stop();
  audit_keeper.Stop();  // after the server: writes the denial counts still pending
  manager.Stop();
  blocking.join();
  ::close(sfd);
  return 0;
}

}  // namespace sbx::cli

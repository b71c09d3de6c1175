#include "cli/build.h"

#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cli/run_net.h"
#include "cli/runtimes.h"
#include "cli/template.h"
#include "cli/units.h"
#include "common/fd.h"
#include "common/fs.h"
#include "common/thread_annotations.h"
#include "network/box_files.h"
#include "runtime/native/native_runtime.h"
#include "sandbox/build.h"
#include "sandbox/id_pool.h"
#include "sandbox/run_networks.h"
#include "storage/dockerfile.h"
#include "store/store.h"

namespace sbx::cli {
namespace {

constexpr int64_t kMaxDockerfileBytes = 1 << 20;

// The network of `sbx build --net`'s RUN steps, as the Builder's stack: each step's box gets a
// network of its own exactly as a `sbx run --net` box does (RunNetwork: its own stack, lock,
// nftables table, link and slot), made at the step's Prepare and removed at its Release. A build
// killed mid-step leaves what a killed run leaves, and the next `sbx build` or `sbx run` reaps it
// (sandbox::ReapKilledRunNetworks).
class StepNetworks final : public network::Stack {
 public:
  StepNetworks(const GlobalOptions& global, store::Store& store, RunNetOptions options)
      : global_(global), store_(store), options_(std::move(options)) {}

  Result<network::BoxNetPlan> Prepare(const std::string& box_id,
                                      const network::BoxNetRequest& request) override {
    auto n = RunNetwork::Start(global_.data_dir, store_, box_id, request.policy, options_,
                               global_.verbose);
    if (!n.ok()) return n.status();
    network::BoxNetPlan plan = (*n)->plan();
    MutexLock lock(mu_);
    nets_[box_id] = std::move(*n);
    return plan;
  }
  Status Attach(const std::string& box_id, pid_t init_pid) override {
    MutexLock lock(mu_);
    auto it = nets_.find(box_id);
    if (it == nets_.end()) return Status::Error("network of " + box_id + ": not prepared", ENOENT);
    return it->second->Attach(init_pid);
  }
  Status Update(const std::string& box_id, const network::BoxNetRequest&) override {
    return Status::Error("network of " + box_id + ": a build's policy is fixed", ENOTSUP);
  }
  Status Release(const std::string& box_id) override {
    std::unique_ptr<RunNetwork> n;  // removed outside the lock (its destructor logs failures)
    MutexLock lock(mu_);
    auto it = nets_.find(box_id);
    if (it == nets_.end()) return {};
    n = std::move(it->second);
    nets_.erase(it);
    return {};
  }
  Status Reconcile(const std::set<std::string>&) override {
    return {};
  }  // sandbox::ReapKilledRunNetworks's
  std::vector<std::string> HostObjects() override { return {}; }

 private:
  const GlobalOptions& global_;
  store::Store& store_;
  const RunNetOptions options_;
  Mutex mu_;
  std::map<std::string, std::unique_ptr<RunNetwork>> nets_ GUARDED_BY(mu_);
};

struct BuildOptions {
  std::string tag;
  std::string file;  // empty: DIR/Dockerfile
  std::vector<std::string> build_args;
  bool no_cache = false;
  RunNetOptions network;
  std::string memory, cpus;
  std::string context;
  // A FROM image's pull (as `sbx template pull`'s flags).
  std::vector<std::string> insecure;
  std::string ca_file, username;
  bool password_stdin = false;
};

int BuildCommand(const GlobalOptions& global, const BuildOptions& o) {
  auto policy = RunPolicy(o.network);
  if (!policy.ok()) return Fail(policy.status());
  if (::geteuid() != 0)
    return Fail(Status::Error("sbx build needs root (it creates namespaces, cgroups and mounts)"));
  std::map<std::string, std::string> build_args;
  for (const auto& a : o.build_args) {
    size_t eq = a.find('=');
    std::string k = a.substr(0, eq);
    if (k.empty()) return Fail(Status::Error("--build-arg: expected K=V or K, got '" + a + "'"));
    if (eq != std::string::npos) {
      build_args[k] = a.substr(eq + 1);
    } else if (const char* v = std::getenv(k.c_str())) {
      build_args[k] = v;  // `--build-arg K` takes K from the environment, as docker build
    }
  }
  std::string context = o.context;
  while (context.size() > 1 && context.back() == '/') context.pop_back();
  char real[PATH_MAX];
  if (::realpath(context.c_str(), real) == nullptr)
    return Fail(Status::Errno("build context " + o.context));
  std::string file = o.file.empty() ? std::string(real) + "/Dockerfile" : o.file;
  auto text = ReadFile(file, kMaxDockerfileBytes);
  if (!text.ok()) return Fail(text.status().Wrap("Dockerfile"));
  auto steps = storage::ParseDockerfile(*text, build_args);
  if (!steps.ok()) return Fail(steps.status());
  auto password = RegistryPassword(o.username, o.password_stdin);
  if (!password.ok()) return Fail(password.status());

  // A Ctrl-C or SIGTERM ends the process: the step's box dies with it (die_with_parent) and the
  // next build removes its directory; staging directories and pins go by the cache's sweep.
  ::signal(SIGPIPE, SIG_IGN);
  runtime::NativeConfig cfg;
  cfg.run_dir = global.data_dir + "/run";
  cfg.agent_path = FindAgent(global.agent_path);
  if (const char* p = std::getenv("SBX_CGROUP_PARENT")) cfg.cgroup_parent = p;
  auto db = store::Store::Open(global.data_dir + "/" + store::kDbFileName);
  if (!db.ok()) return Fail(db.status().Wrap("store"));
  auto pool_config = sandbox::LoadIdPoolConfig(global.data_dir);
  if (!pool_config.ok()) return Fail(pool_config.status());
  auto pool = sandbox::StoreIdPool::Make(**db, *pool_config, cfg.id_base);
  if (!pool.ok()) return Fail(pool.status());
  cfg.id_pool = pool->get();
  cfg.peer_run_dirs = HostRuntimeRunDirs(global);
  auto rt = runtime::NativeRuntime::Open(cfg);
  if (!rt.ok()) return Fail(rt.status());
  const auto& warnings = (*rt)->warnings();
  for (size_t i = 0; i < warnings.size(); ++i) {
    bool fallback = i == 0 && !(*rt)->idmapped();
    if (fallback || global.verbose) std::fprintf(stderr, "sbx: warning: %s\n", warnings[i].c_str());
  }

  sandbox::BuilderConfig bc;
  bc.runtime = rt->get();
  bc.templates = CliTemplateStore(global.data_dir, 0);
  bc.templates.sudo_binary = cfg.agent_path;  // the host template's sudo (template.h)
  bc.store = db->get();
  // The operator's own build: FROM may pull from any registry (plain HTTP only to those named).
  bc.registries.any_registry = true;
  bc.registries.insecure = o.insecure;
  bc.registries.ca_file = o.ca_file;
  bc.registries.docker_config = DockerConfigPath();
  if (Status v = sandbox::ValidateRegistryPolicy(bc.registries); !v.ok()) return Fail(v);
  if (auto none = network::WriteNoNetworkFiles(global.data_dir + "/network/none"); none.ok())
    bc.no_network_files = std::move(*none);
  // The networks of killed `sbx run --net`s and `sbx build --net`s (the Builder reaps their
  // boxes); then this build's, declared before the builder that uses it.
  if (auto reaped = sandbox::ReapKilledRunNetworks(global.data_dir, **db); !reaped.ok())
    std::fprintf(stderr, "sbx: warning: %s\n", reaped.status().message().c_str());
  else if (*reaped > 0 && global.verbose)
    std::fprintf(stderr, "sbx: removed the networks of %d killed run(s) or build(s)\n", *reaped);
  std::unique_ptr<StepNetworks> networks;
  if (policy->mode != network::Mode::kNone) {
    RunNetOptions net = o.network;
    net.refusal_hint = "This box is a RUN step of `sbx build`: build again with another --net.";
    networks = std::make_unique<StepNetworks>(global, **db, std::move(net));
    bc.network = networks.get();
  }
  auto builder = sandbox::MakeBuilder(bc);

  sandbox::BuildSpec spec;
  spec.name = o.tag;
  spec.steps = std::move(*steps);
  spec.context_dir = real;
  spec.no_cache = o.no_cache;
  spec.registry_username = o.username;
  spec.registry_password = *password;
  spec.network = *policy;
  if (!o.memory.empty()) {
    auto v = ParseSize(o.memory);
    if (!v.ok() || *v < (4 << 20))
      return Fail(Status::Error("--memory: a size of at least 4M", EINVAL));
    spec.memory_bytes = *v;
  }
  if (!o.cpus.empty()) {
    char* end = nullptr;
    double c = std::strtod(o.cpus.c_str(), &end);
    if (end == o.cpus.c_str() || *end != '\0' || !(c >= 0.01 && c <= 1024))
      return Fail(Status::Error("--cpus: a number of cores from 0.01 to 1024", EINVAL));
    spec.cpus = c;
  }
  auto rec = builder->Run(std::move(spec), [](const sandbox::BuildLogLine& l) {
    // The step lines and the RUN output on stdout as docker build prints them; the failure is
    // said once, below.
    if (l.level == "error" && l.text.rfind("step ", 0) == 0) return;
    std::fprintf(stdout, "%s\n", l.text.c_str());
    std::fflush(stdout);
  });
  if (!rec.ok()) return Fail(rec.status());
  return 0;
}

}  // namespace

void RegisterBuildVerb(CLI::App& app, const GlobalOptions& global, ClientVerbs& verbs) {
  auto o = std::make_shared<BuildOptions>();
  CLI::App* b = app.add_subcommand(
      "build", "Build a template from a Dockerfile and a context directory (local, as root)");
  b->add_option("-t,--tag", o->tag, "Name of the template to make (replaced if it exists)")
      ->required();
  b->add_option("-f,--file", o->file, "The Dockerfile (default: DIR/Dockerfile)");
  b->add_option("--build-arg", o->build_args,
                "Set an ARG: K=V, or K to take it from the environment");
  b->add_flag("--no-cache", o->no_cache, "Run every step again instead of reusing earlier layers");
  AddRunNetFlags(b, o->network, "each RUN step");
  b->add_option("--memory", o->memory, "Memory limit of each RUN step, e.g. 2G");
  b->add_option("--cpus", o->cpus, "CPU quota of each RUN step in cores");
  b->add_option("--insecure-registry", o->insecure,
                "A FROM image's registry spoken to in plain HTTP, HOST or HOST:PORT (repeatable)");
  b->add_option("--ca-file", o->ca_file,
                "Verify a FROM image's registry with this PEM bundle instead of the host's CAs");
  b->add_option("--username", o->username,
                "Registry user of the FROM image (default: $DOCKER_CONFIG/config.json or "
                "~/.docker/config.json, else anonymous)");
  b->add_flag("--password-stdin", o->password_stdin,
              "Read the registry password from the first line of stdin");
  b->add_option("DIR", o->context, "The build context: COPY reads from it")->required();
  verbs.Add(b, [o, &global] { return BuildCommand(global, *o); });
}

}  // namespace sbx::cli

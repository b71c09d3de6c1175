#include "cli/run.h"

#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "cli/refusals.h"
#include "cli/run_net.h"
#include "cli/runtimes.h"
#include "cli/template.h"
#include "cli/terminal.h"
#include "cli/units.h"
#include "cli/volumes.h"
#include "common/fs.h"
#include "protocol/client.h"
#include "runtime/native/native_runtime.h"
#include "sandbox/id_pool.h"
#include "sandbox/run_networks.h"
#include "sandbox/session.h"
#include "storage/template.h"
#include "store/store.h"

namespace sbx::cli {
namespace {

using protocol::Tag;
using protocol::Type;
using Clock = std::chrono::steady_clock;

void Error(const std::string& msg) { std::fprintf(stderr, "sbx: %s\n", msg.c_str()); }

int64_t Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::microseconds>(b - a).count();
}

// The outcome of the command, as the agent reported it.
struct Outcome {
  bool exited = false;
  int64_t exit_code = 0;
  int64_t signal = 0;
  bool timed_out = false;
};

struct Limits {
  runtime::Limits limits;
  int64_t timeout_ms = 0;
};

Result<Limits> ParseLimits(const RunOptions& o) {
  Limits l;
  if (!o.memory.empty()) {
    auto v = ParseSize(o.memory);
    if (!v.ok()) return v.status().Wrap("--memory");
    if (*v < (4 << 20)) return Status::Error("--memory: at least 4M", EINVAL);
    l.limits.memory_bytes = *v;
  }
  if (!o.disk.empty()) {
    auto v = ParseSize(o.disk);
    if (!v.ok()) return v.status().Wrap("--disk");
    if (*v < (16 << 20)) return Status::Error("--disk: at least 16M", EINVAL);
    l.limits.disk_bytes = *v;
  }
  if (!o.cpus.empty()) {
    char* end = nullptr;
    double c = std::strtod(o.cpus.c_str(), &end);
    if (end == o.cpus.c_str() || *end != '\0' || !(c >= 0.01 && c <= 1024))
      return Status::Error("--cpus: a number of cores from 0.01 to 1024, got '" + o.cpus + "'",
                           EINVAL);
    l.limits.cpus = c;
  }
  if (!o.pids.empty()) {
    char* end = nullptr;
    long long p = std::strtoll(o.pids.c_str(), &end, 10);
    if (end == o.pids.c_str() || *end != '\0' || p < 1 || p > 4194304)
      return Status::Error("--pids: a whole number from 1, got '" + o.pids + "'", EINVAL);
    l.limits.pids = p;
  }
  if (!o.timeout.empty()) {
    auto v = ParseDuration(o.timeout);
    if (!v.ok()) return v.status().Wrap("--timeout");
    if (*v <= 0) return Status::Error("--timeout: must be positive", EINVAL);
    l.timeout_ms = *v;
  }
  for (const auto& e : o.env) {
    if (e.empty() || e.find('=') == std::string::npos || e[0] == '=')
      return Status::Error("--env: expected K=V, got '" + e + "'", EINVAL);
  }
  return l;
}

// Drives one command through the agent: stdin in, stdout/stderr out, signals and resizes, until
// EXIT. Returns nullopt when sbx was interrupted (`*interrupted` = the signal).
Result<Outcome> Drive(protocol::AgentConnection& conn, uint32_t spawn_id, int64_t pid,
                      const RunOptions& o, int sigfd, int64_t deadline_ms, int* interrupted) {
  bool stdin_open = o.interactive;
  auto deadline = deadline_ms > 0 ? Clock::now() + std::chrono::milliseconds(deadline_ms)
                                  : Clock::time_point::max();
  char buf[65536];
  for (;;) {
    pollfd fds[3] = {{conn.fd(), POLLIN, 0}, {sigfd, POLLIN, 0}, {0, POLLIN, 0}};
    nfds_t n = stdin_open ? 3 : 2;
    int timeout = -1;
    if (deadline != Clock::time_point::max()) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0)
        return Status::Error("the agent did not end the command at its deadline", ETIMEDOUT);
      timeout = static_cast<int>(std::min<int64_t>(left, 1 << 30));
    }
    // Frames already read and queued by the client are handled before waiting on the socket.
    int ready = conn.HasQueued() ? 0 : ::poll(fds, n, timeout);
    if (ready < 0 && errno != EINTR) return Status::Errno("poll");
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo si;
      if (::read(sigfd, &si, sizeof si) == sizeof si) {
        if (si.ssi_signo == SIGWINCH) {
          winsize ws{};
          if (::ioctl(0, TIOCGWINSZ, &ws) == 0) {
            protocol::Writer w;
            w.Int(Tag::kPid, pid).Int(Tag::kRows, ws.ws_row).Int(Tag::kCols, ws.ws_col);
            SBX_RETURN_IF_ERROR(conn.Send(Type::kResize, conn.NextId(), w));
          }
        } else {
          *interrupted = static_cast<int>(si.ssi_signo);
          return Outcome{};
        }
      }
    }
    if (stdin_open && (fds[2].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t r = ::read(0, buf, sizeof buf);
      if (r > 0) {
        protocol::Writer w;
        w.Int(Tag::kPid, pid).Str(Tag::kData, std::string_view(buf, static_cast<size_t>(r)));
        SBX_RETURN_IF_ERROR(conn.Send(Type::kStdin, conn.NextId(), w));
      } else if (r == 0 || errno != EINTR) {
        stdin_open = false;
        protocol::Writer w;
        w.Int(Tag::kPid, pid);
        SBX_RETURN_IF_ERROR(conn.Send(Type::kCloseStdin, conn.NextId(), w));
      }
    }
    if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR)) && !conn.HasQueued()) continue;
    auto frame = conn.Receive(0);
    if (!frame.ok()) {
      if (frame.status().err() == ETIMEDOUT) continue;
      return frame.status().Wrap("agent connection");
    }
    const auto& f = *frame;
    if (f.header.type == Type::kError && f.header.id != spawn_id) {
      // A failed STDIN after the process closed its stdin is not worth stopping for.
      continue;
    }
    if (f.header.id != spawn_id) continue;
    if (f.header.type == Type::kOutput) {
      int out = f.fields.Int(Tag::kStream) == 2 ? 2 : 1;
      SBX_RETURN_IF_ERROR(
          WriteAll(out, f.fields.Str(Tag::kData)).Wrap(out == 1 ? "stdout" : "stderr"));
    } else if (f.header.type == Type::kExit) {
      Outcome oc;
      oc.exited = true;
      oc.exit_code = f.fields.Int(Tag::kExitCode, -1);
      oc.signal = f.fields.Int(Tag::kSignal, 0);
      oc.timed_out = f.fields.Int(Tag::kTimedOut, 0) != 0;
      return oc;
    }
  }
}

}  // namespace

std::optional<int> SpawnFailureExit(const std::string& message) {
  if (message.rfind("spawn ", 0) != 0) return std::nullopt;
  // The user, the working directory or the ids could not be set: the program is not at fault.
  for (const char* stage : {": unknown user ", ": chdir ", ": set user", ": set up"})
    if (message.find(stage) != std::string::npos) return kExitCannotExecute;
  std::string enoent = std::string(": ") + std::strerror(ENOENT);
  if (message.size() > enoent.size() &&
      message.compare(message.size() - enoent.size(), enoent.size(), enoent) == 0)
    return kExitNotFound;
  return kExitCannotExecute;
}

std::string FindAgent(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* e = std::getenv("SBX_AGENT")) return e;
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    std::string dir(self);
    dir.resize(dir.rfind('/'));
    std::string beside = dir + "/sbx-agent";
    if (::access(beside.c_str(), X_OK) == 0) return beside;
  }
  return "/usr/local/lib/sbx/sbx-agent";
}

int RunCommand(const GlobalOptions& global, const RunOptions& o) {
  auto t0 = Clock::now();
  auto limits = ParseLimits(o);
  if (!limits.ok()) {
    Error(limits.status().message());
    return kExitSbxError;
  }
  auto volumes = ParseVolumes(o.volumes);
  if (!volumes.ok()) {
    Error(volumes.status().what());
    return kExitSbxError;
  }
  auto policy = RunPolicy(o.network);
  if (!policy.ok()) {
    Error(policy.status().message());
    return kExitSbxError;
  }
  const bool networked = policy->mode != network::Mode::kNone;
  if (::geteuid() != 0) {
    Error("sbx run needs root (it creates namespaces, cgroups and mounts)");
    return kExitSbxError;
  }

  // Termination signals are taken synchronously from here on, so an interrupted run still
  // removes its box. The box's first process resets the mask before anything runs inside.
  sigset_t sigs;
  sigemptyset(&sigs);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH}) sigaddset(&sigs, s);
  ::sigprocmask(SIG_BLOCK, &sigs, nullptr);
  UniqueFd sigfd(::signalfd(-1, &sigs, SFD_CLOEXEC));
  ::signal(SIGPIPE, SIG_IGN);

  runtime::NativeConfig cfg;
  cfg.run_dir = global.data_dir + "/run";
  cfg.agent_path = FindAgent(global.agent_path);
  if (const char* p = std::getenv("SBX_CGROUP_PARENT")) cfg.cgroup_parent = p;
  // The box's id range comes from the pool sbx serve uses (same store, same configuration), so
  // a run's box never shares host ids with a daemon's.
  auto db = store::Store::Open(global.data_dir + "/" + store::kDbFileName);
  if (!db.ok()) {
    Error("store: " + db.status().message());
    return kExitSbxError;
  }
  (void)(*db)->KeepWalShort();  // the next run's open reads less (a speed-up only)
  auto pool_config = sandbox::LoadIdPoolConfig(global.data_dir);
  if (!pool_config.ok()) {
    Error(pool_config.status().message());
    return kExitSbxError;
  }
  auto pool = sandbox::StoreIdPool::Make(**db, *pool_config, cfg.id_base);
  if (!pool.ok()) {
    Error(pool.status().message());
    return kExitSbxError;
  }
  cfg.id_pool = pool->get();
  cfg.peer_run_dirs = HostRuntimeRunDirs(global);
  auto rt = runtime::NativeRuntime::Open(cfg);
  if (!rt.ok()) {
    Error(rt.status().message());
    return kExitSbxError;
  }
  // The command's stderr is passed through untouched: the fallback (boxes without private ids)
  // is said always, the rest only with --verbose.
  const auto& warnings = (*rt)->warnings();
  for (size_t i = 0; i < warnings.size(); ++i) {
    bool fallback = i == 0 && !(*rt)->idmapped();
    if (fallback || global.verbose) std::fprintf(stderr, "sbx: warning: %s\n", warnings[i].c_str());
  }
  // Boxes of earlier `sbx run`s that were killed before they could clean up.
  if (auto reaped = (*rt)->ReapOrphans("run"); reaped.ok() && *reaped > 0 && global.verbose)
    std::fprintf(stderr, "sbx: removed %d box(es) left by killed runs\n", *reaped);
  // And the networks of killed `sbx run --net`s (their tables, links, slots).
  if (auto reaped = sandbox::ReapKilledRunNetworks(global.data_dir, **db); !reaped.ok())
    std::fprintf(stderr, "sbx: warning: %s\n", reaped.status().message().c_str());
  else if (*reaped > 0 && global.verbose)
    std::fprintf(stderr, "sbx: removed the networks of %d killed run(s)\n", *reaped);
  auto t_open = Clock::now();
  // A local root action: a registered name, or a host path (see storage::ResolveLocalTemplate).
  std::function<void()> drop_template;
  storage::TemplateStore ts = CliTemplateStore(global.data_dir, 0);
  ts.sudo_binary = cfg.agent_path;  // the host template's sudo (template.h)
  auto tmpl = storage::ResolveLocalTemplate(ts, **db, o.template_name, &drop_template);
  if (!tmpl.ok()) {
    Error(tmpl.status().message());
    return kExitSbxError;
  }
  struct DropTemplate {
    std::function<void()>& f;
    ~DropTemplate() {
      if (f) f();
    }
  } drop_at_exit{drop_template};
  auto t_template = Clock::now();

  // The runtime asked for, else the template's: one this host lacks fails here, never falls back.
  runtime::Router router(**rt);
  AddHostRuntimes(router, global, cfg.agent_path, cfg.id_pool,
                  !o.runtime.empty()      ? o.runtime
                  : tmpl->runtime.empty() ? "native"
                                          : tmpl->runtime);
  runtime::BoxSpec spec;
  spec.runtime = !o.runtime.empty() ? o.runtime : tmpl->runtime;
  if (Status can = router.CanCreate(spec.runtime); !can.ok()) {
    Error(can.message());
    return kExitSbxError;
  }
  // Boxes of earlier runs under this runtime that were killed before they could clean up (the
  // native runtime's were reaped above; a killed run's watchdog has killed their processes).
  if (!spec.runtime.empty() && spec.runtime != "native") {
    if (auto reaped = router.ReapOrphans("run"); reaped.ok() && *reaped > 0 && global.verbose)
      std::fprintf(stderr, "sbx: removed %d %s box(es) left by killed runs\n", *reaped,
                   spec.runtime.c_str());
  }
  spec.id = RandomId();
  spec.layers = tmpl->layers;
  spec.may_hold_top_layer = true;  // a snapshot's layer on btrfs: started from, never stacked
  spec.binds = tmpl->binds;
  // After the template's: a volume over a template bind (/usr of the host template) wins.
  spec.binds.insert(spec.binds.end(), volumes->begin(), volumes->end());
  spec.limits = limits->limits;
  spec.die_with_parent = true;
  spec.owner = "run";
  // The box's network: a stack of this process's own (run_net.h), planned before the box exists
  // and attached at the runtime's sync point; removed (also on failure) when `net` goes.
  std::unique_ptr<RunNetwork> net;
  if (networked) {
    auto started =
        RunNetwork::Start(global.data_dir, **db, spec.id, *policy, o.network, global.verbose);
    if (!started.ok()) {
      Error(started.status().message());
      return kExitSbxError;
    }
    net = std::move(*started);
    for (const auto& [host, inside] : net->plan().files)
      spec.binds.push_back(runtime::BindMount{host, inside, true, {}});
    RunNetwork* n = net.get();
    spec.at_sync_point = [n](pid_t init_pid) { return n->Attach(init_pid); };
  }
  auto box = router.Create(spec);
  if (!box.ok()) {
    Error(box.status().message());
    return kExitSbxError;
  }
  auto t_created = Clock::now();

  int interrupted = 0;
  std::optional<int> spawn_failure;  // the command could not start: 126 or 127
  Result<Outcome> outcome = Status::Error("not started");
  int64_t spawn_us = 0, run_us = 0, hello_us = 0;
  {
    auto conn = protocol::AgentConnection::Connect(box->agent_socket, 10000);
    auto t_hello = Clock::now();
    hello_us = Us(t_created, t_hello);
    if (!conn.ok()) {
      outcome = conn.status().Wrap("connect to the box's agent");
    } else {
      // The daemon's merge of the template's defaults with the command's (sandbox/session.h).
      sandbox::CommandSpec cmd;
      cmd.argv = o.command;
      if (o.tty) cmd.env["TERM"] = std::getenv("TERM") ? std::getenv("TERM") : "xterm";
      for (const auto& e : o.env) cmd.env[e.substr(0, e.find('='))] = e.substr(e.find('=') + 1);
      // The network's variables (the CA bundle's paths) win over -e, as on sbx serve.
      if (net)
        for (const auto& [k, v] : net->plan().env) cmd.env[k] = v;
      cmd.cwd = o.workdir;
      cmd.user = o.user;
      cmd.stdin_open = o.interactive;
      cmd.timeout = std::chrono::milliseconds(limits->timeout_ms);
      if (o.tty) {
        winsize ws{};
        if (::ioctl(0, TIOCGWINSZ, &ws) != 0 || ws.ws_row == 0) ws = {24, 80, 0, 0};
        cmd.pty = sandbox::PtySize{std::min<int>(ws.ws_row, sandbox::kMaxPtySide),
                                   std::min<int>(ws.ws_col, sandbox::kMaxPtySide)};
      }
      store::TemplateDefaults defaults{tmpl->env, tmpl->user, tmpl->workdir};
      auto w = sandbox::SpawnRequest(defaults, {}, cmd);
      uint32_t id = conn->NextId();
      auto reply = w.ok() ? conn->CallWithId(Type::kSpawn, id, *w, nullptr, 30000)
                          : Result<protocol::Frame>(w.status());
      auto t_spawned = Clock::now();
      spawn_us = Us(t_hello, t_spawned);
      if (!reply.ok()) {
        // The agent's own words for a spawn it refused, without the connection's prefix.
        std::string said = reply.status().message();
        if (said.rfind("agent: ", 0) == 0) said.erase(0, 7);
        spawn_failure = SpawnFailureExit(said);
        outcome = Status::Error(said);
      } else {
        std::optional<RawTerminal> raw;
        if (o.tty && o.interactive) raw.emplace(0);
        // The agent enforces the timeout; the deadline here only guards against an agent that
        // cannot answer any more (frozen, killed).
        int64_t deadline = limits->timeout_ms > 0 ? limits->timeout_ms + 5000 : 0;
        outcome =
            Drive(*conn, id, reply->fields.Int(Tag::kPid), o, sigfd.get(), deadline, &interrupted);
      }
      run_us = Us(t_spawned, Clock::now());
    }
  }
  // After the command's output: what its box's network refused, if anything (cli/refusals.h).
  if (net) PrintRefusals(net->Refusals(), "Change it with `sbx run --net allow=NAME,...`.");

  // OOM kills are counted by the cgroup: read before the box (and its cgroup) goes away.
  uint64_t oom_kills = 0, ooms = 0;
  if (auto st = router.Stats(*box); st.ok()) oom_kills = st->oom_kills, ooms = st->ooms;
  // A lost agent: what the runtime knows of its end (a gVisor sandbox's exit and agent.log's last
  // words), also read before the box goes.
  std::optional<std::string> agent_exit;
  if (!outcome.ok() && !spawn_failure) agent_exit = router.AgentExit(*box);
  auto t_destroy = Clock::now();
  Status destroyed = router.Destroy(*box);
  net.reset();  // after the box: its chain, link, slot, stack and table
  auto t_end = Clock::now();
  if (!destroyed.ok()) Error(destroyed.message());

  if (o.timings) {
    const auto& tm = box->timings;
    std::fprintf(stderr,
                 "sbx timings (us): open=%lld template=%lld prepare=%lld cgroup=%lld clone=%lld "
                 "child=%lld hello=%lld spawn=%lld run=%lld destroy=%lld total=%lld\n",
                 (long long)Us(t0, t_open), (long long)Us(t_open, t_template),
                 (long long)tm.prepare_us, (long long)tm.cgroup_us, (long long)tm.clone_us,
                 (long long)tm.child_us, (long long)hello_us, (long long)spawn_us,
                 (long long)run_us, (long long)Us(t_destroy, t_end), (long long)Us(t0, t_end));
  }
  if (interrupted != 0) {
    Error(std::string("interrupted by ") + ::strsignal(interrupted) + "; box removed");
    return 128 + interrupted;
  }
  const std::string limit_hit =
      "out of memory: the box hit its memory limit of " + FormatSize(limits->limits.memory_bytes);
  const std::string oom =
      limit_hit + " and its OOM killer killed " + std::to_string(oom_kills) + " process(es)";
  if (!outcome.ok() && (oom_kills > 0 || ooms > 0)) {
    // The box's own kernel was among them (gVisor's sandbox, where sbx's OOM guard could not take
    // the kill from the host's kernel), or ended at the limit before anything was killed (gVisor's
    // Sentry failing an allocation the host's kernel refused it there: oom_guard.h). The agent's
    // connection ended with it; the command died of the limit all the same, as by SIGKILL.
    if (oom_kills > 0)
      Error(oom + ", the box's runtime with its command");
    else
      Error(limit_hit + " and its runtime ended with it" +
            (agent_exit ? " (" + *agent_exit + ")" : ""));
    return 128 + SIGKILL;
  }
  if (!outcome.ok()) {
    Error(outcome.status().message() + (agent_exit ? " (" + *agent_exit + ")" : ""));
    return spawn_failure.value_or(kExitSbxError);
  }
  if (outcome->timed_out) {
    Error("timed out after " + o.timeout + "; box removed");
    return kExitTimeout;
  }
  if (oom_kills > 0) Error(oom);
  if (outcome->signal != 0) return 128 + static_cast<int>(outcome->signal);
  if (!destroyed.ok()) return kExitSbxError;
  return static_cast<int>(outcome->exit_code & 0xff);
}

}  // namespace sbx::cli

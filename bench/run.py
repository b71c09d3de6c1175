#!/usr/bin/env python3
"""sbx benchmark harness (issue 5): `make bench` runs this.

Measures, in one run on one machine:
  1. create to first command (P50/P95/P99, success rate) sequentially and at concurrency
     10/50/100 for `sbx run` and its peers (bubblewrap, bubblewrap in a cgroup, runc, crun, plain
     fork+exec), timed by bench/launch.c (sbx-bench-launch), no interpreter in the timed path;
  2. where sbx's creation time goes (`sbx run --timings`, per phase);
  1/3. through a `sbx serve` daemon started for the run (bench/daemon.py, timed by
     bench/api.cc, sbx-bench-api): create to first command via the REST API (in the same
     rotation as the contenders above), exec of `true` in a running sandbox beside plain
     fork+exec, stdout throughput of a 1 GiB stream with the daemon's peak RSS;
  4. density: host memory per idle box at 100 and 1000 boxes, time to create and destroy them
     (bench/density.cc, sbx-bench-density);
  5. every figure as a ratio to the peers of the same run;
  6. networking (bench/net.py, issue 12): create to first command with an `allowlist` policy
     versus `none`, download throughput through the egress proxy versus a direct veth, and the
     time to first byte the proxy adds (HTTP, HTTPS spliced, HTTPS through the interceptor),
     all against the fake internet of tests/network (nothing leaves the machine);
  7. templates (bench/templates.py, issue 13): pull and unpack of an image from a local
     docker-registry by `sbx template pull` versus `skopeo copy` + `umoci unpack`, cold and warm;
     the first create from a new template versus one from a used template; a cached `sbx build`
     versus the first build;
  8. snapshots (bench/snapshots.py, issue 14): a snapshot versus `cp -a` of the same writable
     layer, a fork into 10 versus 10 creates, a create from a snapshot versus one from host, a
     pause without memory and its resume versus a pause and resume with memory, for writable
     layers of 1 MB, 100 MB and 1 GB.
  9. warm pools (bench/pools.py, issue 14): create through the REST API from a warm pool versus a
     cold create versus bubblewrap, at concurrency 1, 10 and 50.
Writes bench/results/<timestamp>.json, bench/results/latest.json, bench/results/latency.svg and
docs/benchmarks.md (keeping its hand-written intro). The E2B SDK row is listed as not measured,
with the reason (the facade does not exist yet).

Usage: python3 bench/run.py [--build DIR] [--quick] [--skip-density] [--only KEY,KEY]
  --only takes contender keys, `net` (the network rows), `templates` (the template rows) and
  `snapshots` (the snapshot rows), `pools` (the warm pool rows), `hotpaths` (issue 14 item 6:
  the cold path, exec and stdout rows), `runtimes` (issue 15: create to first command and idle
  memory per runtime). `--only net`, `--only templates`, `--only snapshots` or a
  comma-separated list of them runs only those sections and merges
  them into bench/results/latest.json, keeping the other sections of the run there.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon as daemon_mod  # noqa: E402
import net as net_mod  # noqa: E402
import peers as peers_mod  # noqa: E402
import pools as pools_mod  # noqa: E402
import runtimes as runtimes_mod  # noqa: E402
import snapshots as snapshots_mod  # noqa: E402
import templates as templates_mod  # noqa: E402
import report  # noqa: E402
from stats import ratio, summarize  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Non-reclaimable kernel memory that boxes add (namespaces, mounts, page tables, stacks). Host-
# wide like MemAvailable, but far less disturbed by other work's page cache and heap.
KERNEL_FIELDS = ("SUnreclaim", "KernelStack", "PageTables")
PHASES = ["open", "template", "prepare", "cgroup", "clone", "child", "hello", "spawn", "run",
          "destroy", "total"]

# (workers, runs per worker). Sequential runs go in blocks rotated across contenders so that
# drift on a shared machine hits all of them alike.
FULL = {"seq_runs": 100, "seq_block": 20, "levels": [(10, 10), (50, 3), (100, 2)],
        "density": [100, 1000], "warmup": 5, "exec_runs": 250}
QUICK = {"seq_runs": 30, "seq_block": 10, "levels": [(10, 3), (50, 1), (100, 1)],
         "density": [20, 100], "warmup": 2, "exec_runs": 200}

NOT_MEASURED = []


T0 = time.time()


def log(msg):
    print(f"bench: [{time.time() - T0:5.0f} s] {msg}", file=sys.stderr, flush=True)


def build_helpers(build_dir):
    """Builds sbx, sbx-agent and the bench helpers; returns an error string or None."""
    targets = ["sbx", "sbx-agent", "sbx-bench-launch", "sbx-bench-density", "sbx-bench-api",
               "sbx-bench-zeroserve"]
    if not os.path.exists(os.path.join(build_dir, "build.ninja")):
        r = subprocess.run(["cmake", "-S", ROOT, "-B", build_dir, "-G", "Ninja"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return "cmake configure failed:\n" + r.stdout[-2000:] + r.stderr[-2000:]
    r = subprocess.run(["cmake", "--build", build_dir, "--target", *targets],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return "build failed:\n" + (r.stdout + r.stderr)[-3000:]
    return None


PEER_PACKAGES = {"bwrap": "bubblewrap", "runc": "runc", "crun": "crun"}


def install_peers():
    """Installs the peers' Debian packages when missing (like `make deps`: only what is absent)."""
    missing = [pkg for exe, pkg in PEER_PACKAGES.items() if not shutil.which(exe)]
    if not missing or not shutil.which("apt-get"):
        return
    log(f"installing the peers' packages: {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    r = subprocess.run(["apt-get", "install", "-y", "-qq", *missing], env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
        r = subprocess.run(["apt-get", "install", "-y", "-qq", *missing], env=env,
                           capture_output=True, text=True)
    if r.returncode != 0:
        log(f"could not install {' '.join(missing)} (they will be reported as not run): "
            f"{r.stderr.strip()[-300:]}")


def machine_info():
    info = {"kernel": platform.release(), "cores": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    info["memory_mib"] = int(line.split()[1]) // 1024
    except OSError:
        pass
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    info["os"] = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    mode, desc, _ = peers_mod.cgroup_mode()
    info["cgroup_mode"] = mode
    info["cgroup_detail"] = desc
    return info


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def parse_timings(text):
    for line in text.splitlines():
        if line.startswith("sbx timings (us):"):
            out = {}
            for kv in line.split(":", 1)[1].split():
                k, _, v = kv.partition("=")
                try:
                    out[k] = int(v)
                except ValueError:
                    pass
            return out
    return None


DAEMON = None  # the `sbx serve` of this run (bench/daemon.py), for the API contenders
# Server-side durations (ms) from the daemon's access log, per (contender, level, route).
SERVER_MS = {}


def launch(launcher, peer, workers, runs, tmp, timeout=900):
    """Runs one batch through sbx-bench-launch (sbx-bench-api for the API contenders); returns
    a list of sample dicts and an error."""
    errdir = tempfile.mkdtemp(prefix="errs-", dir=tmp)
    if peer.api is not None:
        argv = daemon_mod.api_launch_argv(DAEMON, peer, workers, runs, errdir)
        log_from = DAEMON.log_offset()
    else:
        argv = [launcher, "-c", str(workers), "-n", str(runs), "-e", errdir]
        if peer.cgroup:
            argv += ["-g", peer.cgroup]
        argv += ["--", *peer.argv]
    env = dict(os.environ)
    env.update(peer.env or {})
    samples, error = [], None
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env, start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            error = f"batch timed out after {timeout} s and was killed"
        if p.returncode not in (0, None) and not error:
            error = f"launcher exited {p.returncode}: {err.strip()[-500:]}"
    except OSError as e:
        shutil.rmtree(errdir, ignore_errors=True)
        return [], f"cannot start the launcher: {e}"
    if peer.api is not None:
        for route, _, ms in DAEMON.access_entries(log_from):
            SERVER_MS.setdefault((peer.key, str(workers), route), []).append(ms)
    for line in out.splitlines():
        parts = line.split()
        if len(parts) not in (5, 9):
            continue
        w, r, start, dur, status = (int(x) for x in parts[:5])
        s = {"worker": w, "run": r, "start_ns": start, "us": dur // 1000, "status": status}
        if len(parts) == 9:  # sbx-bench-api: create, to_start, exec, delete (ns, -1: none)
            s["api_ms"] = {k: int(v) / 1e6 for k, v in
                           zip(("create", "to_start", "exec", "delete"), parts[5:]) if int(v) >= 0}
        try:
            with open(os.path.join(errdir, f"{w}-{r}.err"), errors="replace") as f:
                text = f.read()
        except OSError:
            text = ""
        if peer.key == "sbx":
            t = parse_timings(text)
            if t:
                s["timings"] = t
        if status != 0:
            msg = "\n".join(l for l in text.splitlines() if not l.startswith("sbx timings"))
            s["error"] = (msg.strip() or f"exit status {status}, no message")[:400]
        samples.append(s)
    shutil.rmtree(errdir, ignore_errors=True)
    return samples, error


def summarize_batch(samples, workers, runs, batch_error):
    ok = [s["us"] / 1000.0 for s in samples if s["status"] == 0]
    attempts = workers * runs
    errors = {}
    for s in samples:
        if s["status"] != 0:
            errors[s["error"]] = errors.get(s["error"], 0) + 1
    if batch_error:
        errors[batch_error] = errors.get(batch_error, 0) + (attempts - len(samples))
    starts = [s["start_ns"] for s in samples]
    ends = [s["start_ns"] + s["us"] * 1000 for s in samples]
    wall_ms = (max(ends) - min(starts)) / 1e6 if samples else None
    return {
        "workers": workers, "runs_per_worker": runs, "attempts": attempts, "ok": len(ok),
        "success_rate": len(ok) / attempts if attempts else 0.0,
        "summary_ms": summarize(ok), "errors": errors, "batch_wall_ms": wall_ms,
        "boxes_per_s": (len(ok) / (wall_ms / 1000.0)) if wall_ms else None,
    }


def probe(launcher, peer, tmp):
    """One run; a contender that fails it is reported with its exact error and not measured."""
    samples, err = launch(launcher, peer, 1, 1, tmp, timeout=120)
    if err:
        return err
    if not samples:
        return "no sample from the launcher"
    if samples[0]["status"] != 0:
        return samples[0].get("error", f"exit status {samples[0]['status']}")
    return None


def run_latency(cfg, peers, launcher, tmp):
    results = {}
    live = []
    for p in peers:
        results[p.key] = {"label": p.label, "isolation": p.isolation, "argv": p.argv,
                          "error": p.error, "levels": {}}
        if p.error is None:
            p.error = probe(launcher, p, tmp)
            if p.error and p.api is not None and DAEMON.proc.poll() is not None:
                p.error = (f"{p.error.strip()} -- sbx serve exited with status "
                           f"{DAEMON.proc.returncode}; its log ends: {DAEMON.log_tail(600)}")
            if p.error and p.key == "crun":
                why = peers_mod.crun_hybrid_explanation()
                if why and "hybrid" in p.error:
                    p.error = f"{p.error.strip()} -- {why}"
            results[p.key]["error"] = p.error
        if p.error:
            log(f"{p.label}: cannot run here: {p.error}")
            continue
        live.append(p)
        launch(launcher, p, 1, cfg["warmup"], tmp, timeout=300)

    # Sequential, in rotated blocks.
    seq = {p.key: [] for p in live}
    seq_err = {p.key: None for p in live}
    blocks = max(1, cfg["seq_runs"] // cfg["seq_block"])
    for b in range(blocks):
        order = live[b % len(live):] + live[:b % len(live)] if live else []
        for p in order:
            t0 = time.time()
            samples, err = launch(launcher, p, 1, cfg["seq_block"], tmp)
            for s in samples:
                s["run"] += b * cfg["seq_block"]
            seq[p.key] += samples
            seq_err[p.key] = seq_err[p.key] or err
            ok = sum(1 for s in samples if s["status"] == 0)
            log(f"sequential block {b + 1}/{blocks}: {p.label}: {ok}/{cfg['seq_block']} ok "
                f"({time.time() - t0:.1f} s)")
    for p in live:
        summ = summarize_batch(seq[p.key], 1, blocks * cfg["seq_block"], seq_err[p.key])
        summ["samples"] = seq[p.key]
        results[p.key]["levels"]["1"] = summ
        log(f"sequential: {p.label}: p50 {fmt(summ['summary_ms']['p50'])} ms, "
            f"success {summ['success_rate'] * 100:.0f}%")

    for workers, runs in cfg["levels"]:
        for p in live:
            if p.seq_only:
                continue
            t0 = time.time()
            samples, err = launch(launcher, p, workers, runs, tmp)
            summ = summarize_batch(samples, workers, runs, err)
            summ["samples"] = samples
            results[p.key]["levels"][str(workers)] = summ
            log(f"concurrency {workers} x {runs}: {p.label}: {summ['ok']}/{summ['attempts']} ok, "
                f"p50 {fmt(summ['summary_ms']['p50'])} ms, p99 {fmt(summ['summary_ms']['p99'])} "
                f"ms ({time.time() - t0:.1f} s)")
    return results


def fmt(v):
    return "-" if v is None else f"{v:.1f}"


def phase_breakdown(latency):
    """Per-phase P50/P95 (ms) of sbx's --timings, per concurrency level."""
    out = {}
    sbx = latency.get("sbx", {})
    for level, data in sbx.get("levels", {}).items():
        ts = [s["timings"] for s in data.get("samples", []) if s["status"] == 0 and
              "timings" in s]
        if not ts:
            continue
        phases = {}
        for ph in PHASES:
            vals = [t[ph] / 1000.0 for t in ts if ph in t]
            phases[ph] = summarize(vals)
        # Create -> first exit as sbx itself sees it: everything but the destroy.
        inner = [(t["total"] - t.get("destroy", 0)) / 1000.0 for t in ts if "total" in t]
        out[level] = {"n": len(ts), "phases": phases, "exit_known_in_sbx": summarize(inner)}
    return out


def ratios(latency):
    """sbx / peer for P50, P95, P99 at every level both measured."""
    out = {}
    sbx = latency.get("sbx", {}).get("levels", {})
    for key, peer in latency.items():
        if key == "sbx" or key.startswith("sbx-rest"):
            continue
        for level, data in peer.get("levels", {}).items():
            if level not in sbx:
                continue
            a, b = sbx[level]["summary_ms"], data["summary_ms"]
            out.setdefault(key, {})[level] = {
                q: ratio(a[q], b[q]) for q in ("p50", "p95", "p99")}
    return out


API_KEYS = ("sbx-rest", "sbx-rest-quickack")


def api_phases(latency):
    """Per API contender and level: the client's phases (create, commands request to the start
    event, to the exit event, the untimed DELETE) and the daemon's access-log durations."""
    out = {}
    for key in API_KEYS:
        for level, data in latency.get(key, {}).get("levels", {}).items():
            ok = [s["api_ms"] for s in data.get("samples", []) if s["status"] == 0 and
                  "api_ms" in s]
            client = {ph: summarize([a[ph] for a in ok if ph in a])
                      for ph in ("create", "to_start", "exec", "delete")}
            server = {route: summarize(SERVER_MS.get((key, level, route), []))
                      for route in ("create", "commands", "delete")}
            out.setdefault(key, {})[level] = {"n": len(ok), "client": client, "server": server}
    return out


def api_ratios(latency, phases):
    """REST API / `sbx run` (end to end, and the exit-known-inside-sbx figure) per level."""
    out = {}
    sbx = latency.get("sbx", {}).get("levels", {})
    for key in API_KEYS:
        for level, data in latency.get(key, {}).get("levels", {}).items():
            if level not in sbx:
                continue
            a, b = data["summary_ms"], sbx[level]["summary_ms"]
            inner = phases.get(level, {}).get("exit_known_in_sbx", {})
            out.setdefault(key, {})[level] = {
                "ratio": {q: ratio(a[q], b[q]) for q in ("p50", "p95", "p99")},
                "diff_ms": {q: (a[q] - b[q]) if a[q] is not None and b[q] is not None else None
                            for q in ("p50", "p95", "p99")},
                "ratio_inner": {q: ratio(a[q], inner.get(q)) for q in ("p50", "p95", "p99")},
                "diff_inner_ms": {q: (a[q] - inner[q]) if a[q] is not None and
                                  inner.get(q) is not None else None
                                  for q in ("p50", "p95", "p99")},
            }
    return out


def run_density(build_dir, counts, tmp):
    exe = os.path.join(build_dir, "bench", "sbx-bench-density")
    argv = [exe, "--agent", os.path.join(build_dir, "sbx-agent"),
            "--counts", ",".join(str(c) for c in counts),
            "--memory", str(peers_mod.MEMORY_BYTES), "--pids", str(peers_mod.PIDS)]
    log(f"density: {', '.join(str(c) for c in counts)} idle boxes (sbx-bench-density)")
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        try:
            out, err = p.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)  # it stops between creations and cleans up
            out, err = p.communicate(timeout=300)
            return {"error": "timed out after 900 s", "stderr": err[-2000:]}
    except OSError as e:
        return {"error": f"cannot start {exe}: {e}"}
    for line in err.splitlines():
        log(line)
    try:
        d = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"sbx-bench-density exited {p.returncode} without a result",
                "stderr": err[-2000:]}
    if p.returncode != 0 and "error" not in d:
        d["error"] = f"sbx-bench-density exited {p.returncode}"
    for r in d.get("rounds", []):
        n = r.get("created", 0)
        if n:
            avail = -r["idle_delta"].get("MemAvailable", 0)
            r["per_box_memavailable_bytes"] = avail / n
            kernel = sum(r["idle_delta"].get(k, 0) for k in KERNEL_FIELDS)
            r["per_box_kernel_bytes"] = kernel / n
            r["per_box_estimate_bytes"] = (kernel + r["agent_pss_sum"]) / n
            r["per_box_cgroup_bytes"] = r["cgroup_memory_usage_sum"] / n
            r["per_box_agent_pss_bytes"] = r["agent_pss_sum"] / n
            r["create_per_box_ms"] = r["create_total_ms"] / n
            r["destroy_per_box_ms"] = r["destroy_total_ms"] / n
            r["create_ms_summary"] = summarize(r.pop("create_ms", []))
    return d


def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            parts = v.split()
            out[k] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    return out


def pss(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def run_density_bwrap(counts, bwrap_argv):
    """The same memory figures for N idle bubblewrap boxes (`sleep` in each), as the peer."""
    rounds = []
    argv = bwrap_argv[:-1] + ["/bin/sleep", "3600"]
    for n in counts:
        log(f"density peer: {n} idle bwrap boxes")
        subprocess.run(["sync"])
        time.sleep(1)
        before = meminfo()
        procs, error = [], None
        t0 = time.time()
        for _ in range(n):
            try:
                procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL,
                                              stderr=subprocess.PIPE))
            except OSError as e:
                error = f"spawn #{len(procs) + 1}: {e}"
                break
        spawn_ms = (time.time() - t0) * 1000
        time.sleep(3)
        idle = meminfo()
        alive = [p for p in procs if p.poll() is None]
        if len(alive) < len(procs) and not error:
            dead = next(p for p in procs if p.poll() is not None)
            error = (f"{len(procs) - len(alive)} bwrap exited early: "
                     f"{dead.stderr.read().decode(errors='replace').strip()[:300]}")
        total_pss = 0
        for p in alive:
            total_pss += pss(p.pid)
            for c in children(p.pid):  # bwrap's pid-1 child, then sleep
                total_pss += pss(c)
                for g in children(c):
                    total_pss += pss(g)
        t1 = time.time()
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
            p.stderr.close()
        kill_ms = (time.time() - t1) * 1000
        delta = {k: idle.get(k, 0) - before.get(k, 0) for k in
                 ("MemAvailable", "SUnreclaim", "KernelStack", "PageTables", "Slab")}
        r = {"requested": n, "created": len(alive), "spawn_total_ms": spawn_ms,
             "kill_total_ms": kill_ms, "idle_delta": delta, "pss_sum": total_pss}
        if error:
            r["error"] = error
        if alive:
            kernel = sum(delta[k] for k in KERNEL_FIELDS)
            r["per_box_kernel_bytes"] = kernel / len(alive)
            r["per_box_estimate_bytes"] = (kernel + total_pss) / len(alive)
            r["per_box_memavailable_bytes"] = -delta["MemAvailable"] / len(alive)
        rounds.append(r)
    return {"rounds": rounds, "argv": argv}


def density_ratios(sbx, bw):
    """sbx / bwrap memory per idle box, per count both reached."""
    out = {}
    bwr = {r["requested"]: r for r in bw.get("rounds", [])}
    for r in sbx.get("rounds", []):
        b = bwr.get(r["requested"])
        if not b:
            continue
        out[str(r["requested"])] = {
            k: ratio(r.get(k), b.get(k)) for k in
            ("per_box_estimate_bytes", "per_box_kernel_bytes", "per_box_memavailable_bytes")}
    return out


def goals(latency, density, exec_res=None, stream=None, phases=None):
    """The goals of issue 5, each with its figure and whether it is met (None: not measured)."""
    lv = lambda k: latency.get(k, {}).get("levels", {}).get("1", {}).get("summary_ms", {})  # noqa
    sbx, bw, bwcg, runc = lv("sbx").get("p50"), lv("bwrap").get("p50"), \
        lv("bwrap-cg").get("p50"), lv("runc").get("p50")
    g = []

    def add(goal, figure, met, note=""):
        g.append({"goal": goal, "figure": figure, "met": met, "note": note})

    for key, label, ref in (("bwrap-cg", "bubblewrap in a memory+pids cgroup", bwcg),
                            ("bwrap", "bubblewrap without limits", bw)):
        if sbx is not None and ref is not None:
            add(f"create to first command via `sbx run` at or below bubblewrap's ({label})",
                f"sequential P50 {sbx:.1f} ms vs {ref:.1f} ms (ratio {sbx / ref:.2f})",
                sbx <= ref)
        else:
            add(f"create to first command via `sbx run` at or below bubblewrap's ({label})",
                "not measured", None, latency.get(key, {}).get("error") or "no result")
    if sbx is not None and runc is not None:
        add("create to first command via `sbx run` at most a fifth of runc's",
            f"sequential P50 {sbx:.1f} ms vs runc {runc:.1f} ms (ratio {sbx / runc:.2f}; goal "
            "<= 0.20)", sbx <= runc / 5)
    else:
        add("create to first command via `sbx run` at most a fifth of runc's", "not measured",
            None, latency.get("runc", {}).get("error") or "no result")
    rest = lv("sbx-rest").get("p50")
    inner = ((phases or {}).get("1", {}).get("exit_known_in_sbx") or {}).get("p50")
    if rest is not None and sbx is not None:
        note = ""
        if inner is not None:
            note = (f"against `sbx run`'s own exit-known-inside-sbx P50 ({inner:.1f} ms, without "
                    f"process start and box removal): {rest - inner:+.1f} ms")
        add("create to first command via the REST API within 2 ms of `sbx run`",
            f"sequential P50 {rest:.1f} ms vs `sbx run` {sbx:.1f} ms end to end "
            f"({rest - sbx:+.1f} ms, ratio {rest / sbx:.2f})", rest <= sbx + 2.0, note)
    else:
        add("create to first command via the REST API within 2 ms of `sbx run`", "not measured",
            None, latency.get("sbx-rest", {}).get("error") or "no result")
    ex = exec_res or {}
    a, f = (ex.get("api") or {}), (ex.get("fork_exec") or {})
    if a.get("p50") is not None and f.get("p50") is not None:
        qa = ex.get("api_quickack") or {}
        note = ""
        if qa.get("p50") is not None:
            note = (f"with the client acknowledging at once (TCP_QUICKACK, diagnostic) P50 "
                    f"{qa['p50']:.2f} ms, {qa['p50'] / f['p50']:.1f}x")
        add("exec in a running sandbox within 1.5x plain fork+exec",
            f"P50 {a['p50']:.2f} ms vs fork+exec {f['p50']:.2f} ms ({a['p50'] / f['p50']:.1f}x); "
            f"P95 {a['p95']:.2f} vs {f['p95']:.2f} ms ({a['p95'] / f['p95']:.1f}x)",
            a["p50"] <= 1.5 * f["p50"], note)
    else:
        add("exec in a running sandbox within 1.5x plain fork+exec", "not measured", None,
            ex.get("error") or "no result")
    st = stream or {}
    best = max((st.get(k) or {} for k in ("api", "api_frames")),
               key=lambda d: d.get("mb_per_s") or 0 if d.get("ok") else 0)
    if best.get("ok") and best.get("mb_per_s"):
        nd = (st.get("api") or {}).get("mb_per_s")
        how = "binary frames" if best is st.get("api_frames") else "NDJSON"
        add("stdout through the API at 500 MB/s or more",
            f"{best['mb_per_s']:.0f} MB/s ({how}; NDJSON with base64 {nd or 0:.0f} MB/s)",
            best["mb_per_s"] >= 500)
    else:
        add("stdout through the API at 500 MB/s or more", "not measured", None,
            (st.get("api") or {}).get("error") or st.get("error") or "no result")
    rounds = [r for r in density.get("rounds", []) if r.get("created")]
    if rounds:
        r = max(rounds, key=lambda r: r["created"])
        est = r["per_box_estimate_bytes"] / (1 << 20)
        avail = r["per_box_memavailable_bytes"] / (1 << 20)
        cg = r["per_box_cgroup_bytes"] / (1 << 20)
        add("under 2 MiB per idle sandbox",
            f"{est:.2f} MiB per box at {r['created']} boxes (non-reclaimable kernel memory "
            f"growth + agent PSS; MemAvailable drop {avail:.2f} MiB, the boxes' own cgroups "
            f"{cg:.2f} MiB)", est < 2.0,
            "judged on the estimate: host-wide MemAvailable also moves with other work on a "
            "shared machine")
    else:
        add("under 2 MiB per idle sandbox", "not measured", None,
            density.get("error", "no density result"))
    return g


def run_e2b(daemon, build_dir, cfg):
    """Create to first command through the official E2B JS SDK, sequentially and at concurrency
    10. Uses the SDK the e2e tests install (build/tests/e2e/work); installs it if missing."""
    work = os.path.join(build_dir, "tests", "e2e", "work")
    here = os.path.join(ROOT, "tests", "e2e")
    if shutil.which("node") is None or shutil.which("npm") is None:
        return {"error": "node and npm are needed for the E2B SDK row"}
    if not os.path.isdir(os.path.join(work, "node_modules", "e2b-251")):
        os.makedirs(work, exist_ok=True)
        for f in ("package.json", "package-lock.json"):
            shutil.copy(os.path.join(here, f), work)
        r = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=work,
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            return {"error": "npm ci: " + r.stderr[-500:]}
    shutil.copy(os.path.join(ROOT, "bench", "e2b.mjs"), work)
    with open(daemon.key_file) as f:
        key = f.read().strip()
    env = dict(os.environ, E2B_API_KEY=key, E2B_API_URL=f"http://127.0.0.1:{daemon.port}",
               E2B_SANDBOX_URL=f"http://127.0.0.1:{daemon.port}")
    out = {"label": "sbx via the E2B JS SDK (Sandbox.create + commands.run)", "levels": {}}
    for level, runs in (("1", cfg["seq_runs"] // 2), ("10", 30)):
        log(f"E2B SDK: {runs} runs at concurrency {level}")
        r = subprocess.run(["node", "e2b.mjs", str(runs), level], cwd=work, env=env,
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            out["levels"][level] = {"error": (r.stderr or r.stdout)[-500:]}
            continue
        data = json.loads(r.stdout.strip().splitlines()[-1])
        v = data["samples_ms"]
        summary = summarize(v)
        out["levels"][level] = {"n": len(v), "ok": len(v), "errors": data["errors"],
                                "summary_ms": summary}
    return out


def cleanup_cgroups(pid):
    """Removes the per-run cgroup trees this harness (and sbx under it) made. Processes still in
    them (boxes left by a daemon that died) are killed first; returns how many."""
    names = [f"sbx-bench-bwrap-{pid}", f"sbx-bench-{pid}", f"sbx-bench-{pid}-net",
             f"sbx-bench-{pid}-tmpl"]
    killed = set()
    for rnd in range(2):
        for own in peers_mod.own_cgroup_dirs():
            for n in names:
                top = os.path.join(own, n)
                for d, _, _ in os.walk(top, topdown=False):
                    try:
                        with open(os.path.join(d, "cgroup.procs")) as f:
                            for x in f.read().split():
                                try:
                                    os.kill(int(x), signal.SIGKILL)
                                    killed.add(int(x))
                                except OSError:
                                    pass
                    except OSError:
                        pass
                    try:
                        os.rmdir(d)
                    except OSError:
                        pass
        if rnd == 0 and killed:
            time.sleep(1)
    return len(killed)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--quick", action="store_true", help="fewer runs (for development)")
    ap.add_argument("--skip-density", action="store_true")
    ap.add_argument("--only", help="comma-separated contender keys")
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    ap.add_argument("--report-only", metavar="JSON",
                    help="only regenerate docs/benchmarks.md and the SVG from a results file")
    args = ap.parse_args()
    if args.report_only:
        with open(args.report_only) as f:
            results = json.load(f)
        write_outputs(results, args, None)
        return
    if os.geteuid() != 0:
        sys.exit("bench: needs root (sbx, bwrap in cgroups, runc)")
    build = os.path.abspath(args.build)
    cfg = dict(QUICK if args.quick else FULL)
    keep = set(args.only.split(",")) if args.only else None
    t_start = time.time()
    started = datetime.datetime.now(datetime.timezone.utc)
    log(f"building helpers in {build}")
    err = build_helpers(build)
    if err:
        sys.exit(f"bench: {err}")
    log("helpers built")
    launcher = os.path.join(build, "bench", "sbx-bench-launch")
    install_peers()  # the sections compare against them too (hotpaths: bwrap)
    if keep is not None and keep <= set(SECTIONS):
        run_sections_only(build, args, [k for k in SECTIONS if k in keep])
        return

    tmp = tempfile.mkdtemp(prefix="sbx-bench-")
    os.chmod(tmp, 0o711)
    pid = os.getpid()
    results = {"schema": 1, "started": started.isoformat(timespec="seconds"),
               "machine": machine_info(), "load_at_start": loadavg(), "config": cfg,
               "quick": args.quick, "not_measured": NOT_MEASURED, "tmp": tmp}
    try:
        peers, versions = peers_mod.make_peers(build, tmp, pid)
        global DAEMON
        DAEMON = daemon_mod.Daemon(build, tmp, pid)
        if not args.only or any(k.startswith("sbx-rest") for k in args.only.split(",")):
            log("starting sbx serve for the API rows")
            DAEMON.start()
            if DAEMON.error:
                log(f"sbx serve: {DAEMON.error}")
            peers[1:1] = daemon_mod.api_peers(DAEMON)
        if args.only:
            keep = set(args.only.split(","))
            peers = [p for p in peers if p.key in keep]
        results["versions"] = versions
        results["latency"] = run_latency(cfg, peers, launcher, tmp)
        results["load_after_latency"] = loadavg()
        results["phases"] = phase_breakdown(results["latency"])
        results["ratios"] = ratios(results["latency"])
        results["api_phases"] = api_phases(results["latency"])
        results["api_ratios"] = api_ratios(results["latency"], results["phases"])
        if DAEMON.proc is not None and not DAEMON.error and DAEMON.proc.poll() is None:
            results["exec"] = daemon_mod.run_exec(DAEMON, launcher, log, cfg["exec_runs"])
            results["stream"] = daemon_mod.run_stream(DAEMON, build, log)
            results["e2b"] = run_e2b(DAEMON, build, cfg)
        else:
            why = DAEMON.error or ("sbx serve exited: " + DAEMON.log_tail()
                                   if DAEMON.proc is not None else "not selected (--only)")
            results["exec"] = {"error": why}
            results["stream"] = {"error": why}
        results["daemon_stop"] = DAEMON.stop()
        results["daemon_vmhwm_kb"] = results["stream"].get("daemon_vmhwm_lifetime_kb_at_end")
        results["load_after_api"] = loadavg()
        if keep is None or "net" in keep:
            results["net"] = net_mod.run_net(build, tmp, pid, log, args.quick)
        if keep is None or "templates" in keep:
            results["templates"] = templates_mod.run_templates(build, tmp, pid, log, args.quick)
        if keep is None or "snapshots" in keep:
            results["snapshots"] = snapshots_mod.run_snapshots(build, tmp, pid, log, args.quick)
        if keep is None or "pools" in keep:
            results["pools"] = pools_mod.run_pools(build, tmp, pid, log, args.quick)
        if keep is None or "runtimes" in keep:
            results["runtimes"] = runtimes_mod.run_runtimes(build, tmp, pid, log, args.quick)
        if args.skip_density:
            results["density"] = {"error": "skipped (--skip-density)"}
        else:
            results["density"] = run_density(build, cfg["density"], tmp)
            bw = next((p for p in peers if p.key == "bwrap" and not p.error), None)
            if bw:
                results["density_bwrap"] = run_density_bwrap(cfg["density"], bw.argv)
            else:
                results["density_bwrap"] = {"error": "bwrap could not run (see latency)"}
            results["density_ratios"] = density_ratios(results["density"],
                                                       results["density_bwrap"])
    finally:
        if DAEMON is not None and DAEMON.proc is not None and DAEMON.proc.poll() is None:
            DAEMON.stop()
        killed = cleanup_cgroups(pid)
        if killed:
            log(f"cleanup: killed {killed} processes left in the benchmark's cgroups")
            results["leftover_processes_killed"] = killed
        shutil.rmtree(tmp, ignore_errors=True)
    results["goals"] = goals(results["latency"], results["density"], results.get("exec"),
                             results.get("stream"), results.get("phases"))
    results["load_at_end"] = loadavg()
    results["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds")
    results["duration_s"] = round(time.time() - t_start, 1)

    write_outputs(results, args, started.strftime("%Y%m%dT%H%M%SZ"))


def run_hotpaths(build, tmp, pid, log_fn, quick):
    """Issue 14 item 6's rows, in one run: the cold path (`sbx run -- /bin/true` beside
    bubblewrap with and without a cgroup, and `sbx --version`, the binary's start-up and exit
    alone), sequential in rotated blocks, with `sbx run`'s phases; exec in a running sandbox
    beside plain fork+exec; stdout through the API as NDJSON and as binary frames. One
    `sbx serve` (networking off) of its own for the last two."""
    cfg = dict(QUICK if quick else FULL)
    cfg["levels"] = []
    t0 = time.time()
    res = {"config": cfg, "quick": quick,
           "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "load_at_start": loadavg()}
    launcher = os.path.join(build, "bench", "sbx-bench-launch")
    sbx = os.path.join(build, "sbx")
    res["binary_bytes"] = os.path.getsize(sbx)
    peers = [p for p in peers_mod.make_peers(build, tmp, pid)[0]
             if p.key in ("sbx", "bwrap", "bwrap-cg", "fork-exec")]
    peers.append(peers_mod.Peer("sbx-start", "sbx --version (start-up and exit only)",
                                [sbx, "--version"], "none: the sbx binary starts and exits"))
    latency = run_latency(cfg, peers, launcher, tmp)
    res["phases"] = phase_breakdown(latency).get("1", {})
    for v in latency.values():
        for level in v.get("levels", {}).values():
            level.pop("samples", None)
    res["latency"] = latency
    d = daemon_mod.Daemon(build, tmp, pid, name="sbx-serve-hot", flags=["--network", "off"])
    try:
        d.start()
        if d.error:
            raise RuntimeError(d.error)
        res["exec"] = daemon_mod.run_exec(d, launcher, log_fn, cfg["exec_runs"])
        res["stream"] = daemon_mod.run_stream(d, build, log_fn)
        res["kill"] = daemon_mod.run_kill(d, log_fn, 20 if quick else 60)
    except (OSError, ValueError, RuntimeError, subprocess.SubprocessError) as e:
        res["error"] = str(e)
    finally:
        note = d.stop()
        if note:
            res["daemon_stop"] = note
        shutil.rmtree(d.data, ignore_errors=True)
    res["load_at_end"] = loadavg()
    res["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    res["duration_s"] = round(time.time() - t0, 1)
    return res


# The sections `--only` can run alone: key -> the function that runs it.
SECTIONS = {"net": net_mod.run_net, "templates": templates_mod.run_templates,
            "snapshots": snapshots_mod.run_snapshots, "pools": pools_mod.run_pools,
            "hotpaths": run_hotpaths, "runtimes": runtimes_mod.run_runtimes}


def run_sections_only(build, args, keys):
    """`--only net` / `--only templates`: those sections alone, merged into the previous results
    (bench/results/latest.json) so that docs/benchmarks.md keeps the other sections of that run.
    Each section's own results go to bench/results/<timestamp>-<key>.json."""
    started = datetime.datetime.now(datetime.timezone.utc)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    tmp = tempfile.mkdtemp(prefix="sbx-bench-")
    os.chmod(tmp, 0o711)
    pid = os.getpid()
    got = {}
    try:
        for key in keys:
            got[key] = SECTIONS[key](build, tmp, pid, log, args.quick)
    finally:
        killed = cleanup_cgroups(pid)
        if killed:
            log(f"cleanup: killed {killed} processes left in the benchmark's cgroups")
        shutil.rmtree(tmp, ignore_errors=True)
    latest = os.path.join(args.results, "latest.json")
    try:
        with open(latest) as f:
            results = json.load(f)
    except (OSError, ValueError):
        results = {"schema": 1, "started": started.isoformat(timespec="seconds"),
                   "machine": machine_info(), "config": dict(QUICK if args.quick else FULL),
                   "quick": args.quick, "latency": {}, "density": {"error": "not run"},
                   "load_at_start": loadavg(), "load_at_end": loadavg(),
                   "not_measured": NOT_MEASURED}
    os.makedirs(args.results, exist_ok=True)
    own = []
    for key, res in got.items():
        res["quick"] = args.quick
        res["machine"] = machine_info()
        res["sbx"] = peers_mod._git_describe()
        path = os.path.join(args.results, f"{stamp}-{key}.json")
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
        res["json"] = f"bench/results/{stamp}-{key}.json"
        own.append(path)
        results[key] = res
    with open(latest, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    base = datetime.datetime.fromisoformat(results["started"]).strftime("%Y%m%dT%H%M%SZ")
    svg_path = os.path.join(args.results, "latency.svg")
    report.write_markdown(results, args.doc, os.path.relpath(svg_path, os.path.dirname(args.doc)),
                          f"bench/results/{base}.json")
    secs = sum(r.get("duration_s", 0) for r in got.values())
    log(f"wrote {args.doc}, {', '.join(own)} and the merged bench/results/latest.json "
        f"({secs:.0f} s of benchmarking)")


def write_outputs(results, args, stamp):
    """Results JSON (when `stamp` is set), the SVG and docs/benchmarks.md."""
    os.makedirs(args.results, exist_ok=True)
    if stamp:
        for name in (f"{stamp}.json", "latest.json"):
            with open(os.path.join(args.results, name), "w") as f:
                json.dump(results, f, indent=1)
                f.write("\n")
    else:
        stamp = datetime.datetime.fromisoformat(results["started"]).strftime("%Y%m%dT%H%M%SZ")
    svg_path = os.path.join(args.results, "latency.svg")
    with open(svg_path, "w") as f:
        f.write(report.svg(results))
    report.write_markdown(results, args.doc, os.path.relpath(svg_path, os.path.dirname(args.doc)),
                          f"bench/results/{stamp}.json")
    log(f"wrote {args.doc}, {svg_path} and bench/results/{stamp}.json "
        f"({results.get('duration_s', 0):.0f} s of benchmarking)")

if __name__ == "__main__":
    main()

"""The network rows (issue 12, item 10), measured against a fake internet so that nothing leaves
the machine (tests/network/fakenet.sh: a daemon namespace with no route off the machine and an
"upstream" namespace with fakenet.mjs's DNS, HTTP and HTTPS servers).

  - create to first command through the REST API with network `allowlist` versus `none`, on one
    `sbx serve --network on` running inside the daemon namespace (sbx-bench-api under nsenter);
  - download throughput (MB/s) of a large body from sbx-bench-zeroserve (bench/zeroserve.c) in
    the upstream namespace: by curl in an allowlist box, through the egress proxy, versus the
    same curl in a plain "peer" namespace with a veth straight to the upstream namespace (no sbx
    in the path);
  - the latency the proxy adds: curl's time to first byte of a small request (fakenet's
    /headers) over a fresh connection, HTTP and HTTPS, from the box versus from the peer
    namespace; for HTTPS both spliced (an allowed host, no secret) and through the interceptor
    (a host a secret of the box is bound to: TLS ends in sbx, and starts again upstream).

Everything this makes (three namespaces, their veths, the daemon, the server, /etc/netns files)
is removed at the end, also when a step fails (NetBench.close, called from a finally).
"""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time

import daemon as daemon_mod
import peers as peers_mod
from stats import ratio, summarize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKENET = os.path.join(ROOT, "tests", "network", "fakenet.sh")
LIMITS = {"memory_bytes": peers_mod.MEMORY_BYTES, "pids": peers_mod.PIDS}
ALLOWED = "allowed.test"  # fakenet.mjs's zone: 198.18.1.30, echoes requests at /headers
ALLOWED_ADDR = "198.18.1.30"
ZERO_PORT = 8080  # sbx-bench-zeroserve on ALLOWED_ADDR (fakenet's servers hold 80 and 443)
POLICY = {"mode": "allowlist", "allow": [ALLOWED]}
BODIES = {
    "none": {"limits": LIMITS},
    "allowlist": {"limits": LIMITS, "network": POLICY},
}
# The peer namespace's link to the upstream namespace (fakenet's own link is 198.19.255.0/30).
PEER_NET = ("198.19.254.1", "198.19.254.2")
CURL_W = r"%{time_namelookup} %{time_connect} %{time_appconnect} %{time_starttransfer} " \
         r"%{http_code}\n"
FULL = {"create_runs": 100, "create_block": 20, "create_levels": [(10, 3)], "warmup": 3,
        "bytes": 1 << 30, "stream_rounds": 3, "ttfb_runs": 200, "ttfb_block": 20}
QUICK = {"create_runs": 20, "create_block": 10, "create_levels": [(10, 1)], "warmup": 2,
         "bytes": 256 << 20, "stream_rounds": 2, "ttfb_runs": 40, "ttfb_block": 20}


def _sh(argv, timeout=120, check=True):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: "
                           f"{' '.join((p.stderr or p.stdout).split())[-400:]}")
    return p


class NetBench:
    def __init__(self, build_dir, tmp, pid, log):
        self.build = build_dir
        self.log = log
        self.tag = f"b{pid}"
        self.dir = os.path.join(tmp, "fakenet")
        self.dns = f"sbxt-{self.tag}-d"  # the daemon's namespace (fakenet.sh)
        self.up = f"sbxt-{self.tag}-u"  # the "internet"
        self.peer = f"sbxt-{self.tag}-p"  # the direct path: a veth straight to the internet
        self.ca = os.path.join(self.dir, "ca.pem")
        self.zero = None
        self.fakenet_up = False
        self.peer_made = False
        self.direct_cg = None
        self.daemon = daemon_mod.Daemon(
            build_dir, tmp, pid, name="sbx-serve-net",
            prefix=["nsenter", f"--net=/run/netns/{self.dns}"],
            flags=["--network", "on", "--upstream-dns", "198.18.0.53:53", "--upstream-ca",
                   self.ca],
            cgroup_parent=f"sbx-bench-{pid}-net", unix_socket=True)
        self.secret = f"bench-{pid}"

    # ---- setup and teardown ----

    def open(self):
        os.makedirs(self.dir, exist_ok=True)
        self.fakenet_up = True  # from here on, close() runs fakenet's down
        _sh([FAKENET, "up", self.tag, self.dir])
        # The peer: its own namespace, a veth to the upstream namespace, the fake DNS server.
        self.peer_made = True
        _sh(["ip", "netns", "add", self.peer])
        _sh(["ip", "-n", self.peer, "link", "set", "lo", "up"])
        _sh(["ip", "link", "add", "vp", "netns", self.peer, "type", "veth", "peer", "name", "vq",
             "netns", self.up])
        _sh(["ip", "-n", self.up, "addr", "add", PEER_NET[0] + "/30", "dev", "vq"])
        _sh(["ip", "-n", self.peer, "addr", "add", PEER_NET[1] + "/30", "dev", "vp"])
        _sh(["ip", "-n", self.up, "link", "set", "vq", "up"])
        _sh(["ip", "-n", self.peer, "link", "set", "vp", "up"])
        _sh(["ip", "-n", self.peer, "route", "add", "198.18.0.0/16", "via", PEER_NET[0]])
        os.makedirs(f"/etc/netns/{self.peer}", exist_ok=True)
        with open(f"/etc/netns/{self.peer}/resolv.conf", "w") as f:
            f.write("nameserver 198.18.0.53\noptions ndots:0\n")
        # The fast upstream for the throughput row.
        ready = os.path.join(self.dir, "zeroserve.ready")
        exe = os.path.join(self.build, "bench", "sbx-bench-zeroserve")
        self.zero_log = open(os.path.join(self.dir, "zeroserve.log"), "wb")
        self.zero = subprocess.Popen(["ip", "netns", "exec", self.up, exe, ALLOWED_ADDR,
                                      str(ZERO_PORT), ready], stdout=self.zero_log,
                                     stderr=self.zero_log, start_new_session=True)
        deadline = time.time() + 20
        while not os.path.exists(ready):
            if self.zero.poll() is not None or time.time() > deadline:
                raise RuntimeError("sbx-bench-zeroserve did not start: " + self._zero_log())
            time.sleep(0.02)
        self.daemon.start()
        if self.daemon.error:
            raise RuntimeError(f"sbx serve --network on: {self.daemon.error}")

    def _zero_log(self):
        try:
            with open(os.path.join(self.dir, "zeroserve.log"), errors="replace") as f:
                return " ".join(f.read().split())[-400:]
        except OSError:
            return ""

    def close(self):
        """Removes everything open() made, whatever step it reached; returns notes."""
        notes = []
        if self.daemon.proc is not None:
            try:
                n = self.daemon.stop()
                if n:
                    notes.append(n)
            except Exception as e:  # noqa: BLE001 (clean up the rest whatever happened)
                notes.append(f"stopping the daemon: {e}")
                if self.daemon.proc.poll() is None:
                    self.daemon.proc.kill()
                    self.daemon.proc.wait()
        if self.zero is not None:
            if self.zero.poll() is None:
                self.zero.kill()
            self.zero.wait()
            self.zero_log.close()
        if self.direct_cg:
            try:
                os.rmdir(self.direct_cg)
            except OSError:
                pass  # run.py's cleanup_cgroups removes the parent tree, killing what is left
        if self.peer_made:
            subprocess.run(["ip", "netns", "del", self.peer], capture_output=True)
            shutil.rmtree(f"/etc/netns/{self.peer}", ignore_errors=True)
        if self.fakenet_up:
            p = subprocess.run([FAKENET, "down", self.tag, self.dir], capture_output=True,
                               text=True)
            if p.returncode != 0:
                notes.append(f"fakenet down: {p.stderr.strip()[-300:]}")
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        if f"sbxt-{self.tag}-" in left:
            notes.append(f"namespaces left: {left.strip()}")
        return notes

    # ---- the API, over the daemon's unix socket ----

    def create(self, body):
        status, text = self.daemon.request("POST", "/v1/sandboxes", body, timeout=120)
        if status != 201:
            raise RuntimeError(f"create: HTTP {status}: {text[:300]!r}")
        return json.loads(text)["id"]

    def delete(self, sid):
        self.daemon.request("DELETE", f"/v1/sandboxes/{sid}", timeout=120)

    def run_in_box(self, sid, command, timeout=600):
        """(exit code, stdout, stderr) of a shell command in the box."""
        status, text = self.daemon.request("POST", f"/v1/sandboxes/{sid}/commands",
                                           {"command": command, "timeout": timeout},
                                           timeout=timeout + 30)
        if status != 200:
            raise RuntimeError(f"commands: HTTP {status}: {text[:300]!r}")
        out, err, code = b"", b"", None
        for line in text.splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("type") == "stdout":
                out += base64.b64decode(e["data"])
            elif e.get("type") == "stderr":
                err += base64.b64decode(e["data"])
            elif e.get("type") == "exit":
                code = e.get("exit_code")
        return code, out.decode(errors="replace"), err.decode(errors="replace")

    def _direct_cgroup(self):
        """A cpu cgroup beside the boxes' (under the daemon's cgroup parent) for the direct
        path's commands: every box is a cpu cgroup of its own, and on a machine busy with other
        work a command left in our cgroup would get a smaller CPU share than the same command in
        a box, which would make the direct path look slower than it is."""
        if self.direct_cg is None:
            self.direct_cg = ""
            for controller in ("cpu", ""):
                own = peers_mod.own_cgroup_dir(controller)
                if not own:
                    continue
                d = os.path.join(own, self.daemon.cgroup_parent, "direct-path")
                try:
                    os.makedirs(d, exist_ok=True)
                    self.direct_cg = d
                except OSError:
                    continue
                break
        return self.direct_cg

    def run_direct(self, command, timeout=600):
        """The same command in the peer namespace (no sbx in the path)."""
        cg = self._direct_cgroup()

        def join():
            if cg:
                with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
        p = subprocess.run(["ip", "netns", "exec", self.peer, "sh", "-c", command],
                           capture_output=True, text=True, timeout=timeout, preexec_fn=join)
        return p.returncode, p.stdout, p.stderr

    # ---- 1. create to first command, allowlist versus none ----

    def create_batch(self, kind, workers, runs):
        errdir = tempfile.mkdtemp(prefix="errs-", dir=self.dir)
        argv = self.daemon.client_argv("create-run", "-c", str(workers), "-n", str(runs), "-e",
                                       errdir, body=json.dumps(BODIES[kind],
                                                               separators=(",", ":")))
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=900)
            out, batch_err = p.stdout, (None if p.returncode == 0 else
                                        f"sbx-bench-api exited {p.returncode}: "
                                        f"{' '.join(p.stderr.split())[-300:]}")
        except subprocess.TimeoutExpired:
            out, batch_err = "", "batch timed out after 900 s"
        samples = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) != 9:
                continue
            w, r, start, dur, status, *ph = (int(x) for x in parts)
            s = {"worker": w, "run": r, "start_ns": start, "ms": dur / 1e6, "status": status,
                 "api_ms": {k: v / 1e6 for k, v in
                            zip(("create", "to_start", "exec", "delete"), ph) if v >= 0}}
            if status != 0:
                try:
                    with open(os.path.join(errdir, f"{w}-{r}.err"), errors="replace") as f:
                        s["error"] = " ".join(f.read().split())[:300] or f"status {status}"
                except OSError:
                    s["error"] = f"status {status}"
            samples.append(s)
        shutil.rmtree(errdir, ignore_errors=True)
        return samples, batch_err

    def run_create(self, cfg):
        res = {"bodies": BODIES, "levels": {}}
        for kind in BODIES:  # warm-up: the template, the first slot, the proxy's first name
            self.create_batch(kind, 1, cfg["warmup"])
        levels = [(1, cfg["create_runs"], cfg["create_block"])] + \
                 [(w, r, r) for w, r in cfg["create_levels"]]
        for workers, runs, block in levels:
            got = {k: [] for k in BODIES}
            errs = {k: [] for k in BODIES}
            kinds = list(BODIES)
            for b in range(max(1, runs // block)):
                order = kinds[b % 2:] + kinds[:b % 2]  # alternate who goes first
                for kind in order:
                    samples, err = self.create_batch(kind, workers, block)
                    got[kind] += samples
                    if err:
                        errs[kind].append(err)
            lv = {}
            for kind in BODIES:
                ok = [s for s in got[kind] if s["status"] == 0]
                attempts = workers * max(1, runs // block) * block
                lv[kind] = {
                    "attempts": attempts, "ok": len(ok),
                    "success_rate": len(ok) / attempts if attempts else 0.0,
                    "summary_ms": summarize([s["ms"] for s in ok]),
                    "phases_ms": {ph: summarize([s["api_ms"][ph] for s in ok
                                                 if ph in s["api_ms"]])
                                  for ph in ("create", "exec", "delete")},
                    "errors": sorted({s["error"] for s in got[kind] if s.get("error")})[:10]
                    + errs[kind][:5],
                }
                self.log(f"net create, {kind}, {workers} worker(s): {len(ok)}/{attempts} ok, "
                         f"p50 {_f(lv[kind]['summary_ms']['p50'])} ms")
            a, n = lv["allowlist"]["summary_ms"], lv["none"]["summary_ms"]
            lv["ratio"] = {q: ratio(a[q], n[q]) for q in ("p50", "p95", "p99")}
            lv["diff_ms"] = {q: (a[q] - n[q]) if a[q] is not None and n[q] is not None else None
                             for q in ("p50", "p95", "p99")}
            res["levels"][str(workers)] = lv
        return res

    # ---- 2. throughput through the proxy versus a direct veth ----

    def run_stream(self, cfg, box):
        n = cfg["bytes"]
        url = f"http://{ALLOWED}:{ZERO_PORT}/bytes/{n}"
        cmd = (f"curl -sS -o /dev/null -w '%{{size_download}} %{{time_total}} "
               f"%{{time_starttransfer}}\\n' {url}")
        res = {"bytes": n, "url": url, "command": cmd, "rounds": []}
        runs = {"proxy": [], "direct": []}
        for r in range(cfg["stream_rounds"]):
            order = ["proxy", "direct"] if r % 2 == 0 else ["direct", "proxy"]
            for kind in order:
                if kind == "proxy":
                    code, out, err = self.run_in_box(box, cmd)
                else:
                    code, out, err = self.run_direct(cmd)
                row = {"kind": kind, "exit": code}
                try:
                    size, total, ttfb = out.split()[:3]
                    row.update(bytes=int(size), seconds=float(total), ttfb_s=float(ttfb))
                    row["mb_per_s"] = row["bytes"] / 1e6 / row["seconds"]
                except ValueError:
                    pass
                if code != 0 or row.get("bytes") != n:
                    row["error"] = (f"exit {code}, {row.get('bytes')} of {n} bytes: "
                                    f"{' '.join(err.split())[-300:]}")
                else:
                    runs[kind].append(row["mb_per_s"])
                res["rounds"].append(row)
                self.log(f"net throughput, {kind}: {_f(row.get('mb_per_s'), 0)} MB/s"
                         f"{' FAILED: ' + row['error'] if 'error' in row else ''}")
        for kind, v in runs.items():
            res[kind] = summarize(v)
        res["ratio_p50"] = ratio(res["proxy"]["p50"], res["direct"]["p50"])
        return res

    # ---- 3. time to first byte: the latency the proxy adds ----

    def _ttfb_loop(self, url, runs, cacert):
        ca = f"--cacert {cacert} " if cacert else ""
        return (f"for i in $(seq {runs}); do curl -sS -o /dev/null {ca}"
                f"-H \"Authorization: Bearer $API_KEY\" -w '{CURL_W}' {url} || echo fail; done")

    def run_ttfb(self, cfg, box, mitm_box):
        http_url, https_url = f"http://{ALLOWED}/headers", f"https://{ALLOWED}/headers"
        # In a box, curl trusts what sbx's bundle holds (CURL_CA_BUNDLE in the box's env: the
        # upstream roots and sbx's own CA); in the peer namespace it is told the fake CA.
        kinds = {
            "http_direct": (None, http_url),
            "http_proxy": (box, http_url),
            "https_direct": (None, https_url),
            "https_spliced": (box, https_url),
            "https_mitm": (mitm_box, https_url),
        }
        res = {"runs": cfg["ttfb_runs"], "block": cfg["ttfb_block"], "kinds": {}}
        rows = {k: [] for k in kinds}
        errors = {k: [] for k in kinds}
        names = list(kinds)
        for b in range(max(1, cfg["ttfb_runs"] // cfg["ttfb_block"])):
            for k in names[b % len(names):] + names[:b % len(names)]:
                sid, url = kinds[k]
                if sid is None:
                    code, out, err = self.run_direct(
                        self._ttfb_loop(url, cfg["ttfb_block"], self.ca))
                else:
                    code, out, err = self.run_in_box(
                        sid, self._ttfb_loop(url, cfg["ttfb_block"], None))
                for line in out.splitlines():
                    p = line.split()
                    if len(p) == 5 and p[4] == "200":
                        dns, conn, tls, first = (float(x) * 1000 for x in p[:4])
                        rows[k].append({"dns": dns, "connect": conn - dns,
                                        "tls": (tls - conn) if tls > 0 else None,
                                        "ttfb": first - dns})
                    else:
                        errors[k].append(line[:200])
                if code != 0:
                    errors[k].append(f"exit {code}: {' '.join(err.split())[-300:]}")
        for k in kinds:
            v = rows[k]
            res["kinds"][k] = {
                "ok": len(v), "attempts": max(1, cfg["ttfb_runs"] // cfg["ttfb_block"]) *
                cfg["ttfb_block"], "errors": errors[k][:10],
                "ttfb_ms": summarize([r["ttfb"] for r in v]),
                "ttfb_samples_ms": [round(r["ttfb"], 3) for r in v],
                "connect_ms": summarize([r["connect"] for r in v]),
                "tls_ms": summarize([r["tls"] for r in v if r["tls"] is not None]),
                "dns_ms": summarize([r["dns"] for r in v]),
            }
            s = res["kinds"][k]["ttfb_ms"]
            # Runs 40 ms or more above the path's best: how often a delayed-ACK stall (Linux's
            # delayed ACK is about 40 ms) or something as long hits a request.
            res["kinds"][k]["slow_share"] = (sum(1 for r in v if r["ttfb"] >= s["min"] + 40) /
                                             len(v)) if v else None
            self.log(f"net ttfb, {k}: {len(v)} ok, p50 {_f(s['p50'], 2)} ms, "
                     f"p95 {_f(s['p95'], 2)} ms")
        res["comparisons"] = {}
        for name, a, b in (("http: proxy / direct", "http_proxy", "http_direct"),
                           ("https: spliced / direct", "https_spliced", "https_direct"),
                           ("https: interceptor / direct", "https_mitm", "https_direct"),
                           ("https: interceptor / spliced", "https_mitm", "https_spliced")):
            x, y = res["kinds"][a]["ttfb_ms"], res["kinds"][b]["ttfb_ms"]
            res["comparisons"][name] = {
                "a": a, "b": b,
                "ratio": {q: ratio(x[q], y[q]) for q in ("p50", "p95", "min")},
                "added_ms": {q: (x[q] - y[q]) if x[q] is not None and y[q] is not None else None
                             for q in ("p50", "p95", "min")}}
        return res

    def check_paths(self, box, mitm_box):
        """That the rows measure what they say: the proxy answers for allowed.test in both
        boxes, the interceptor adds the secret's header only in the box that has it, and the
        peer namespace reaches the same server without sbx."""
        url = f"https://{ALLOWED}/headers"
        out = {}
        code, spliced, err = self.run_in_box(box, f"curl -sS {url}", 120)
        if code != 0:
            raise RuntimeError(f"HTTPS from the allowlist box failed: {err.strip()[-300:]}")
        code, mitm, err = self.run_in_box(
            mitm_box, f"curl -sS -H \"Authorization: Bearer $API_KEY\" {url}", 120)
        if code != 0:
            raise RuntimeError(f"HTTPS from the box with a secret failed: {err.strip()[-300:]}")
        code, direct, err = self.run_direct(f"curl -sS --cacert {self.ca} {url}", 120)
        if code != 0:
            raise RuntimeError(f"HTTPS from the peer namespace failed: {err.strip()[-300:]}")
        out["spliced_has_secret_header"] = "x-bench-key" in spliced
        out["mitm_has_secret_header"] = "x-bench-key" in mitm
        if out["spliced_has_secret_header"] or not out["mitm_has_secret_header"]:
            raise RuntimeError("the interceptor is not where the rows assume: spliced box saw "
                               f"{spliced[:200]!r}, the box with a secret saw {mitm[:200]!r}")
        return out

    def run(self, cfg):
        res = {"config": cfg, "started": time.strftime("%Y-%m-%dT%H:%M:%S+00:00",
                                                          time.gmtime())}
        with open("/proc/loadavg") as f:
            res["load_at_start"] = " ".join(f.read().split()[:3])
        res["create"] = self.run_create(cfg)
        status, text = self.daemon.request("POST", "/v1/secrets", {
            "name": self.secret, "value": "bench-secret-value-0123456789",
            "hosts": [ALLOWED], "header": "X-Bench-Key", "format": "{}"})
        if status != 201:
            raise RuntimeError(f"POST /v1/secrets: HTTP {status}: {text[:300]!r}")
        box = self.create(BODIES["allowlist"])
        mitm_box = self.create(dict(BODIES["allowlist"], secrets={"API_KEY": self.secret}))
        try:
            res["checks"] = self.check_paths(box, mitm_box)
            res["stream"] = self.run_stream(cfg, box)
            res["ttfb"] = self.run_ttfb(cfg, box, mitm_box)
        finally:
            self.delete(box)
            self.delete(mitm_box)
        with open("/proc/loadavg") as f:
            res["load_at_end"] = " ".join(f.read().split()[:3])
        res["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
        return res


def _f(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def run_net(build_dir, tmp, pid, log, quick):
    """All the network rows; always returns a dict (with "error" when a step failed) and leaves
    no namespace, veth, process or file behind."""
    cfg = dict(QUICK if quick else FULL)
    nb = NetBench(build_dir, tmp, pid, log)
    t0 = time.time()
    res = {}
    try:
        log("net: fake internet, peer namespace, sbx serve --network on in the daemon namespace")
        nb.open()
        res = nb.run(cfg)
    except Exception as e:  # noqa: BLE001 (a failed row is reported, never fatal to the bench)
        res["error"] = f"{type(e).__name__}: {e}"
        res["daemon_log_tail"] = nb.daemon.log_tail(600)
        log(f"net: {res['error']}")
    finally:
        notes = nb.close()
        if notes:
            res["cleanup_notes"] = notes
            log(f"net cleanup: {'; '.join(notes)}")
    res["duration_s"] = round(time.time() - t0, 1)
    return res

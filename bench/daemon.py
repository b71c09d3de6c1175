"""The REST API rows (issue 5 items 1, 3, 5): a `sbx serve` daemon for the run, and the rows
measured through it with bench/api.cc (sbx-bench-api).

  - create to first command via the API: contenders "sbx-rest" (and the sequential-only
    diagnostic "sbx-rest-quickack") in run.py's latency rotation;
  - exec in a running sandbox (`true`, >= 200 runs) beside plain fork+exec of /bin/true;
  - stdout throughput of `head -c 1 GiB /dev/zero`, decoded at the client, with the daemon's
    peak RSS;
  - the daemon's own view: its access log's per-request durations.
"""

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import peers as peers_mod
from stats import summarize

STREAM_BYTES = 1 << 30
CREATE_BODY = json.dumps({"limits": {"memory_bytes": peers_mod.MEMORY_BYTES,
                                     "pids": peers_mod.PIDS}}, separators=(",", ":"))
ACCESS_RE = re.compile(r'http \S+ "(\w+) (\S+)" (\d+) (\d+)us')


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over the daemon's unix socket: how the harness reaches a daemon that runs in another
    network namespace (its 127.0.0.1 is not ours)."""

    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


class Daemon:
    """One `sbx serve` for the run. `prefix` runs it under another command (nsenter into a
    network namespace: then the harness talks to it over `--unix-socket` and runs its clients
    under the same prefix); `flags` are more serve flags. Networking is off unless `flags` turn
    it on: a daemon with networking runs only inside a namespace with no route off the machine
    (bench/net.py), never in the host's own."""

    def __init__(self, build_dir, tmp, pid, name="sbx-serve", prefix=(), flags=(),
                 cgroup_parent=None, unix_socket=False):
        self.exe = os.path.join(build_dir, "sbx")
        self.client = os.path.join(build_dir, "bench", "sbx-bench-api")
        self.data = os.path.join(tmp, f"{name}-data")
        self.log_path = os.path.join(tmp, f"{name}.log")
        self.cgroup_parent = cgroup_parent or f"sbx-bench-{pid}"
        self.prefix = list(prefix)
        self.flags = list(flags) if flags else ["--network", "off"]
        self.unix_socket = os.path.join(self.data, "api.sock") if unix_socket else None
        if self.unix_socket:
            self.flags += ["--unix-socket", self.unix_socket]
        self.proc = None
        self.port = None
        self.key_file = os.path.join(self.data, "api-key")
        self.error = None

    def start(self):
        """Starts `sbx serve` on 127.0.0.1:0; sets self.error instead of raising."""
        os.makedirs(self.data, mode=0o711, exist_ok=True)
        os.chmod(self.data, 0o711)
        if not os.access(self.client, os.X_OK):
            self.error = f"{self.client} is missing (cmake --build: target sbx-bench-api)"
            return
        env = dict(os.environ, SBX_CGROUP_PARENT=self.cgroup_parent)
        port_file = os.path.join(self.data, "serve.port")
        try:
            os.unlink(port_file)
        except OSError:
            pass
        self.log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [*self.prefix, self.exe, "--data-dir", self.data, "serve", "--listen",
                 "127.0.0.1:0", *self.flags],
                stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, env=env,
                start_new_session=True)
        except OSError as e:
            self.error = f"cannot start sbx serve: {e}"
            return
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.error = f"sbx serve exited {self.proc.returncode}: {self.log_tail()}"
                return
            try:
                with open(port_file) as f:
                    txt = f.read().strip()
                if txt and os.path.exists(self.key_file) and (
                        not self.unix_socket or os.path.exists(self.unix_socket)):
                    self.port = int(txt)
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        self.error = f"sbx serve did not write its port within 30 s: {self.log_tail()}"

    def log_tail(self, n=1500):
        try:
            with open(self.log_path, errors="replace") as f:
                return " ".join(f.read()[-n:].split())
        except OSError:
            return ""

    def log_offset(self):
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def access_entries(self, since):
        """(method, route, status, ms) of the access log lines written after offset `since`."""
        out = []
        try:
            with open(self.log_path, "rb") as f:
                f.seek(since)
                text = f.read().decode(errors="replace")
        except OSError:
            return out
        for m in ACCESS_RE.finditer(text):
            method, path, status, us = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
            if path.startswith("/v1/sandboxes/") and path.endswith("/commands"):
                route = "commands"
            elif path == "/v1/sandboxes" and method == "POST":
                route = "create"
            elif path.startswith("/v1/sandboxes/") and method == "DELETE":
                route = "delete"
            elif path == "/healthz":
                route = "healthz"
            else:
                route = f"{method} {path}"
            out.append((route, status, us / 1000.0))
        return out

    def client_argv(self, *args, body=CREATE_BODY):
        return [*self.prefix, self.client, "--port", str(self.port), "--key-file",
                self.key_file, "--body", body, *args]

    def status_kb(self, field):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        return int(line.split()[1])
        except (OSError, AttributeError):
            pass
        return None

    def request(self, method, path, body=None, timeout=60):
        """(status, body bytes) of one API request; over the unix socket when there is one."""
        with open(self.key_file) as f:
            key = f.read().strip()
        headers = {"Authorization": f"Bearer {key}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.unix_socket:
            conn = UnixHTTPConnection(self.unix_socket, timeout)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def _call(self, method, path, body=None):
        status, text = self.request(method, path, body)
        if status >= 400:
            raise OSError(f"{method} {path}: HTTP {status}: {text[:300]!r}")
        return json.loads(text) if text else None

    def stop(self):
        """Deletes what is left (the daemon keeps boxes running across a stop), then SIGTERM.
        Returns a note on leftovers, or None."""
        note = None
        if self.proc is None:
            return None
        if self.proc.poll() is None and self.port:
            try:
                left = self._call("GET", "/v1/sandboxes?state=running&state=paused")
                ids = [s["id"] for s in left.get("sandboxes", [])]
                for i in ids:
                    self._call("DELETE", f"/v1/sandboxes/{i}")
                if ids:
                    note = f"{len(ids)} sandboxes were left running after the API rows; deleted"
            except (OSError, ValueError) as e:
                note = f"could not list/delete leftover sandboxes: {e}"
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                note = (note + "; " if note else "") + "sbx serve did not stop in 60 s (killed)"
        self.log.close()
        return note


def api_peers(daemon):
    """The API contenders for run.py's latency rotation."""
    iso = ("as `sbx run` (the daemon's NativeRuntime, host template, memory 256 MiB + pids 256), "
           "created with POST /v1/sandboxes, then POST /v1/sandboxes/{id}/commands "
           '{"argv":["true"]} read until the exit event; one keep-alive connection per worker '
           "(sbx-bench-api, bench/api.cc); DELETE after each run, outside the timed window "
           "(timed separately)")
    argv = ["sbx-bench-api", "create-run", "--body", CREATE_BODY]
    return [
        peers_mod.Peer("sbx-rest", "sbx via the REST API", argv, iso, api=[],
                       error=daemon.error),
        peers_mod.Peer("sbx-rest-quickack", "sbx via the REST API, client TCP_QUICKACK³",
                       argv + ["--quickack"],
                       iso + "; diagnostic: the client acknowledges every segment at once",
                       api=["--quickack"], seq_only=True, error=daemon.error),
    ]


def api_launch_argv(daemon, peer, workers, runs, errdir):
    return daemon.client_argv("create-run", "-c", str(workers), "-n", str(runs), "-e", errdir,
                              *peer.api)


def _lines(out):
    rows = []
    for line in out.splitlines():
        parts = line.split()
        try:
            rows.append([int(x) for x in parts])
        except ValueError:
            continue
    return rows


def _run(argv, timeout):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return -1, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or ""), f"timed out after {timeout} s"


def run_exec(daemon, launcher, log, runs=250, block=50):
    """Exec of `true` in one running sandbox via the API (plain client and the --quickack
    diagnostic) beside plain fork+exec of /bin/true by sbx-bench-launch, in rotated blocks."""
    res = {"runs": runs, "block": block}
    samples = {"api": [], "api_quickack": [], "fork_exec": [], "healthz": []}
    errors = {k: [] for k in samples}
    server = []
    for b in range(max(1, runs // block)):
        jobs = [("api", daemon.client_argv("exec", "-n", str(block))),
                ("api_quickack", daemon.client_argv("exec", "-n", str(block), "--quickack")),
                ("fork_exec", [launcher, "-c", "1", "-n", str(block), "--", "/bin/true"]),
                ("healthz", daemon.client_argv("healthz", "-n", str(block)))]
        jobs = jobs[b % len(jobs):] + jobs[:b % len(jobs)]
        for key, argv in jobs:
            off = daemon.log_offset()
            rc, out, err = _run(argv, 600)
            if key == "api":
                server += [ms for route, st, ms in daemon.access_entries(off)
                           if route == "commands"]
            for row in _lines(out):
                if key == "fork_exec":
                    if len(row) == 5:
                        (samples[key] if row[4] == 0 else errors[key]).append(
                            row[3] / 1e6 if row[4] == 0 else f"exit status {row[4]}")
                elif len(row) == 3:
                    if row[2] == 0 and row[1] >= 0:
                        samples[key].append(row[1] / 1e6)
                    else:
                        errors[key].append(f"status {row[2]}")
            if rc != 0:
                errors[key].append(f"exit {rc}: {' '.join(err.split())[-300:]}")
        log(f"exec block {b + 1}: api p50 {_p50(samples['api'])} ms, quickack "
            f"{_p50(samples['api_quickack'])} ms, fork+exec {_p50(samples['fork_exec'])} ms")
    for k, v in samples.items():
        res[k] = summarize(v)
        res[k + "_errors"] = errors[k][:20]
        res[k + "_attempts"] = (runs // block) * block
    res["server_commands_ms"] = summarize(server)
    return res


def run_kill(daemon, log, runs=60):
    """Issue 14 item 5's destroy that answers first: DELETE of a fresh sandbox as the API answers
    it (once its processes are dead; the rest of the box goes after), alternated with
    `DELETE ...?wait=true` (answered once the box is gone from the host, as every kill was
    before). Milliseconds from the request sent to the answer read, one connection each."""
    out = {"answer": [], "wait": [], "errors": []}
    for i in range(runs * 2):
        key, query = ("answer", "") if i % 2 == 0 else ("wait", "?wait=true")
        try:
            sid = daemon._call("POST", "/v1/sandboxes", {})["id"]
            # The previous kill's removal is not this one's to pay for.
            daemon._call("GET", "/v1/cleanups?wait=true")
            t = time.perf_counter()
            status, text = daemon.request("DELETE", f"/v1/sandboxes/{sid}{query}")
            ms = (time.perf_counter() - t) * 1000
        except (OSError, ValueError, KeyError) as e:
            out["errors"].append(str(e))
            continue
        if status == 204:
            out[key].append(ms)
        else:
            out["errors"].append(f"DELETE{query}: HTTP {status}: {text[:200]!r}")
    res = {k: summarize(out[k]) for k in ("answer", "wait")}
    res["errors"] = out["errors"][:5]
    log(f"kill: answering first P50 {_p50(out['answer'])} ms, waiting for the removal "
        f"P50 {_p50(out['wait'])} ms")
    return res


def _p50(v):
    s = summarize(v)["p50"]
    return "-" if s is None else f"{s:.2f}"


def run_stream(daemon, build_dir, log, nbytes=STREAM_BYTES):
    """One 1 GiB stdout stream via the API, plus `sbx run` of the same command to /dev/null as a
    reference for the path without HTTP."""
    res = {"bytes": nbytes}
    # NDJSON with base64 (the default encoding), then binary frames (Accept:
    # application/vnd.sbx.frames).
    for key, extra, label in (("api", [], "NDJSON"), ("api_frames", ["--frames"], "frames")):
        log(f"stream: {nbytes} bytes of stdout via the API ({label})")
        argv = daemon.client_argv("stream", "--bytes", str(nbytes), "--daemon-pid",
                                  str(daemon.proc.pid), *extra)
        rc, out, err = _run(argv, 600)
        try:
            d = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            d = {"ok": False, "error": f"sbx-bench-api exited {rc} without a result: "
                                       f"{' '.join(err.split())[-300:]}"}
        if d.get("ok") and d.get("decoded_bytes") != nbytes:
            d["ok"] = False
            d["error"] = f"decoded {d.get('decoded_bytes')} bytes, expected exactly {nbytes}"
        if d.get("seconds"):
            d["mb_per_s"] = d.get("decoded_bytes", 0) / 1e6 / d["seconds"]
            d["mib_per_s"] = d.get("decoded_bytes", 0) / (1 << 20) / d["seconds"]
        res[key] = d
        log(f"stream via the API ({label}): {d.get('mb_per_s', 0):.0f} MB/s, decoded "
            f"{d.get('decoded_bytes')} bytes, daemon VmHWM {d.get('daemon_vmhwm_kb')} kB "
            f"{'' if d.get('ok') else 'FAILED: ' + str(d.get('error'))}")

    # Reference: the same command through `sbx run`, stdout into /dev/null, timed end to end.
    data = os.path.join(os.path.dirname(daemon.data), "sbx-data")
    env = dict(os.environ, SBX_CGROUP_PARENT=daemon.cgroup_parent)
    t0 = time.time()
    try:
        p = subprocess.run([os.path.join(build_dir, "sbx"), "--data-dir", data, "run", "--memory",
                            "256M", "--pids", "256", "--", "head", "-c", str(nbytes),
                            "/dev/zero"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           env=env, timeout=600)
        secs = time.time() - t0
        ref = {"ok": p.returncode == 0, "seconds": secs, "mb_per_s": nbytes / 1e6 / secs,
               "exit": p.returncode}
        if p.returncode != 0:
            ref["error"] = " ".join(p.stderr.decode(errors="replace").split())[-300:]
    except (OSError, subprocess.TimeoutExpired) as e:
        ref = {"ok": False, "error": str(e)}
    res["sbx_run"] = ref
    log(f"stream via sbx run: {ref.get('mb_per_s', 0):.0f} MB/s")
    res["daemon_vmhwm_lifetime_kb_at_end"] = daemon.status_kb("VmHWM")
    return res


def create_runs(daemon, tmp, workers, runs, body=CREATE_BODY, timeout=900):
    """`sbx-bench-api create-run` against `daemon`: the create and create-to-first-command times
    (ms) of the runs that succeeded, how many failed, and the first three failures' messages."""
    errdir = tempfile.mkdtemp(prefix="errs-", dir=tmp)
    argv = daemon.client_argv("create-run", "-c", str(workers), "-n", str(runs), "-e", errdir,
                              body=body)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    create, total, failed = [], [], 0
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) != 9:
            continue
        status, tot, cr = int(parts[4]), int(parts[3]), int(parts[5])
        if status != 0 or cr < 0:
            failed += 1
            continue
        create.append(cr / 1e6)
        total.append(tot / 1e6)
    errors = []
    for name in sorted(os.listdir(errdir))[:3]:
        with open(os.path.join(errdir, name)) as f:
            errors.append(f.read().strip()[-300:])
    shutil.rmtree(errdir, ignore_errors=True)
    if p.returncode != 0 and not create:
        raise RuntimeError(f"sbx-bench-api exited {p.returncode}: {p.stderr[-300:]}")
    return create, total, failed, errors

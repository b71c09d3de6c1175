"""The runtime rows (issue 15 item 5): create to first command through the REST API under each
runtime this host has (native, runc, gvisor; vm where it boots), and the memory an idle box
costs under each, in one run.

One `sbx serve` (networking off). Per round, in rotated order of the runtimes: `runs` sequential
creates by sbx-bench-api `create-run` with the create naming the runtime (POST /v1/sandboxes
{"runtime": R, limits as the latency table's}, then `true` through the commands route, DELETE
after each run outside the timed window): the create's own answer and create to the first
command's exit. Then IDLE boxes of each runtime are made and left alone for SETTLE seconds, and
their memory is read from the sandbox record's stats (the box's memory cgroup: for gVisor its
Sentry and gofer, for runc and native the agent and what it started). A runtime the daemon lists
unavailable is reported with its reason, not measured. Everything the section made is removed
at the end, also when a step fails.

Memory restore versus cold boot (vm): a template of a static busybox alone (no host directory
shared: QEMU can save its boxes), made the vm's with `sbx template runtime`. Per round: create to
the first command's exit (a cold boot), then pause (the memory saved to disk, the box stopped),
then resume to the first command's exit (a restore), all timed through the REST API.
"""

import json
import os
import shutil
import subprocess
import time

import daemon as daemon_mod
import peers as peers_mod
from stats import ratio, run_bench, summarize

FULL = {"runs": 30, "rounds": 2, "idle": 5, "settle_s": 5, "vm_runs": 5, "vm_idle": 2,
        "restores": 5}
QUICK = {"runs": 8, "rounds": 1, "idle": 2, "settle_s": 2, "vm_runs": 2, "vm_idle": 1,
         "restores": 2}
RESTORE_TEMPLATE = "bench-busybox-vm"
# A VM boots a kernel (seconds under TCG) and holds its guest's memory: fewer of them.
SLOW = {"vm"}


def body(runtime):
    return json.dumps({"runtime": runtime,
                       "limits": {"memory_bytes": peers_mod.MEMORY_BYTES,
                                  "pids": peers_mod.PIDS}})


class RuntimeBench:
    def __init__(self, build_dir, tmp, pid, log, cfg):
        self.d = daemon_mod.Daemon(build_dir, tmp, pid, name="sbx-serve-runtimes",
                                   flags=["--network", "off"])
        self.tmp = tmp
        self.log = log
        self.cfg = cfg

    def batch(self, runtime, runs):
        return daemon_mod.create_runs(self.d, self.tmp, 1, runs, body=body(runtime), timeout=1800)

    def idle_memory(self, runtime):
        ids = []
        try:
            for _ in range(self.cfg["vm_idle" if runtime in SLOW else "idle"]):
                ids.append(self.d._call("POST", "/v1/sandboxes", json.loads(body(runtime)))["id"])
            time.sleep(self.cfg["settle_s"])  # idle means left alone: the wait is the measurement
            mem = [self.d._call("GET", f"/v1/sandboxes/{i}")["stats"]["memory_bytes"]
                   for i in ids]
        finally:
            for i in ids:
                self.d._call("DELETE", f"/v1/sandboxes/{i}?wait=true")
        return {"boxes": len(mem), "mib": summarize([m / 2**20 for m in mem])}

    def first_command(self, sid):
        status, text = self.d.request("POST", f"/v1/sandboxes/{sid}/commands",
                                      {"argv": ["true"]}, timeout=600)
        if status != 200 or b'"exit_code":0' not in text.replace(b" ", b""):
            raise OSError(f"true in {sid}: HTTP {status}: {text[-300:]!r}")

    def vm_restore(self):
        rootfs = os.path.join(self.tmp, "busybox-rootfs")
        for d in ("bin", "etc", "tmp", "root"):
            os.makedirs(os.path.join(rootfs, d), exist_ok=True)
        shutil.copy2("/bin/busybox", os.path.join(rootfs, "bin", "busybox"))
        applets = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True,
                                 check=True).stdout.split()
        for a in applets:
            if a != "busybox" and not os.path.lexists(os.path.join(rootfs, "bin", a)):
                os.symlink("busybox", os.path.join(rootfs, "bin", a))
        with open(os.path.join(rootfs, "etc", "passwd"), "w") as f:
            f.write("root:x:0:0::/root:/bin/sh\n")
        with open(os.path.join(rootfs, "etc", "group"), "w") as f:
            f.write("root:x:0:\n")
        for argv in (["template", "add", RESTORE_TEMPLATE, rootfs],
                     ["template", "runtime", RESTORE_TEMPLATE, "vm"]):
            subprocess.run([self.d.exe, "--data-dir", self.d.data, *argv], check=True,
                           capture_output=True, timeout=600)
        shutil.rmtree(rootfs, ignore_errors=True)
        cold, pause, restore = [], [], []
        req = json.loads(body("vm"))
        req["template"] = RESTORE_TEMPLATE
        for _ in range(self.cfg["restores"]):
            t0 = time.monotonic()
            sid = self.d._call("POST", "/v1/sandboxes", req)["id"]
            try:
                self.first_command(sid)
                t1 = time.monotonic()
                self.d._call("POST", f"/v1/sandboxes/{sid}/pause")
                t2 = time.monotonic()
                self.d._call("POST", f"/v1/sandboxes/{sid}/resume")
                self.first_command(sid)
                t3 = time.monotonic()
            finally:
                self.d._call("DELETE", f"/v1/sandboxes/{sid}?wait=true")
            cold.append((t1 - t0) * 1000)
            pause.append((t2 - t1) * 1000)
            restore.append((t3 - t2) * 1000)
        row = {"cold": summarize(cold), "pause": summarize(pause), "restore": summarize(restore)}
        row["ratio_restore_to_cold"] = ratio(row["restore"].get("p50"), row["cold"].get("p50"))
        self.log(f"runtimes: vm memory restore P50 {row['restore'].get('p50')} ms, cold boot "
                 f"{row['cold'].get('p50')} ms, pause to disk {row['pause'].get('p50')} ms")
        return row

    def run(self):
        out = {"runtimes": {}}
        self.d.start()
        if self.d.error:
            raise RuntimeError(self.d.error)
        listed = self.d._call("GET", "/v1/runtimes")["runtimes"]
        names = [r["name"] for r in listed if r["available"]]
        for r in listed:
            if not r["available"]:
                out["runtimes"][r["name"]] = {"unavailable": r.get("reason", "")}
        samples = {n: {"create": [], "total": [], "failed": 0, "errors": []} for n in names}
        for rnd in range(self.cfg["rounds"]):
            k = rnd % len(names)
            for name in names[k:] + names[:k]:
                c, t, f, errors = self.batch(
                    name, self.cfg["vm_runs" if name in SLOW else "runs"])
                s = samples[name]
                s["create"] += c
                s["total"] += t
                s["failed"] += f
                s["errors"] += errors
        for name in names:
            s = samples[name]
            row = {"create": summarize(s["create"]), "total": summarize(s["total"]),
                   "failed": s["failed"],
                   "runs": self.cfg["vm_runs" if name in SLOW else "runs"] * self.cfg["rounds"]}
            if s["errors"]:
                row["errors"] = s["errors"][:3]
            row["memory"] = self.idle_memory(name)
            out["runtimes"][name] = row
            self.log(f"runtimes: {name}: create P50 {row['create'].get('p50')} ms, to first "
                     f"command {row['total'].get('p50')} ms, idle box "
                     f"{row['memory']['mib'].get('p50')} MiB")
        base = out["runtimes"].get("native", {}).get("total", {}).get("p50")
        for name in names:
            row = out["runtimes"][name]
            row["ratio_total_to_native"] = ratio(row["total"].get("p50"), base)
        if "vm" in names:
            try:
                out["vm_restore"] = self.vm_restore()
            except (OSError, subprocess.SubprocessError) as e:
                out["vm_restore"] = {"error": str(e)}
        return out

    def close(self):
        notes = []
        n = self.d.stop()
        if n:
            notes.append(n)
        shutil.rmtree(self.d.data, ignore_errors=True)
        return notes


def run_runtimes(build_dir, tmp, pid, log, quick):
    """The runtime rows; always returns a dict (with "error" when a step failed) and leaves no
    process or file of the run behind."""
    cfg = dict(QUICK if quick else FULL)
    return run_bench(cfg, quick, RuntimeBench(build_dir, tmp, pid, log, cfg))

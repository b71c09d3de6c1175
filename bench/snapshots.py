"""The snapshot rows (issue 14, item 7), each beside its floor measured in the same run:

  - a snapshot of a running sandbox (`POST /v1/sandboxes/{id}/snapshots`: freeze, copy of the
    writable layer, thaw, the layer registered) versus `cp -a` of the same writable layer on the
    host (the copy alone, no freeze, nothing registered), for writable layers of 1 MB, 100 MB and
    1 GB;
  - a fork into 10 sandboxes (`POST /v1/sandboxes/{id}/fork {"count": 10}`: one snapshot, ten
    creates) versus ten creates from the host template (the creates alone);
  - a create from a snapshot versus a create from the host template;
  - a pause without memory (`{"memory": false}`: the copy, then the box destroyed; the writable
    layer written afresh before each) and the resume from it (a new box of the recorded layers)
    versus a pause and resume with memory (freeze, thaw).

Twice: with the data directory on the run's temporary directory (the host's ext4: the writable
layer is copied), and on a btrfs filesystem the section makes (a sparse image in the temporary
directory, loop-mounted, unmounted and removed at the end): the writable layer is a subvolume
there, a snapshot a subvolume snapshot, and a create or fork from it a writable snapshot of that. One `sbx serve` (networking off) each; its sandboxes, snapshots and data directory are
removed at the end, also when a step fails. The two sides of each ratio alternate within each
round.
"""

import os
import shutil
import subprocess
import time

import daemon as daemon_mod
from stats import ratio, summarize

SIZES = [("1 MB", 1 << 20), ("100 MB", 100 << 20), ("1 GB", 1 << 30)]
FULL = {"rounds": 5, "fork_rounds": 3, "sizes": [s for s, _ in SIZES]}
QUICK = {"rounds": 2, "fork_rounds": 1, "sizes": ["1 MB", "100 MB"]}


def _ms(t0):
    return (time.monotonic() - t0) * 1000.0


class SnapshotBench:
    def __init__(self, build_dir, tmp, pid, log, cfg, name="sbx-serve-snapshots"):
        self.d = daemon_mod.Daemon(build_dir, tmp, pid, name=name)
        self.tmp = tmp
        self.log = log
        self.cfg = cfg

    def open(self):
        self.d.start()
        if self.d.error:
            raise RuntimeError(self.d.error)

    def close(self):
        notes = []
        try:
            for s in self.d._call("GET", "/v1/snapshots").get("snapshots", []):
                self.d._call("DELETE", f"/v1/snapshots/{s['id']}")
        except (OSError, ValueError) as e:
            notes.append(f"could not delete the snapshots: {e}")
        n = self.d.stop()
        if n:
            notes.append(n)
        shutil.rmtree(self.d.data, ignore_errors=True)
        return notes

    def create(self, template="host"):
        t0 = time.monotonic()
        s = self.d._call("POST", "/v1/sandboxes", {"template": template, "timeout": 3600})
        return s["id"], _ms(t0)

    def kill(self, sid):
        self.d._call("DELETE", f"/v1/sandboxes/{sid}")

    def exec(self, sid, cmd):
        status, body = self.d.request("POST", f"/v1/sandboxes/{sid}/commands",
                                      {"argv": ["sh", "-c", cmd]}, timeout=600)
        if status != 200 or b'"exit_code":0' not in body:
            raise RuntimeError(f"{cmd}: HTTP {status}: {body[-300:]!r}")

    def run_size(self, label, nbytes):
        rounds = self.cfg["rounds"]
        src, _ = self.create()
        try:
            self.exec(src, f"head -c {nbytes} /dev/urandom > /root/blob && sync")
            # On btrfs the writable layer is in the subvolume fs/layer.
            box = os.path.join(self.d.data, "run", src, "fs")
            upper = os.path.join(box, "layer", "upper")
            if not os.path.isdir(upper):
                upper = os.path.join(box, "upper")
            snap, cp, from_snap, from_host = [], [], [], []
            for i in range(rounds):
                # The floor: cp -a of the same writable layer (same filesystem, no freeze).
                dest = os.path.join(self.d.data, f"cp-floor-{i}")
                t0 = time.monotonic()
                subprocess.run(["cp", "-a", upper, dest], check=True)
                cp.append(_ms(t0))
                shutil.rmtree(dest, ignore_errors=True)
                t0 = time.monotonic()
                s = self.d._call("POST", f"/v1/sandboxes/{src}/snapshots", {})
                snap.append(_ms(t0))
                sid, ms = self.create(s["id"])
                from_snap.append(ms)
                self.kill(sid)
                hid, ms = self.create()
                from_host.append(ms)
                self.kill(hid)
                self.d._call("DELETE", f"/v1/snapshots/{s['id']}")
            forks, creates10 = [], []
            for _ in range(self.cfg["fork_rounds"]):
                t0 = time.monotonic()
                got = self.d._call("POST", f"/v1/sandboxes/{src}/fork", {"count": 10})
                forks.append(_ms(t0))
                ids = [f["sandbox"]["id"] for f in got["forks"] if "sandbox" in f]
                if len(ids) != 10:
                    raise RuntimeError(f"fork: {len(ids)} of 10 forks: {got}")
                for f in ids:
                    self.kill(f)
                t0 = time.monotonic()
                ids = [self.create()[0] for _ in range(10)]
                creates10.append(_ms(t0))
                for f in ids:
                    self.kill(f)
            pause_disk, resume_disk, pause_mem, resume_mem = [], [], [], []
            for _ in range(rounds):
                # N bytes in the writable layer again (a resumed box's files are its layers).
                self.exec(src, f"head -c {nbytes} /dev/urandom > /root/blob && sync")
                t0 = time.monotonic()
                self.d._call("POST", f"/v1/sandboxes/{src}/pause", {"memory": False})
                pause_disk.append(_ms(t0))
                t0 = time.monotonic()
                self.d._call("POST", f"/v1/sandboxes/{src}/resume")
                resume_disk.append(_ms(t0))
                t0 = time.monotonic()
                self.d._call("POST", f"/v1/sandboxes/{src}/pause")
                pause_mem.append(_ms(t0))
                t0 = time.monotonic()
                self.d._call("POST", f"/v1/sandboxes/{src}/resume")
                resume_mem.append(_ms(t0))
        finally:
            self.kill(src)
        row = {
            "bytes": nbytes,
            "snapshot_ms": summarize(snap), "cp_ms": summarize(cp),
            "create_from_snapshot_ms": summarize(from_snap),
            "create_from_host_ms": summarize(from_host),
            "fork10_ms": summarize(forks), "create10_ms": summarize(creates10),
            "pause_disk_ms": summarize(pause_disk), "resume_disk_ms": summarize(resume_disk),
            "pause_memory_ms": summarize(pause_mem), "resume_memory_ms": summarize(resume_mem),
        }
        p = lambda k: row[k]["p50"]  # noqa: E731
        row["ratios"] = {
            "snapshot_to_cp": ratio(p("snapshot_ms"), p("cp_ms")),
            "fork10_to_create10": ratio(p("fork10_ms"), p("create10_ms")),
            "create_snapshot_to_host": ratio(p("create_from_snapshot_ms"),
                                             p("create_from_host_ms")),
            "resume_disk_to_memory": ratio(p("resume_disk_ms"), p("resume_memory_ms")),
        }
        self.log(f"snapshots: {label}: snapshot P50 {p('snapshot_ms'):.0f} ms (cp -a "
                 f"{p('cp_ms'):.0f} ms), fork x10 {p('fork10_ms'):.0f} ms")
        return row


def _run_fs(build_dir, where, pid, log, cfg, label):
    """The rows with the daemon's data directory below `where`."""
    out = {"sizes": {}}
    sb = SnapshotBench(build_dir, where, pid, log, cfg)
    try:
        sb.open()
        for size, nbytes in SIZES:
            if size not in cfg["sizes"]:
                continue
            try:
                out["sizes"][size] = sb.run_size(f"{label}, {size}", nbytes)
            except Exception as e:  # noqa: BLE001 (a failed row is reported, the others run)
                out["sizes"][size] = {"error": f"{type(e).__name__}: {e}"}
                log(f"snapshots: {label}, {size}: {out['sizes'][size]['error']}")
    except Exception as e:  # noqa: BLE001 (a failed section is reported, never fatal)
        out["error"] = f"{type(e).__name__}: {e}"
        log(f"snapshots: {label}: {out['error']}")
    finally:
        notes = sb.close()
        if notes:
            out["cleanup_notes"] = notes
    return out


def _run_btrfs(build_dir, tmp, pid, log, cfg):
    if shutil.which("mkfs.btrfs") is None:
        return {"error": "mkfs.btrfs is missing (make deps installs btrfs-progs)"}
    img, mnt = os.path.join(tmp, "snapshots-btrfs.img"), os.path.join(tmp, "snapshots-btrfs")
    os.makedirs(mnt, exist_ok=True)
    try:
        with open(img, "wb") as f:
            f.truncate(24 << 30)  # sparse: only what the rows write is allocated
        subprocess.run(["mkfs.btrfs", "-q", "-f", img], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "loop", img, mnt], check=True, capture_output=True)
        os.chmod(mnt, 0o711)
        return _run_fs(build_dir, mnt, pid, log, cfg, "btrfs")
    except (OSError, subprocess.CalledProcessError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        subprocess.run(["umount", mnt], capture_output=True)
        for p in (img,):
            try:
                os.unlink(p)
            except OSError:
                pass


def run_snapshots(build_dir, tmp, pid, log, quick):
    """All the snapshot rows; always returns a dict (with "error" when a step failed) and leaves
    no process or file of the run behind."""
    cfg = dict(QUICK if quick else FULL)
    t0 = time.time()
    res = {"config": cfg, "quick": quick,
           "started": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())}
    with open("/proc/loadavg") as f:
        res["load_at_start"] = " ".join(f.read().split()[:3])
    res["ext4"] = _run_fs(build_dir, tmp, pid, log, cfg, "ext4")
    res["btrfs"] = _run_btrfs(build_dir, tmp, pid, log, cfg)
    with open("/proc/loadavg") as f:
        res["load_at_end"] = " ".join(f.read().split()[:3])
    res["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    res["duration_s"] = round(time.time() - t0, 1)
    return res

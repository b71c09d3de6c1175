"""The warm pool rows (issue 14, items 5 and 7): create through the REST API from a warm pool
versus a cold create versus bubblewrap, at concurrency 1, 10 and 50, in one run.

One `sbx serve` (networking off) with `--pool host:SIZE`. Per level, in rotated order:
  - pool: the pool is filled to SIZE (at least every run of the level) and the level's creates
    are timed by sbx-bench-api `create-run` (POST /v1/sandboxes, then `true` through
    POST /v1/sandboxes/{id}/commands, DELETE after each run outside the timed window): the
    create's own answer (`create`) and create to the first command's exit (`total`);
  - cold: the pool set to 0 and emptied first, the same creates made from nothing;
  - bwrap: `bwrap --unshare-all ... /bin/true` by sbx-bench-launch (bench/launch.c) with the same
    workers and runs, the peer of run.py's latency table.
The pool's refill runs during the pool rows, as it would on a host serving creates. Everything
the section made (the pool's boxes, sandboxes, the data directory) is removed at the end, also
when a step fails.
"""

import os
import shutil
import subprocess
import tempfile
import time

import daemon as daemon_mod
import peers as peers_mod
from stats import ratio, run_bench, summarize

FULL = {"levels": [(1, 30), (10, 3), (50, 1)], "rounds": 2}
QUICK = {"levels": [(1, 10), (10, 1), (50, 1)], "rounds": 1}
POOL = 50  # the largest level's runs: every create of a round finds a box


class PoolBench:
    def __init__(self, build_dir, tmp, pid, log, cfg):
        self.d = daemon_mod.Daemon(build_dir, tmp, pid, name="sbx-serve-pools",
                                   flags=["--network", "off", "--pool", f"host:{POOL}"])
        self.launcher = os.path.join(build_dir, "bench", "sbx-bench-launch")
        self.tmp = tmp
        self.log = log
        self.cfg = cfg
        self.bwrap = None
        for p in peers_mod.make_peers(build_dir, tmp, pid)[0]:
            if p.key == "bwrap" and not p.error:
                self.bwrap = p.argv

    def pool(self):
        got = self.d._call("GET", "/v1/pools").get("pools", [])
        return got[0] if got else {"ready": 0, "filling": 0, "size": 0}

    def set_pool(self, size, timeout=900):
        """Sets the pool's size and waits (polling GET /v1/pools) until it holds exactly that."""
        self.d._call("PUT", "/v1/pools/host", {"size": size})
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            p = self.pool()
            if p.get("ready") == size and p.get("filling", 0) == 0:
                return (time.monotonic() - t0) * 1000.0
            time.sleep(0.1)
        raise RuntimeError(f"the pool did not reach {size} in {timeout} s: {self.pool()}")

    def api_batch(self, workers, runs):
        create, total, failed, _ = daemon_mod.create_runs(self.d, self.tmp, workers, runs)
        return create, total, failed

    def bwrap_batch(self, workers, runs):
        errdir = tempfile.mkdtemp(prefix="errs-", dir=self.tmp)
        argv = [self.launcher, "-c", str(workers), "-n", str(runs), "-e", errdir, "--",
                *self.bwrap]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        ms, failed = [], 0
        for line in p.stdout.splitlines():
            parts = line.split()
            if len(parts) != 5:
                continue
            if int(parts[4]) != 0:
                failed += 1
                continue
            ms.append(int(parts[3]) / 1e6)
        shutil.rmtree(errdir, ignore_errors=True)
        return ms, failed

    def run(self):
        out = {"pool_size": POOL, "levels": {}}
        self.d.start()
        if self.d.error:
            raise RuntimeError(self.d.error)
        out["first_fill_ms"] = round(self.set_pool(POOL), 1)
        for workers, runs in self.cfg["levels"]:
            s = {"pool_create": [], "pool_total": [], "cold_create": [], "cold_total": [],
                 "bwrap": [], "failed": {"pool": 0, "cold": 0, "bwrap": 0}}
            for rnd in range(self.cfg["rounds"]):
                order = ["pool", "cold", "bwrap"]
                k = (rnd + len(out["levels"])) % 3
                for kind in order[k:] + order[:k]:
                    if kind == "pool":
                        self.set_pool(POOL)
                        c, t, f = self.api_batch(workers, runs)
                        s["pool_create"] += c
                        s["pool_total"] += t
                    elif kind == "cold":
                        self.set_pool(0)
                        c, t, f = self.api_batch(workers, runs)
                        s["cold_create"] += c
                        s["cold_total"] += t
                    else:
                        if not self.bwrap:
                            continue
                        ms, f = self.bwrap_batch(workers, runs)
                        s["bwrap"] += ms
                    s["failed"][kind] += f
            row = {k: summarize(v) for k, v in s.items() if k != "failed"}
            row["failed"] = s["failed"]
            row["workers"], row["runs"] = workers, runs
            for a, b in (("pool_create", "cold_create"), ("pool_total", "cold_total"),
                         ("pool_total", "bwrap"), ("cold_total", "bwrap")):
                row[f"ratio_{a}_to_{b}"] = ratio(row[a]["p50"], row[b]["p50"])
            out["levels"][str(workers)] = row
            self.log(f"pools: concurrency {workers}: pool create P50 "
                     f"{row['pool_create'].get('p50')} ms, cold "
                     f"{row['cold_create'].get('p50')} ms, bwrap {row['bwrap'].get('p50')} ms")
        # Memory of the ready boxes, as /metrics shows it.
        self.set_pool(POOL)
        p = self.pool()
        out["pool_memory_bytes"] = p.get("memory_bytes")
        out["pool_memory_per_box_mib"] = round(p.get("memory_bytes", 0) / POOL / 2**20, 2)
        return out

    def close(self):
        notes = []
        if self.d.proc is not None and self.d.proc.poll() is None and self.d.port:
            try:
                self.set_pool(0, timeout=300)
            except (OSError, ValueError, RuntimeError) as e:
                notes.append(f"could not empty the pool: {e}")
        n = self.d.stop()
        if n:
            notes.append(n)
        shutil.rmtree(self.d.data, ignore_errors=True)
        return notes


def run_pools(build_dir, tmp, pid, log, quick):
    """The warm pool rows; always returns a dict (with "error" when a step failed) and leaves no
    process or file of the run behind."""
    cfg = dict(QUICK if quick else FULL)
    return run_bench(cfg, quick, PoolBench(build_dir, tmp, pid, log, cfg))

"""Percentiles and summaries of latency samples, and the frame of a bench section's results
(stdlib only)."""

import subprocess
import time


def percentile(sorted_values, p):
    """Linear interpolation between closest ranks (numpy's default); None for no samples."""
    if not sorted_values:
        return None
    if len(sorted_values) == 1:
        return sorted_values[0]
    k = (len(sorted_values) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def summarize(values):
    """P50/P95/P99/mean/min/max of a list of numbers (any unit); all None when empty."""
    v = sorted(values)
    if not v:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "mean": None, "min": None,
                "max": None}
    return {
        "n": len(v),
        "p50": percentile(v, 50),
        "p95": percentile(v, 95),
        "p99": percentile(v, 99),
        "mean": sum(v) / len(v),
        "min": v[0],
        "max": v[-1],
    }


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def _load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run_bench(cfg, quick, bench):
    """Runs a section's bench object (run() -> its rows, close() -> cleanup notes) between the
    fields every section's results carry: its configuration, when it ran, the load average at
    both ends and its duration. Always returns a dict, with "error" when a step failed; close()
    runs whatever happened."""
    t0 = time.time()
    res = {"config": cfg, "quick": quick,
           "started": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
           "load_at_start": _load()}
    try:
        res.update(bench.run())
    except (OSError, ValueError, KeyError, RuntimeError, subprocess.SubprocessError) as e:
        res["error"] = str(e)
    finally:
        notes = bench.close()
        if notes:
            res["notes"] = notes
    res["load_at_end"] = _load()
    res["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    res["duration_s"] = round(time.time() - t0, 1)
    return res

"""Percentiles and summaries of latency samples (stdlib only)."""


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

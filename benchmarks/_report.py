"""The one figure a speed benchmark is judged by, handed to benchmarks/run_all.py.

Each benchmark prints its own lines for a person; `report` adds one, PASS or FAIL with the figure and its target,
so that a run that misses its target says so. Run under run_all.py (which sets
KVPLAN_BENCH_REPORT to a file of its own), it also writes the figure, its target and the verdict there as JSON.
"""

from __future__ import annotations

import json
import os
import tempfile

ENV = "KVPLAN_BENCH_REPORT"


def report(figure: float, target: float, unit: str, *, higher_is_better: bool, what: str) -> bool:
    """Whether `figure` meets `target`; written for run_all.py when it asked (see the module's docstring)."""
    ok = figure >= target if higher_is_better else figure <= target
    bound = "at least" if higher_is_better else "at most"
    print(f"{'PASS' if ok else 'FAIL'}: {what}: {_num(figure)} {unit}, target {bound} {_num(target)}")
    path = os.environ.get(ENV)
    if path:
        body = dict(figure=figure, target=target, unit=unit, higher_is_better=higher_is_better, what=what, ok=ok)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".report-")
        with os.fdopen(fd, "w") as f:
            json.dump(body, f)
        os.replace(tmp, path)
    return ok


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"

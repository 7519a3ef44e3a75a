"""Every speed target kvplan holds, each benchmark in a process of its own, one line each: the figure it is judged
by, its target, and measured / target.

    python benchmarks/run_all.py [--only NAME ...] [--quick]

Exits 1 when any benchmark misses its target (or fails to run). Run it on a quiet machine: each benchmark takes
the best of several runs, and the cold start compares kvplan against a bare typer app timed in the same runs, but
a machine busy with other work still slows everything down. It is never part of the unit tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _report import ENV  # noqa: E402

FIXTURE_LOGS = os.path.join(HERE, "..", "tests", "fixtures", "logs")

# name: the script and its arguments (the --quick variant's extra arguments second)
BENCHMARKS = {
    "cold start": (["startup.py"], ["--runs", "10"]),
    "sweep": (["sweep.py"], ["--repeat", "2"]),
    "throughput": (["throughput.py"], ["--runs", "2"]),
    "capacity catalog": (["command.py", "--", "capacity", "--gpu", "h100"], []),
    "log summary": (["command.py", "--what", "kvplan log --summary over the fixture logs", "--", "log", "--summary", "--configs",
                     os.path.join(HERE, "..", "tests", "fixtures", "configs"), "LOGS"], []),
}


def _logs() -> list[str]:
    out = []
    for root, _, files in os.walk(FIXTURE_LOGS):
        out += [os.path.join(root, f) for f in files if f.endswith(".log")]
    return sorted(out)


def run(name: str, quick: bool) -> tuple[bool, str]:
    script, quick_args = BENCHMARKS[name]
    args = [a for x in script for a in (_logs() if x == "LOGS" else [x])]
    if quick:  # the options go before a command.py's "--"
        cut = args.index("--") if "--" in args else len(args)
        args = args[:cut] + quick_args + args[cut:]
    with tempfile.TemporaryDirectory(prefix="kvplan-bench-") as tmp:
        path = os.path.join(tmp, "report.json")
        env = dict(os.environ, **{ENV: path})
        start = time.perf_counter()
        p = subprocess.run([sys.executable, os.path.join(HERE, args[0]), *args[1:]], capture_output=True,
                           text=True, env=env)
        took = time.perf_counter() - start
        if not os.path.exists(path):
            tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
            return False, f"{name:17} did not report (exit {p.returncode}): {tail[0]}"
        with open(path) as f:
            r = json.load(f)
    fig, target = r["figure"], r["target"]
    margin = fig / target if r["higher_is_better"] else target / fig
    sign = ">=" if r["higher_is_better"] else "<="
    verdict = "ok" if r["ok"] and p.returncode == 0 else "MISS"
    return verdict == "ok", (f"{name:17} {_num(fig):>11} {r['unit']:12} target {sign} {_num(target):>9}  "
                             f"margin {margin:5.2f}x  {verdict:4}  ({r['what']}; {took:.0f} s)")


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=list(BENCHMARKS), help="run these benchmarks alone")
    ap.add_argument("--quick", action="store_true", help="fewer runs of each (a rougher figure, a shorter wait)")
    a = ap.parse_args()
    results = []
    for name in a.only or BENCHMARKS:
        ok, line = run(name, a.quick)
        print(line, flush=True)
        results.append(ok)
    missed = results.count(False)
    print(f"{len(results) - missed} of {len(results)} targets held" + (f", {missed} missed" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

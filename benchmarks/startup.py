"""Cold-start time of a planning command against importing kvplan's own dependencies.

    python benchmarks/startup.py [--runs 30] [--target 1.3]

Runs, in turn (side by side, so machine noise hits all alike), each in a fresh interpreter with output to a pipe:
  baseline  python -c "import typer, rich, pydantic, yaml"
  typer     benchmarks/floor_app.py --bare: the smallest typer command (one argument, one option, one plain line
            printed); typer builds a pydantic adapter for each parameter, so this alone imports pydantic's internals
  floor     benchmarks/floor_app.py: the least a typer command of the same shape costs (same option types, one
            pydantic model validated from YAML, one rich table printed)
  kvplan    kvplan crossover llama3-8b --dtype fp8
and reports the median and minimum of each, kvplan / baseline (the target), typer / baseline (what the CLI library
alone costs) and kvplan / floor (kvplan's own share). Exits 1 when the median kvplan / baseline ratio exceeds --target.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

BASELINE = [sys.executable, "-c", "import typer, rich, pydantic, yaml"]
_APP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "floor_app.py")
TYPER = [sys.executable, _APP, "--bare", "llama3-8b", "--dtype", "fp8"]
FLOOR = [sys.executable, _APP, "crossover", "llama3-8b", "--dtype", "fp8"]


def kvplan_cmd() -> list[str]:
    exe = shutil.which("kvplan")
    prefix = [exe] if exe else [sys.executable, "-m", "kvplan.cli"]
    return prefix + ["crossover", "llama3-8b", "--dtype", "fp8"]


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--target", type=float, default=1.3)
    args = ap.parse_args()
    cmd = kvplan_cmd()
    env_note = f"python {sys.version.split()[0]}, {os.cpu_count()} cpus"
    runs = {"baseline": (BASELINE, []), "typer": (TYPER, []), "floor": (FLOOR, []), "kvplan": (cmd, [])}
    for _ in range(3):  # warm the page cache and .pyc files
        for c, _times in runs.values():
            timed(c)
    for _ in range(args.runs):
        for c, times in runs.values():
            times.append(timed(c))
    med = {k: statistics.median(t) for k, (_, t) in runs.items()}
    low = {k: min(t) for k, (_, t) in runs.items()}
    for k, (c, _t) in runs.items():
        shown = " ".join(os.path.basename(x) if x.endswith(".py") or x == sys.executable else x for x in c)
        print(f"{k:9} {shown[:62]:62} median {med[k] * 1e3:7.1f} ms  min {low[k] * 1e3:7.1f} ms")
    ratio = med["kvplan"] / med["baseline"]
    print(f"kvplan / baseline: {ratio:.2f} (min/min {low['kvplan'] / low['baseline']:.2f}), target <= {args.target}")
    print(f"typer  / baseline: {med['typer'] / med['baseline']:.2f} (min/min {low['typer'] / low['baseline']:.2f})")
    print(f"floor  / baseline: {med['floor'] / med['baseline']:.2f} (min/min {low['floor'] / low['baseline']:.2f})")
    print(f"kvplan / floor:    {med['kvplan'] / med['floor']:.2f} (min/min {low['kvplan'] / low['floor']:.2f})")
    print(f"[{env_note}, {args.runs} runs each]")
    return 0 if ratio <= args.target else 1


if __name__ == "__main__":
    sys.exit(main())

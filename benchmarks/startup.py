"""Cold-start time of a planning command against importing kvplan's own dependencies.

    python benchmarks/startup.py [--runs 30] [--target 1.3]

Runs `kvplan crossover llama3-8b --dtype fp8` and `python -c "import typer, rich, pydantic, yaml"` alternately
(side by side, so machine noise hits both alike), each in a fresh interpreter with output to a pipe, and reports the
median and minimum wall time of each and their ratio. Exits 1 when the median ratio exceeds --target.
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
    for _ in range(3):  # warm the page cache and .pyc files
        timed(BASELINE), timed(cmd)
    base, ours = [], []
    for _ in range(args.runs):
        base.append(timed(BASELINE))
        ours.append(timed(cmd))
    mb, mo = statistics.median(base), statistics.median(ours)
    print(f"{' '.join(BASELINE[1:])!s:60} median {mb * 1e3:7.1f} ms  min {min(base) * 1e3:7.1f} ms")
    print(f"{' '.join(cmd[-4:])!s:60} median {mo * 1e3:7.1f} ms  min {min(ours) * 1e3:7.1f} ms")
    ratio = mo / mb
    print(f"ratio (median) {ratio:.2f}  (min/min {min(ours) / min(base):.2f})  target <= {args.target}  [{env_note}, "
          f"{args.runs} runs each]")
    return 0 if ratio <= args.target else 1


if __name__ == "__main__":
    sys.exit(main())

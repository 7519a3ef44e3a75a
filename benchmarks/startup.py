"""Cold-start time of a planning command against importing kvplan's own dependencies.

    python benchmarks/startup.py [--runs 30] [--target 1.3] [--kvplan PATH]...

Runs, in turn (side by side, so machine noise hits all alike), each in a fresh interpreter with output to a pipe:
  baseline    python -c "import typer, rich, pydantic, yaml"
  typer-bare  benchmarks/floor_app.py --bare: the smallest typer command (one argument, one option, one plain line
              printed); typer builds a pydantic adapter for each parameter, so this alone imports pydantic's internals
  floor       benchmarks/floor_app.py: the least a typer command of the same shape costs (same option types, one
              pydantic model validated from YAML, one rich table printed)
  kvplan      kvplan crossover llama3-8b --dtype fp8
and reports the median and minimum wall-clock time of each (and the median CPU time, user + system, which a busy
machine disturbs less), then the ratios of the medians (and of the minimums):
  kvplan / typer-bare  the target: kvplan's cold start against the minimal typer app run the same way
  kvplan / baseline    against merely importing kvplan's dependencies
  typer-bare / baseline (what the CLI library alone costs) and kvplan / floor (kvplan's own share)
Exits 1 when the median wall-clock kvplan / typer-bare ratio exceeds --target.

--kvplan PATH (repeatable) also times the same command from the source checkout at PATH: the same `kvplan` script
run with PATH first on PYTHONPATH, in a row named kvplan[BASENAME] beside the installed copy's, so that a change is
measured against the installed (say, main's) start in the same run. Given, the ratio judged against --target is the
last such checkout's. Each kvplan row keeps kvplan's cache (KVPLAN_CACHE_DIR: the catalogs' parses and validated
specs) in a folder of its own under the run's temporary one, filled by the warm-up rounds as the bytecode is, so that
two copies of kvplan never take or overwrite each other's.

Every run may write bytecode, into a temporary cache (PYTHONPYCACHEPREFIX) that the warm-up rounds fill, even where
PYTHONDONTWRITEBYTECODE is set: an installed kvplan has its .pyc files as typer, rich and pydantic have theirs, so
compiling kvplan's sources on every run is no part of its start-up. --no-bytecode-cache runs with the environment as
it is instead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import report  # noqa: E402

BASELINE = [sys.executable, "-c", "import typer, rich, pydantic, yaml"]
_APP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "floor_app.py")
TYPER = [sys.executable, _APP, "--bare", "llama3-8b", "--dtype", "fp8"]
FLOOR = [sys.executable, _APP, "crossover", "llama3-8b", "--dtype", "fp8"]


def kvplan_cmd() -> list[str]:
    exe = shutil.which("kvplan")
    prefix = [exe] if exe else [sys.executable, "-m", "kvplan.app.cli"]
    return prefix + ["crossover", "llama3-8b", "--dtype", "fp8"]


def _children_cpu() -> float:
    try:
        import resource
    except ImportError:  # Windows
        return float("nan")
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def with_pythonpath(env: dict[str, str] | None, path: str) -> dict[str, str]:
    """`env` (or this process's environment) with `path` first on PYTHONPATH."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.abspath(path), out.get("PYTHONPATH")) if p)
    return out


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall-clock seconds of one run, and the CPU seconds (user + system) it used."""
    cpu = _children_cpu()
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True, env=env)
    return time.perf_counter() - start, _children_cpu() - cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--target", type=float, default=1.3, help="most kvplan / typer-bare may be (median)")
    ap.add_argument("--no-bytecode-cache", action="store_true",
                    help="run with the environment as it is (PYTHONDONTWRITEBYTECODE, if set, applies)")
    ap.add_argument("--kvplan", action="append", default=[], metavar="PATH",
                    help="also time the command from this source checkout (PATH first on PYTHONPATH); repeatable")
    args = ap.parse_args()
    cmd = kvplan_cmd()
    env_note = f"python {sys.version.split()[0]}, {os.cpu_count()} cpus"
    with tempfile.TemporaryDirectory(prefix="kvplan-startup-pyc-") as pyc:
        env = None
        if not args.no_bytecode_cache:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env["PYTHONPYCACHEPREFIX"] = pyc
            env_note += ", bytecode cached (warm-up fills it)"
        elif os.environ.get("PYTHONDONTWRITEBYTECODE"):
            env_note += ", PYTHONDONTWRITEBYTECODE set: kvplan's sources are compiled on every run"
        runs = {"baseline": (BASELINE, []), "typer-bare": (TYPER, []), "floor": (FLOOR, []), "kvplan": (cmd, [])}
        envs = {k: env for k in runs}
        for path in args.kvplan:
            name = f"kvplan[{os.path.basename(os.path.normpath(path))}]"
            runs[name], envs[name] = (cmd, []), with_pythonpath(env, path)
        for i, k in enumerate(k for k in runs if k.startswith("kvplan")):  # a catalog cache of its own each
            envs[k] = {**(os.environ if envs[k] is None else envs[k]),
                       "KVPLAN_CACHE_DIR": os.path.join(pyc, f"kvplan-cache-{i}")}
        for _ in range(3):  # warm the page cache and .pyc files
            for k, (c, _times) in runs.items():
                timed(c, envs[k])
        for _ in range(args.runs):
            for k, (c, times) in runs.items():
                times.append(timed(c, envs[k]))
    med = {k: statistics.median(w for w, _ in t) for k, (_, t) in runs.items()}
    low = {k: min(w for w, _ in t) for k, (_, t) in runs.items()}
    cpu = {k: statistics.median(c for _, c in t) for k, (_, t) in runs.items()}
    w = max(10, *map(len, runs))
    for k, (c, _t) in runs.items():
        shown = " ".join(os.path.basename(x) if x.endswith(".py") or x == sys.executable else x for x in c)
        print(f"{k:{w}} {shown[:62]:62} median {med[k] * 1e3:7.1f} ms  min {low[k] * 1e3:7.1f} ms  "
              f"cpu {cpu[k] * 1e3:7.1f} ms")

    def line(a: str, b: str, note: str = "") -> str:
        return f"{a + ' / ' + b + ':':{w + 14}} {med[a] / med[b]:.2f} (min/min {low[a] / low[b]:.2f}){note}"

    judged = list(runs)[-1]  # the installed kvplan, or the last checkout given
    for k in [k for k in runs if k.startswith("kvplan")]:
        ratio = med[k] / med["typer-bare"]
        verdict = ("ok" if ratio <= args.target else "OVER") if k == judged else "not judged"
        print(line(k, "typer-bare", f"  target <= {args.target}: {verdict}  "
                   f"(cpu {cpu[k] / cpu['typer-bare']:.2f})"))
    ratio = med[judged] / med["typer-bare"]
    print(line("kvplan", "baseline"))
    print(line("typer-bare", "baseline"))
    print(line("floor", "baseline"))
    print(line("kvplan", "floor"))
    print(f"[{env_note}, {args.runs} runs each]")
    ok = report(ratio, args.target, "x typer-bare", higher_is_better=False,
                what=f"{judged} crossover's cold start / the one-command typer app's, medians of {args.runs} runs")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

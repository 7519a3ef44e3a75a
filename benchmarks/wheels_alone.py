"""Check that the wheels benchmarks/device_wheels.txt pins are all kvplan needs beside torch and triton: install them
from a folder of wheels alone (no index, dependencies resolved from that folder only) into an empty virtual
environment in which torch and triton (with their own requirements) are the only other packages, then import
kvplan's measure path there and plan a measurement.

    python3 benchmarks/wheels_alone.py [--wheels .whl] [--without-torch]

Run from the repository root with the Python the GPU machine runs kvplan with (the one that has torch and triton).
`--without-torch` leaves torch and triton out (on a machine without them): the planning side of `kvplan measure` is
checked, and `kvplan measure` itself must refuse in one line. Exits 0 when everything imported and ran, 1 otherwise
(the first failure on the last line), 2 on bad input.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = Path(__file__).with_name("device_wheels.txt")


def pins(manifest: Path = MANIFEST) -> list[str]:
    """The manifest's requirements, `name==version` each."""
    out = []
    for line in manifest.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            out.append(line)
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def torch_closure(leave_out: set[str]) -> list:
    """The installed distributions of torch and triton and, recursively, of everything they require here (markers
    evaluated for this interpreter, extras left out), less the packages in `leave_out` (the wheels provide those)."""
    from importlib import metadata

    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip's own copy
        from pip._vendor.packaging.requirements import Requirement

    seen, todo, dists = set(), ["torch", "triton"], []
    while todo:
        name = _norm(todo.pop())
        if name in seen or name in leave_out:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        dists.append(dist)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return dists


def link_packages(dists: list, folder: Path) -> int:
    """Symbolic links in `folder` to every top-level file and folder the distributions installed (their RECORD),
    so that a path entry for `folder` shows these packages and nothing else. Returns the links made."""
    made = 0
    for dist in dists:
        base = Path(dist.locate_file(""))
        for f in dist.files or []:
            parts = Path(f).parts
            if not parts or parts[0] == ".." or parts[0] == "__pycache__":
                continue
            target, link = base / parts[0], folder / parts[0]
            if target.exists() and not link.exists():
                link.symlink_to(target)
                made += 1
    return made


def run(args: argparse.Namespace) -> int:
    wheels = Path(args.wheels)
    if not wheels.is_dir() or not any(wheels.glob("*.whl")):
        print(f"wheels_alone: no wheels in {wheels}", file=sys.stderr)
        return 2
    requirements = pins()
    with tempfile.TemporaryDirectory(prefix="kvplan-wheels-") as tmp:
        venv = Path(tmp) / "venv"
        r = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if r.returncode:
            print(f"cannot create a virtual environment: {r.stderr.strip().splitlines()[-1:]}")
            return 1
        py = venv / "bin" / "python"
        if not args.without_torch:
            only = Path(tmp) / "torch-only"
            only.mkdir()
            dists = torch_closure({_norm(p.split("==")[0]) for p in requirements})
            if not {_norm(d.metadata["Name"]) for d in dists} >= {"torch", "triton"}:
                print("torch and triton are not both installed for this Python: run it with the one that has them, "
                      "or pass --without-torch")
                return 1
            n = link_packages(dists, only)
            site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True).stdout.strip()
            Path(site, "torch-only.pth").write_text(str(only) + "\n")
            print(f"torch and triton present: {len(dists)} distributions, {n} links")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "PYTHONNOUSERSITE": "1",
               "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONPATH": str(ROOT)}
        # dependencies resolved from the folder alone: a requirement no wheel there provides fails the install
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--ignore-installed",
                            "--no-cache-dir", "--find-links", str(wheels), *requirements],
                           capture_output=True, text=True, env=env)
        print(r.stdout + r.stderr, end="")
        if r.returncode:
            print(f"the wheels in {wheels} do not install alone (pip exit {r.returncode})")
            return 1
        checks = [("imports", [str(py), "-c", "import typer, rich, pydantic, yaml, kvplan.app.cli, kvplan.measure.run, "
                               "kvplan.specs.calibration, kvplan.app.render, kvplan.sizing.kv_cache, "
                               "kvplan.sizing.weights"]),
                  ("measure --dry-run", [str(py), "-m", "kvplan", "measure", "--dry-run", "--quick"])]
        if args.without_torch:
            checks.append(("measure without torch", [str(py), "-m", "kvplan", "measure", "--quick"]))
        else:
            checks.append(("kernel imports", [str(py), "-c", "import torch, triton; import kvplan.kernels.bench, "
                           "kvplan.kernels.probe, kvplan.kernels.paged_attention, kvplan.kernels.int4_attention, "
                           "kvplan.kernels.nvfp4_attention, kvplan.kernels.turboquant_attention, "
                           "kvplan.kernels.kivi_attention, kvplan.kernels.gemv, kvplan.kernels.stream; "
                           "print('torch', torch.__version__, 'triton', triton.__version__)"]))
        failed = None
        for name, cmd in checks:
            r = subprocess.run(cmd, capture_output=True, text=True, env=env)
            refused = name == "measure without torch"
            ok = (r.returncode == 2 and "needs torch and triton" in r.stderr) if refused else r.returncode == 0
            tail = (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]
            print(f"{'ok' if ok else 'FAILED'}  {name}: {tail[0]}")
            if not ok and failed is None:
                failed = f"{name} failed in the environment of the wheels alone (exit {r.returncode})"
        if failed:
            print(failed)
            return 1
    print(f"the {len(requirements)} wheels install alone and kvplan's measure path runs with them")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", default=".whl", help="the folder of wheels (default .whl)")
    ap.add_argument("--without-torch", action="store_true", help="leave torch and triton out")
    return run(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())

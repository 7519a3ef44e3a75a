"""benchmarks/device_check.sh on the CPU: run with a fake python3 and nvidia-smi that record their calls, it runs
every step even when one fails and writes each step's result; and the wheels it installs are a closed set, by their
metadata and (where the wheels and a CPython 3.12 are at hand) by installing them alone into an empty venv."""

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "device_check.sh"
MANIFEST = ROOT / "benchmarks" / "device_wheels.txt"

FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >>"$CALLS"
case "$*" in
  *"measure --quick"*)
    if [ -n "${FAIL_MEASURE:-}" ]; then echo "the self-check failed"; exit 3; fi
    out=""; prev=""
    for a in "$@"; do [ "$prev" = "--output" ] && out=$a; prev=$a; done
    echo "schema: kvplan-calibration/1" >"$out" ;;
  *"measure --probe"*)
    if [ -n "${FAIL_PROBE:-}" ]; then echo "the probe failed"; exit 4; fi
    out=""; prev=""
    for a in "$@"; do [ "$prev" = "--output" ] && out=$a; prev=$a; done
    echo "{}" >"$out" ;;
  *) echo "ran: $*" ;;
esac
exit 0
"""


def _manifest() -> list[tuple[str, str]]:
    rows = []
    for line in MANIFEST.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            rows.append((name, version))
    return rows


def _run(tmp_path, *, fail_measure: bool, drop: str | None, fail_probe: bool = False):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    work = tmp_path / "repo"
    (work / ".whl").mkdir(parents=True)
    for name, version in _manifest():  # empty stand-ins named as pip names the wheels
        if name != drop:
            (work / ".whl" / f"{name.lower().replace('-', '_')}-{version}-py3-none-any.whl").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, text in (("python3", FAKE_PYTHON), ("nvidia-smi", "#!/usr/bin/env bash\necho 'NVIDIA H200, 143771 MiB'\n")):
        (bin_dir / tool).write_text(text)
        (bin_dir / tool).chmod(stat.S_IRWXU)
    calls = tmp_path / "calls.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls)}
    env.pop("OUT", None)
    if fail_measure:
        env["FAIL_MEASURE"] = "1"
    if fail_probe:
        env["FAIL_PROBE"] = "1"
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(SCRIPT), str(out)], cwd=work, env=env, capture_output=True, text=True,
                       timeout=60)
    results = [line.split("\t") for line in (out / "results.tsv").read_text().splitlines()[1:]]
    return r, {name: int(rc) for name, rc, _ in results}, [c.split() for c in calls.read_text().splitlines()], out


def test_every_step_runs_when_one_fails(tmp_path):
    r, status, calls, out = _run(tmp_path, fail_measure=True, drop="pyyaml", fail_probe=True)
    # the missing wheel fails the wheels step, the self-check fails measure and the probe fails; every later step
    # still ran
    assert status == {"wheels": 1, "wheels-alone": 0, "imports": 0, "device": 0, "measure": 3, "validate-auto": 0,
                      "validate-fp8": 0, "validate-int4_per_token_head": 0, "probe": 4}
    assert r.returncode == 1
    log = (out / "steps.log").read_text()
    assert "missing wheel: pyyaml==6.0.4" in log and "the self-check failed" in log
    assert "== measure: exit 3" in log and "NVIDIA H200" in log and "== probe: exit 4" in log
    # the wheels went in without an index, into /tmp/site; the validations ran without a profile (none written)
    assert calls[0][:4] == ["-m", "pip", "install", "-q"] and "--no-index" in calls[0] and "/tmp/site" in calls[0]
    validate = [c for c in calls if "--validate" in c]
    assert [c[c.index("-d") + 1] for c in validate] == ["auto", "fp8", "int4_per_token_head"]
    assert not any("--calibration" in c for c in validate)
    assert sorted(p.name for p in out.iterdir()) == ["results.tsv", "steps.log"]


def test_every_step_passes(tmp_path):
    r, status, calls, out = _run(tmp_path, fail_measure=False, drop=None)
    assert set(status.values()) == {0} and len(status) == 9 and r.returncode == 0
    # the wheels checked alone, in an empty environment beside torch and triton
    assert calls[1] == [str(ROOT / "benchmarks" / "wheels_alone.py"), "--wheels", ".whl"]
    validate = [c for c in calls if "--validate" in c]
    assert all(c[c.index("--calibration") + 1] == str(out / "calibration.yaml") for c in validate)
    # the probe, last, with its budget and its output in the folder
    assert calls[-1] == ["-m", "kvplan", "measure", "--probe", "--budget", "90", "--output", str(out / "probe.json")]
    # four files come back from the machine, well inside what a device run returns (8)
    assert sorted(p.name for p in out.iterdir()) == ["calibration.yaml", "probe.json", "results.tsv", "steps.log"]


def test_no_step_cancels_the_others():
    text = SCRIPT.read_text()
    assert not re.search(r"^\s*set -[a-z]*e", text, re.M)  # no errexit
    assert "set -uo pipefail" in text


def test_the_wheels_are_a_closed_set():
    # every requirement of every listed wheel (for CPython 3.12 on Linux, extras left out) is listed too, kvplan's
    # own requirements on the measure path are there (typer, rich, pydantic, pyyaml), and typer's annotated-doc and
    # pydantic's compiled core are among them; read from the installed packages' metadata, where they match the pins
    from importlib import metadata

    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    pins = dict(_manifest())
    norm = {n.lower().replace("_", "-"): v for n, v in pins.items()}
    assert {"typer", "rich", "pydantic", "pyyaml", "annotated-doc", "pydantic-core"} <= set(norm)
    env = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}
    checked = 0
    for name, version in norm.items():
        try:
            if metadata.version(name) != version:
                continue
        except metadata.PackageNotFoundError:
            continue
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            dep = req.name.lower().replace("_", "-")
            assert dep in norm, f"{name} needs {dep}, which benchmarks/device_wheels.txt leaves out"
            assert req.specifier.contains(norm[dep], prereleases=True), f"{name} needs {req}, pinned {norm[dep]}"
        checked += 1
    if not checked:
        pytest.skip("none of the pinned versions is installed here")


def _python312() -> str | None:
    """A CPython 3.12 to install the wheels with (they are built for it): KVPLAN_DEVICE_PYTHON, or python3.12."""
    for exe in (os.environ.get("KVPLAN_DEVICE_PYTHON"), shutil.which("python3.12")):
        if exe and subprocess.run([exe, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"],
                                  capture_output=True).returncode == 0:
            return exe
    return None


def test_the_wheels_install_alone():
    # the wheels of .whl/ (or KVPLAN_DEVICE_WHEELS), installed with no index into an empty virtual environment,
    # dependencies resolved from that folder alone; kvplan's measure path imports and plans there, and measure
    # itself refuses in one line (torch and triton are left out here; benchmarks/device_check.sh runs the same check
    # on the GPU machine with them present)
    wheels = Path(os.environ.get("KVPLAN_DEVICE_WHEELS") or ROOT / ".whl")
    if not wheels.is_dir() or not list(wheels.glob("*.whl")):
        pytest.skip(f"no wheels in {wheels} (benchmarks/fetch_device_wheels.sh downloads them)")
    py = _python312()
    if py is None:
        pytest.skip("no CPython 3.12 here (KVPLAN_DEVICE_PYTHON names one)")
    r = subprocess.run([py, str(ROOT / "benchmarks" / "wheels_alone.py"), "--wheels", str(wheels), "--without-torch"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok  measure --dry-run" in r.stdout and "ok  measure without torch" in r.stdout

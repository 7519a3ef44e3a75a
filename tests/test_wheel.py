"""A wheel built from the repository carries the bundled specs: installed (not editable) in a fresh virtual
environment, `kvplan crossover llama3-8b` answers from the installed package alone."""

import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("hatchling", reason="building the wheel needs hatchling (pip install -e '.[test]')")


def test_wheel_installs_and_answers(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(ROOT)], check=True)
    wheel = next(dist.glob("kvplan-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "kvplan/_bundled/models/llama-3-8b.yaml" in names
    assert "kvplan/_bundled/hardware/h100-sxm.yaml" in names
    assert "kvplan/kernels/paged_attention.py" in names and "kvplan/kernels/layouts.py" in names
    assert not any(n.startswith(("kernels/", "models/", "hardware/", "tests/")) for n in names)

    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    py = env / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    # The dependencies come from this interpreter's site-packages, appended after the venv's own, so kvplan itself
    # can only be the installed wheel.
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "_outer_deps.pth").write_text("\n".join(sorted(deps)) + "\n")

    where = subprocess.run([str(py), "-c", "import kvplan; print(kvplan.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(env))
    r = subprocess.run([str(env / "bin" / "kvplan"), "crossover", "llama3-8b", "--json"], cwd=tmp_path,
                       capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "COLUMNS": "120"})
    assert r.returncode == 0, r.stderr
    assert '"kv_bytes_per_token": 131072' in r.stdout
    r = subprocess.run([str(env / "bin" / "kvplan"), "capacity", "llama3-8b", "--gpu", "h100"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "H100" in r.stdout

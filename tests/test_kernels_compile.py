"""Every kernel compiles for Hopper (sm_90, the H100 and H200) with Triton's own compiler, down to a cubin, on a
machine without a GPU: the interpreter tests check what the kernels compute, this checks that they build."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")


def test_every_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("compile_kernels.py")
    r = subprocess.run([sys.executable, str(script), "--arch", "90"], env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    ok = [line.split()[2] for line in r.stdout.splitlines() if line.startswith("ok ")]
    # the 18 families `kvplan measure` runs use 8 kernels (the paged kernel in 5 modes, turboquant in 4 bit
    # layouts, KIVI in 2), each launch with its own constants: 19 distinct launches counting the combine kernel's
    # two; the paged write path in its 6 modes (fp16 too), the int4 write path, the NVFP4 one in 2, the
    # TurboQuant one in its 4 bit layouts and the KIVI one in 2: 34
    assert set(ok) == {"_read_kernel", "_copy_kernel", "_gemv_kernel", "_paged_decode_kernel", "_combine_kernel",
                       "_int4_decode_kernel", "_nvfp4_decode_kernel", "_tq_decode_kernel", "_kivi_decode_kernel",
                       "_reshape_and_cache_kernel", "_int4_write_kernel", "_nvfp4_write_kernel",
                       "_tq_write_kernel", "_kivi_write_kernel"}
    assert len(ok) == 34 and "FAILED" not in r.stdout

"""Every kernel compiles for Hopper (sm_90, the H100 and H200) with Triton's own compiler, down to a cubin, on a
machine without a GPU: the interpreter tests check what the kernels compute, this checks that they build."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")


@pytest.fixture(scope="module")
def report():
    """`compile_kernels.py --arch 90 --report`, run once for the module's tests."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("compile_kernels.py")
    return subprocess.run([sys.executable, str(script), "--arch", "90", "--report"], env=env, capture_output=True,
                          text=True, timeout=900)


def test_every_kernel_compiles_for_sm90(report):
    r = report
    assert r.returncode == 0, r.stdout + r.stderr
    ok = [line.split()[2] for line in r.stdout.splitlines() if line.startswith("ok ")]
    # the static report: one row per launch, and for every decode kernel its blocks per SM, main-loop
    # instructions and instructions per byte read
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("report ")]
    assert len(rows) == len(ok)
    decode = [row for row in rows if row[1].endswith("_decode_kernel")]
    assert len(decode) == 13  # paged in 5 modes, int4, NVFP4, TurboQuant in 4 bit layouts, KIVI in 2
    for row in decode:
        blocks, loop, per_byte, ceiling = int(row[-5]), int(row[-4]), float(row[-2]), float(row[-1])
        assert blocks >= 1 and loop > 0 and per_byte > 0 and ceiling > 0
    # the 18 families `kvplan measure` runs use 8 kernels (the paged kernel in 5 modes, turboquant in 4 bit
    # layouts, KIVI in 2), each launch with its own constants: 19 distinct launches counting the combine kernel's
    # two; the paged write path in its 6 modes (fp16 too), the int4 write path, the NVFP4 one in 2, the
    # TurboQuant one in its 4 bit layouts and the KIVI one in 2: 34
    assert set(ok) == {"_read_kernel", "_copy_kernel", "_gemv_kernel", "_paged_decode_kernel", "_combine_kernel",
                       "_int4_decode_kernel", "_nvfp4_decode_kernel", "_tq_decode_kernel", "_kivi_decode_kernel",
                       "_reshape_and_cache_kernel", "_int4_write_kernel", "_nvfp4_write_kernel",
                       "_tq_write_kernel", "_kivi_write_kernel"}
    assert len(ok) == 34 and "FAILED" not in r.stdout


def test_report_arithmetic():
    sys.path.insert(0, str(Path(__file__).parent))
    import compile_kernels as ck

    # 64 registers a thread: 64 x 32 = 2,048 a warp (a multiple of 256), 4 warps: 8,192 a block, 65,536 / 8,192 = 8
    # blocks; 12,864 B of shared memory + 1 KB reserved: 233,472 / 13,888 = 16; 64 / 4 = 16 by warps: 8
    assert ck.blocks_per_sm(64, 12864, 4) == 8
    # 100 registers: 3,200 a warp, rounded up to 3,328 (13 x 256); 4 warps 13,312: 65,536 / 13,312 = 4 blocks
    assert ck.blocks_per_sm(100, 8768, 4) == 4
    # 243 registers, 8 warps: 7,776 a warp, rounded to 7,936; 63,488 a block: 1
    assert ck.blocks_per_sm(243, 4096, 8) == 1
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_3:
        /*0010*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0020*/                   FFMA R3, R2, R2, R3 ;
        /*0030*/                   IADD3 R4, R4, 0x10, RZ ;
        /*0040*/                   ISETP.GE.AND P0, PT, R4, R5, PT ;
        /*0050*/              @!P0 BRA `(.L_x_3) ;
        /*0060*/                   EXIT ;
.L_x_5:
        /*0070*/                   BRA `(.L_x_5);
"""
    # the loop runs from 0x10 to the branch at 0x50: (0x50 - 0x10) / 16 + 1 = 5 instructions; the one-instruction
    # trap loop at the end does not count
    assert ck.main_loop(sass) == 5


# The issue ceilings the decode kernels must keep on an H100 (132 SMs, 4 warp-instructions a clock, 1.98 GHz; see
# compile_kernels.py): 1.1x the fraction of the stream read each family is meant to reach, the stream read being
# 0.90 of the 3.35 TB/s peak: bf16 0.85 -> 2.82 TB/s; fp8 and int8/fp8 per-token-head 0.80 -> 2.65; int4 and NVFP4
# 0.70 -> 2.32; TurboQuant and KIVI 0.60 -> 1.99.
_STREAM = 0.90 * 3.35
_TARGETS = {"_paged_decode_kernel MODE=0": 0.85, "_paged_decode_kernel MODE=1": 0.80,
            "_paged_decode_kernel MODE=2": 0.80, "_paged_decode_kernel MODE=3": 0.80,
            "_paged_decode_kernel MODE=4": 0.80, "_int4_decode_kernel": 0.70, "_nvfp4_decode_kernel": 0.70,
            "_tq_decode_kernel K_BITS=8 V_BITS=4": 0.60, "_tq_decode_kernel K_BITS=4 V_BITS=4": 0.60,
            "_tq_decode_kernel K_BITS=3 V_BITS=4": 0.60, "_tq_decode_kernel K_BITS=3 V_BITS=3": 0.60,
            "_kivi_decode_kernel BITS=2": 0.60, "_kivi_decode_kernel BITS=4": 0.60}
# still below their target: NVFP4's nibble unpacking, TurboQuant's and KIVI's CUDA-core dequantization
_BELOW = {"_nvfp4_decode_kernel", "_tq_decode_kernel K_BITS=8 V_BITS=4", "_tq_decode_kernel K_BITS=4 V_BITS=4",
          "_tq_decode_kernel K_BITS=3 V_BITS=4", "_tq_decode_kernel K_BITS=3 V_BITS=3", "_kivi_decode_kernel BITS=2",
          "_kivi_decode_kernel BITS=4"}


@pytest.fixture(scope="module")
def report_ceilings(report):
    r = report
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("report ")]
    return {" ".join(row[1:-8]): float(row[-1]) for row in rows if row[1].endswith("_decode_kernel")}


@pytest.mark.parametrize("kernel", [pytest.param(k, marks=pytest.mark.xfail(strict=True, reason="below target"))
                                    if k in _BELOW else k for k in _TARGETS])
def test_issue_ceiling_meets_its_target(report_ceilings, kernel):
    assert report_ceilings[kernel] >= 1.1 * _TARGETS[kernel] * _STREAM

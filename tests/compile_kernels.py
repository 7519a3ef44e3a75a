"""Compile every kvplan kernel for a GPU architecture without a GPU: the interpreter tests prove what the kernels
compute, this proves that Triton's compiler accepts them (down to a cubin) for the architecture given.

    python tests/compile_kernels.py [--arch 90] [--arch 80 ...]

Two steps, each in its own interpreter (Triton chooses between interpreting and compiling when a kernel is
defined): first, with TRITON_INTERPRET=1, every workload `kvplan measure` runs is launched on the CPU with each
kernel replaced by a recorder, which keeps the argument types and compile-time constants of every launch; then,
without the interpreter, each distinct launch is compiled for each architecture. Prints one line per kernel and
exits 1 if any fails to compile.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

KERNELS = {  # module: the kernels it launches
    "kvplan.kernels.paged_attention": ["_paged_decode_kernel", "_reshape_and_cache_kernel"],
    "kvplan.kernels.int4_attention": ["_int4_decode_kernel", "_int4_write_kernel"],
    "kvplan.kernels.nvfp4_attention": ["_nvfp4_decode_kernel", "_nvfp4_write_kernel"],
    "kvplan.kernels.turboquant_attention": ["_tq_decode_kernel", "_tq_write_kernel"],
    "kvplan.kernels.kivi_attention": ["_kivi_decode_kernel", "_kivi_write_kernel"],
    "kvplan.kernels.common": ["_combine_kernel"],
    "kvplan.kernels.gemv": ["_gemv_kernel"],
    "kvplan.kernels.stream": ["_read_kernel", "_copy_kernel"],
}


def _type_of(value) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.uint8: "u8",
                 torch.int8: "i8", torch.int32: "i32", torch.int64: "i64", torch.float8_e4m3fn: "fp8e4nv",
                 torch.float8_e5m2: "fp8e5"}
        return "*" + names[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot type {value!r}")


def capture() -> list[dict]:
    """Every distinct launch of every `kvplan measure` workload, by kernel: argument types and constants."""
    import importlib
    import inspect

    import torch
    from kvplan.kernels.bench import workload

    from kvplan.calibration import FAMILIES

    launches: dict[str, dict] = {}

    class Recorder:
        def __init__(self, module: str, name: str, kernel):
            self.module, self.name, self.kernel = module, name, kernel

        def __getitem__(self, grid):
            def launch(*args, **constants):
                params = list(inspect.signature(self.kernel.fn).parameters)[:len(args)]  # constants come by name
                signature = {n: _type_of(a) for n, a in zip(params, args, strict=True)}
                options = {k: constants.pop(k) for k in ("num_warps", "num_stages") if k in constants}
                key = json.dumps([self.module, self.name, signature, constants, options], sort_keys=True)
                launches[key] = {"module": self.module, "kernel": self.name, "signature": signature,
                                 "constants": constants, "options": options}
            return launch

    for module, names in KERNELS.items():
        mod = importlib.import_module(module)
        for name in names:
            setattr(mod, name, Recorder(module, name, getattr(mod, name)))
    for family in FAMILIES:
        fn, _ = workload(family, 256 * 1024, torch.device("cpu"))
        fn()
    from kvplan.kernels.bench import HEAD_DIM, KV_HEADS, PAGED_FORMATS
    from kvplan.kernels.paged_attention import make_cache, reshape_and_cache

    for fmt in PAGED_FORMATS:  # the write path of every paged format
        cache, layout = make_cache(fmt, 1, 16, KV_HEADS, HEAD_DIM)
        x = torch.zeros(4, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
        reshape_and_cache(cache, layout, torch.arange(4), x, x, 0.05, 0.05)
    from kvplan.kernels.int4_attention import reshape_and_cache_int4
    from kvplan.kernels.nvfp4_attention import reshape_and_cache_nvfp4

    x = torch.zeros(4, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
    cache, layout = make_cache("int4_per_token_head", 1, 16, KV_HEADS, HEAD_DIM)
    reshape_and_cache_int4(cache, layout, torch.arange(4), x, x)
    for fmt in ("nvfp4", "nvfp4_4over6"):
        cache, layout = make_cache(fmt, 1, 16, KV_HEADS, HEAD_DIM)
        reshape_and_cache_nvfp4(cache, layout, torch.arange(4), x, x, 1.0, 1.0)
    from kvplan.kernels.turboquant_attention import reshape_and_cache_turboquant

    for fmt in ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"):
        cache, layout = make_cache(fmt, 1, 16, KV_HEADS, HEAD_DIM)
        reshape_and_cache_turboquant(cache, layout, torch.arange(4), x + 1, x + 1)
    from kvplan.kernels.kivi_attention import reshape_and_cache_kivi

    x = torch.zeros(32, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
    for fmt in ("kivi2", "kivi4"):
        cache, layout = make_cache(fmt, 2, 16, KV_HEADS, HEAD_DIM)
        reshape_and_cache_kivi(cache, layout, torch.arange(32), x, x)
    # the combine kernel, which folds several splits (the CPU plans one split, where the decode kernels write the
    # answer and nothing is combined): into bf16 answers and into the float32 ones int4 rotates back
    from kvplan.kernels.bench import HEADS
    from kvplan.kernels.common import combine_splits

    part = torch.zeros(2, HEADS, HEAD_DIM)
    for dtype in (torch.bfloat16, torch.float32):
        combine_splits(part, torch.zeros(2, HEADS, 2), 1, 2, dtype)
    return list(launches.values())


def _resources(ptx: str, arch: int) -> str:
    """Registers per thread and spilled bytes, from ptxas -v on the PTX (the ptxas that ships with Triton)."""
    import re
    import tempfile

    import triton

    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    suffix = "a" if arch == 90 else ""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        for name in ("ptxas-blackwell", "ptxas"):
            exe = os.path.join(bin_dir, name)
            if not os.path.exists(exe):
                continue
            r = subprocess.run([exe, "-v", "--gpu-name", f"sm_{arch}{suffix}", src, "-o", os.path.join(d, "k.o")],
                               capture_output=True, text=True)
            if r.returncode == 0:
                regs = re.search(r"Used (\d+) registers", r.stderr)
                spill = re.search(r"(\d+) bytes spill stores", r.stderr)
                return f"{regs.group(1) if regs else '?'} registers, {spill.group(1) if spill else '?'} B spilled"
    return ""


def compile_all(launches: list[dict], archs: list[int]) -> int:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    failed = 0
    for arch in archs:
        for launch in launches:
            kernel = getattr(importlib.import_module(launch["module"]), launch["kernel"])
            signature = dict(launch["signature"])
            for p in kernel.params:
                if p.is_constexpr:
                    signature[p.name] = "constexpr"
            # launches were recorded under the interpreter; compile what a GPU runs (no interpreter workaround)
            consts = {**launch["constants"], **({"WIDEN": False} if "WIDEN" in launch["constants"] else {})}
            what = f"sm_{arch} {launch['kernel']} " + " ".join(
                f"{k}={v}" for k, v in {**consts, **launch["options"]}.items()
                if k in ("MODE", "K_BITS", "V_BITS", "BITS", "FP8", "FOUR_OVER_SIX", "num_warps"))
            try:
                compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=consts),
                                          target=GPUTarget("cuda", arch, 32), options=launch["options"])
                print(f"ok      {what:48} {_resources(compiled.asm['ptx'], arch)}")
            except Exception as e:  # report every failure, then exit 1
                failed += 1
                print(f"FAILED  {what}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, action="append", help="compute capability x 10, e.g. 90 (H100/H200)")
    ap.add_argument("--capture", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.capture:
        json.dump(capture(), sys.stdout)
        return 0
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, __file__, "--capture"], env=env, capture_output=True, text=True)
    if out.returncode:
        sys.stderr.write(out.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET to compile", file=sys.stderr)
        return 2
    launches = json.loads(out.stdout)
    print(f"{len(launches)} distinct kernel launches")
    return 1 if compile_all(launches, args.arch or [90]) else 0


if __name__ == "__main__":
    sys.exit(main())

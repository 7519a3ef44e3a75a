"""Compile every kvplan kernel for a GPU architecture without a GPU: the interpreter tests prove what the kernels
compute, this proves that Triton's compiler accepts them (down to a cubin) for the architecture given.

    python tests/compile_kernels.py [--arch 90] [--arch 80 ...] [--report [--json PATH]]

Two steps, each in its own interpreter (Triton chooses between interpreting and compiling when a kernel is
defined): first, with TRITON_INTERPRET=1, every workload `kvplan measure` runs is launched on the CPU with each
kernel replaced by a recorder, which keeps the argument types and compile-time constants of every launch; then,
without the interpreter, each distinct launch is compiled for each architecture. Every decode kernel is also
compiled at head_dim 64 and 256 and for multi-head attention (not in the report). Prints one line per kernel and
exits 1 if any fails to compile. `--report` adds, per launch, its occupancy, its main loop's instructions per byte
and bytes in flight, and the issue and latency ceilings they set on an H100 and an H200.
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


def _divisible(value) -> bool:
    """The runtime's specialization: a pointer 16-byte aligned (every allocation on a GPU is), an integer (not a
    flag) divisible by 16; the compiler is told so, and may use 16-byte vector loads and drop the bounds math."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.data_ptr() % 16 == 0
    return isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0


def capture() -> list[dict]:
    """Every distinct launch of every `kvplan measure` workload, by kernel: argument types and constants."""
    import importlib
    import inspect

    import torch
    from kvplan.kernels.bench import workload

    from kvplan.specs.calibration import FAMILIES

    launches: dict[str, dict] = {}

    class Recorder:
        def __init__(self, module: str, name: str, kernel):
            self.module, self.name, self.kernel = module, name, kernel

        def __getitem__(self, grid):
            def launch(*args, **constants):
                params = list(inspect.signature(self.kernel.fn).parameters)[:len(args)]  # constants come by name
                signature = {n: _type_of(a) for n, a in zip(params, args, strict=True)}
                options = {k: constants.pop(k) for k in ("num_warps", "num_stages") if k in constants}
                aligned = sorted(n for n, a in zip(params, args, strict=True) if _divisible(a))
                key = json.dumps([self.module, self.name, signature, constants, options, aligned], sort_keys=True)
                launches[key] = {"module": self.module, "kernel": self.name, "signature": signature,
                                 "constants": constants, "options": options, "aligned": aligned}
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
    # every decode kernel at the other shapes `kvplan measure --validate` runs a model's layers at: head_dim 64 and
    # 256, multi-head attention and groups of 8 and 16 query heads (compiled, not in the report)
    from kvplan.kernels.bench import CHECK_FORMATS, _decode_call
    from kvplan.kernels.layouts import slot_layout

    before = set(launches)
    for fmt in CHECK_FORMATS:
        for d, kv_heads, heads in ((64, 2, 16), (128, 4, 4), (256, 2, 32)):
            if fmt.startswith("nvfp4") and d % 64:
                continue
            layout = slot_layout(fmt, d)
            cache, _ = make_cache(fmt, 4, 16, kv_heads, d)
            q = torch.zeros(1, heads, d, dtype=torch.bfloat16)
            fn, _ = _decode_call(layout, q, cache, torch.zeros(1, 4, dtype=torch.int32),
                                 torch.tensor([40], dtype=torch.int32), torch.device("cpu"))
            fn()
    for key in set(launches) - before:
        launches[key]["report"] = False
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


# Hopper (sm_90: H100 SXM and H200 alike): per SM 65,536 registers allocated 256 a warp at a time, 228 KB of shared
# memory (1 KB of it reserved per block), 64 warps and 32 blocks at most; 132 SMs, each issuing 4 warp-instructions
# a clock, at the 1.98 GHz both report as their highest SM clock
SM90 = {"regs": 65536, "smem": 233472, "warps": 64, "blocks": 32, "sms": 132, "issue": 4, "clock_hz": 1.98e9}

# The two sm_90 GPUs the report prices: the same SM count and clock (so the same issue ceiling), different HBM (peak
# bandwidth from their datasheets: 3.35 TB/s for the H100 SXM's HBM3, 4.8 TB/s for the H200's HBM3e)
GPUS = {"H100": {"sms": 132, "peak_bytes_per_s": 3.35e12}, "H200": {"sms": 132, "peak_bytes_per_s": 4.8e12}}

# The DRAM latency a streaming kernel's loads wait for on either GPU, assumed 600 ns. Public pointer-chase
# microbenchmarks put Hopper's HBM latency at about 450-500 ns unloaded (one dependent load at a time, an idle
# memory system); a kernel streaming at near-peak bandwidth queues its requests in the memory controllers and the
# latency each one sees rises above that, so 600 ns is a loaded figure, not a measured one. The H200's HBM3e is taken
# at the same latency (its gain is bandwidth, not latency). By Little's law a GPU moves at most (bytes in flight) /
# (latency): the latency ceiling = bytes in flight per SM x SMs / 600 ns.
DRAM_LATENCY_S = 600e-9


def blocks_per_sm(regs: int, shared: int, warps: int, sm: dict = SM90) -> int:
    """Blocks of a kernel resident on one SM at once on `sm`: the rule the launchers plan their splits with
    (`kvplan.kernels.common.occupancy`)."""
    from kvplan.kernels.common import occupancy

    return occupancy(regs, shared, warps, {"regs": sm["regs"], "smem": sm["smem"], "threads": 32 * sm["warps"],
                                           "blocks": sm["blocks"]})


def loop_body(sass: str) -> list[str]:
    """The instructions of the largest loop of a disassembled kernel (nvdisasm -c): from a label to the branch back
    to it, 16 bytes an instruction; none where the kernel has no loop (a trailing one-instruction trap loop aside)."""
    import re

    labels, best, pending, text = {}, (0, 0), [], []
    for line in sass.splitlines():
        m = re.match(r"^(\.L_x_\d+):", line.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*)$", line)
        if not m:
            continue
        addr = int(m.group(1), 16)
        text.append((addr, m.group(2).strip()))
        for name in pending:
            labels[name] = addr
        pending = []
        b = re.search(r"\bBRA\b.*?\(?(\.L_x_\d+)\)?", m.group(2))
        if b and b.group(1) in labels and labels[b.group(1)] <= addr:
            lo = labels[b.group(1)]
            if (addr - lo) // 16 + 1 > 3 and addr - lo > best[1] - best[0]:
                best = (lo, addr)
    return [t for a, t in text if best[0] <= a <= best[1]] if best != (0, 0) else []


def main_loop(sass: str) -> int:
    """Instructions in the largest loop of a disassembled kernel (`loop_body`); 0 where it has no loop."""
    return len(loop_body(sass))


def asynchronous_copies(loop: list[str]) -> bool:
    """Whether a main loop fetches from global memory by asynchronous copies into shared memory: LDGSTS (cp.async)
    or TMA (UTMALDG), which Triton's pipeliner issues iterations ahead of their use into multiple buffers."""
    import re

    return any(re.match(r"^(@!?U?P\w+\s+)?(LDGSTS|UTMALDG)\b", t) for t in loop)


def bytes_in_flight(nbytes: int, asynchronous: bool, num_stages: int, shared: int) -> int:
    """Bytes one block has outstanding to DRAM at a time in its main loop.

    A loop of plain loads (LDG) issues one iteration's loads and waits for them before it uses them: one
    iteration's bytes are in flight. A loop of asynchronous copies (LDGSTS/cp.async or TMA), pipelined over
    `num_stages` stages, keeps the copies of the next num_stages - 1 iterations in flight while it computes one;
    they land in shared memory, so no more iterations can be outstanding than the block's shared memory holds
    (and at least one is)."""
    if not asynchronous:
        return nbytes
    return nbytes * max(1, min(num_stages - 1, shared // nbytes))


def _bytes_per_iteration(kernel: str, c: dict) -> int | None:
    """Bytes one program reads in one trip of its main loop (a whole program where it has none)."""
    if kernel in ("_paged_decode_kernel", "_int4_decode_kernel", "_nvfp4_decode_kernel", "_tq_decode_kernel"):
        return c["TILE"] * c["SLOT"]  # TILE tokens of one KV head: K and V
    if kernel == "_kivi_decode_kernel":
        return c["G"] * c["SLOT"]  # one token group
    if kernel == "_gemv_kernel":
        return c["BK"] * c["BN"] * (1 if c["FP8"] else 2)
    if kernel == "_read_kernel":
        return c["BLOCK"] * 4
    if kernel == "_copy_kernel":
        return c["BLOCK"] * 8  # read and written
    return None


# What each decode kernel is meant to reach when it reads 256 MB or more, as a fraction of the GPU's stream read
# (the streaming read probe, itself meant to reach 0.90 of the peak bandwidth); the report prices each kernel's
# lower ceiling against 1.1x its target, the margin a kernel needs over the DRAM it is to keep busy
STREAM_READ = 0.90
TARGETS = {"_paged_decode_kernel": {0: 0.85, 5: 0.85, 1: 0.80, 2: 0.80, 3: 0.80, 4: 0.80},
           "_int4_decode_kernel": 0.70, "_nvfp4_decode_kernel": 0.70, "_tq_decode_kernel": 0.60,
           "_kivi_decode_kernel": 0.60}


def target_of_peak(kernel: str, consts: dict) -> float | None:
    """A kernel's target as a fraction of the peak bandwidth (None for kernels without one)."""
    if kernel == "_read_kernel":
        return STREAM_READ
    t = TARGETS.get(kernel)
    if isinstance(t, dict):
        t = t.get(consts.get("MODE"))
    return None if t is None else t * STREAM_READ


def _report_row(launch: dict, consts: dict, compiled, arch: int) -> dict:
    """Registers, shared memory, blocks per SM (from the compiled kernel), main-loop warp-instructions per byte and
    bytes in flight (from its SASS and its pipeline stages), and the two ceilings they set on each GPU of `GPUS`."""
    import re
    import tempfile

    import triton

    regs = spill = 0
    m = re.match(r"(\d+) registers, (\d+) B", _resources(compiled.asm["ptx"], arch) or "")
    if m:
        regs, spill = int(m.group(1)), int(m.group(2))
    warps, shared = compiled.metadata.num_warps, compiled.metadata.shared
    stages = compiled.metadata.num_stages
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        sass = subprocess.run([os.path.join(bin_dir, "nvdisasm"), "-c", path], capture_output=True,
                              text=True).stdout
    body = loop_body(sass)
    loop = len(body)
    if not loop:  # no loop: the whole program
        loop = sum(1 for line in sass.splitlines() if re.match(r"^\s*/\*[0-9a-f]{4,}\*/", line))
    nbytes = _bytes_per_iteration(launch["kernel"], consts)
    per_byte = loop * warps / nbytes if nbytes else None
    blocks = blocks_per_sm(regs, shared, warps)
    asynchronous = asynchronous_copies(body)
    in_flight = blocks * bytes_in_flight(nbytes, asynchronous, stages, shared) if nbytes else None
    share = target_of_peak(launch["kernel"], consts)
    gpus = {}
    for name, g in GPUS.items():
        issue = g["sms"] * SM90["issue"] * SM90["clock_hz"] / per_byte if per_byte else None
        latency = in_flight * g["sms"] / DRAM_LATENCY_S if in_flight else None
        gpus[name] = {"issue_ceiling_bytes_per_s": issue, "latency_ceiling_bytes_per_s": latency,
                      "ceiling_bytes_per_s": min(issue, latency) if issue and latency else None,
                      "needed_bytes_per_s": 1.1 * share * g["peak_bytes_per_s"] if share else None}
    return {"kernel": launch["kernel"], "constants": consts, "warps": warps, "num_stages": stages,
            "registers": regs, "spilled": spill, "shared": shared, "blocks_per_sm": blocks,
            "loop_instructions": loop, "asynchronous_copies": asynchronous, "bytes_per_iteration": nbytes,
            "bytes_in_flight_per_sm": in_flight, "instructions_per_byte": per_byte,
            "issue_ceiling_bytes_per_s": gpus["H100"]["issue_ceiling_bytes_per_s"], "gpus": gpus}


def row_name(r: dict) -> str:
    """A launch's name in the report: its kernel and the constants that tell its variants apart."""
    c = r["constants"]
    return " ".join([r["kernel"]] + [f"{k}={c[k]}" for k in ("MODE", "K_BITS", "V_BITS", "BITS", "FP8") if k in c])


def _tb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e12:.2f}"


def print_report(rows: list[dict]) -> None:
    print("\nstatic report (sm_90): registers, shared memory and blocks per SM from the compiled kernels; main-loop "
          "warp-instructions per byte from their SASS; issue ceiling = 132 SMs x 4 warp-instructions a clock x "
          "1.98 GHz / instructions per byte (H100 and H200 alike); bytes in flight per SM = blocks per SM x a "
          "block's outstanding bytes (one iteration for plain loads; num_stages - 1 iterations, as many as its "
          "shared memory holds, for asynchronous copies: copy column, with the stages); latency ceiling = bytes in "
          "flight per SM x 132 SMs / 600 ns (H100 and H200 alike); per GPU the lower of the two and the 1.1x target "
          "it is held to (H100 3.35 TB/s peak, H200 4.8 TB/s), in TB/s")
    print(f"{'kernel':44} {'warps':>5} {'regs':>4} {'smem B':>7} {'blocks/SM':>9} {'loop instr':>10} "
          f"{'B/iter':>7} {'instr/B':>8} {'copy':>6} {'KB/SM':>6} {'issue':>6} {'latency':>7} {'H100':>5} "
          f"{'need':>5} {'H200':>5} {'need':>5}")
    for r in rows:
        per_b = "-" if r["instructions_per_byte"] is None else f"{r['instructions_per_byte']:.3f}"
        copy = f"{'async' if r['asynchronous_copies'] else 'ldg'}{r['num_stages']}"
        kb = "-" if r["bytes_in_flight_per_sm"] is None else f"{r['bytes_in_flight_per_sm'] / 1024:.0f}"
        h100, h200 = r["gpus"]["H100"], r["gpus"]["H200"]
        print(f"report {row_name(r):37} {r['warps']:>5} {r['registers']:>4} {r['shared']:>7} {r['blocks_per_sm']:>9} "
              f"{r['loop_instructions']:>10} {r['bytes_per_iteration'] or '-':>7} {per_b:>8} {copy:>6} {kb:>6} "
              f"{_tb(h100['issue_ceiling_bytes_per_s']):>6} {_tb(h100['latency_ceiling_bytes_per_s']):>7} "
              f"{_tb(h100['ceiling_bytes_per_s']):>5} {_tb(h100['needed_bytes_per_s']):>5} "
              f"{_tb(h200['ceiling_bytes_per_s']):>5} {_tb(h200['needed_bytes_per_s']):>5}")


def compile_all(launches: list[dict], archs: list[int], report: list | None = None) -> int:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kvplan.errors import error_line

    failed = 0
    for arch in archs:
        for launch in launches:
            rows = report if arch == 90 and launch.get("report", True) else None
            kernel = getattr(importlib.import_module(launch["module"]), launch["kernel"])
            signature = dict(launch["signature"])
            for p in kernel.params:
                if p.is_constexpr:
                    signature[p.name] = "constexpr"
            # launches were recorded under the interpreter; compile what a GPU runs (no interpreter workaround)
            consts = {**launch["constants"], **({"WIDEN": False} if "WIDEN" in launch["constants"] else {})}
            what = f"sm_{arch} {launch['kernel']} " + " ".join(
                f"{k}={v}" for k, v in {**consts, **launch["options"]}.items()
                if k in ("MODE", "K_BITS", "V_BITS", "BITS", "FP8", "FOUR_OVER_SIX", "HEAD_DIM", "D", "HALF", "G_PAD",
                         "TILE", "num_warps"))
            attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in launch.get("aligned", [])}
            try:
                compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=consts, attrs=attrs),
                                          target=GPUTarget("cuda", arch, 32), options=launch["options"])
                print(f"ok      {what:64} {_resources(compiled.asm['ptx'], arch)}")
                if rows is not None:
                    rows.append(_report_row(launch, consts, compiled, arch))
            except Exception as e:  # report every failure, then exit 1
                failed += 1
                print(f"FAILED  {what}: {error_line(e)}")
    return failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, action="append", help="compute capability x 10, e.g. 90 (H100/H200)")
    ap.add_argument("--report", action="store_true",
                    help="after compiling, a static performance report per launch (sm_90 only)")
    ap.add_argument("--json", metavar="PATH", help="with --report: its rows as JSON, written to PATH")
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
    report = [] if args.report else None
    failed = compile_all(launches, args.arch or [90], report)
    if report:
        print_report(report)
        if args.json:
            with open(args.json, "w") as f:
                json.dump([{**r, "name": row_name(r)} for r in report], f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Fit kvplan's bundled step-time profiles (hardware/profiles/step-time.yaml) from public kernel timings.

The timings are NVIDIA AIConfigurator's measurements of vLLM's own kernels (repository ai-dynamo/aiconfigurator,
commit 095f58a51c4ca8e61b66ec108d86f223f8d559ce, aic-core/src/aiconfigurator_core/systems/data/<gpu>/; vLLM 0.19.0
on H100, H200, B200 and 0.14.0 on A100). Point SILICON at a folder holding one sub-folder per GPU with the parquet
tables renamed <family>-<table>.parquet, then:

    python benchmarks/fit_step_profiles.py SILICON > hardware/profiles/step-time.yaml

Needs pandas and pyarrow (`pip install -e '.[parquet]'`). Every family is t = t0 + bytes / (eta x peak bandwidth),
with the extra terms named below, fitted by least squares on relative error; the share of rows of at least 64 MiB
that the fit reproduces within 10% is written beside each fit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

MB = 2**20
# silicon folder -> (kvplan GPU name, peak bandwidth B/s, dense bf16 FLOP/s, dense fp8 FLOP/s): hardware/*.yaml
GPUS = {
    "a100_sxm": ("A100-SXM4-80GB", 2.039e12, 312e12, None),
    "h100_sxm": ("H100-SXM5-80GB", 3.35e12, 989.4e12, 1978.9e12),
    "h200_sxm": ("H200-SXM-141GB", 4.8e12, 989.4e12, 1978.9e12),
    "b200_sxm": ("B200", 8.0e12, 2250e12, 4500e12),
}
WEIGHT_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp8_block": 1.0 + 4 / 128**2, "int8_wo": 1.0, "int4_wo": 0.5,
                "nvfp4": 0.5 + 1 / 16}
ACT_BYTES = {"fp8": 1, "fp8_block": 1, "nvfp4": 0.5}


def _lstsq(columns, y, weight):
    a = np.vstack(columns).T
    coef, *_ = np.linalg.lstsq(a * weight[:, None], y * weight, rcond=None)
    return coef, a @ coef


def _share(pred, y, big):
    err = np.abs(pred / y - 1)
    return round(float(np.mean(err[big] < 0.10)), 3), int(big.sum())


def attention(df, peak):
    """Decode attention: t = t0 + c_seq x (batch x KV heads) + c_q x (batch x query heads)
    + max(bytes / (eta x B), c_tok x context). c_seq is each (sequence, KV head) pair's own work (block-table walk,
    split combine), c_q each query head's; c_tok is the serial walk of one split over a sequence's tokens, which
    bounds a call whose bytes are too few to load the GPU (batch 1 below ~8k tokens: every cache dtype alike)."""
    out = {}
    full = df[df.window_size == 0] if "window_size" in df else df
    for kv, eb in (("bfloat16", 2), ("fp8", 1)):
        d = full[full.kv_cache_dtype == kv]
        if d.empty:
            continue
        n = (d.step + 1).to_numpy(float)
        byt = (d.batch_size * n * d.num_key_value_heads * d.head_dim * 2 * eb).to_numpy(float)
        seqs = (d.batch_size * d.num_key_value_heads).to_numpy(float)
        qh = (d.batch_size * d.num_heads).to_numpy(float)
        y = d.latency.to_numpy(float) / 1e3
        big = byt >= 64 * MB
        w = 1 / y * np.where(big, 1.0, 0.3)
        best = None
        for eta in np.linspace(0.40, 1.10, 71):
            for c_tok in np.concatenate([[0.0], np.geomspace(1e-11, 1e-8, 60)]):
                core = np.maximum(byt / (eta * peak), c_tok * n)
                coef, pred = _lstsq([np.ones_like(y), seqs, qh], y - core, w)
                pred = pred + core
                loss = float(np.sum((w * (pred - y)) ** 2))
                if best is None or loss < best[0]:
                    best = (loss, eta, c_tok, coef)
        _, eta, c_tok, coef = best
        pred = coef[0] + coef[1] * seqs + coef[2] * qh + np.maximum(byt / (eta * peak), c_tok * n)
        share, rows = _share(pred, y, big)
        out[kv] = dict(t0_s=float(coef[0]), eta=float(eta), per_sequence_head_s=float(coef[1]),
                       per_query_head_s=float(coef[2]), per_token_chain_s=float(c_tok), within_10pct=share,
                       rows_64mib=rows)
    return out


def gemm(df, peak, f16, f8):
    """GEMMs: t = t0 + max(bytes / (eta x B), flops / (mu x F)); t0 and eta from decode-sized rows (m <= 64), mu
    from large compute-bound rows (m, n, k >= 4096)."""
    out = {}
    for dt in sorted(df.gemm_dtype.unique()):
        wb, ab = WEIGHT_BYTES.get(dt), ACT_BYTES.get(dt, 2)
        if wb is None:
            continue
        flops_peak = (f8 if ab < 2 and f8 else f16) * (2 if dt == "nvfp4" else 1)

        def feats(d):
            return ((d.n * d.k * wb + d.m * d.k * ab + d.m * d.n * 2).to_numpy(float),
                    (2.0 * d.m * d.n * d.k).to_numpy(float), d.latency.to_numpy(float) / 1e3)
        d = df[(df.gemm_dtype == dt) & (df.m <= 64)]
        byt, _, y = feats(d)
        big = byt >= 64 * MB
        coef, _ = _lstsq([np.ones_like(y), byt], y, 1 / y * np.where(big, 1.0, 0.3))
        t0, eta = float(coef[0]), float(1 / (coef[1] * peak))
        large = df[(df.gemm_dtype == dt) & (df.m >= 4096) & (df.n >= 4096) & (df.k >= 4096)]
        _, fl, yl = feats(large)
        mu = float(np.median(fl / (flops_peak * (yl - t0)))) if len(yl) else 0.5
        pred = t0 + np.maximum(byt / (eta * peak), feats(d)[1] / (mu * flops_peak))
        share, rows = _share(pred, y, big)
        out[dt] = dict(t0_s=t0, eta=eta, mu=mu, peak_flops=flops_peak, within_10pct=share, rows_64mib=rows)
    return out


def moe(df, peak, f16, f8):
    """Fused MoE layer (balanced routing, no expert parallelism): bytes are the experts the tokens touch under
    uniform routing, E x (1 - (1 - k/E)^T), times their three matrices on this rank; same form as GEMMs."""
    out = {}
    df = df[(df.distribution == "balanced") & (df.moe_ep_size == 1)]
    for dt in sorted(df.moe_dtype.unique()):
        wb = WEIGHT_BYTES.get(dt if dt != "int4_wo" else "int4_wo")
        if wb is None:
            continue
        flops_peak = f8 if dt.startswith("fp8") and f8 else f16

        def feats(d):
            inter = d.inter_size / d.moe_tp_size
            e, k, t = d.num_experts, d.topk, d.num_tokens
            touched = e * (1 - (1 - k / e) ** t)
            return ((touched * 3 * d.hidden_size * inter * wb).to_numpy(float),
                    (t * k * 6.0 * d.hidden_size * inter).to_numpy(float), d.latency.to_numpy(float) / 1e3)
        d = df[(df.moe_dtype == dt) & (df.num_tokens <= 64)]
        byt, _, y = feats(d)
        big = byt >= 64 * MB
        coef, _ = _lstsq([np.ones_like(y), byt], y, 1 / y * np.where(big, 1.0, 0.3))
        t0, eta = float(coef[0]), float(1 / (coef[1] * peak))
        _, fl, yl = feats(df[(df.moe_dtype == dt) & (df.num_tokens >= 4096)])
        mu = float(np.median(fl / (flops_peak * (yl - t0)))) if len(yl) else 0.5
        pred = t0 + np.maximum(byt / (eta * peak), feats(d)[1] / (mu * flops_peak))
        share, rows = _share(pred, y, big)
        out[dt] = dict(t0_s=t0, eta=eta, mu=mu, peak_flops=flops_peak, within_10pct=share, rows_64mib=rows)
    return out


def allreduce(df):
    """NCCL all-reduce of 16-bit values by world size: t = t0 + bytes / rate, from messages of 256 B to 64 MiB.
    message_size counts elements (2 bytes each): read as bytes, 8 H100s would reach only 222 GB/s of bus bandwidth
    at 512 MiB, half of what NCCL reaches over NVLink."""
    out = {}
    d = df[(df.op_name == "all_reduce") & (df.nccl_dtype == "half") & (df.message_size <= 32 * MB)]
    for n in sorted(d.num_gpus.unique()):
        x = d[d.num_gpus == n]
        byt, y = (x.message_size * 2).to_numpy(float), x.latency.to_numpy(float) / 1e3
        coef, pred = _lstsq([np.ones_like(y), byt], y, 1 / y)
        share, rows = _share(pred, y, np.ones_like(y, dtype=bool))
        out[int(n)] = dict(t0_s=float(coef[0]), bytes_per_s=float(1 / coef[1]), within_10pct=share, rows=rows)
    return out


def main(silicon: Path) -> None:
    doc = {"schema": "kvplan-step-profiles/1",
           "source": "fits of AIConfigurator's vLLM kernel timings (ai-dynamo/aiconfigurator @095f58a, Apache-2.0); "
                     "benchmarks/fit_step_profiles.py", "gpus": {}}
    for folder, (name, peak, f16, f8) in GPUS.items():
        base = silicon / folder
        if not base.is_dir():
            continue
        read = lambda stem: pd.read_parquet(base / f"{stem}.parquet")  # noqa: E731
        vllm = yaml.safe_load((base / "collection_meta.yaml").read_text())["runtime"]["version"]
        doc["gpus"][name] = {
            "silicon": f"{folder} (vLLM {vllm})", "peak_bandwidth_bytes_per_s": peak,
            "attention": attention(read("attention-generation_attention_perf"), peak),
            "gemm": gemm(read("gemm-gemm_perf"), peak, f16, f8),
            "moe": moe(read("moe-moe_perf"), peak, f16, f8),
            "allreduce": allreduce(read("comm-nccl_perf")),
        }
    sys.stdout.write("# kvplan's bundled step-time profiles: written by benchmarks/fit_step_profiles.py, do not edit\n")
    sys.stdout.write(yaml.safe_dump(doc, sort_keys=False, width=120))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

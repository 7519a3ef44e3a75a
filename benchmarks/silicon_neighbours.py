"""How smooth are the GEMM timing tables the bundled step-time profiles are fitted to?

Each row of >= 64 MiB is predicted from its own table alone: a plane in (log n, log k) through the log times of its
(up to) eight neighbouring shapes at the same m, the row itself left out. The share of rows this reproduces within
10% shows how much of a fit's miss is the tables' own scatter between neighbouring shapes (the kernel a library picks
changes from one shape to the next) rather than the fit's form. It is an indication, not a bound: a model that knew
where the kernels switch could do better, and one that interpolates across a switch does worse.

    python benchmarks/silicon_neighbours.py SILICON

SILICON as for benchmarks/fit_step_profiles.py. Needs pandas and pyarrow; a few seconds per GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from fit_step_profiles import ACT_BYTES, DECODE_TOKENS, GEMM_BUCKETS, GPUS, MB, WEIGHT_BYTES


def neighbour_shares(df: pd.DataFrame, dtype: str) -> dict:
    """{(lo, hi): (share within 10%, rows)} per range of m up to DECODE_TOKENS, and "all" over them."""
    wb, ab = WEIGHT_BYTES[dtype], ACT_BYTES.get(dtype, 2)
    d = df[(df.gemm_dtype == dtype) & (df.m <= DECODE_TOKENS)]
    ns, ks = sorted(d.n.unique()), sorted(d.k.unique())
    ni, ki = {v: i for i, v in enumerate(ns)}, {v: i for i, v in enumerate(ks)}
    hits = []
    for m, dm in d.groupby("m"):
        logt = {(ni[n], ki[k]): np.log(t) for n, k, t in zip(dm.n, dm.k, dm.latency)}
        for n, k, t in zip(dm.n, dm.k, dm.latency):
            if n * k * wb + m * k * ab + m * n * 2 < 64 * MB:
                continue
            i, j = ni[n], ki[k]
            near = [(a, b) for a in (i - 1, i, i + 1) for b in (j - 1, j, j + 1)
                    if (a, b) != (i, j) and (a, b) in logt]
            if len(near) < 4:
                continue
            x = np.array([[1.0, np.log(ns[a]), np.log(ks[b])] for a, b in near])
            coef, *_ = np.linalg.lstsq(x, np.array([logt[p] for p in near]), rcond=None)
            pred = coef @ [1.0, np.log(n), np.log(k)]
            hits.append((m, abs(np.exp(pred - np.log(t)) - 1) < 0.10))
    ms, ok = np.array([h[0] for h in hits]), np.array([h[1] for h in hits])
    out = {(lo, hi): (float(ok[(ms >= lo) & (ms <= hi)].mean()), int(((ms >= lo) & (ms <= hi)).sum()))
           for lo, hi in GEMM_BUCKETS if hi <= DECODE_TOKENS and ((ms >= lo) & (ms <= hi)).any()}
    out["all"] = (float(ok.mean()), len(ok))
    return out


def main(silicon: Path) -> None:
    for folder in GPUS:
        path = silicon / folder / "gemm-gemm_perf.parquet"
        if not path.is_file():
            continue
        df = pd.read_parquet(path)
        for dtype in ("bfloat16", "fp8"):
            if not (df.gemm_dtype == dtype).any():
                continue
            s = neighbour_shares(df, dtype)
            share, rows = s.pop("all")
            ranges = "  ".join(f"m<={hi}: {v[0]:.0%}" for (lo, hi), v in s.items())
            print(f"{folder:9} {dtype:9} {share:6.1%} of {rows:5} rows   {ranges}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

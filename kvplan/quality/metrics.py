"""The figures `kvplan quality` compares, from log-probabilities and tensors: next-token KL divergence to the
model-dtype run, top-1 agreement, perplexity, and relative errors. Plain torch, no model."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def token_figures(base_logp: torch.Tensor, logp: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per position, from log-probabilities [n, vocab] of the model-dtype run and of a format's, and the next tokens
    [n]: KL(model dtype || format), whether both rank the same token first, and the format's negative
    log-likelihood of the next token."""
    base_logp, logp = base_logp.float(), logp.float()
    kl = (base_logp.exp() * (base_logp - logp)).sum(-1).clamp_min(0.0)  # rounding can leave -1e-9 where equal
    agree = base_logp.argmax(-1) == logp.argmax(-1)
    nll = -logp.gather(-1, targets[:, None].long())[:, 0]
    return kl, agree, nll


def percentile(values: torch.Tensor, q: float) -> float:
    """The q-th percentile (0..100), linear between the order statistics (numpy's default)."""
    return float(torch.quantile(values.double(), q / 100.0)) if values.numel() else math.nan


def perplexity(nll: torch.Tensor) -> float:
    return float(torch.exp(nll.double().mean())) if nll.numel() else math.nan


POSITION_EDGES = (0, 128, 512, 2048, 8192, 32768, 131072, 524288)  # where the KL by position is cut


def by_position(kl: torch.Tensor, agree: torch.Tensor, positions: torch.Tensor) -> list[dict]:
    """KL mean and top-1 agreement per range of positions in the window [from, to), for the ranges that hold any
    (errors grow with the context a query attends over)."""
    out = []
    for lo, hi in zip(POSITION_EDGES, POSITION_EDGES[1:], strict=False):
        inside = (positions >= lo) & (positions < hi)
        if bool(inside.any()):
            out.append({"from": lo, "to": hi, "positions": int(inside.sum()), "kl_mean": float(kl[inside].mean()),
                        "top1_agreement": float(agree[inside].float().mean())})
    return out


@dataclass
class ErrorSum:
    """||approx - exact||^2 and ||exact||^2 summed over many tensors: their relative error as one figure."""

    diff_sq: float = 0.0
    ref_sq: float = 0.0

    def add(self, approx: torch.Tensor, exact: torch.Tensor) -> None:
        self.diff_sq += float((approx.float() - exact.float()).pow(2).sum())
        self.ref_sq += float(exact.float().pow(2).sum())

    @property
    def relative(self) -> float:
        if self.ref_sq > 0:
            return math.sqrt(self.diff_sq / self.ref_sq)
        return 0.0 if self.diff_sq == 0 else math.inf


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """||approx - exact|| / ||exact|| (0 where both are 0)."""
    e = ErrorSum()
    e.add(approx, exact)
    return e.relative

"""Measuring the GPU: what `kvplan measure` runs (the plan, pure and importable without torch), the fit of
t = t0 + bytes / (eta x peak bandwidth) per kernel family, and the calibration profile (versioned YAML) that later
predictions read."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from kvplan.errors import KvplanError
from kvplan.values import frozen_dataclass

if TYPE_CHECKING:
    from kvplan.specs.gpu import GPUSpec

SCHEMA = "kvplan-calibration/1"
MB = 2**20
DECODE_FORMATS = ("bfloat16", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head",
                  "int4_per_token_head", "nvfp4", "nvfp4_4over6", "turboquant_k8v4", "turboquant_4bit_nc",
                  "turboquant_k3v4_nc", "turboquant_3bit_nc", "kivi2", "kivi4")
FAMILIES = ("stream_read", "stream_copy", "gemv_bf16", "gemv_fp8") + tuple(f"decode_{f}" for f in DECODE_FORMATS)


@frozen_dataclass
class PlanItem:
    family: str
    size_bytes: int  # bytes one call reads (and writes, for the copy)
    samples: int


@dataclass
class MeasurePlan:
    items: list[PlanItem]
    warmup: int
    flush_bytes: int  # read between samples to evict L2 (at least twice its size)
    bandwidth_bytes_per_s: float  # assumed for the duration estimate
    notes: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(i.size_bytes * (i.samples + self.warmup) for i in self.items)

    def expected_seconds(self) -> float:
        """Kernel time at 70% of the assumed bandwidth, an L2 flush and 20 us per sample, 0.25 s of set-up per
        point (allocating and filling the buffers), 2 s of Triton compilation per kernel family."""
        t = 2.0 * len({i.family for i in self.items})
        for i in self.items:
            per = i.size_bytes / (0.7 * self.bandwidth_bytes_per_s) + self.flush_bytes / self.bandwidth_bytes_per_s
            t += (i.samples + self.warmup) * (per + 20e-6) + 0.25
        return t


def measure_plan(quick: bool = False, *, l2_bytes: int = 50 * MB, bandwidth_bytes_per_s: float = 3.35e12,
                 free_bytes: Optional[int] = None, families: tuple[str, ...] = FAMILIES,
                 sizes: Optional[list[int]] = None, samples: Optional[int] = None, warmup: int = 3) -> MeasurePlan:
    """The sweep: sizes from 8 MB to 1 GB (quick: 4 sizes, 10 samples) or 2 GB (full: 9 sizes, 30 samples), each
    family at each size, capped at a third of the free memory (buffers, caches and the flush buffer must fit)."""
    if sizes is None:
        sizes = [8 * MB, 64 * MB, 256 * MB, 1024 * MB] if quick else [8 * MB * 2**i for i in range(9)]
    notes = []
    if free_bytes is not None:
        cap = free_bytes // 3
        if any(s > cap for s in sizes):
            notes.append(f"sizes above {cap / MB:,.0f} MB left out: a third of the free memory")
        sizes = [s for s in sizes if s <= cap] or [min(sizes)]
    samples = samples or (10 if quick else 30)
    items = [PlanItem(f, s, samples) for f in families for s in sizes]
    return MeasurePlan(items, warmup, max(2 * l2_bytes, 64 * MB), bandwidth_bytes_per_s, notes)


# ----------------------------------------------------------------------------------------------------------------
# Fitting


@dataclass
class FamilyFit:
    family: str
    t0_s: float  # fixed cost per call (launch, tail)
    eta: float  # achieved fraction of the peak bandwidth on the streaming part
    points: list[list[float]]  # [bytes, median s, p10 s, p90 s]

    def seconds(self, nbytes: float, peak_bytes_per_s: float, calls: int = 1) -> float:
        return calls * self.t0_s + nbytes / (self.eta * peak_bytes_per_s)


def fit_family(family: str, points: list[tuple[float, float, float, float]], peak_bytes_per_s: float) -> FamilyFit:
    """Least squares of median time on bytes: t = t0 + bytes x slope, eta = 1 / (slope x peak)."""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    n = len(points)
    if n == 1:
        slope, t0 = ys[0] / xs[0], 0.0
    else:
        mx, my = sum(xs) / n, sum(ys) / n
        var = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else my / mx
        t0 = my - slope * mx
        if t0 < 0:  # a negative fixed cost is noise: fit through the origin instead
            slope, t0 = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs), 0.0
    if slope <= 0:
        raise KvplanError(f"measuring {family}: the times do not grow with the bytes; rerun on an idle GPU")
    return FamilyFit(family, t0, 1.0 / (slope * peak_bytes_per_s), [list(p) for p in points])


# ----------------------------------------------------------------------------------------------------------------
# Profiles


@dataclass
class CalibrationProfile:
    device: dict  # name, compute capability, memory, clocks, driver, torch and triton versions
    peak_bandwidth_bytes_per_s: float  # the datasheet figure eta is relative to
    families: dict[str, FamilyFit]
    quick: bool = False
    schema: str = SCHEMA

    def to_dict(self) -> dict:
        plain = {k: (v if isinstance(v, (int, float, bool)) or v is None else str(v)) for k, v in self.device.items()}
        return {"schema": self.schema, "device": plain, "quick": self.quick,
                "peak_bandwidth_bytes_per_s": self.peak_bandwidth_bytes_per_s,
                "families": {k: {"t0_s": float(f.t0_s), "eta": float(f.eta),
                                 "points": [[float(x) for x in p] for p in f.points]}
                             for k, f in self.families.items()}}

    def fit(self, family: str) -> Optional[FamilyFit]:
        return self.families.get(family)

    def peak_fraction(self, family: str) -> Optional[float]:
        """Bytes per second at the family's largest measured size, as a fraction of the datasheet peak."""
        f = self.families.get(family)
        if f is None or not f.points:
            return None
        big = max(f.points, key=lambda p: p[0])
        return big[0] / big[1] / self.peak_bandwidth_bytes_per_s

    def stream_bandwidth(self, nbytes: float) -> Optional[float]:
        """The streaming read's bytes per second at `nbytes`: between two measured sizes, interpolated linearly in
        log(bytes per second) over log(bytes); beyond the measured sizes, the nearest one's. None without a
        streaming read."""
        import math

        ref = self.families.get("stream_read")
        if ref is None or not ref.points:
            return None
        pts = sorted((p[0], p[0] / p[1]) for p in ref.points)
        if nbytes <= pts[0][0]:
            return pts[0][1]
        if nbytes >= pts[-1][0]:
            return pts[-1][1]
        for (x0, b0), (x1, b1) in zip(pts, pts[1:], strict=False):
            if x0 <= nbytes <= x1:
                if x1 == x0:
                    return b0
                w = math.log(nbytes / x0) / math.log(x1 / x0)
                return math.exp(math.log(b0) + w * math.log(b1 / b0))
        return pts[-1][1]

    def stream_fraction(self, family: str, min_bytes: int = 256 * MB) -> Optional[float]:
        """The family's bytes per second as a fraction of the streaming read's at the same number of bytes
        (`stream_bandwidth`, interpolated between the read's sizes), averaged over the family's points of at
        least `min_bytes`: how close a kernel comes to the bandwidth this GPU delivers when the per-call cost no
        longer counts. None without such points or without a streaming read."""
        f = self.families.get(family)
        if f is None or self.families.get("stream_read") is None:
            return None
        ratios = [p[0] / p[1] / self.stream_bandwidth(p[0]) for p in f.points if p[0] >= min_bytes]
        return sum(ratios) / len(ratios) if ratios else None


def save_calibration(profile: CalibrationProfile, path: str | Path) -> None:
    import yaml

    from kvplan.files import atomic_write_text

    atomic_write_text(path, "# kvplan calibration profile: measured by `kvplan measure`\n"
                      + yaml.safe_dump(profile.to_dict(), sort_keys=False))


def load_calibration(path: str | Path) -> CalibrationProfile:
    """A profile `kvplan measure` wrote; anything missing or of the wrong type is one line naming the field."""
    from kvplan.files import check_finite, read_yaml, type_name

    d = read_yaml(path, "calibration profile", "`kvplan measure` writes one")
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        raise KvplanError(f"{path}: not a kvplan calibration profile (schema {SCHEMA})")
    check_finite(d, path)

    def field(where: str, value, expected: str, ok) -> None:
        if value is None:
            raise KvplanError(f"{path}: field '{where}' is missing; `kvplan measure` writes a complete profile")
        if not ok(value):
            raise KvplanError(f"{path}: field '{where}': expected {expected}, found {type_name(value)}")

    def number(where: str, value, minimum: float = 0.0, strict: bool = True) -> float:
        above = f"{'above' if strict else 'at least'} {minimum:g}"
        field(where, value, f"a number {above}", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
              and (v > minimum if strict else v >= minimum))
        return float(value)

    field("device", d.get("device"), "a mapping of the GPU's properties", lambda v: isinstance(v, dict))
    device = dict(d["device"])
    if device.get("memory_total_bytes") is not None:
        number("device.memory_total_bytes", device["memory_total_bytes"])
    peak = number("peak_bandwidth_bytes_per_s", d.get("peak_bandwidth_bytes_per_s"))
    quick = d.get("quick", False)
    field("quick", quick, "true or false", lambda v: isinstance(v, bool))
    field("families", d.get("families"), "a mapping of kernel families to their fits",
          lambda v: isinstance(v, dict))
    fams = {}
    for name, v in d["families"].items():
        at = f"families.{name}"
        field(at, v, "a mapping with t0_s, eta and points", lambda x: isinstance(x, dict))
        t0 = number(f"{at}.t0_s", v.get("t0_s"), strict=False)
        eta = number(f"{at}.eta", v.get("eta"))
        points = v.get("points", [])
        field(f"{at}.points", points, "a list of [bytes, median s, p10 s, p90 s]", lambda x: isinstance(x, list))
        for i, p in enumerate(points):
            field(f"{at}.points.{i}", p, "a list of [bytes, median s, p10 s, p90 s]",
                  lambda x: isinstance(x, list) and len(x) >= 2)
            number(f"{at}.points.{i}.0", p[0])
            number(f"{at}.points.{i}.1", p[1])
            for j in range(2, len(p)):
                number(f"{at}.points.{i}.{j}", p[j], strict=False)
        fams[str(name)] = FamilyFit(str(name), t0, eta, [[float(x) for x in p] for p in points])
    return CalibrationProfile(device, peak, fams, quick)


def cache_dir() -> Path:
    base = os.environ.get("KVPLAN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kvplan")
    return Path(base) / "calibration"


def profile_name(device_name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in device_name.lower()).strip("-") + ".yaml"


def find_calibration(gpu_names: list[str]) -> Optional[Path]:
    """A profile saved for this GPU in the user's cache directory (by the device name CUDA reports). A file there
    that cannot be read is still returned, so that loading it says what is wrong with it."""
    d = cache_dir()
    for name in gpu_names:
        if not name:
            continue
        p = d / profile_name(name)
        try:
            if p.exists() and not p.is_dir():
                return p
        except OSError:  # a cache directory that cannot be searched holds nothing kvplan can use
            return None
    return None


def calibration_for(path, gpu: Optional[GPUSpec]) -> tuple:
    """The calibration profile asked for, or one saved for this GPU in kvplan's cache; (None, "") without. One
    measured on another GPU than --gpu is refused."""
    if path is None and gpu is None:
        return None, ""
    if isinstance(path, CalibrationProfile):
        return path, "a calibration profile"
    explicit = path is not None
    if path is None and gpu is not None:
        found = find_calibration([gpu.smi_name or "", gpu.name])
        path = str(found) if found else None
    if path is None:
        return None, ""
    cal = load_calibration(path)
    measured = str(cal.device.get("name") or "")
    if explicit and gpu is not None and measured and measured not in (gpu.name, gpu.smi_name):
        raise KvplanError(f"the calibration profile {path} was measured on {measured}, not {gpu.name}; measure this "
                          f"GPU (`kvplan measure`) or drop --gpu")
    return cal, str(path)


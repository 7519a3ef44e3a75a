"""The diagnosis figures: KV bytes per step against resident tokens (with the weight line and each dtype's
crossover), and concurrency against context length. The curves come from the engine; drawing is matplotlib for
PNG and SVG files, or a character chart for the terminal."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

from kvplan.errors import KvplanError
from kvplan.sizing.kv_cache import (
    SkipLayers,
    WeightRead,
    _solve_crossover,
    check_tp,
    kv_layers,
    kv_read_bytes,
    weight_read_bytes,
)
from kvplan.sizing.weights import weight_bytes
from kvplan.specs.catalog import ModelSpec
from kvplan.specs.kv_formats import KVFormat


@dataclass
class Series:
    label: str
    x: list[float]
    y: list[float]
    marker: Optional[tuple[float, float]] = None  # (x, y) of a point to mark on the curve (the crossover)
    marker_label: str = ""


@dataclass
class Figure:
    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    hline: Optional[tuple[str, float]] = None
    vline: Optional[tuple[str, float]] = None
    points: list[tuple[str, float, float]] = field(default_factory=list)  # labelled points (an operating point)
    logx: bool = True
    logy: bool = True
    notes: list[str] = field(default_factory=list)
    each_point: bool = False  # the series are measured points (a mark on each), not sampled curves


def _geomspace(lo: float, hi: float, n: int) -> list[float]:
    a, b = math.log10(lo), math.log10(hi)
    return [10 ** (a + (b - a) * i / (n - 1)) for i in range(n)]


def crossover_figure(model: ModelSpec, fmts: Sequence[KVFormat], *, tp: int = 1, weight_dtype: Optional[str] = None,
                     weight_read: WeightRead = "streamed", skip: SkipLayers = None,
                     batch: Optional[int] = None, context: Optional[int] = None, points: int = 200) -> Figure:
    """KV bytes a step reads against the cached tokens of one sequence, per dtype, with the flat weight line."""
    check_tp(model, tp)
    if weight_read not in ("streamed", "all"):
        raise KvplanError(f"--weight-read '{weight_read}': choose 'streamed' or 'all'")
    wb = weight_bytes(model, tp, weight_dtype)
    w1 = weight_read_bytes(model, wb, 1, weight_read)
    all_layers = [(f, kv_layers(model, f, tp, skip)) for f in fmts]
    stars = [_solve_crossover(layers, w1) for _, layers in all_layers]
    top = max([s for s in stars if s] + [1e6, (batch or 1) * (context or 1)]) * 4
    xs = _geomspace(256, top, points)
    series: list[Series] = []
    firsts = []  # each series' first format and its layers (a label may list several, and a name hold commas)
    for (f, layers), nstar in zip(all_layers, stars, strict=True):
        ys = [kv_read_bytes(layers, 1, x) for x in xs]
        same = next((s for s in series if s.y == ys), None)
        if same:  # formats with the same bytes draw one curve
            same.label += f", {f.name}"
            continue
        mark = (nstar, w1) if nstar else None
        series.append(Series(f.name, xs, ys, mark, f"N* {nstar:,.0f}" if nstar else "no N* at batch 1"))
        firsts.append((f.name, layers))
    fig = Figure(
        title=f"{model.name}, TP {tp}: bytes one decode step reads per rank",
        xlabel="cached tokens of one sequence (batch 1)", ylabel="bytes per step",
        series=series, hline=(f"weights read per step ({weight_read})", w1),
        notes=[f"weights: {w1 / 1e9:.3g} GB per step"],
    )
    if batch and context:
        wb_b = weight_read_bytes(model, wb, batch, weight_read)
        fig.vline = (f"operating point: {batch} x {context:,} = {batch * context:,} tokens", batch * context)
        for name, layers in firsts:
            fig.points.append((f"{name}: {kv_read_bytes(layers, batch, context) / 1e9:.3g} GB",
                               batch * context, kv_read_bytes(layers, batch, context)))
        if model.moe and wb_b != w1:  # the flat line is batch 1's: the operating point's own weight read beside it
            fig.points.append((f"weights at batch {batch}: {wb_b / 1e9:.3g} GB", batch * context, wb_b))
            fig.notes.append(f"at batch {batch} the weight read grows to {wb_b / 1e9:.3g} GB (more experts touched)")
    return fig


def capacity_figure(deployments: Sequence, lengths: Optional[Sequence[int]] = None) -> Figure:
    """Sequences the pool holds against max_model_len, one curve per resolved Deployment (kvplan.deployment), by
    vLLM's concurrency: the same plan `capacity` computes."""
    from kvplan.errors import KvplanError
    from kvplan.plan.vllm_pool import plan_for
    from kvplan.plan.vllm_problems import pool_problem

    d0 = deployments[0]
    model, gpu = d0.model, d0.gpu
    top = model.max_position_embeddings
    if lengths is None:
        lengths = sorted({int(round(x)) for x in _geomspace(min(1024, top), top, 60)} | {top})
    series, notes, problems = [], [], []
    for d in deployments:
        plan = plan_for(d)
        problem = pool_problem(d, plan)
        if problem is not None or (plan.available <= 0 and not plan.overridden):  # capacity refuses it too
            short = "the weights leave no room for a KV pool" if plan.available <= 0 else problem
            notes.append(f"{d.kv.name}: {short}")
            problems.append(problem or notes[-1])
            continue
        ys, xs = [], []
        for n in lengths:
            fig = plan.per_length(n)
            if fig["fits"]:
                xs.append(n)
                ys.append(fig["max_concurrency"])
        same = next((s for s in series if s.y == ys and s.x == xs), None)
        if same:
            same.label += f", {d.kv.name}"
        else:
            series.append(Series(d.kv.name, xs, ys))
        if not xs:
            problems.append(f"{d.kv.name}: no max_model_len from {lengths[0]:,} to {lengths[-1]:,} tokens fits one "
                            f"sequence in the pool")
    if not any(s.x for s in series):  # nothing to draw: say why, as capacity does
        raise KvplanError(problems[0] if len(set(problems)) == 1 or len(deployments) == 1
                          else "; ".join(dict.fromkeys(problems)))
    return Figure(
        title=f"{model.name} on {gpu.name if gpu else 'the given memory'}, TP {d0.tp}: sequences the KV pool holds",
        xlabel="max_model_len (tokens per sequence)", ylabel="max concurrency (sequences)", series=series,
        hline=("1 sequence", 1.0), notes=notes + [n for n in d0.notes],
    )


def throughput_figure(result) -> Figure:
    """Output tokens/s per GPU against TPOT, one curve per KV dtype (a point per concurrency: the Pareto front of
    that dtype), from a kvplan.plan.throughput.ThroughputResult; the TPOT limit as a vertical line, each dtype's best
    concurrency marked."""
    series = []
    for name in dict.fromkeys(r.kv_cache_dtype for r in result.rows):
        rows = sorted((r for r in result.rows if r.kv_cache_dtype == name and not r.kv_limited),
                      key=lambda r: r.tpot_ms)
        if not rows:
            continue
        best = result.best.get(name)
        series.append(Series(name, [r.tpot_ms for r in rows], [r.output_tokens_per_s_per_gpu for r in rows],
                             marker=(best.tpot_ms, best.output_tokens_per_s_per_gpu) if best else None,
                             marker_label=f"best: {best.concurrency}" if best else ""))
    notes = [f"one point per concurrency ({', '.join(str(c) for c in sorted({r.concurrency for r in result.rows}))})"
             f"; step times: {result.profile}", result.verdict]
    return Figure(
        title=f"{result.model} on {result.gpu}, TP {result.tp}" + (f", PP {result.pp}" if result.pp > 1 else "")
              + f", isl {result.isl:,} / osl {result.osl:,}: "
              "output tokens/s per GPU against TPOT",
        xlabel="TPOT (ms)", ylabel="output tokens/s per GPU", series=series,
        vline=(f"TPOT limit {result.tpot_limit_ms:g} ms", result.tpot_limit_ms) if result.tpot_limit_ms else None,
        notes=notes, each_point=True)


def figure_data(fig: Figure) -> dict:
    """The figure's numbers as plain values (`kvplan plot ... --json`)."""
    from dataclasses import asdict

    return asdict(fig)


# ----------------------------------------------------------------------------------------------------------------
# Drawing


def save(fig: Figure, path: str) -> None:
    """Draw with matplotlib and write PNG or SVG atomically."""
    from pathlib import Path

    from kvplan.errors import KvplanError
    from kvplan.files import atomic_write

    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in ("png", "svg"):
        raise KvplanError(f"cannot draw {path}: use a .png or .svg name (or no --output for a terminal chart)")
    f = draw(fig)
    try:
        atomic_write(path, lambda tmp: f.savefig(tmp, format=fmt))
    finally:
        import matplotlib.pyplot as plt

        plt.close(f)


def draw(fig: Figure):
    """The figure drawn with matplotlib (a matplotlib Figure, for save to write)."""
    from kvplan.errors import KvplanError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KvplanError("drawing PNG or SVG needs matplotlib: pip install matplotlib (the plot extra)") from None

    import textwrap

    crowded = len(fig.series) > 4
    width_in = 11 if crowded else 9
    # the footer: each note on lines of its own, as many characters as 7-point text fits across the figure
    footer = [ln for n in fig.notes for ln in textwrap.wrap(n, int(width_in * 72 / (7 * 0.62)))]
    line_in = 7 * 1.35 / 72
    height_in = 5.5 + line_in * len(footer)
    f, ax = plt.subplots(figsize=(width_in, height_in), dpi=120)
    # up to 20 series in 20 distinct colours (tab20's dark and light pairs), then line styles
    colors = list(plt.get_cmap("tab20").colors) if len(fig.series) > 10 else \
        plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if len(fig.series) > 10:
        colors = colors[0::2] + colors[1::2]
    styles = ["-", "--", "-.", ":"]
    shapes = "os^vDPX*<>"
    for i, s in enumerate(fig.series):
        c, ls = colors[i % len(colors)], styles[(i // len(colors)) % len(styles)]
        label = _wrap(s.label) + (f"  ({s.marker_label})" if s.marker_label else "")
        mark = dict(marker=shapes[i % len(shapes)], markersize=3.5) if fig.each_point else {}
        ax.plot(s.x, s.y, label=label, color=c, linestyle=ls, linewidth=1.8, **mark)
        if s.marker:  # its value is in the legend ("N* ..."): marks of close crossovers would overprint labels
            ax.plot(*s.marker, "o", color=c, markersize=8, markerfacecolor="white", markeredgewidth=2)
    if fig.hline:
        ax.axhline(fig.hline[1], color="black", linestyle="--", linewidth=1.2, label=fig.hline[0])
    if fig.vline:
        ax.axvline(fig.vline[1], color="gray", linestyle=":", linewidth=1.2, label=fig.vline[0])
    for _, x, y in fig.points:
        ax.plot(x, y, "s", color="gray", markersize=5)
    ax.set_xscale("log" if fig.logx else "linear")
    ax.set_yscale("log" if fig.logy else "linear")
    for axis, log in ((ax.xaxis, fig.logx), (ax.yaxis, fig.logy)):
        if log:  # ticks as numbers (20, 30, 1,000), not powers of ten (2x10^1)
            axis.set_major_formatter(_plain_log_formatter()())
            axis.set_minor_formatter(_plain_log_formatter()(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
    if fig.points and not crowded:
        _label_points(ax, fig.points)
    ax.set_xlabel(fig.xlabel)
    ax.set_ylabel(fig.ylabel)
    ax.set_title(fig.title, fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    if crowded:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        ax.legend(fontsize=8, loc="best")
    bottom = (0.1 + line_in * len(footer)) / height_in if footer else 0.03
    if footer:
        f.text(0.01, 0.1 / height_in, "\n".join(footer), fontsize=7, color="dimgray", va="bottom",
               linespacing=1.2)
    f.tight_layout(rect=(0, bottom, 1, 1))
    return f


def _plain_log_formatter():
    """matplotlib's log-axis formatter (which ticks it labels), writing a label below a million as a plain number
    (20, 30, 1,000) and a larger one as a power of ten, as matplotlib does."""
    from matplotlib.ticker import LogFormatterSciNotation

    class PlainLog(LogFormatterSciNotation):
        def __call__(self, x, pos=None):
            label = super().__call__(x, pos)
            if not label or x >= 1e6:
                return label
            return f"{x:,.0f}" if x >= 1 and float(x).is_integer() else f"{x:.3g}"

    return PlainLog


def _label_points(ax, points, gap: float = 0.055) -> None:
    """Each labelled point's text to the right of it, in a column spread so that no two labels overlap (at least
    `gap` of the axes' height apart), with a thin leader line from the text to its point."""
    ax.set_xlim(ax.get_xlim())  # the limits the drawing settled on: the labels must not move them
    ax.set_ylim(ax.get_ylim())
    to_axes = ax.transAxes.inverted()
    placed = sorted(((to_axes.transform(ax.transData.transform((x, y))), label, x, y) for label, x, y in points),
                    key=lambda p: p[0][1])
    heights, last = [], -1.0
    for (_, fy), *_ in placed:
        last = max(fy, last + gap)
        heights.append(last)
    shift = max(0.0, heights[-1] - 0.97) if heights else 0.0  # keep the top label inside the axes
    for ((fx, _), label, x, y), h in zip(placed, heights, strict=True):
        ax.annotate(label, (x, y), xycoords="data", xytext=(fx + 0.03, h - shift), textcoords="axes fraction",
                    fontsize=7, color="dimgray", va="center", zorder=5,
                    bbox=dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor="none", alpha=0.85),
                    arrowprops=dict(arrowstyle="-", color="gray", linewidth=0.6, shrinkA=0, shrinkB=3))


def _wrap(label: str, width: int = 48) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(label, width)) or label


def text_chart(fig: Figure, width: int = 72, height: int = 20, columns: Optional[int] = None) -> str:
    """The figure as characters: one letter per series, '-' the horizontal line, 'o' each series' mark. With
    `columns` (the terminal's width), the plot area narrows so that the chart fits in it (24 characters at least)."""
    xs = [x for s in fig.series for x in s.x] + ([fig.vline[1]] if fig.vline else [])
    ys = [y for s in fig.series for y in s.y if y > 0] + ([fig.hline[1]] if fig.hline else [])
    if not xs or not ys:
        return fig.title + "\n(nothing to draw)\n"
    ytop, ybot = _num(max(ys)), _num(min(ys))
    pad = max(len(ytop), len(ybot))
    if columns is not None:  # each row is the y label, " |" and the plot area
        width = max(24, min(width, columns - pad - 2))
    tx = (lambda v: math.log10(v)) if fig.logx else (lambda v: v)
    ty = (lambda v: math.log10(v)) if fig.logy else (lambda v: v)
    x0, x1 = tx(min(xs)), tx(max(xs))
    y0, y1 = ty(min(ys)), ty(max(ys))
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    grid = [[" "] * width for _ in range(height)]

    def put(x, y, ch):
        if x <= 0 or y <= 0:
            return
        col = round((tx(x) - x0) / (x1 - x0) * (width - 1))
        row = height - 1 - round((ty(y) - y0) / (y1 - y0) * (height - 1))
        if 0 <= col < width and 0 <= row < height:
            grid[row][col] = ch

    if fig.hline:
        for c in range(width):
            put(10 ** (x0 + (x1 - x0) * c / (width - 1)) if fig.logx else x0 + (x1 - x0) * c / (width - 1),
                fig.hline[1], "-")
    if fig.vline:
        for r in range(height):
            yv = y0 + (y1 - y0) * r / (height - 1)
            put(fig.vline[1], 10 ** yv if fig.logy else yv, ":")
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    for i, s in enumerate(fig.series):
        for x, y in zip(s.x, s.y, strict=True):
            put(x, y, letters[i % 26])
    for s in fig.series:
        if s.marker:
            put(*s.marker, "o")
    def text(line: str, indent: str = "") -> list[str]:  # a line of words, wrapped to the terminal's width
        if columns is None or len(line) <= columns:
            return [line]
        import textwrap

        return textwrap.wrap(line, max(20, columns), subsequent_indent=indent, break_on_hyphens=False)

    lines = text(fig.title)
    for r, row in enumerate(grid):
        label = ytop if r == 0 else ybot if r == height - 1 else ""
        lines.append(f"{label:>{pad}} |" + "".join(row))
    lines.append(" " * pad + " +" + "-" * width)
    lines.append(" " * pad + f"  {_num(min(xs))}" + f"{_num(max(xs)):>{width - len(_num(min(xs)))}}")
    axes = [f"x: {fig.xlabel}{' (log)' if fig.logx else ''}", f"y: {fig.ylabel}{' (log)' if fig.logy else ''}"]
    if columns is not None and pad + 2 + len("; ".join(axes)) > columns:
        import textwrap

        # one line each where both do not fit in one, wrapped where one alone does not
        lines += [" " * pad + f"  {ln}" for a in axes for ln in textwrap.wrap(a, max(20, columns - pad - 2))]
    else:
        lines.append(" " * pad + "  " + "; ".join(axes))
    for i, s in enumerate(fig.series):
        extra = f"  o {s.marker_label}" if s.marker else (f"  {s.marker_label}" if s.marker_label else "")
        lines += text(f"  {letters[i % 26]}  {s.label}{extra}", " " * 5)
    if fig.hline:
        lines += text(f"  -  {fig.hline[0]}: {_num(fig.hline[1])}", " " * 5)
    if fig.vline:
        lines += text(f"  :  {fig.vline[0]}", " " * 5)
    for label, _x, y in fig.points:
        lines += text(f"     {label}: {_num(y)}", " " * 7)
    lines += [ln for n in fig.notes for ln in text(f"  note: {n}", " " * 8)]
    return "\n".join(lines) + "\n"


def _num(v: float) -> str:
    if v >= 1e6:
        return f"{v:.3g}"
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"

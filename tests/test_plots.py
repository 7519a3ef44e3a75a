"""The figures render for a dense, a sliding-window, an MLA and a MoE model, as PNG, SVG and text."""

import xml.etree.ElementTree as ET

import pytest

from kvplan.app.plots import capacity_figure, crossover_figure, text_chart
from kvplan.specs.catalog import load_gpu, load_model
from kvplan.specs.kv_formats import kv_format

MODELS = ["llama3-8b", "gemma-3-27b", "deepseek-v3", "qwen3-30b-a3b"]  # dense, sliding-window, MLA, MoE


@pytest.mark.parametrize("name", MODELS)
def test_crossover_figure_marks_each_crossover(name):
    m = load_model(name)
    fmts = [kv_format("auto"), kv_format("fp8_ds_mla" if m.is_mla else "fp8")]
    fig = crossover_figure(m, fmts, batch=16, context=32768)
    w = fig.hline[1]
    for s in fig.series:
        # the mark sits where the curve crosses the weight line
        assert s.marker is not None and s.marker[1] == w
        below = [y for x, y in zip(s.x, s.y, strict=True) if x < s.marker[0]]
        above = [y for x, y in zip(s.x, s.y, strict=True) if x > s.marker[0]]
        assert max(below) <= w <= min(above)
    assert fig.vline[1] == 16 * 32768 and [p[0].split(":")[0] for p in fig.points[:2]] == [f.name for f in fmts]
    # an MoE model's step at batch 16 touches more experts than batch 1's: its own weight read is marked too
    more = [p for p in fig.points[2:] if p[0].startswith("weights at batch 16: ")]
    assert len(fig.points) == 2 + len(more) and len(more) == (1 if m.moe else 0)
    if more:
        assert more[0][2] > w and more[0][1] == 16 * 32768


@pytest.mark.parametrize("name", MODELS)
def test_png_svg_and_text(cli, tmp_path, name):
    pytest.importorskip("matplotlib")
    png, svg = tmp_path / "x.png", tmp_path / "c.svg"
    r = cli("plot", "crossover", name, "--batch", "8", "--context", "16k", "-o", str(png))
    assert r.code == 0, r.err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    r = cli("plot", "capacity", name, "--gpu", "h200", "--tp", "8", "-d", "all", "-o", str(svg))
    assert r.code == 0, r.err
    assert ET.parse(svg).getroot().tag.endswith("svg")
    r = cli("plot", "crossover", name)
    assert r.code == 0 and "N*" in r.out and "weights read per step" in r.out
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary file left behind


def test_capacity_figure_follows_capacity():
    from kvplan import capacity
    from kvplan.deployment import DeploymentArgs

    m, g = load_model("llama3-8b"), load_gpu("h100")
    d = DeploymentArgs(model=m, gpu=g, kv_cache_dtype="fp8").resolve(needs_memory=True)
    fig = capacity_figure([d], lengths=[1024, 4096, 8192])
    s = fig.series[0]
    assert s.x == [1024, 4096, 8192]
    assert s.y == [capacity(m, g, "fp8", max_model_len=n).max_concurrency for n in s.x]


def test_text_chart_shape():
    fig = crossover_figure(load_model("llama3-8b"), [kv_format("auto")])
    lines = text_chart(fig, width=50, height=12).splitlines()
    assert lines[0].startswith("Llama-3-8B") and any("o" in ln for ln in lines[1:13])


def test_plot_errors(cli):
    r = cli("plot", "crossover", "llama3-8b", "-o", "fig.jpg")
    assert r.code == 2 and ".png or .svg" in r.err
    r = cli("plot", "crossover", "llama3-8b", "--batch", "4")
    assert r.code == 2 and "--context" in r.err


@pytest.mark.parametrize("out", [[], ["-o", "x.png"]])
def test_plot_capacity_with_nothing_to_draw_exits_2_as_capacity_does(cli, tmp_path, out):
    # Llama-3.1-405B in bf16 on one H100: the weights alone exceed the budget, so capacity exits 2 with the reason;
    # the plot gives the same line and writes no file
    refused = cli("capacity", "llama-3.1-405b", "--gpu", "h100")
    assert refused.code == 2 and "exceed" in refused.err
    args = [a if a != "x.png" else str(tmp_path / a) for a in out]
    r = cli("plot", "capacity", "llama-3.1-405b", "--gpu", "h100", *args)
    assert r.code == 2 and r.out == "" and r.err == refused.err
    assert not (tmp_path / "x.png").exists()


def test_operating_point_labels_do_not_overlap():
    # three dtypes at 32 x 8k on Llama-3-8B: their points lie within a factor 3 of each other on a log axis, yet
    # each label gets its own line (no two text boxes intersect) and the N* values are left to the legend
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvplan.app.plots import _label_points

    fig = crossover_figure(load_model("llama3-8b"), [kv_format(n) for n in ("auto", "fp8", "turboquant_4bit_nc")],
                           batch=32, context=8192)
    f, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    for s in fig.series:
        ax.plot(s.x, s.y)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _label_points(ax, fig.points)
    f.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.texts]
    assert [t.get_text() for t in sorted(ax.texts, key=lambda t: t.get_position()[1])] == \
        ["turboquant_4bit_nc: 12.2 GB", "fp8: 17.2 GB", "auto: 34.4 GB"]  # 32 x 8,192 x 65,536 B is 17.2 GB
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    plt.close(f)


@pytest.mark.parametrize("columns", [50, 80])
@pytest.mark.parametrize("argv", [["plot", "crossover", "llama3-8b", "-d", "auto,fp8"],
                                  ["plot", "capacity", "llama3-8b", "--gpu", "h100"]])
def test_text_chart_fits_the_terminal(monkeypatch, argv, columns):
    # the 20 plot rows ("label |" and the plot area) and the axis lines fit in COLUMNS; wide terminals keep the
    # 72-character plot area
    from tests.test_options import _run

    monkeypatch.setenv("COLUMNS", str(columns))
    code, out, _ = _run(argv)
    rows = out.splitlines()[1:24]
    assert code == 0 and all(len(r) <= columns for r in rows), max(map(len, rows))
    monkeypatch.setenv("COLUMNS", "200")
    wide = _run(argv)[1].splitlines()[1:21]
    assert {len(r.split("|", 1)[1]) for r in wide} == {72}


@pytest.mark.parametrize("dtypes", ["auto,fp8", "auto,float16,bfloat16,fp8,fp8_e4m3,fp8_e5m2,fp8_per_token_head,"
                                    "int8_per_token_head,int4_per_token_head,turboquant_k8v4,turboquant_4bit_nc,"
                                    "turboquant_k3v4_nc,turboquant_3bit_nc"], ids=["two", "vllm-all"])
def test_throughput_png_is_legible(dtypes):
    # the footer (the concurrencies and the verdict) lies inside the image, the log axes read as plain numbers
    # (20, 30 rather than 2x10^1), every concurrency has a mark, and no two series share colour and line style
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import kvplan
    from kvplan.app.plots import draw, throughput_figure

    r = kvplan.throughput(load_model("llama-3.1-8b"), load_gpu("h100"), kv_cache_dtypes=dtypes.split(","), isl=1024, osl=1024,
                          tpot_ms=20)
    fig = throughput_figure(r)
    f = draw(fig)
    f.canvas.draw()
    page = f.bbox
    for t in f.texts + f.axes[0].texts:
        box = t.get_window_extent()
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, t.get_text()
    assert " ".join(t.get_text() for t in f.texts).split() == " ".join(fig.notes).split()  # every word of the notes
    ticks = [t.get_text() for axis in (f.axes[0].xaxis, f.axes[0].yaxis)
             for t in axis.get_ticklabels() + axis.get_ticklabels(minor=True)]
    assert "10" in ticks and "20" in ticks and not any("times" in t or "^" in t for t in ticks)
    lines = [ln for ln in f.axes[0].get_lines() if ln.get_label() in {s.label for s in fig.series}
             or any(ln.get_label().startswith(s.label + "  (") for s in fig.series)]
    assert len(lines) == len(fig.series) and all(ln.get_marker() not in (None, "None", "") for ln in lines)
    looks = {(matplotlib.colors.to_hex(ln.get_color()), ln.get_linestyle()) for ln in lines}
    assert len(looks) == len(lines)
    plt.close(f)


def test_plot_throughput_takes_throughputs_limits_and_layout(cli):
    # --ttft-ms picks the same best concurrency as `throughput --ttft-ms`; --pp and --max-model-len reach the plan
    import json

    base = ["--gpu", "h100", "--isl", "1k", "--osl", "1k", "-d", "auto"]
    table = json.loads(cli("throughput", "llama-3.1-8b", *base, "--ttft-ms", "300", "--json").out)
    fig = json.loads(cli("plot", "throughput", "llama-3.1-8b", *base, "--ttft-ms", "300", "--json").out)
    assert fig["series"][0]["marker_label"] == f"best: {table['best']['concurrency']}"
    r = cli("plot", "throughput", "llama-3.1-8b", *base, "--pp", "2", "--json")
    assert r.code == 0 and ", PP 2," in json.loads(r.out)["title"]
    # 8,192 + 1,024 tokens do not fit a max_model_len of 8,192
    r = cli("plot", "throughput", "llama-3.1-8b", "--gpu", "h100", "--isl", "8k", "--osl", "1k", "--max-model-len",
            "8k")
    assert r.code == 2 and "9,216 tokens exceeds the max_model_len 8,192" in r.err


def test_usage_lines_name_arguments_in_capitals(cli):
    for argv, usage in [(["plot", "throughput"], "kvplan plot throughput [OPTIONS] MODEL"),
                        (["log"], "kvplan log [OPTIONS] FILES..."), (["gate"], "kvplan gate [OPTIONS] FILE"),
                        (["capacity"], "kvplan capacity [OPTIONS] [MODEL]")]:
        r = cli(*argv, "--help")
        assert r.code == 0 and usage in r.out and "{" not in r.out.splitlines()[1], r.out[:300]

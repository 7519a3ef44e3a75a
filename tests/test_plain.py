"""Output to a pipe or a file is drawn without rich (kvplan.app.text_table) and must be what rich itself prints there,
character
for character: every table and line of every command, at several widths, against rich run on the same output."""

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest

import kvplan.app.text_table
from kvplan.app.cli import main
from kvplan.app.text_table import wrap

COMMANDS = [
    "crossover llama3-8b --dtype fp8",
    "crossover qwen3-30b-a3b --batch 1,64 --context 8k --gpu h100",
    "capacity llama-3.1-8b --gpu h100 -d auto,fp8,turboquant_4bit_nc --max-model-len 32768",
    "capacity --gpu h100",
    "capacity deepseek-v3 --gpu b200 --tp 8 -d auto,fp8_ds_mla",
    "capacity llama-3.1-8b --gpu h100 --engine sglang -d auto,fp8_e4m3",
    "log tests/fixtures/logs/vllm-v1-0.33-llama31-8b-h100.log --gpu h100",
    "log tests/fixtures/logs/vllm-0.19-h100/qwen-qwen2-5-7b-instruct--h100-80gb--tp2pp1dp1--8192.log "
    "tests/fixtures/logs/vllm-0.19-h100/microsoft-phi-2--h100-80gb--tp1pp1dp1--8192.FAILED.log "
    "--configs tests/fixtures/configs --summary",
    "gate examples/gates.yaml",
    "models",
    "models show gpt-oss-120b",
    "gpus",
    "gpus show h100",
    "formats",
]


def _run(argv, monkeypatch, width, plain):
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setattr(kvplan.app.text_table, "plain_output", lambda: plain)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue()


@pytest.mark.parametrize("width", [60, 80, 120, 200])
@pytest.mark.parametrize("command", COMMANDS)
def test_plain_output_is_what_rich_prints(monkeypatch, command, width):
    argv = command.split()
    plain = _run(argv, monkeypatch, width, True)
    rich = _run(argv, monkeypatch, width, False)  # rich itself, onto the same non-terminal output: no styles
    assert plain == rich


@pytest.mark.parametrize("text", ["aaa bbb ccc", "aaaaaaaaaa bb", "  x\n\ny", "one two  three   four " * 5,
                                  "a" * 25 + " b", "weights held per rank: 14.96 GiB   read per step"])
@pytest.mark.parametrize("width", [4, 7, 10, 33])
def test_wrap_like_rich(text, width):
    # rich is the oracle: its console, printing the same text at the same width onto a non-terminal
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=width, highlight=False, emoji=False).print(text)
    assert wrap(text, width) == out.getvalue().split("\n")[:-1]

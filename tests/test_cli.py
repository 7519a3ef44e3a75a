"""The command line as a user meets it: help on every command, and one clear line with exit code 2 for bad input."""

import json

import pytest

COMMANDS = [[], ["crossover"], ["capacity"], ["formats"], ["models"], ["models", "show"], ["gpus"], ["gpus", "show"],
            ["sweep"], ["gate"], ["log"], ["measure"], ["plot"], ["plot", "crossover"], ["plot", "capacity"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "kvplan")
def test_help(cli, cmd):
    r = cli(*cmd, "--help")
    assert r.code == 0
    assert "Usage" in r.out


def test_help_texts_read_as_written(cli):
    # the install hint names the package to install, and at 200 columns each command's summary
    # in the listing is one line: the source's wrapping does not leak into the terminal
    assert "pip install matplotlib" in cli("plot", "--help").out
    listing = cli("--help").out
    line = next(ln for ln in listing.splitlines() if "│ crossover" in ln)
    assert "weight read, and step bytes" in line


@pytest.mark.parametrize("args, says", [
    (["crossover", "llama3-8bb"], "unknown model 'llama3-8bb' (did you mean llama3-8b"),
    (["crossover", "llama3-8b", "--gpu", "h1000"], "unknown GPU 'h1000'"),
    (["crossover", "llama3-8b", "--dtype", "fp9"], "unknown KV cache dtype 'fp9'"),
    (["crossover", "llama3-8b", "--tp", "3"], "--tp 3 does not split"),
    (["crossover", "llama3-8b", "--context", "lots"], "--context 'lots'"),
    (["crossover", "llama3-8b", "--weight-read", "some"], "--weight-read 'some'"),
    (["crossover", "llama3-8b", "--weight-dtype", "int3"], "unknown weight dtype 'int3'"),
    (["crossover", "llama3-8b", "--dtype", "fp8_ds_mla"], "applies only to MLA models"),
    (["crossover", "deepseek-v3", "--dtype", "turboquant_k8v4"], "does not apply to MLA models"),
    (["crossover", "llama3-8b", "--kv-cache-dtype-skip-layers", "40"], "layer 40 does not exist"),
    (["crossover", "llama3-8b", "--tp", "abc"], "--tp 'abc': expected a whole number such as 8"),
    (["crossover"], "Missing argument"),
    (["capacity", "llama3-8b"], "capacity needs --gpu"),
    (["capacity", "llama3-8b", "--gpu", "h100", "--gpu-memory-utilization", "1.2"], "must be in (0, 1]"),
    (["capacity", "llama3-70b", "--gpu", "h100"], "weights (131.42 GiB per rank)"),
    (["capacity", "llama3-8b", "--gpu", "h100", "--max-model-len", "65536"], "exceeds Llama-3-8B's"),
    (["capacity", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "131072", "--activation-gib", "48"],
     "the longest that fits is"),
    (["models", "show", "nope-7b"], "unknown model 'nope-7b'"),
    (["frobnicate"], "No such command"),
])
def test_bad_input_is_one_line_exit_2(cli, args, says):
    r = cli(*args)
    assert r.code == 2, r.out
    assert says in r.err
    assert r.err.count("\n") == 1 and r.err.startswith("kvplan: error: ")
    assert "Traceback" not in r.err and r.out == ""


def test_malformed_spec_file(cli, tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("name: [unclosed\n")
    r = cli("crossover", str(p))
    assert r.code == 2 and "m.yaml" in r.err and "not valid YAML" in r.err


def test_models_and_gpus_listings(cli):
    r = cli("models")
    assert r.code == 0 and "llama-3-8b" in r.out and "deepseek-v3" in r.out and "MLA 576" in r.out
    rows = json.loads(cli("models", "--json").out)
    assert len(rows) >= 25
    assert {r["key"]: r["params"] for r in rows}["llama-3-70b"] == 70_553_706_496
    r = cli("gpus")
    assert r.code == 0 and "H100-SXM5-80GB" in r.out
    assert len(json.loads(cli("gpus", "--json").out)) >= 15


def test_models_show(cli):
    r = cli("models", "show", "deepseek-v3", "--json")
    d = json.loads(r.out)
    assert d["computed_params"] == 671_026_419_200 and d["mla"]["kv_lora_rank"] == 512
    r = cli("models", "show", "llama3-8b")
    assert r.code == 0 and "8,030,261,248" in r.out
    r = cli("gpus", "show", "h200")
    assert r.code == 0 and "139.8" in r.out


@pytest.mark.parametrize("group, name", [("models", "llama3-8b"), ("gpus", "h100")])
def test_group_json_applies_to_show(cli, group, name):
    # `kvplan models --json show NAME` is `kvplan models show NAME --json`
    before, after = cli(group, "--json", "show", name), cli(group, "show", name, "--json")
    assert before.code == after.code == 0
    assert json.loads(before.out) == json.loads(after.out) and before.out == after.out


def test_planning_imports_no_torch_triton_pandas():
    import subprocess
    import sys

    code = ("import sys, kvplan.app.cli as c; c.main(['crossover','llama3-8b','--dtype','fp8']); "
            "c.main(['capacity','llama3-8b','--gpu','h100']); "
            "bad = [m for m in ('torch', 'triton', 'pandas', 'numpy') if m in sys.modules]; "
            "sys.stderr.write(repr(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "[]"


@pytest.mark.parametrize("args, says", [
    (["capacity", "llama3-8b", "--gpu", "h100", "--max-model-len", "0"], "--max-model-len must be positive"),
    (["capacity", "llama3-8b", "--gpu", "h100", "--block-size", "0"], "--block-size must be positive"),
    (["crossover", "llama3-8b", "--batch", "0"], "--batch must be at least 1"),
    (["crossover", "./missing/config.json"], "no such file"),
    (["formats", "--head-dim", "0"], "--head-dim"),
])
def test_more_bad_input(cli, args, says):
    r = cli(*args)
    assert r.code == 2 and says in r.err and r.err.count("\n") == 1


def test_python_dash_m(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "kvplan", "formats", "--json"], capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout)[0]["name"] == "auto"


def test_no_command_shows_the_help_and_one_line(cli):
    r = cli()
    assert r.code == 2 and "Usage" in r.out
    assert r.err == "kvplan: error: no command given: the help above lists them (`kvplan COMMAND --help`)\n"


@pytest.mark.parametrize("typed, meant", [("8192", 8192), ("128k", 128 * 1024), ("1.5k", 1536), ("2m", 2 * 1024**2),
                                          (".5k", 512), (str(2**53), 2**53)])
def test_token_counts_are_read_exactly(cli, typed, meant):
    """k is 1,024 and m 1,024^2, as vLLM's own size arguments; the value is the exact product, never a float's."""
    import json

    r = cli("crossover", "llama3-8b", "-c", typed, "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["operating_points"][0]["context"] == meant


@pytest.mark.parametrize("typed, says", [
    ("1e30", "--context '1e30': exponent notation is not taken; write a whole number from 1 to 2**53 "
             "(9,007,199,254,740,992) or use k or m (128k, 2m)"),
    ("1E3", "--context '1e3': exponent notation is not taken; write the digits (1000) or use k or m (128k, 2m)"),
    ("99999999999999999999999", "--context '99999999999999999999999': at most 2**53 (9,007,199,254,740,992), the "
                                "largest whole number kvplan's arithmetic holds exactly"),
    ("1.5", "--context '1.5': expected a whole number such as 8192 or 128k"),
    ("nan", "--context 'nan': expected a whole number such as 8192 or 128k"),
])
def test_token_counts_refuse_exponents_and_sizes_beyond_exact(cli, typed, says):
    r = cli("crossover", "llama3-8b", "-c", typed)
    assert (r.code, r.out, r.err) == (2, "", f"kvplan: error: {says}\n")
    r = cli("crossover", "llama3-8b", "-b", "1e9", "-c", "2k")
    assert r.err == ("kvplan: error: --batch '1e9': exponent notation is not taken; write the digits (1000000000) or "
                     "use k or m (128k, 2m)\n")


@pytest.mark.parametrize("argv", [["crossover", "llama3-8b"], ["capacity", "llama3-8b", "--gpu", "h100"],
                                  ["sweep", "-m", "llama3-8b", "-g", "h100"]])
@pytest.mark.parametrize("empty", ["", " , "])
def test_empty_dtype_list_is_named_as_empty(cli, argv, empty):
    r = cli(*argv, "-d", empty)
    assert r.code == 2 and r.out == "" and r.err.count("\n") == 1
    assert r.err.startswith("kvplan: error: -d / --dtype is empty")


@pytest.mark.parametrize("columns", ["50", "80"])
@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "kvplan")
def test_help_never_cuts_an_option_name(monkeypatch, cmd, columns):
    # an option name wider than its column continues on the next line: the first column, read down each option's
    # lines, spells every long option in full, and nothing is cut with "…"
    import re

    from kvplan.app.cli import _command_for
    from tests.test_options import _run

    monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = _run([*cmd, "--help"])
    assert code == 0 and "…" not in out
    names = "".join(re.findall(r"^│ [ *]?\s*(\S+)", out, re.M))
    command = _command_for([*cmd, "--help"])
    for name in cmd:
        command = command.commands[name] if hasattr(command, "commands") else command
    for p in getattr(command, "params", []):
        for opt in [] if getattr(p, "hidden", False) else p.opts:
            if opt.startswith("--") and opt != "--help":
                assert opt in names, (opt, columns)


def test_help_mentions_the_profile_only_where_there_is_one():
    # "default: the profile's" is a promise of --profile: a command without it says its own default
    from kvplan.app.cli import _command_for

    root = _command_for(["--help"])
    todo = [([], root)]
    while todo:
        path, command = todo.pop()
        if hasattr(command, "commands"):
            todo += [([*path, n], c) for n, c in command.commands.items()]
            continue
        opts = {o for p in command.params for o in p.opts}
        for p in command.params:
            if "the profile's" in (getattr(p, "help", None) or ""):
                assert "--profile" in opts, (path, p.opts)

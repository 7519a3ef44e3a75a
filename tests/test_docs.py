"""The examples in the docstrings run as written, and the package's public names are what they say."""

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import kvplan

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("module", ["kvplan", "kvplan.grid", "kvplan.gates"])
def test_docstring_examples(module):
    failures, tried = doctest.testmod(importlib.import_module(module), verbose=False)
    assert tried >= 2 and failures == 0


def test_public_names_are_not_shadowed_by_submodules():
    # importing every submodule binds it on the package; an exported function of the same name would be lost
    for info in pkgutil.iter_modules(kvplan.__path__):
        if info.name not in ("__main__",):
            importlib.import_module(f"kvplan.{info.name}")
    for name in kvplan.__all__:
        assert not isinstance(getattr(kvplan, name), type(kvplan)), name


def test_readme_test_command_is_what_ci_runs():
    command = "pip install -e '.[test]' && python -m pytest -q"
    assert command in (ROOT / "README.md").read_text()
    assert command in (ROOT / ".ci" / "run").read_text()


def test_results_to_frame():
    pd = pytest.importorskip("pandas")
    m = kvplan.load_model("llama3-8b")
    x = kvplan.crossover(m, "fp8", contexts=[2048, 8192], batches=[1, 4])
    fx = x.to_frame()
    assert len(fx) == 4 and list(fx["context"]) == [2048, 8192, 2048, 8192]
    assert (fx["crossover_tokens"] == x.crossover_tokens).all()
    c = pd.concat([kvplan.capacity(m, kvplan.load_gpu("h100"), d, activation_gib=6).to_frame() for d in ("auto", "fp8")])
    assert list(c["dtype"]) == ["auto", "fp8"] and c["num_blocks"].iloc[1] == 53_067

"""The examples in the package docstring run as written."""

import doctest

import kvplan


def test_package_docstring_examples():
    failures, tried = doctest.testmod(kvplan, verbose=False)
    assert tried >= 4 and failures == 0


def test_readme_test_command_is_what_ci_runs():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    command = "pip install -e '.[test]' && python -m pytest -q"
    assert command in (root / "README.md").read_text()
    assert command in (root / ".ci" / "run").read_text()

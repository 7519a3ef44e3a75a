import io
import os

# The kernel tests run under Triton's interpreter; it must be chosen before anything imports triton.
os.environ.setdefault("TRITON_INTERPRET", "1")
# No test reaches the Hugging Face Hub or reads the user's cache (huggingface_hub reads these once, at import)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch, tmp_path_factory):
    """No test sees the user's calibration cache or a CI runner's GitHub variables; tests that need them set them."""
    monkeypatch.setenv("KVPLAN_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path_factory.mktemp("hf-cache")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY"):
        monkeypatch.delenv(name, raising=False)


class Run:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err


@pytest.fixture
def cli(monkeypatch):
    """Run the kvplan CLI in-process; returns exit code, stdout and stderr."""
    from kvplan.app.cli import main

    def run(*args: str) -> Run:
        monkeypatch.setenv("COLUMNS", "200")
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = main(list(args))
        return Run(code, out.getvalue(), err.getvalue())

    return run


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES

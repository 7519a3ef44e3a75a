"""Writing results to files: atomically (a temporary file beside the target, then a rename), so a reader never
sees half a file and an interrupted run leaves none."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from .errors import KvplanError

FRAME_FORMATS = {".csv": "csv", ".parquet": "parquet", ".json": "json", ".md": "markdown", ".markdown": "markdown"}


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)` to fill a temporary file in the target's folder, then move it into place."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise KvplanError(f"cannot write {path}: folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise KvplanError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: str | Path, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write)


def frame_format(path: str | None, fmt: str | None) -> str:
    if fmt:
        fmt = fmt.lower()
        if fmt not in set(FRAME_FORMATS.values()):
            raise KvplanError(f"--format {fmt}: choose csv, parquet, json or markdown")
        return fmt
    if path:
        suffix = Path(path).suffix.lower()
        if suffix not in FRAME_FORMATS:
            raise KvplanError(f"cannot tell the format of {path}: use a .csv, .parquet, .json or .md name, or --format")
        return FRAME_FORMATS[suffix]
    return "csv"


def frame_to_markdown(df) -> str:
    """A GitHub-flavoured markdown table (no extra dependency)."""
    cols = [str(c) for c in df.columns]
    right = [df[c].dtype.kind in "iuf" for c in df.columns]

    def cell(v) -> str:
        if isinstance(v, float):
            return "" if v != v else f"{v:.6g}"
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def write_frame(df, path: str | None, fmt: str) -> str | None:
    """Write `df` to `path` (atomically) in `fmt`; with no path, return the text for stdout."""
    if fmt == "parquet":
        if not path:
            raise KvplanError("parquet is binary: give --output PATH.parquet")
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise KvplanError("writing parquet needs pyarrow: pip install pyarrow (or write .csv / .json)") from None
        atomic_write(path, lambda tmp: df.to_parquet(tmp, index=False))
        return None
    if fmt == "csv":
        text = df.to_csv(index=False)
    elif fmt == "json":
        text = df.to_json(orient="records", indent=1) + "\n"
    else:
        text = frame_to_markdown(df)
    if path:
        atomic_write_text(path, text)
        return None
    return text

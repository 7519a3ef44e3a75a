"""Reading the files kvplan is given and writing its results.

Every file kvplan reads (a spec, a config.json, a profile, a gates file) goes through `read_text`, so whatever is
wrong with it (missing, a directory, unreadable, not UTF-8, not valid YAML or JSON) is one line naming the file.
Results are written atomically (a temporary file beside the target, then a rename), so a reader never sees half a
file and an interrupted run leaves none; a new file gets the permissions the umask allows, a replaced one keeps its
own.
"""

from __future__ import annotations

import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable

from kvplan.errors import KvplanError

FRAME_FORMATS = {".csv": "csv", ".parquet": "parquet", ".json": "json", ".md": "markdown", ".markdown": "markdown"}
_SUFFIX = {fmt: suffix for suffix, fmt in reversed(FRAME_FORMATS.items())}  # markdown: .md


# ----------------------------------------------------------------------------------------------------------------
# Reading


def read_text(path: str | Path, what: str = "file", hint: str = "") -> str:
    """The text of a file kvplan was given, decoded as UTF-8 (a leading byte-order mark is dropped).

    `what` names the file for people ("gates file", "calibration profile"); `hint` says where to get one, for a
    file that does not exist. Each failure is a KvplanError of one line naming the file.
    """
    data = _read_bytes(path, what, hint)
    try:  # UTF-8 without its byte-order mark: the utf-8-sig codec's decoding, without importing that codec
        return (data[3:] if data[:3] == b"\xef\xbb\xbf" else data).decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise KvplanError(f"{path}: line {line}: byte 0x{data[e.start]:02x} is not UTF-8; save the {what} as "
                          "UTF-8 text") from None


def _read_bytes(path: str | Path, what: str, hint: str) -> bytes:
    p = Path(path)
    try:
        return p.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        raise KvplanError(f"no such {what}: {path}" + (f" ({hint})" if hint else "")) from None
    except IsADirectoryError:
        raise KvplanError(f"{path} is a directory, not a {what}; name the file itself") from None
    except PermissionError:
        if p.is_dir():  # what Windows raises for a directory
            raise KvplanError(f"{path} is a directory, not a {what}; name the file itself") from None
        raise KvplanError(f"cannot read {what} {path}: permission denied; make it readable "
                          f"(chmod u+r {path})") from None
    except OSError as e:
        raise KvplanError(f"cannot read {what} {path}: {e.strerror or e}") from None


def read_yaml(path: str | Path, what: str = "YAML file", hint: str = "") -> Any:
    """A YAML file, parsed; a syntax error becomes one line naming the file and line."""
    import yaml

    text = read_text(path, what, hint)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    kind = "JSON" if str(path).endswith(".json") else "YAML"  # JSON files are read as the YAML they are
    try:
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as e:
        if kind == "JSON":  # the JSON parser's own line and wording
            return _parse_json(path, text)
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where = f" line {mark.line + 1}"
        elif isinstance(getattr(e, "position", None), int):  # a character YAML does not allow
            where = f" line {text[: e.position].count(chr(10)) + 1}"
        else:
            where = ""
        problem = getattr(e, "problem", None) or getattr(e, "reason", None) or str(e).splitlines()[0]
        raise KvplanError(f"{path}:{where} is not valid {kind}: {_one_line(problem)}") from None
    except (ValueError, TypeError, OverflowError) as e:  # a value YAML parses but cannot build, e.g. 2024-13-45
        raise KvplanError(f"{path}: is not valid {kind}: {_value_problem(e)}") from None
    except RecursionError:
        raise KvplanError(f"{path}: is not valid {kind}: nested too deeply") from None


def read_json(path: str | Path, what: str = "JSON file", hint: str = "") -> Any:
    """A JSON file, parsed; a syntax error becomes one line naming the file and line."""
    return _parse_json(path, read_text(path, what, hint))


def _parse_json(path: str | Path, text: str) -> Any:
    """JSON text parsed; a syntax error becomes one line naming the file and the JSON parser's line and problem."""
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise KvplanError(f"{path}: line {e.lineno}: not valid JSON: {e.msg}") from None
    except RecursionError:
        raise KvplanError(f"{path}: not valid JSON: nested too deeply") from None
    except ValueError as e:  # a number of thousands of digits
        raise KvplanError(f"{path}: not valid JSON: {_value_problem(e)}") from None


def check_finite(data: Any, path: str | Path, where: str = "") -> None:
    """Refuse a NaN or infinite number anywhere in parsed YAML or JSON (YAML spells them .nan and .inf)."""
    todo = [(where, data)]
    while todo:
        at, value = todo.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise KvplanError(f"{path}: field '{at or '(top level)'}': expected a finite number, found {value}")
        if isinstance(value, dict):
            todo.extend((f"{at}.{k}" if at else str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            todo.extend((f"{at}.{i}" if at else str(i), v) for i, v in enumerate(value))


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _value_problem(e: Exception) -> str:
    if "integer string conversion" in str(e):
        return "a number has more than 4300 digits"
    return _one_line(str(e))


def type_name(value: Any) -> str:
    """How a parsed YAML or JSON value is called in an error: 'a string ("32")', 'a list', 'a number (32.5)'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        if isinstance(value, int) and value.bit_length() > 100:  # too long to print (Python refuses past 4300 digits)
            return "a number (of more than 30 digits)"
        return f"a number ({value})"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"a string ({_one_line(repr(shown))})"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def check_writable(path: str | Path) -> None:
    """Refuse, before any work, a path `atomic_write` could not write: a folder, or a file in a missing folder."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise KvplanError(f"cannot write {path}: it is a folder; give a file name inside it")
    if not folder.is_dir():
        raise KvplanError(f"cannot write {path}: folder {folder} does not exist")


def atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)` to fill a temporary file in the target's folder, then move it into place.

    The file ends up with the permissions of the one it replaces, or those a plain open() would give a new file
    (0o666 less the umask)."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise KvplanError(f"cannot write {path}: folder {folder} does not exist")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
        os.close(fd)
        write(tmp)
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except OSError as e:
        raise KvplanError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _mode_for(path: Path) -> int:
    """The permission bits a written file gets: the replaced file's, or 0o666 less the umask for a new one."""
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            return stat.S_IMODE(st.st_mode)
    except OSError:
        pass
    return 0o666 & ~_umask()


def _umask() -> int:
    try:  # Linux reports it without changing it
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write)


def frame_format(path: str | None, fmt: str | None) -> str:
    """The format a table is written in: --format's, else the output file's suffix's, else csv. A folder, or a
    --format the file's suffix contradicts, is refused."""
    if path and Path(path).is_dir():
        raise KvplanError(f"--output {path} is a folder: give a file name in it, such as "
                          f"{Path(path) / 'sweep.csv'}")
    suffix = Path(path).suffix.lower() if path else ""
    if fmt:
        fmt = fmt.lower()
        if fmt not in set(FRAME_FORMATS.values()):
            raise KvplanError(f"--format {fmt}: choose csv, parquet, json or markdown")
        if suffix in FRAME_FORMATS and FRAME_FORMATS[suffix] != fmt:
            raise KvplanError(f"{path} names a {FRAME_FORMATS[suffix]} file but {fmt} was asked for (--format or "
                              f"--json): drop one, or name the file {Path(path).with_suffix(_SUFFIX[fmt])}")
        return fmt
    if path:
        if suffix not in FRAME_FORMATS:
            raise KvplanError(f"cannot tell the format of {path}: use a .csv, .parquet, .json or .md name, or --format")
        return FRAME_FORMATS[suffix]
    return "csv"


def frame_to_markdown(df) -> str:
    """A GitHub-flavoured markdown table (no extra dependency)."""
    cols = [str(c) for c in df.columns]
    right = [df[c].dtype.kind in "iuf" for c in df.columns]

    def cell(v) -> str:
        if isinstance(v, float):  # whole numbers in full (15009857536, not 1.50099e+10), others to 6 digits
            if v != v:
                return ""
            if v.is_integer() and abs(v) < 2**53:
                return str(int(v))
            return f"{v:.6g}" if abs(v) < 1e5 else f"{v:.1f}"
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
    whole = [c for c in df.attrs.get("whole_columns", ()) if c in df.columns and df[c].dtype.kind == "f"
             and df[c].notna().all() and (df[c] % 1 == 0).all() and (df[c].abs() < 2**53).all()]
    if whole:  # byte counts the frame holds as floats, written as the integers they are (131072, not 131072.0)
        df = df.astype({c: "int64" for c in whole})
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

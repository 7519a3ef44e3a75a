"""Tables and text for output that is not a terminal (a pipe, a file, a CI log), without importing rich.

The output is character for character what rich prints there (no colour: rich emits styles only to a terminal): the
same width (COLUMNS, else the terminal behind stdin, stdout or stderr, else 80), the same word wrapping, markup tags
dropped, and tables in the SIMPLE_HEAD box kvplan uses. Anything this renderer does not reproduce exactly (a table
wider than the console, which rich lays out by wrapping text columns; characters wider than one cell; escaped
markup) is handed to rich itself, imported only then.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Optional

_TAG = re.compile(r"\[[a-z#/@][^[]*?]")  # rich.markup.RE_TAGS without escapes (which are handed to rich)
_WORD = re.compile(r"\s*\S+\s*")  # rich._wrap.re_word


def plain_output() -> bool:
    """Output goes where rich would print no styles: not a terminal, and nothing forces one."""
    if any(os.environ.get(k) for k in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "JUPYTER_COLUMNS")):
        return False
    try:
        return not sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def console_width() -> int:
    """rich.Console's width: COLUMNS when it is a number, else the terminal size of stdin, stdout or stderr, else 80."""
    columns = os.environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        return int(columns)
    for fd in (0, 1, 2):
        try:
            return os.get_terminal_size(fd).columns or 80
        except (AttributeError, ValueError, OSError):
            continue
    return 80


def _simple(text: str) -> bool:
    """Text this renderer reproduces exactly: printable ASCII (one cell each), no escaped markup, no tabs."""
    return text.isascii() and "\\[" not in text and "\t" not in text and "\r" not in text


def _strip(text: str) -> str:
    return _TAG.sub("", text)


def wrap(text: str, width: int) -> list[str]:
    """rich's Text.wrap for one paragraph with justify 'default': break before a word that does not fit (rich._wrap
    .divide_line), fold a word longer than the width, drop trailing spaces only beyond the width."""
    lines: list[str] = []
    for para in text.split("\n"):
        breaks: list[int] = []
        offset = 0
        for m in _WORD.finditer(para):
            start, word = m.start(), m.group(0)
            length = len(word.rstrip())
            if width - offset >= length:
                offset += len(word)
            elif length > width:
                chunks = [word[i:i + width] for i in range(0, len(word), width)]
                for k, chunk in enumerate(chunks):
                    if start:
                        breaks.append(start)
                    if k == len(chunks) - 1:
                        offset = len(chunk)
                    else:
                        start += len(chunk)
            elif offset and start:
                breaks.append(start)
                offset = len(word)
        bounds = [0, *breaks, len(para)]
        for a, b in zip(bounds, bounds[1:]):
            line = para[a:b]
            if len(line) > width:  # rstrip_end: trailing whitespace beyond the width goes
                excess = len(line) - width
                spaces = len(line) - len(line.rstrip())
                line = line[: len(line) - min(spaces, excess)]
            lines.append(line[:width] if len(line) > width else line)
    return lines


class PlainTable:
    """The part of rich.table.Table kvplan uses, recorded so that rich can replay it when needed."""

    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs
        self.columns: list[tuple[str, dict]] = []
        self.rows: list[tuple[tuple[str, ...], bool]] = []

    def add_column(self, header: str = "", **kwargs: Any) -> None:
        self.columns.append((header, kwargs))

    def add_row(self, *cells: Any, end_section: bool = False) -> None:
        self.rows.append((tuple("" if c is None else str(c) for c in cells), end_section))

    def to_rich(self):
        from rich import box
        from rich.table import Table

        kwargs = dict(self.kwargs)
        kwargs.setdefault("box", box.SIMPLE_HEAD)
        kwargs.setdefault("pad_edge", False)
        t = Table(**kwargs)
        for header, kw in self.columns:
            t.add_column(header, **kw)
        for cells, end in self.rows:
            t.add_row(*cells, end_section=end)
        return t

    def render(self, width: int) -> Optional[list[str]]:
        """The lines rich prints for this table, or None where rich must lay it out itself."""
        unsupported = set(self.kwargs) - {"title", "title_justify", "show_header"}
        if unsupported or not self.columns or self.kwargs.get("title_justify", "left") != "left":
            return None
        show_header = self.kwargs.get("show_header", True)
        n = len(self.columns)
        headers = [_strip(h) for h, _ in self.columns]
        rows = [([_strip(c) for c in cells] + [""] * (n - len(cells)), end) for cells, end in self.rows]
        if any(len(cells) > n for cells, _ in self.rows):
            return None
        texts = [*(headers if show_header else []), *(c for cells, _ in rows for c in cells)]
        if not all(_simple(t) and "\n" not in t for t in texts):
            return None
        widths = [max([len(headers[i]) if show_header else 0] + [len(cells[i]) for cells, _ in rows])
                  for i in range(n)]
        total = sum(widths) + 3 * n - 1  # SIMPLE_HEAD: two edge cells, n - 1 dividers, inner padding
        if total > width:
            return None  # rich wraps the text columns (print_table's layout)
        justify = [kw.get("justify", "left") for _, kw in self.columns]
        if any(j not in ("left", "right", "center") for j in justify):
            return None

        def line(cells: list[str]) -> str:
            parts = []
            for i, (c, w, j) in enumerate(zip(cells, widths, justify)):
                body = c.rjust(w) if j == "right" else c.center(w) if j == "center" else c.ljust(w)
                parts.append(("" if i == 0 else " ") + body + ("" if i == n - 1 else " "))
            return " " + " ".join(parts) + " "

        out = []
        title = self.kwargs.get("title")
        if title:
            t = _strip(str(title))
            if not _simple(t):
                return None
            out += [ln.ljust(total) for ln in wrap(t, total)]
        blank = " " * total
        out.append(blank)
        if show_header:
            out.append(line(headers))
            out.append(" " + "─" * (total - 2) + " ")
        for k, (cells, end) in enumerate(rows):
            out.append(line(cells))
            if end and k < len(rows) - 1:
                out.append(blank)
        out.append(blank)
        return out


class PlainConsole:
    """The part of rich.console.Console kvplan uses, printing plain text."""

    def __init__(self) -> None:
        self.width = console_width()

    def print(self, obj: Any = "", *, highlight: bool = False, soft_wrap: bool = False) -> None:
        """Print a table or a line of text; soft_wrap: the line as it is, however long (rich's soft wrapping)."""
        if isinstance(obj, PlainTable):
            lines = obj.render(self.width)
            if lines is None:
                return self._rich_print(obj.to_rich())
        else:
            text = _strip(str(obj))
            if not _simple(str(obj)):
                return self._rich_print(obj, soft_wrap=soft_wrap)
            lines = text.split("\n") if soft_wrap else wrap(text, self.width)
        sys.stdout.write("".join(ln + "\n" for ln in lines))

    def _rich_print(self, obj: Any, **kwargs: Any) -> None:
        from rich.console import Console

        Console(highlight=False, emoji=False, width=self.width).print(obj, **kwargs)

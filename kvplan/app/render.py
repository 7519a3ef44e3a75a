"""Rich tables and JSON for the CLI. The only module that formats numbers for people."""

from __future__ import annotations

import re
import sys
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

from kvplan.units import GiB

if TYPE_CHECKING:  # rich is imported where a table is drawn, so --json output never loads it
    from rich.console import Console
    from rich.table import Table as _RichTable



def Table(**kwargs) -> _RichTable:  # noqa: N802 - one look for every table
    from kvplan.app.text_table import PlainTable, plain_output

    if plain_output():  # a pipe or a file: drawn without importing rich (kvplan.app.text_table), the same characters
        return PlainTable(**kwargs)  # type: ignore[return-value]
    from rich import box
    from rich.table import Table as _RichTable

    kwargs.setdefault("box", box.SIMPLE_HEAD)
    kwargs.setdefault("pad_edge", False)
    return _RichTable(**kwargs)


def console() -> Console:
    from kvplan.app.text_table import PlainConsole, plain_output

    if plain_output():
        return PlainConsole()  # type: ignore[return-value]
    from rich.console import Console

    # emoji=False: no text kvplan prints means an emoji code, and resolving ':name:' would load rich's emoji table
    return Console(highlight=False, emoji=False)


def print_table(con: Console, table: _RichTable, keys: int = 1) -> None:
    """Print a table within the console's width without cutting any cell short.

    Right-aligned columns hold numbers: they never wrap and are never truncated. Other columns hold text, which
    may wrap between words but never inside one. When the table is wider than the console, the text columns give
    up their width first; when even the narrowest such layout does not fit, the columns after the first `keys`
    (the row labels) continue in a second table below the first, and a third below that, each repeating the row
    labels under the one title, so that every line fits (only a single cell wider than the console can make one longer).
    """
    import copy

    from kvplan.app.text_table import PlainTable

    if isinstance(table, PlainTable):
        lines = table.render(con.width)
        if lines is not None:
            sys.stdout.write("".join(ln + "\n" for ln in lines))
            return
        from rich.console import Console as _Console

        table, con = table.to_rich(), _Console(highlight=False, emoji=False, width=con.width)
    for col in table.columns:
        if col.justify == "right":
            col.no_wrap = True

    def part(indices: list[int], first: bool) -> _RichTable:
        sub = copy.copy(table)
        sub.columns = []
        for k, i in enumerate(indices):
            col = copy.copy(table.columns[i])
            col._index = k
            sub.columns.append(col)
        if not first:
            sub.title = None
        return sub

    whole = part(list(range(len(table.columns))), True)
    needed = _fit(con, whole)
    if needed > con.width and len(table.columns) <= keys + 1:
        needed = _fit(con, whole, fold_words=True)
    if needed <= con.width or len(table.columns) <= keys + 1:
        return _print_at(con, whole, needed)
    keys = max(1, min(keys, len(table.columns) - 1))
    rest = list(range(keys, len(table.columns)))
    if table.title:  # the title spans the console, not the first part's width
        con.print(table.title)
    first = False
    while rest:
        take = [rest[0]]
        for i in rest[1:]:
            if _fit(con, part([*range(keys), *take, i], first)) > con.width:
                break
            take.append(i)
        sub = part([*range(keys), *take], first)
        needed = _fit(con, sub)
        if needed > con.width:  # one column beside the labels does not fit: its words (and the labels') fold
            needed = _fit(con, sub, fold_words=True)
        _print_at(con, sub, needed)
        rest, first = rest[len(take):], False


def _fit(con: Console, table: _RichTable, fold_words: bool = False) -> int:
    """Set the widths of a table's text columns for the console (numbers whole, text wrapped between words, the
    narrowest text column widened first); the width the table then takes. A column made to fold (a path, a list)
    breaks a word that does not fit, and so does every text column with fold_words; a number never breaks."""
    cols = table.columns
    for col in cols:
        col.width = None
    unbounded = con.options.update_width(10**6)
    ranges = [table._measure_column(con, unbounded, col) for col in cols]
    room = con.width - table._extra_width
    if sum(r.maximum for r in ranges) <= room:
        return sum(r.maximum for r in ranges) + table._extra_width
    widths = [r.maximum if col.no_wrap else r.minimum for col, r in zip(cols, ranges)]
    excess = sum(widths) - room
    for i, col in enumerate(cols):  # a text column that may fold a word (a path, a list) gives it up, numbers kept
        if excess > 0 and (col.overflow == "fold" or fold_words) and not col.no_wrap:
            col.overflow = "fold"
            cut = min(excess, widths[i] - _fold_floor(col) - table._get_padding_width(i))
            if cut > 0:
                widths[i] -= cut
                excess -= cut
    wrap = [i for i, col in enumerate(cols) if not col.no_wrap and ranges[i].maximum > widths[i]]
    spare = room - sum(widths)
    while spare > 0 and wrap:
        # widen the narrowest text column that still wraps, one character at a time
        i = min(wrap, key=lambda k: widths[k])
        widths[i] += 1
        spare -= 1
        if widths[i] >= ranges[i].maximum:
            wrap.remove(i)
    for i, col in enumerate(cols):
        col.width = max(widths[i] - table._get_padding_width(i), 1)
    return sum(widths) + table._extra_width


_NUMBER = re.compile(r"[-+~]?\d[\d,._]*(?:e[-+]?\d+)?[x%]?")


def _fold_floor(col) -> int:
    """The narrowest a folding text column may be: its longest number stays whole (and 8 characters at least)."""
    return max([8] + [len(m) for cell in col._cells for m in _NUMBER.findall(str(cell))])


def _print_at(con: Console, table: _RichTable, needed: int) -> None:
    """Print a table laid out by _fit; one whose narrowest layout is wider than the console prints at the width it
    needs (a line longer than the terminal is better than a lost digit)."""
    if needed <= con.width:
        con.print(table)
        return
    width = con.width
    con.width = needed
    try:
        con.print(table)
    finally:
        con.width = width


def print_json(obj: Any) -> None:
    import json

    def default(o):
        if is_dataclass(o):
            return asdict(o)
        if hasattr(o, "model_dump"):
            return o.model_dump()
        raise TypeError(type(o).__name__)

    sys.stdout.write(json.dumps(_whole_numbers(obj), indent=2, default=default) + "\n")


def _whole_numbers(obj: Any) -> Any:
    """Byte counts computed in floating point print as integers when they are whole."""
    if is_dataclass(obj):
        obj = asdict(obj)
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    if isinstance(obj, dict):
        return {k: _whole_numbers(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_whole_numbers(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------------------------------------------
# Number formats


def sci(x: Optional[float], digits: int = 3) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    return f"{x:.{digits - 1}e}".replace("e+0", "e").replace("e+", "e")


def gb(x: float, unit: bool = True) -> str:
    """Decimal gigabytes, 4 significant digits: how bandwidth is quoted (1 GB/s = 1e9 B/s)."""
    s = f"{x / 1e9:#,.4g}".rstrip(".") if x < 1e13 else f"{x / 1e9:,.0f}"
    return s + " GB" if unit else s


def gib(x: float) -> str:
    return f"{x / GiB:,.2f} GiB"


def num(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}"


def pct(x: float) -> str:
    return f"{x * 100:.1f}%" if abs(x) >= 0.1 else f"{x * 100:.2f}%"


def tokens(x: Optional[float]) -> str:
    if x is None:
        return "never"
    return f"{x:,.0f}"


def _layer_list(xs: Sequence[int]) -> str:
    if not xs:
        return "-"
    from kvplan.sizing.kv_cache import _ranges

    return _ranges(xs)

"""The `kvplan` command line: the commands (kvplan.app.plan_commands, kvplan.app.tool_commands) on one Typer
application (kvplan.app.options), and the entry point that turns bad input into one line and exit code 2."""

from __future__ import annotations

import os
import sys
from typing import List, Optional

import typer

import kvplan.app.plan_commands  # noqa: F401 (registers the planning commands)
import kvplan.app.tool_commands  # noqa: F401 (registers the other commands)
from kvplan.app.options import _exit, _formats_for, app  # noqa: F401 (app and _formats_for for callers)


def _fold_option_names() -> None:
    """In --help, an option name wider than its column (--kv-cache-dtype-skip-layers at 80 columns) continues on
    the next line instead of being cut with an ellipsis, so that the whole name can be read and typed."""
    try:
        import typer.rich_utils as rich_help
    except ImportError:  # typer without rich: click's plain help never cuts names
        return
    for name in ("highlighter", "negative_highlighter"):
        shown = getattr(rich_help, name, None)
        if shown is None or getattr(shown, "folds", False):
            continue

        class Folding(type(shown)):  # type: ignore[misc]
            folds = True

            def __call__(self, text):
                out = super().__call__(text)
                if hasattr(out, "overflow"):
                    out.overflow = "fold"
                return out

        setattr(rich_help, name, Folding())


def _join_wrapped_lines(command) -> None:
    """Help texts are wrapped in the source; join each paragraph into one line, so that the command listing reflows
    to the terminal's width instead of breaking where the source did."""
    import re

    for sub in getattr(command, "commands", {}).values():
        if sub.help:
            sub.help = re.sub(r"(?<!\n)\n(?!\n)\s*", " ", sub.help)
        _join_wrapped_lines(sub)


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point: bad input becomes one line on stderr and exit code 2, never a traceback. Output cut short by a
    closed pipe (`kvplan ... | head`) ends quietly, with the status the command had."""
    import errno

    from kvplan.errors import KvplanError

    args = sys.argv[1:] if argv is None else argv
    command = _command_for(args)
    if "-h" in args or "--help" in args or not args:
        _fold_option_names()
    _join_wrapped_lines(command)
    _flags_without_type(command)
    _usage_names(command)
    _exit["status"] = 0
    streams = sys.stdout, sys.stderr
    try:
        rv = command.main(args=argv, prog_name="kvplan", standalone_mode=False)
    except KvplanError as e:
        print(f"kvplan: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _discard_stdout()
    except SystemExit as e:
        # typer answers a closed pipe with status 1, whatever the command's own
        if getattr(e.__context__, "errno", None) == errno.EPIPE:
            sys.stdout, sys.stderr = streams
            return _discard_stdout()
        raise
    except Exception as e:  # click's usage errors (vendored inside typer) and Ctrl-C
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            message = e.format_message() or "no command given: the help above lists them (`kvplan COMMAND --help`)"
            message = _whole_number_advice(e, message, args)
            print(f"kvplan: error: {_one_line(message)}", file=sys.stderr)
            return 2
        if type(e).__name__ == "Abort":
            print("kvplan: interrupted", file=sys.stderr)
            return 130
        raise
    return rv if isinstance(rv, int) else 0


def _whole_number_advice(e, message: str, args: List[str]) -> str:
    """An integer option given something else: the value and what to write instead (the digits of 1e3), rather than
    the parser's 'Input should be a valid integer, unable to parse string as an integer'."""
    import re

    param = getattr(e, "param", None)
    if param is None or "valid integer" not in message:
        return message
    opts = [*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())]
    value = None
    for i, a in enumerate(args):
        if a in opts and i + 1 < len(args):
            value = args[i + 1]
        elif "=" in a and a.split("=", 1)[0] in opts:
            value = a.split("=", 1)[1]
    name = max(opts, key=len) if opts else "the option"
    if value is None:
        return f"{name}: expected a whole number such as 8"
    exp = re.fullmatch(r"[+]?([0-9]+\.?[0-9]*|\.[0-9]+)[eE][+]?([0-9]{1,3})", value.strip())
    if exp:
        from fractions import Fraction

        x = Fraction(exp.group(1)) * 10 ** int(exp.group(2))
        if x.denominator == 1:
            return f"{name} '{value}': exponent notation is not taken; write the digits ({int(x)})"
    return f"{name} '{value}': expected a whole number such as 8"


def _command_for(args: List[str]):
    """The click command for these arguments: the app with only the command asked for when the first argument
    names one (building all fifteen costs a start-up its time), the whole app otherwise (help, errors)."""
    if args:
        for info in app.registered_commands:
            if (info.name or info.callback.__name__.replace("_", "-")) == args[0]:
                break
        else:
            info = next((g for g in app.registered_groups if g.name == args[0]), None)
        if info is not None:
            one = typer.Typer()
            one.info, one.registered_callback = app.info, app.registered_callback
            if isinstance(info, typer.models.CommandInfo):
                one.registered_commands = [info]
            else:
                one.registered_groups = [info]
            return typer.main.get_command(one)
    return typer.main.get_command(app)


_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # what str.splitlines() breaks at


def _one_line(message: str) -> str:
    """An error is one line: a line break inside it (from a value the user gave, such as a name in a file) is
    shown escaped, as \\n."""
    return "".join(c.encode("unicode_escape").decode() if c in _LINE_BREAKS else c for c in message)


def _flags_without_type(command) -> None:
    """A flag takes no value, so its help line shows no type (such as `<bool>`) beside it."""
    for param in command.params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    get_help_option = command.get_help_option

    def help_option(ctx):
        option = get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        _flags_without_type(sub)


def _usage_names(command) -> None:
    """The usage line names an argument as the convention has it: MODEL when it is required, [FILES]... when it is
    optional or repeats (click's get_usage_pieces; typer would write {model})."""
    for param in command.params:
        if getattr(param, "param_type_name", None) == "argument":
            name = (param.metavar or param.name or "").upper()
            piece = (name if param.required else f"[{name}]") + ("..." if param.nargs != 1 else "")
            param.get_usage_pieces = lambda ctx, piece=piece: [piece]
    for sub in getattr(command, "commands", {}).values():
        _usage_names(sub)


def _discard_stdout() -> int:
    """stdout's reader has gone: whatever is still buffered for it goes nowhere, so that exiting raises no second
    error. Returns the status the command had."""
    import os

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return _exit["status"]
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return _exit["status"]


YOUNG_OBJECTS = 100_000  # new objects the command line's process makes before its first garbage collection


def _start_without_young_collections() -> None:
    """The command line's process (this entry point alone, not kvplan used as a library) runs its first garbage
    collection after YOUNG_OBJECTS new objects instead of 700, and the collector's own thresholds from then on. A
    planning command's run makes some 31,000 objects that live to its end (the modules it imports, typer's
    parameters, the specs and catalogs) and a few hundred in cycles: the 45 young-generation collections that found
    next to nothing there no longer run, and a long command (a sweep, a simulation) has its cycles collected as
    before once it passes the first."""
    import gc

    thresholds = gc.get_threshold()

    def restore(phase: str, info: dict) -> None:
        if phase == "stop" and restore in gc.callbacks:
            gc.set_threshold(*thresholds)
            gc.callbacks.remove(restore)

    gc.callbacks.append(restore)
    gc.set_threshold(max(YOUNG_OBJECTS, thresholds[0]), *thresholds[1:])


def entry() -> None:
    # The command line validates only kvplan's own catalogs, so it does not scan every installed package's entry
    # points for pydantic plugins (observability hooks for an application's models) on its first validation, as
    # typer already does not for its own; a value set in the environment is kept.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "1")
    _start_without_young_collections()
    status = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _discard_stdout()
    sys.exit(status)


if __name__ == "__main__":
    entry()

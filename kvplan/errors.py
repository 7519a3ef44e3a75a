"""The one exception kvplan raises for bad input (the CLI prints its message on one line and exits 2), and any
exception written as one line where a report records a failure and goes on (the kernel checks and sweeps)."""


class KvplanError(Exception):
    """A problem with what the user asked for: an unknown name, a malformed spec, an impossible configuration.

    The message names what is wrong and what would fix it, in one line.
    """


class UnmodelledWeights(KvplanError):
    """A checkpoint's weight quantization kvplan does not model; --weight-dtype plans the weights instead. `problem`
    says where and what, `what` names the scheme, `formats` suggests weight dtypes."""

    def __init__(self, problem: str, what: str, formats: str = "fp8, int8, int4_g128, mxfp4, nvfp4"):
        super().__init__(f"{problem}; pass --weight-dtype ({formats}) to plan the weights in that format")
        self.problem, self.what = problem, what


class HubUnavailable(KvplanError):
    """A Hugging Face id's config.json could not be had from the Hub: no hub extra, HF_HUB_OFFLINE, or the Hub out
    of reach. `why` says which, for the note of a catalog model planned in its place."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why


def check_whole(option: str, value, least: int = 1) -> None:
    """Refuse `value` for `option` unless it is a whole number of at least `least` (None: not given)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
        raise KvplanError(f"{option} must be a whole number of at least {least}, got {value!r}")


def did_you_mean(name: str, choices: list[str]) -> str:
    """A ' (did you mean X?)' suffix for an unknown name, or '' when nothing is close."""
    import difflib

    close = difflib.get_close_matches(name.lower(), [c.lower() for c in choices], n=3, cutoff=0.5)
    if not close:
        return ""
    by_lower = {c.lower(): c for c in choices}
    return " (did you mean " + ", ".join(by_lower[c] for c in close) + "?)"


def error_line(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"

"""`python -m kvplan` runs the command line."""

from .cli import entry

entry()

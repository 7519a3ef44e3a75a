"""`python -m kvplan` runs the command line."""

from kvplan.app.cli import entry

entry()

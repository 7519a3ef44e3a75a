"""The command line under its earlier name: `python -m kvplan.cli`, `import kvplan.cli` and `from kvplan.cli import
app` keep working; the commands live in kvplan.app.cli."""

from kvplan.app.cli import app, entry, main  # noqa: F401

if __name__ == "__main__":
    entry()

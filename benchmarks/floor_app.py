"""The least a typer command of kvplan's shape can cost: the same option types as `kvplan crossover`, one pydantic
model validated from a YAML file, one rich table printed. benchmarks/startup.py times it beside kvplan.

With --bare as the first argument it is instead the smallest typer command there is: one argument, one option, one
plain line printed."""

import sys
from typing import List, Optional

import typer

if sys.argv[1:2] == ["--bare"]:
    bare = typer.Typer(add_completion=False)

    @bare.command()
    def _bare(model: str, dtype: str = typer.Option("auto", "--dtype")) -> None:
        print(model, dtype)

    del sys.argv[1]
    bare()
    sys.exit(0)

app = typer.Typer(add_completion=False)


@app.command()
def crossover(
    model: str,
    dtype: Optional[List[str]] = typer.Option(None, "--dtype"),
    tp: int = typer.Option(1, "--tp"),
    weight_dtype: Optional[str] = typer.Option(None, "--weight-dtype"),
    gpu: Optional[str] = typer.Option(None, "--gpu"),
    context: Optional[List[str]] = typer.Option(None, "--context"),
    batch: Optional[List[str]] = typer.Option(None, "--batch"),
    weight_read: str = typer.Option("streamed", "--weight-read"),
    baseline: str = typer.Option("auto", "--baseline"),
    skip_layers: Optional[str] = typer.Option(None, "--skip"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    import yaml
    from pydantic import BaseModel, ConfigDict
    from rich.console import Console
    from rich.table import Table

    class Spec(BaseModel):
        model_config = ConfigDict(frozen=True, extra="allow")
        name: str
        num_layers: int

    spec = Spec.model_validate(yaml.safe_load(f"name: {model}\nnum_layers: 32\n"))
    t = Table()
    t.add_column("model")
    t.add_column("layers")
    t.add_row(spec.name, str(spec.num_layers))
    Console().print(t)


@app.command()
def other(x: int = 1) -> None:
    pass


if __name__ == "__main__":
    app()
